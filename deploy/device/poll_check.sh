#!/usr/bin/env bash
# What a poll of a real GPU costs, idle and under load, and a live recording replayed. On the GPU
# machine, from the repository root, with foreshock's wheel in .whl/ (pip wheel --no-deps -w .whl .)
# and the packages watch_check.sh expects:
#   1. bench/bench_poll.py with the GPU idle: NvmlSource.read() vs the bare pynvml calls, each
#      field's call, and the nvidia-smi source vs running nvidia-smi;
#   2. the same while deploy/device/gpu_load.py runs matmuls (does a busy GPU answer slower?);
#   3. `foreshock record --source nvml` at 1 s over idle -> matmul -> idle, ended by SIGTERM
#      before its --duration (the close a service manager gives it), then `foreshock replay --max`
#      of what it wrote.
# Writes $OUT/log.txt (everything printed), $OUT/phases.jsonl, $OUT/recording.tar. Changes no GPU
# setting.
set -u
OUT=${OUT:?set OUT to the output folder}
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/foreshock-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba-cache
FORESHOCK="python3 -m foreshock.cli.main"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv
date -u +%FT%TZ; echo "== 1. poll cost, GPU idle"
python3 bench/bench_poll.py --polls 200
date -u +%FT%TZ; echo "== 2. poll cost, GPU under matmuls"
python3 deploy/device/gpu_load.py matmul:45 > "$OUT/phases-bench.jsonl" &
LOAD=$!
sleep 8  # PyTorch's start and the first products
python3 bench/bench_poll.py --polls 200
wait $LOAD; echo "load exit $?"
date -u +%FT%TZ; echo "== 3. record over a load step, SIGTERM before its end"
python3 deploy/device/gpu_load.py idle:10 matmul:30 idle:20 > "$OUT/phases.jsonl" &
LOAD=$!
$FORESHOCK record --source nvml --interval 1 --duration 600 --out /tmp/rec &
REC=$!
wait $LOAD; echo "load exit $?"
kill -TERM $REC; wait $REC; echo "record exit $? (after SIGTERM)"
ls -la /tmp/rec
$FORESHOCK replay /tmp/rec --max --port 0 2>&1 | tail -30
tar cf "$OUT/recording.tar" -C /tmp rec
date -u +%FT%TZ
