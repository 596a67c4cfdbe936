"""Fill the Numba cache (NUMBA_CACHE_DIR) before `make test` runs the suite.

On a fresh clone every kernel compiles on first use: ~2 minutes of CPU, paid inside whichever
tests come first — by both pytest-xdist processes where they reach a kernel together, and by
each Kafka worker subprocess a test starts (one warm-up took 100 s cold against its 60-s wait for
the group). `make test` runs this while the services start (downloads, a JVM: little CPU), in
two processes, one per core: an evaluation of a small simulated recording (the kernels as the
pipeline calls them on many-row frames) and a Kafka worker's own warm-up (the one- and two-row
versions). Not a test; a failure here only leaves the compiling to the tests.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker_warm_up() -> None:
    from foreshock.detectors.bank import DetectorBank
    from foreshock.simulator import ClusterSimulator, load_scenario
    from foreshock.streams.kafka_worker import DetectionStage

    topology = ClusterSimulator(gpus=16, scenario=load_scenario("mixed"), seed=0).topology
    DetectionStage(topology, lambda hardware: DetectorBank.from_names(hardware), partitions=1).warm_up()


def evaluate_small_recording(folder: Path) -> None:
    cli = [sys.executable, "-m", "foreshock.cli.main"]
    rec = folder / "rec"
    subprocess.run(cli + ["simulate", "--scenario", "mixed", "--random-faults", "--gpus", "64", "--duration", "600",
                          "--seed", "3", "--out", str(rec), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(cli + ["evaluate", str(rec), "--detectors", "foreshock", "--no-plots",
                          "--report", str(folder / "report")], check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    if sys.argv[1:] == ["--worker"]:
        worker_warm_up()
        return 0
    began = time.monotonic()
    worker = subprocess.Popen([sys.executable, __file__, "--worker"])
    with tempfile.TemporaryDirectory(prefix="foreshock-warm-") as tmp:
        evaluate_small_recording(Path(tmp))
    status = worker.wait()
    print(f"Numba cache warmed in {time.monotonic() - began:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
