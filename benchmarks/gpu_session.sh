#!/usr/bin/env bash
# What a short lease of a GPU machine is for, as one prepared script (the machine is bare and
# lent for minutes; what the first lease taught: benchmarks/gpu_sessions/2026-12-04-h200/).
#   benchmarks/gpu_session.sh [OUT_DIR] [SECONDS] [gpu|host|study]
# gpu (default), one after the other so that nothing runs beside a rate: the step rates of the
#   GPU capacity study's four arms alone and 4 side by side (benchmarks/gate_train_speed.py
#   --device cuda: `tern gate plan --speed` prices the study from them) and a profile of the
#   e8 / e64 steps with the default dispatch and the bf16 grouped one (GPU kernel time against
#   wall, kernels and syncs per step), the CUDA checks of
#   training (tests/train/test_cuda.py), the 30M preset alone on the GPU (exported to a packed
#   model), and the torch.compile check with what time is left.
# host: the machine's CPU alone (issue 17): a full probe on two physical cores, then the
#   decode sweep at 1 and 2 threads on them (rows are appended point by point, so a sweep
#   the lease cuts short keeps what it measured).
# study: the GPU capacity study itself (gates/v2/7_capacity_per_param_gpu.toml), 4 runs side
#   by side (its registry rows are appended run by run; an e64 run takes ~14 min at that rate).
# Everything it measured ends in OUT_DIR (default results/gpu_session) as logs, JSONL rows and
# one tarball; work still running at SECONDS (default 480) is stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu_session}
LIMIT=${2:-480}
MODE=${3:-gpu}
[[ $LIMIT =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 60 ] || { echo "gpu_session.sh: SECONDS must be a whole number >= 60, got '$LIMIT'" >&2; exit 2; }
case $MODE in gpu|host|study) ;; *) echo "gpu_session.sh: mode must be gpu, host or study, got '$MODE'" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/tern-gpu.XXXXXX)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
# seconds left before LIMIT, less a margin $1 (at least 1: a timeout of 0 would never stop)
left() { local s=$(( LIMIT - ($(date +%s) - T0) - ${1:-0} )); echo $(( s > 1 ? s : 1 )); }
stamp() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
# taskset / timeout run programs, not shell functions: a tern launcher that needs no install
printf '#!/bin/sh\nexec %s -c "import sys; from tern.cli import main; sys.exit(main())" "$@"\n' "$PY" > "$W/tern"
chmod +x "$W/tern"
tern=$W/tern
NCPU=$(nproc --all)
{ date -u; echo "mode $MODE, limit $LIMIT s"; nvidia-smi -L; nproc --all; lscpu | grep -v "^Flags\|^Vulnerab"
  "$PY" -c "import torch, numba, numpy, sys
print(sys.version); print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
print('numba', numba.__version__, 'numpy', numpy.__version__)"; } > "$OUT/env.txt" 2>&1

# pin by physical core: on an SMT machine cpus 0 and 1 may be two threads of one core, and the
# host's "2 threads" must be two cores. Two cores for the host sweep (or the tests), the rest
# (every thread of the other cores) for the GPU processes; prints "HOST REST"
SPLIT=$("$PY" -c "import os
cores = {}
for c in sorted(os.sched_getaffinity(0)):
    try: key = open(f'/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list').read().strip()
    except OSError: key = str(c)
    cores.setdefault(key, []).append(c)
cs = list(cores.values())
if len(cs) < 4: print('0', ','.join(str(c) for k in cs for c in k))
else: print(f'{cs[0][0]},{cs[1][0]}', ','.join(str(c) for k in cs[2:] for c in k))" 2>/dev/null \
  || echo "0 0-$((NCPU - 1))")
read -r HOST REST <<< "$SPLIT"
echo "cpus: host/tests $HOST, GPU processes $REST" >> "$OUT/env.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 5 \
  > "$OUT/gpu_load.csv" 2>&1 &
LOAD=$!
GATE=gates/v2/7_capacity_per_param_gpu.toml

case $MODE in
gpu)
  # one thing at a time, so each rate is the GPU's own: 1. the step rates of the four arms,
  # alone and 4 side by side (cores REST); 2. the CUDA checks; 3. the 30M preset alone;
  # 4. the torch.compile check with what time is left
  taskset -c "$REST" timeout "$(left 200)" "$PY" benchmarks/gate_train_speed.py --gate "$GATE" \
    --arms e8 e16 e32 e64 --device cuda --threads 1 --concurrent 1 4 --steps 20 --warmup 5 --eval \
    --out "$OUT/gate_train_speed_cuda.jsonl" > "$OUT/gate_train_speed.txt" 2>&1
  stamp speed $? >> "$OUT/gate_train_speed.txt"
  # where a GPU step's time goes: kernel time against wall, kernels and syncs per step
  taskset -c "$REST" timeout "$(left 170)" "$PY" benchmarks/gate_train_speed.py --gate "$GATE" \
    --arms e8 e64 --dispatch auto grouped --device cuda --threads 1 --steps 5 --warmup 3 --profile 5 \
    --out "$OUT/gate_train_profile_cuda.jsonl" >> "$OUT/gate_train_speed.txt" 2>&1
  stamp profile $? >> "$OUT/gate_train_speed.txt"
  taskset -c "$HOST" timeout "$(left 100)" "$PY" -m pytest -q -rA -p no:cacheprovider tests/train/test_cuda.py \
    -k "not compile" > "$OUT/cuda_tests.txt" 2>&1
  stamp cuda_tests $? >> "$OUT/cuda_tests.txt"
  taskset -c "$REST" timeout "$(left 40)" "$tern" train --preset 30m --device cuda \
    --minutes "$(awk -v s="$(left 70)" 'BEGIN { m = s / 60; m = (m > 1.5 ? 1.5 : m); print (m > 0.25 ? m : 0.25) }')" \
    --out "$W/t30m" --no-progress --json > "$OUT/train30m.json" 2> "$W/train30m.log"
  stamp train $? >> "$W/train30m.log"
  [ -f "$W/t30m/checkpoint.pt" ] && "$tern" export "$W/t30m/checkpoint.pt" "$W/t30m.tern" >> "$W/train30m.log" 2>&1
  taskset -c "$HOST" timeout "$(left 5)" "$PY" -m pytest -q -rA -p no:cacheprovider tests/train/test_cuda.py \
    -k compile >> "$OUT/cuda_tests.txt" 2>&1
  stamp compile_test $? >> "$OUT/cuda_tests.txt"
  ;;
host)
  ( taskset -c "$HOST" timeout "$(left 10)" "$tern" probe --out "$W/host/host_profile.json" > "$W/host_probe.log" 2>&1 &&
    taskset -c "$HOST" timeout "$(left 10)" "$tern" bench sweep --threads 1 2 --no-calibrate \
      --results "$W/host" --host "$W/host/host_profile.json" > "$W/host_sweep.log" 2>&1
    stamp host $? >> "$W/host_sweep.log"
    cp "$W/host/host_profile.json" "$W/host/bench/sweep.jsonl" "$OUT/" 2>/dev/null ) &
  wait $(jobs -p | grep -vx "$LOAD")
  ;;
study)
  ( taskset -c "$REST" timeout "$(left 15)" "$tern" gate run "$GATE" --workers 4 \
      --registry "$OUT/gpu_registry.jsonl" --work-dir "$W/gates" > "$OUT/gate.txt" 2>&1
    stamp gate $? >> "$OUT/gate.txt" ) &
  wait $(jobs -p | grep -vx "$LOAD")
  ;;
esac
kill "$LOAD" 2>/dev/null
nvidia-smi > "$W/nvidia-smi.txt" 2>&1
tar czf "$OUT/gpu_session.tgz" -C "$W" --exclude='*.pt' --exclude='models' --exclude='gates' . 2>/dev/null
ls -la "$OUT"
tail -n 12 "$OUT/gate_train_speed.txt" 2>/dev/null
echo "gpu_session ($MODE) done in $(( $(date +%s) - T0 )) s"
