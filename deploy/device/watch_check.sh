#!/usr/bin/env bash
# Run `foreshock watch` live on a real GPU, through NVML and through nvidia-smi side by side, while
# deploy/device/gpu_load.py steps the GPU idle -> matmul -> memory-bound copy -> idle; scrape both
# /metrics endpoints as it runs. Before it: the NVML source's tests (its real-GPU test runs there)
# and the H200 step-response tests. Run from the repository root on the GPU machine, with
# foreshock's wheel in .whl/ (pip wheel --no-deps -w .whl .); numpy, numba, pyarrow, pyyaml,
# click, rich, prometheus-client, scikit-learn, matplotlib, nvidia-ml-py and PyTorch are expected
# there (the image has them). Writes into $OUT:
#   log.txt             everything printed (tests, the watches' progress and summaries)
#   phases.jsonl        when each load phase started (Unix seconds)
#   watch.tar           each watch's findings (JSON lines) and the /metrics scrapes
#   nvidia-smi-q.txt    nvidia-smi -q before the run
# It changes no GPU setting.
set -u
OUT=${OUT:?set OUT to the output folder}
SCHEDULE=${SCHEDULE:-"idle:20 matmul:90 copy:30 idle:40"}
WATCH_S=${WATCH_S:-190}
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/foreshock-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba-cache
FORESHOCK="python3 -m foreshock.cli.main"
nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw,enforced.power.limit --format=csv
python3 -c "import numpy, numba, pynvml; print('numpy', numpy.__version__, 'numba', numba.__version__)"
date -u +%FT%TZ; echo "== tests"
# The tests import foreshock from /tmp/site; the repository's own folders are not the package.
(cd tests && python3 -m pytest -q -p no:cacheprovider -x test_streams_nvml.py test_h200_step.py -rs 2>&1 | tail -15)
date -u +%FT%TZ; echo "== watch (Numba compiles on the first replay)"
$FORESHOCK replay tests/data/h200_step/run1_500ms --port 0 > /dev/null 2>&1
mkdir -p /tmp/w
python3 deploy/device/gpu_load.py $SCHEDULE > "$OUT/phases.jsonl" &
LOAD=$!
$FORESHOCK watch --source nvml --interval 1 --duration "$WATCH_S" --port 9108 \
    --findings /tmp/w/nvml-findings.jsonl > /tmp/w/nvml-watch.txt 2>&1 &
W1=$!
$FORESHOCK watch --source nvidia-smi --interval 1 --duration "$WATCH_S" --port 9109 \
    --findings /tmp/w/smi-findings.jsonl > /tmp/w/smi-watch.txt 2>&1 &
W2=$!
python3 - <<'PY'
import time, urllib.request
start = time.time()
for k in range(12):  # every 15 s from 10 s: idle, the matmul, the copy and idle again
    time.sleep(max(0.0, start + 10 + 15 * k - time.time()))
    for name, port in (("nvml", 9108), ("smi", 9109)):
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            open(f"/tmp/w/{name}-metrics-{k:02d}.txt", "wb").write(body)
        except Exception as exc:
            print("scrape", name, k, "failed:", exc)
PY
wait $LOAD; echo "load exit $?"
wait $W1; echo "watch nvml exit $?"
wait $W2; echo "watch nvidia-smi exit $?"
echo "== nvml watch"; tail -25 /tmp/w/nvml-watch.txt
echo "== nvidia-smi watch"; tail -25 /tmp/w/smi-watch.txt
wc -l /tmp/w/*findings.jsonl
tar cf "$OUT/watch.tar" -C /tmp w
date -u +%FT%TZ
