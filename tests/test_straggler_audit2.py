"""Straggler audit 2 (/tmp/audit_strag2/): clocks without their maximum, a job split in two
halves, and the job cost of a "slower" finding."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import straggler as sg
from foreshock.detectors.incidents import IncidentEngine
from foreshock.frames import Frame
from foreshock.topology import Topology

CLOCK_MAX = 1.98e9  # an H200's max SM clock (FACTS)


def topology(n_nodes: int) -> Topology:
    """One rack, ``n_nodes`` nodes of 8 GPUs, one job on all of them."""
    return Topology.from_dict({
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}], "racks": [{"name": "rack0", "row": "row0"}],
        "nodes": [{"name": f"n{i}", "rack": "rack0", "gpus": 8} for i in range(n_nodes)],
        "jobs": [{"name": "job0", "nodes": [f"n{i}" for i in range(n_nodes)]}]})


def run(det: sg.StragglerDetector, n: int, clock_fn=None, temp_fn=None, throttle_fn=None,
        with_max=None, t_end: float = 900.0) -> list:
    """Feed ``det`` busy samples every 10 s, clocks with 0.5 % noise; ``with_max``: the GPUs whose
    rows carry ``sm_clock_max`` (the others: NaN, as a source without the field); the findings."""
    found = []
    for t in np.arange(0.0, t_end, 10.0):
        rng = np.random.default_rng(int(t))
        clock = np.full(n, CLOCK_MAX) * (1 - 0.005 * rng.random(n))
        clock = clock if clock_fn is None else clock_fn(clock)
        clock_max = np.full(n, CLOCK_MAX)
        if with_max is not None:
            clock_max[~with_max] = np.nan
        temp = np.full(n, 60.0) if temp_fn is None else temp_fn(t)
        bits = np.zeros(n) if throttle_fn is None else throttle_fn(t)
        found += det.update(Frame("gpu", np.full(n, t), np.arange(n), {
            "sm_clock": clock, "sm_clock_max": clock_max, "util": np.ones(n), "gpu_temp": temp,
            "throttle_reasons": bits, "power": np.full(n, 600.0)}))
    return found


def named(found: list, field: str) -> set[int]:
    return {f.slot for f in found if f.field == field}


@pytest.mark.kernel  # the comparison kernel's MAD bar: rerun as Python too
def test_a_slower_gpu_is_named_where_clocks_come_without_their_maximum():
    """dcgm-exporter's default counters carry no max SM clock: GPU 5 at 30 % below its 31 peers
    is the job's pacer all the same (a relative deficit needs no maximum), its reason in MHz
    (~1380 against ~1975). Skipped, no clock was read and the check was silently off. A job whose
    GPUs come with and without the maximum compares one kind (most of them: the ratios), never
    both in one median: there GPU 3 (30 % slow, with its max) alone is named, not the 12 read
    without it (their raw clock is no share of a maximum)."""
    slow5 = lambda c: np.where(np.arange(32) == 5, c * 0.70, c)  # noqa: E731
    found = run(sg.StragglerDetector(topology(4)), 32, clock_fn=slow5, with_max=np.zeros(32, bool))
    assert named(found, "sm_clock") == {5}
    # the reason reads clocks in MHz: 0.7 x ~1975 (the noise takes up to 0.5 % off) and ~1975
    import re
    reason = next(f.reason for f in found if f.field == "sm_clock")
    mhz = [float(v) for v in re.findall(r"([\d.]+) MHz", reason)]
    assert len(mhz) == 2 and 1370 < mhz[0] < 1390 and 1965 < mhz[1] < 1985, reason

    # a state saved and loaded keeps each GPU's kind of clock mean; one saved before the kinds were
    # kept (no s_clock_raw) loads as ratios
    det = sg.StragglerDetector(topology(4))
    run(det, 32, clock_fn=slow5, with_max=np.zeros(32, bool))
    again = sg.StragglerDetector(topology(4))
    again.load_state_dict(det.state_dict())
    assert again.s_clock_raw.tolist() == [1.0] * 32
    older = {k: v for k, v in sg.StragglerDetector(topology(4)).state_dict().items() if k != "s_clock_raw"}
    again.load_state_dict(older)
    assert again.s_clock_raw.tolist() == [0.0] * 32

    mixed = np.arange(32) < 20  # 20 GPUs with the max, 12 without
    slow3 = lambda c: np.where(np.arange(32) == 3, c * 0.70, c)  # noqa: E731
    found = run(sg.StragglerDetector(topology(4)), 32, clock_fn=slow3, with_max=mixed)
    assert named(found, "sm_clock") == {3}

    # an exporter that loses the field mid-run: the GPU's mean starts afresh in its new kind and
    # nobody is named (a ratio of 1 averaged with raw clocks would sit anywhere between)
    det = sg.StragglerDetector(topology(4))
    assert run(det, 32, with_max=np.ones(32, bool), t_end=600.0) == []
    half = np.arange(32) < 16
    found = []
    for t in np.arange(600.0, 1500.0, 10.0):
        clock_max = np.where(half, CLOCK_MAX, np.nan) if t >= 900 else np.full(32, CLOCK_MAX)
        found += det.update(Frame("gpu", np.full(32, t), np.arange(32), {
            "sm_clock": np.full(32, CLOCK_MAX), "sm_clock_max": clock_max, "util": np.ones(32),
            "gpu_temp": np.full(32, 60.0), "throttle_reasons": np.zeros(32), "power": np.full(32, 600.0)}))
    assert found == []


@pytest.mark.kernel  # the comparison kernel's MAD bar: rerun as Python too
def test_one_node_of_a_two_node_job_slower_hotter_or_throttling_is_named():
    """A job's busy GPUs split in two equal halves put its median midway and its MAD at half the
    gap, which k_mad (4) MADs never reach: node n1 at half the clock of n0 went unnamed. Split so
    (its two middle values two gaps apart or more) the job is judged against its better half, n0:
    all 8 GPUs of n1 are named, none of n0. The same for temperature (n1 40 °C hotter) and for the
    throttled share (n1 always thermally throttled, n0 never)."""
    slow = lambda c: np.where(np.arange(16) >= 8, c * 0.5, c)  # noqa: E731
    assert named(run(sg.StragglerDetector(topology(2)), 16, clock_fn=slow), "sm_clock") == set(range(8, 16))
    hot = lambda t: np.where(np.arange(16) >= 8, 100.0, 60.0)  # noqa: E731
    assert named(run(sg.StragglerDetector(topology(2)), 16, temp_fn=hot), "gpu_temp") == set(range(8, 16))
    from foreshock import facts
    thr = lambda t: np.where(np.arange(16) >= 8, float(facts.THROTTLE_SW_THERMAL), 0.0)  # noqa: E731
    assert named(run(sg.StragglerDetector(topology(2)), 16, throttle_fn=thr),
                 "throttle_reasons") == set(range(8, 16))


@pytest.mark.kernel
def test_a_spread_job_without_a_straggler_names_nobody():
    """Noisy peers (each GPU's clock 0-8 % under the max, its temperature 55-70 °C, for good): a
    spread job, no straggler in it, nobody named."""
    rng = np.random.default_rng(7)
    offset, warm = 1 - 0.08 * rng.random(32), 55 + 15 * rng.random(32)
    found = run(sg.StragglerDetector(topology(4)), 32, clock_fn=lambda c: c * offset,
                temp_fn=lambda t: warm, t_end=1800.0)
    assert found == []


def test_a_slower_members_clock_deficit_is_its_jobs_cost():
    """GPU 0 runs 30 % slower than its 31 peers and 20 °C hotter: its incident's job cost is the
    pace it sets, 1 / (1 - 0.3) = 1.43x, and 32 GPUs x 0.3 = 9.6 GPU-h at risk per hour (the
    "slower" finding counted x1.0 and none at risk). A GPU only hotter (its clock at its peers')
    costs its job nothing: the hotter finding carries no clock deficit."""
    def incident(clock_factor: float):
        det, eng = sg.StragglerDetector(topology(4)), IncidentEngine(topology(4))
        for t in np.arange(0.0, 1800.0, 10.0):
            clock, temp = np.full(32, CLOCK_MAX), np.full(32, 60.0)
            clock[0] *= clock_factor
            temp[0] = 80.0
            fr = Frame("gpu", np.full(32, t), np.arange(32), {
                "sm_clock": clock, "sm_clock_max": np.full(32, CLOCK_MAX), "util": np.ones(32),
                "gpu_temp": temp, "throttle_reasons": np.zeros(32), "power": np.full(32, 600.0)})
            found = det.update(fr)
            eng.observe_frame(fr)
            eng.observe(found, float(t))
        (inc,) = eng.incidents(1790.0)
        return inc

    inc = incident(0.70)
    assert dict(inc.jobs)["job0"] == pytest.approx(1 / 0.7, abs=0.01)
    assert inc.gpu_hours_at_risk_per_hour == pytest.approx(32 * 0.3, abs=0.1)
    inc = incident(1.0)
    assert dict(inc.jobs).get("job0", 1.0) == pytest.approx(1.0)
    assert inc.gpu_hours_at_risk_per_hour == pytest.approx(0.0)
