#!/usr/bin/env bash
# Measure this machine as a committed host (benchmarks/hosts/LABEL): a full probe, the decode
# sweep at 1 and 2 threads with the 105m/206m pair, nothing reused, and the 10B pick; then the
# same sweep once more (the host's own run-to-run spread: a shared VM may not hold still);
# commit the profile and the measured rows. Run on a quiet machine (the timing takes ~20 min;
# REPEAT=0 skips the repeat sweep).
#   benchmarks/commit_host.sh LABEL [native|avx2|noavx2] [note]
# avx2: numba compiles for an AVX2-only CPU (Haswell: the reference PC's class); noavx2: for
# an SSE4.2 CPU (the engine's plain numba paths). Each target caches its code separately.
set -euo pipefail
cd "$(dirname "$0")/.."
LABEL=${1:?usage: benchmarks/commit_host.sh LABEL [native|avx2|noavx2] [note]}
TARGET=${2:-native}
NOTE=${3:-}
PY=${PYTHON:-.venv/bin/python}
TERN=${TERN:-.venv/bin/tern}
RES=results/hosts/$LABEL
mkdir -p "$RES/bench" results/models
[ -e "$RES/models" ] || ln -s "$PWD/results/models" "$RES/models"  # the random models are shared
SSE="+64bit,+cmov,+cx16,+cx8,+fxsr,+mmx,+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3"
case $TARGET in
  native) ;;
  avx2) export NUMBA_CPU_NAME=haswell NUMBA_CACHE_DIR=$PWD/results/numba-cache-avx2
        export NUMBA_CPU_FEATURES="$SSE,+avx,+avx2,+bmi,+bmi2,+f16c,+fma,+lzcnt,+movbe,+pclmul,+xsave" ;;
  noavx2) export NUMBA_CPU_NAME=nehalem NUMBA_CACHE_DIR=$PWD/results/numba-cache-noavx2
          export NUMBA_CPU_FEATURES="$SSE" ;;
  *) echo "target must be native, avx2 or noavx2" >&2; exit 2 ;;
esac
lscpu > "$RES/lscpu.txt"
"$TERN" probe --out "$RES/host_profile.json" > "$RES/probe.txt"
rm -f "$RES/bench/sweep.jsonl"
"$TERN" bench sweep --threads 1 2 --pair --no-calibrate --results "$RES" --host "$RES/host_profile.json" \
  > "$RES/sweep.txt"
"$PY" -c "import sys; from tern.core.host_profile import HostProfile; from tern.measure.hosts import measure_10b_pick; \
measure_10b_pick(HostProfile.load(sys.argv[1]), sys.argv[2])" "$RES/host_profile.json" "$RES"
REPEAT_ARGS=()
if [ "${REPEAT:-1}" != 0 ]; then
  mkdir -p "$RES/repeat/bench"
  [ -e "$RES/repeat/models" ] || ln -s "$PWD/results/models" "$RES/repeat/models"
  rm -f "$RES/repeat/bench/sweep.jsonl"
  "$TERN" bench sweep --threads 1 2 --pair --no-calibrate --results "$RES/repeat" --host "$RES/host_profile.json" \
    > "$RES/sweep_repeat.txt"
  REPEAT_ARGS=(--repeat-rows "$RES/repeat/bench/sweep.jsonl")
fi
"$TERN" bench hosts --save "$LABEL" --profile "$RES/host_profile.json" --rows "$RES/bench/sweep.jsonl" --note "$NOTE" \
  "${REPEAT_ARGS[@]}"
