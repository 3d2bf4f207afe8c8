#!/usr/bin/env bash
# tern set-up-and-go. Creates .venv (once), installs the kit, then runs a job:
#   ./go report [args]   the main job on the shipped defaults (tern report)
#   ./go test   [args]   the test suite (what CI runs)
#   ./go tern   [args]   any tern subcommand inside the environment
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${TERN_VENV:-.venv}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[go] creating $VENV" >&2
    # system site packages: a preinstalled torch (Kaggle, Colab, conda) is seen and kept
    "$PY" -m venv --system-site-packages "$VENV"
  fi
  local stamp="$VENV/.tern-installed" want
  want=$(cat pyproject.toml | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      echo "[go] GPU found: installing the default (CUDA) torch build" >&2
      "$VENV/bin/python" -m pip install -q "torch>=2.1" >&2
    else
      echo "[go] no GPU: installing the CPU build of torch" >&2
      if "$VENV/bin/python" -c "import urllib.request as u; u.urlopen('https://download.pytorch.org/whl/cpu/', timeout=5)" 2>/dev/null; then
        "$VENV/bin/python" -m pip install -q "torch==2.13.0" \
          --index-url https://download.pytorch.org/whl/cpu >&2
      else  # PyTorch's index unreachable: the configured index / local wheels (CPU build here)
        "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
      fi
    fi
  fi
  echo "[go] installing tern and its dependencies" >&2
  "$VENV/bin/python" -m pip install -q -e ".[test]" >&2
  echo "$want" > "$stamp"
}

job=${1:-report}; shift || true
setup
case "$job" in
  test)   exec "$VENV/bin/python" -m pytest -q -n 2 "$@" ;;
  report) exec "$VENV/bin/tern" report "$@" ;;
  tern)   exec "$VENV/bin/tern" "$@" ;;
  *) echo "usage: ./go [report|test|tern] [args...]" >&2; exit 2 ;;
esac
