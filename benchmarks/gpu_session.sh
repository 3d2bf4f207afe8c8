#!/usr/bin/env bash
# What a short lease of a GPU machine is for, as one prepared script (the machine is bare and
# lent for minutes): the CUDA checks of training (tests/train/test_cuda.py), the capacity study
# at its GPU budget (gates/v2/7_capacity_per_param_gpu.toml, issue 18; 4 runs side by side), a short 30M training
# run exported to a packed model, and the machine's host CPU measured on two pinned cores
# (probe + decode sweep, issue 17) while the GPU work runs on the other cores.
#   benchmarks/gpu_session.sh [OUT_DIR] [SECONDS]
# Everything it measured ends in OUT_DIR (default results/gpu_session) as logs plus one
# tarball; work that is still running at SECONDS (default 480) is stopped, and a gate's
# finished runs are kept (its registry rows are appended run by run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu_session}
LIMIT=${2:-480}
[[ $LIMIT =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 60 ] || { echo "gpu_session.sh: SECONDS must be a whole number >= 60, got '$LIMIT'" >&2; exit 2; }
PY=${PYTHON:-python3}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/tern-gpu.XXXXXX)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
# seconds left before LIMIT, less a margin $1 (at least 1: a timeout of 0 would never stop)
left() { local s=$(( LIMIT - ($(date +%s) - T0) - ${1:-0} )); echo $(( s > 1 ? s : 1 )); }
# taskset / timeout run programs, not shell functions: a tern launcher that needs no install
printf '#!/bin/sh\nexec %s -c "import sys; from tern.cli import main; sys.exit(main())" "$@"\n' "$PY" > "$W/tern"
chmod +x "$W/tern"
tern=$W/tern
NCPU=$(nproc --all)
{ date -u; nvidia-smi -L; nproc --all; lscpu; "$PY" -c "import torch, numba, numpy, sys
print(sys.version); print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
print('numba', numba.__version__, 'numpy', numpy.__version__)"; } > "$OUT/env.txt" 2>&1

# pin by physical core: on an SMT machine cpus 0 and 1 may be two threads of one core, and the
# host's "2 threads" must be two cores. Two cores for the host, two for the tests, the rest
# (every thread of the other cores) for the gate; prints "HOST TEST GATE WORKERS"
SPLIT=$("$PY" -c "import os
cores = {}
for c in sorted(os.sched_getaffinity(0)):
    try: key = open(f'/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list').read().strip()
    except OSError: key = str(c)
    cores.setdefault(key, []).append(c)
cs = list(cores.values())
if len(cs) < 8: print('0 0', ','.join(str(c) for k in cs for c in k), 2)
else:
    gate = [c for k in cs[4:] for c in k]
    print(f'{cs[0][0]},{cs[1][0]} {cs[2][0]},{cs[3][0]}', ','.join(map(str, gate)), len(cs) - 4)" 2>/dev/null \
  || echo "0 0 0-$((NCPU - 1)) 2")
read -r HOST TEST GATE WORKERS <<< "$SPLIT"
echo "cpus: host $HOST, tests $TEST, gate $GATE ($WORKERS workers)" >> "$OUT/env.txt"
# at most 4 gate runs side by side: on the first H200 lease (benchmarks/gpu_sessions/2026-12-04-h200)
# 4 gave 1.7x (e8) / 4.0x (e64) one run's rate, while 12 (beside a 30M run) finished no run in 8 min
[ "$WORKERS" -gt 4 ] && WORKERS=4

# the GPU's load every 5 s while the work runs (how busy the side-by-side runs keep it)
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 5 \
  > "$W/gpu_load.csv" 2>&1 &
LOAD=$!
# 1. CUDA checks, then the 30M run (cores TEST)
( taskset -c "$TEST" timeout 150 "$PY" -m pytest -q -rA -p no:cacheprovider tests/train/test_cuda.py \
    -k "not compile" > "$OUT/cuda_tests.txt" 2>&1
  echo "rc=$? at $(( $(date +%s) - T0 )) s" >> "$OUT/cuda_tests.txt"
  taskset -c "$TEST" timeout 150 "$PY" -m pytest -q -rA -p no:cacheprovider tests/train/test_cuda.py \
    -k compile >> "$OUT/cuda_tests.txt" 2>&1
  echo "compile rc=$? at $(( $(date +%s) - T0 )) s" >> "$OUT/cuda_tests.txt"
  taskset -c "$TEST" timeout "$(left 40)" "$tern" train --preset 30m --device cuda \
    --minutes "$(awk -v s="$(left 100)" 'BEGIN { m = s / 60; print (m > 0.5 ? m : 0.5) }')" --out "$W/t30m" --no-progress --json > "$W/train30m.json" 2> "$W/train30m.log"
  echo "train rc=$? at $(( $(date +%s) - T0 )) s" >> "$W/train30m.log"
  [ -f "$W/t30m/checkpoint.pt" ] && "$tern" export "$W/t30m/checkpoint.pt" "$W/t30m.tern" >> "$W/train30m.log" 2>&1
) &
# 2. the capacity study on the GPU (cores GATE)
( taskset -c "$GATE" timeout "$(left 25)" "$tern" gate run gates/v2/7_capacity_per_param_gpu.toml \
    --workers "$WORKERS" --registry "$W/gpu_registry.jsonl" --work-dir "$W/gates" > "$W/gate.log" 2>&1
  echo "gate rc=$? at $(( $(date +%s) - T0 )) s" >> "$W/gate.log"
) &
# 3. the host CPU on two pinned cores: full probe, then the 1- and 2-thread decode sweep
( taskset -c "$HOST" timeout "$(left 25)" "$tern" probe --out "$W/host/host_profile.json" \
    > "$W/host_probe.log" 2>&1 &&
  taskset -c "$HOST" timeout "$(left 25)" "$tern" bench sweep --threads 1 2 --no-calibrate \
    --results "$W/host" --host "$W/host/host_profile.json" > "$W/host_sweep.log" 2>&1
  echo "host rc=$? at $(( $(date +%s) - T0 )) s" >> "$W/host_sweep.log"
) &
wait $(jobs -p | grep -vx "$LOAD")
kill "$LOAD" 2>/dev/null
nvidia-smi > "$W/nvidia-smi.txt" 2>&1
cp "$W/gate.log" "$OUT/gate.txt" 2>/dev/null
tar czf "$OUT/gpu_session.tgz" -C "$W" --exclude='*.pt' --exclude='models' --exclude='gates' . 2>/dev/null
ls -la "$OUT"
echo "gpu_session done in $(( $(date +%s) - T0 )) s"
