"""Findings of an audit of the straggler detector (2026-12-04), each reproduced first: its state did
not say which job each GPU was judged in, so a worker restarted under a new job list (``foreshock
topology jobs``) carried every GPU's flags and busy means into its new job:

- a flag raised in the old job held the new job's first report back for up to ``refresh_s``, the
  last report standing naming the old job;
- the carried flag's lowered bar (hysteresis) named a GPU 4.6 % slower than its new peers (under
  the 5 % gap) for good;
- the old job's busy means (a compute-bound job's clock at 0.75) made a node's GPUs stragglers at
  the start of the next job, a memory-bound one at full clock.

A GPU whose job is not the one it was saved in now starts afresh, as a member joining late does.
"""

from __future__ import annotations

import numpy as np

from foreshock.detectors import straggler as sg
from foreshock.frames import Frame
from foreshock.topology import Topology


def _topology(jobs: list[tuple[str, list[str]]]) -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": f"n{i}", "rack": "k", "gpus": 8} for i in range(4)],
        "jobs": [{"name": j, "nodes": nodes} for j, nodes in jobs]})


def _feed(det: sg.StragglerDetector, t0: float, t1: float, slow: tuple[int, ...] = (),  # type: ignore[no-untyped-def]
          busy=None, clock_share=None) -> list:
    found = []
    for t in np.arange(t0, t1, 10.0):
        rng = np.random.default_rng(int(t))
        clock = np.full(32, 1.98e9) * (1 - 0.005 * rng.random(32))
        clock[list(slow)] *= 0.85
        util = np.ones(32) if busy is None else busy(t).astype(float)
        if clock_share is not None:
            clock = np.where(util > 0, clock * clock_share(t), 0.17 * 1.98e9)
        found += det.update(Frame("gpu", np.full(32, float(t)), np.arange(32), {
            "sm_clock": clock, "sm_clock_max": np.full(32, 1.98e9), "util": util,
            "gpu_temp": np.full(32, 60.0), "throttle_reasons": np.zeros(32)}))
    return found


OLD = [("A", ["n0", "n1"]), ("B", ["n2", "n3"])]


def test_a_gpu_flagged_in_its_old_job_is_reported_in_its_new_one_at_once() -> None:
    det = sg.StragglerDetector(_topology(OLD))
    before = _feed(det, 0, 720, slow=(5,))
    assert [f.ts for f in before] == [60.0, 660.0] and "job A" in before[-1].reason
    restarted = sg.StragglerDetector(_topology([("C", ["n0", "n2", "n3"])]))
    restarted.load_state_dict(det.state_dict())
    after = _feed(restarted, 720, 1500, slow=(5,))
    assert after and after[0].ts <= 780.0 and "job C" in after[0].reason


def test_the_same_jobs_listed_again_keep_what_was_said() -> None:
    """The job list written again in another order (the same jobs, found by name and nodes): a
    flag said at 660 s is not said again before its refresh."""
    det = sg.StragglerDetector(_topology(OLD))
    _feed(det, 0, 720, slow=(5,))
    restarted = sg.StragglerDetector(_topology(list(reversed(OLD))))
    restarted.load_state_dict(det.state_dict())
    after = _feed(restarted, 720, 1500, slow=(5,))
    assert [f.ts for f in after] == [1260.0]


def test_the_old_jobs_busy_means_make_no_straggler_of_the_new_job() -> None:
    a, c = np.zeros(32, bool), np.zeros(32, bool)
    a[:16] = True
    c[:8] = c[16:] = True

    def busy(t: float) -> np.ndarray:  # job A on n0-n1 to 1800 s, 60 s idle, job C on n0, n2, n3
        return a if t < 1800 else (np.zeros(32, bool) if t < 1860 else c)

    def clock_share(t: float) -> float:  # A compute-bound (0.75 of max), C at full clock
        return 0.75 if t < 1800 else 1.0

    det = sg.StragglerDetector(_topology([("A", ["n0", "n1"])]))
    _feed(det, 0, 1800, busy=busy, clock_share=clock_share)
    restarted = sg.StragglerDetector(_topology([("C", ["n0", "n2", "n3"])]))
    restarted.load_state_dict(det.state_dict())
    assert _feed(restarted, 1800, 3000, busy=busy, clock_share=clock_share) == []


def test_a_state_saved_without_its_jobs_loads_as_of_the_jobs_listed_now() -> None:
    det = sg.StragglerDetector(_topology(OLD))
    _feed(det, 0, 720, slow=(5,))
    state = {k: v for k, v in det.state_dict().items() if k not in ("jobs", "gpu_job_saved")}
    restarted = sg.StragglerDetector(_topology(OLD))
    restarted.load_state_dict(state)
    assert [f.ts for f in _feed(restarted, 720, 1500, slow=(5,))] == [1260.0]
