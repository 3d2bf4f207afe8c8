#!/usr/bin/env bash
# Re-measure every figure the issue notes quote, one step after another on a quiet machine.
# Writes logs to results/measure/ and rows to results/bench/*.jsonl. Usage:
#   benchmarks/measure_all.sh [step ...]     steps: probe c kernels dram ladder sweep predict 10b
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TERN=${TERN:-.venv/bin/tern}
LOG=results/measure
mkdir -p "$LOG"
steps=${*:-probe c kernels dram ladder sweep predict 10b}
run() { local name=$1; shift; echo "== $name: $*" >&2; local t0=$SECONDS
  "$@" > "$LOG/$name.out" 2> "$LOG/$name.err"; local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$LOG/times.txt" >&2; }
for s in $steps; do case $s in
  probe)   run probe_quick $TERN probe --quick --out results/host_profile_quick.json --json
           run probe $TERN probe --json ;;
  c)       run c_read $PY benchmarks/compare_c_read.py ;;
  kernels) run kernels $PY benchmarks/ternary_matvec.py ;;
  dram)    run dram_model $PY benchmarks/dram_model.py ;;
  predict) run predict $TERN predict --config sandbox 30m 105m 206m 10b --threads 1 2 --json
           run predict_cal $TERN predict --host results/host_profile_calibrated.json \
             --config sandbox 30m 105m 206m 10b --threads 1 2 --json
           run predict_ref $TERN predict --reference --config sandbox 30m 105m 206m 10b --threads 1 6 --json
           run design $TERN design --threads 1 2 --json
           run design_ref $TERN design --reference --threads 1 6 --json ;;
  ladder)  run ladder $TERN bench ladder --repeats 5 --json ;;
  sweep)   run sweep $TERN bench sweep --pair --json ;;
  10b)     run toward_10b .venv/bin/papermill notebooks/08_toward_10b.ipynb "$LOG/08_toward_10b.ipynb" \
             -p RESULTS "$PWD/results" --cwd notebooks ;;
  *) echo "unknown step $s" >&2; exit 2 ;;
esac; done
