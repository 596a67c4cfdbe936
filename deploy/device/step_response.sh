#!/usr/bin/env bash
# Record a real GPU's thermal step response with foreshock's NVML source while a load steps
# idle -> full (matmul) -> memory-bound (copy) -> idle. Run from the repository root on the
# GPU machine, with foreshock's wheel in .whl/ (pip wheel --no-deps -w .whl .) and PyTorch,
# numpy, pyarrow, pyyaml, numba and nvidia-ml-py installed there. Writes into $OUT:
#   rec.tar           the recording folder (topology.yaml, gpu.parquet, ...) from the NVML source
#   phases.jsonl      when each load phase started (Unix seconds)
#   nvidia-smi.csv    nvidia-smi --query-gpu at 500 ms over the same minutes (a cross-check)
#   nvidia-smi-q.txt  nvidia-smi -q before the run (limits and thresholds of this GPU)
#   log.txt           everything the commands printed
# It changes no GPU setting.
set -u
OUT=${OUT:?set OUT to the output folder}
SCHEDULE=${SCHEDULE:-"idle:30 matmul:150 copy:60 idle:90"}
RECORD_S=${RECORD_S:-345}
INTERVAL_S=${INTERVAL_S:-0.5}
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/foreshock-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1
nvidia-smi
python3 -m foreshock.streams.nvml /tmp/smoke 2 1 || echo "SMOKE FAILED"
nvidia-smi --query-gpu=timestamp,temperature.gpu,temperature.memory,power.draw,enforced.power.limit,clocks.sm,clocks.max.sm,utilization.gpu,clocks_event_reasons.active,fan.speed \
  --format=csv -lms 500 > "$OUT/nvidia-smi.csv" 2>&1 &
SMI=$!
python3 -m foreshock.streams.nvml /tmp/rec "$RECORD_S" "$INTERVAL_S" > "$OUT/nvml-summary.json" &
REC=$!
python3 deploy/device/gpu_load.py $SCHEDULE > "$OUT/phases.jsonl"
wait $REC; echo "recorder exit $?"
kill $SMI
cat "$OUT/nvml-summary.json" "$OUT/phases.jsonl"
tar cf "$OUT/rec.tar" -C /tmp rec && tar tvf "$OUT/rec.tar"
python3 - <<'PY'
import pyarrow.parquet as pq, glob
for f in sorted(glob.glob("/tmp/rec/*.parquet")):
    t = pq.read_table(f)
    print(f, t.num_rows, t.column_names)
    d = t.to_pandas()
    print(d.iloc[::40].to_string(max_cols=30))
PY
