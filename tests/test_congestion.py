"""Congestion: per-port signals at the port's rate, spreading vs one hot port, rerouting cause."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import congestion
from foreshock.detectors.congestion import (COUNTERS, PARAMS, R_CODE, R_DOWN, R_ECN, R_PAUSE, R_SCORE, R_SIZE,
                                            R_WAIT, CongestionDetector, _congestion_kernel)
from foreshock.frames import Frame
from foreshock.topology import Topology

TICKS_400G = 400e9 / 8 / facts.XMIT_WAIT_TICK_BYTES  # xmit_wait ticks per second at 400 Gb/s


def fabric(nodes: int = 4, rails: int = 2) -> Topology:
    """``nodes`` nodes of ``rails`` GPUs, one leaf per rail, one uplink per leaf; two jobs."""
    names = [f"n{i}" for i in range(nodes)]
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": n, "rack": "k", "gpus": rails} for n in names],
        "switches": [{"name": f"leaf{r}", "rail": r} for r in range(rails)] + [{"name": "spine", "tier": "spine"}],
        "links": [{"name": f"{n}/gpu{r}~leaf{r}", "a": f"{n}/gpu{r}", "b": f"leaf{r}"} for n in names for r in range(rails)]
        + [{"name": f"leaf{r}~spine", "a": f"leaf{r}", "b": "spine"} for r in range(rails)],
        "jobs": [{"name": "j0", "nodes": names[: nodes // 2]}, {"name": "j1", "nodes": names[nodes // 2:]}],
    })


class Fabric:
    """Cumulative counters of every link, advanced one second at a time."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        n = topo.size("link")
        self.t = 0.0
        self.c = {k: np.full(n, 1e6) for k in ("xmit_wait", "pfc_pause_duration", "ecn_marked", "cnp_sent")}
        self.c["link_downed"] = np.zeros(n)
        self.state = np.full(n, 4.0)
        self.rate = np.where(topo.link_gpu >= 0, 400e9, 800e9)

    def tick(self, wait=None, pause=None, ecn=None, down=(), up=(), with_state=True, with_downed=True) -> Frame:
        n = self.topo.size("link")
        self.t += 1.0
        ticks = self.rate / 8 / facts.XMIT_WAIT_TICK_BYTES
        self.c["xmit_wait"] += ticks * (1e-4 if wait is None else wait)
        self.c["pfc_pause_duration"] += 1e-6 if pause is None else pause
        self.c["ecn_marked"] += 2.0 if ecn is None else ecn
        self.c["cnp_sent"] += 1.0
        for link in down:
            self.c["link_downed"][link] += 1
            self.state[link] = 1.0
        for link in up:
            self.state[link] = 4.0
        cols = {k: v.copy() for k, v in self.c.items()}
        if not with_downed:
            del cols["link_downed"]
        cols["link_state"] = self.state.copy() if with_state else np.full(n, np.nan)
        cols["link_rate"] = self.rate.astype(float)
        return Frame("link", np.full(n, self.t), np.arange(n), cols)


def slot(topo: Topology, name: str) -> int:
    return topo.slot("link", name)


def run(det, fab: Fabric, seconds: int, **kw) -> list:
    out = []
    for _ in range(seconds):
        out += det.update(fab.tick(**kw))
    return out


# ---- per-port signals -------------------------------------------------------------------------
def _warmed(ticks: int, **params) -> tuple[Topology, Fabric, CongestionDetector, np.ndarray]:
    """A fabric and a congestion detector (``params``) after ``ticks`` quiet ticks, and a quiet
    xmit_wait per port to make some congested."""
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo, **params)
    run(det, fab, ticks)
    return topo, fab, det, np.full(topo.size("link"), 1e-4)


def test_xmit_wait_is_a_fraction_of_time_at_the_ports_rate():
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 3)
    port, uplink = slot(topo, "n0/gpu0~leaf0"), slot(topo, "leaf0~spine")
    wait = np.full(topo.size("link"), 1e-4)
    # the same number of ticks per second: 1 % of the time at 400 Gb/s, 0.5 % at 800 Gb/s
    ticks = 0.01 * TICKS_400G
    wait[port] = ticks / TICKS_400G
    wait[uplink] = ticks / (2 * TICKS_400G)
    found = det.update(fab.tick(wait=wait))
    by_slot = {p.slot: p for p in found}
    assert set(by_slot) == {port, uplink}
    assert "xmit_wait 1.00% of time" in by_slot[port].reason
    assert "xmit_wait 0.50% of time" in by_slot[uplink].reason


def test_without_link_rate_the_default_rate_is_used():
    topo = fabric()
    det = CongestionDetector(topo, default_rate_bps=400e9)
    wait = 0.0
    found = []
    for t in range(3):
        wait += TICKS_400G * (0.01 if t == 2 else 0.0)
        found += det.update(Frame("link", [float(t)], [0], {"xmit_wait": [wait]}))
    assert len(found) == 1 and "xmit_wait 1.00%" in found[0].reason


@pytest.mark.parametrize("signal", ["pause", "ecn"])
def test_pfc_pause_and_ecn_alone_are_congestion(signal):
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 3)
    values = np.zeros(topo.size("link"))
    values[3] = 0.05 if signal == "pause" else 5e4
    found = det.update(fab.tick(**{signal: values}))
    assert [p.slot for p in found] == [3]
    assert ("PFC pause 5.00%" if signal == "pause" else "ECN/CNP 5e+04/s") in found[0].reason


def test_healthy_ports_are_quiet():
    topo = fabric(8, 4)
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    assert run(det, fab, 120) == []


# ---- onset, hold, withdrawal --------------------------------------------------------------------
def test_found_at_the_first_congested_sample_and_withdrawn_after_the_hold():
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 5)
    hot = np.full(topo.size("link"), 1e-4)
    hot[2] = 0.2
    start = det.update(fab.tick(wait=hot))
    assert [(p.slot, p.active) for p in start] == [(2, True)] and start[0].ts == fab.t
    onset = fab.t
    later = run(det, fab, 40)
    withdrawn = [p for p in later if not p.active]
    assert len(withdrawn) == 1 and withdrawn[0].slot == 2
    assert withdrawn[0].ts - (onset + 1) == PARAMS["off_hold_s"]


def test_wraps_and_resets_never_look_like_congestion():
    topo = fabric()
    n = topo.size("link")
    det = CongestionDetector(topo, counter_bits=32)
    wait = np.full(n, 2.0**32 - 1000.0)
    found = []
    for t in range(6):
        if t == 3:
            wait = np.full(n, 500.0)  # every xmit_wait wrapped at 32 bits: +1500 ticks
        if t == 5:
            wait = np.zeros(n)  # a reset (perfquery -R): not a wrap, not congestion
        found += det.update(Frame("link", np.full(n, float(t)), np.arange(n), {"xmit_wait": wait.copy(),
                                                                              "link_rate": np.full(n, 400e9)}))
        wait = wait + 100.0
    assert found == []
    assert det.counters.s_resets[:, 0].tolist() == [1] * n


# ---- spreading and cause ------------------------------------------------------------------------
def test_spreading_over_a_leaf_versus_one_hot_port():
    topo = fabric(6, 2)
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 3)
    wait = np.full(topo.size("link"), 1e-4)
    leaf0 = [slot(topo, f"n{i}/gpu0~leaf0") for i in range(4)]
    wait[leaf0] = 0.1
    found = det.update(fab.tick(wait=wait))
    assert sorted(p.slot for p in found) == sorted(leaf0)
    # every port starting in the scrape sees all four (counted as of each row, in slot order, the
    # first said "one hot port" and the last "spreading over 4")
    assert all("spreading over 4 ports of leaf0" in p.reason for p in found)
    topo = fabric(6, 2)
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 3)
    wait = np.full(topo.size("link"), 1e-4)
    wait[slot(topo, "n5/gpu1~leaf1")] = 0.1
    (only,) = det.update(fab.tick(wait=wait))
    assert "one hot port" in only.reason and "likely cause" not in only.reason


@pytest.mark.parametrize("with_state,with_downed", [(True, True), (False, True), (True, False)])
def test_rerouted_congestion_names_the_failed_link(with_state, with_downed):
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 5, with_state=with_state, with_downed=with_downed)
    dead, sibling = slot(topo, "n1/gpu0~leaf0"), slot(topo, "n1/gpu1~leaf1")
    wait = np.full(topo.size("link"), 1e-4)
    wait[sibling] = 0.1
    found = det.update(fab.tick(wait=wait, down=[dead], with_state=with_state, with_downed=with_downed))
    assert [p.slot for p in found] == [sibling]
    assert "traffic rerouted from n1/gpu0~leaf0" in found[0].reason
    assert "same node" in found[0].reason


def test_the_coincident_failure_wins_over_an_older_closer_one():
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 3)
    old = slot(topo, "n3/gpu1~leaf1")  # same leaf as the victim, down long before
    run(det, fab, 1, down=[old])
    run(det, fab, 400)
    fresh, victim = slot(topo, "n0/gpu0~leaf0"), slot(topo, "n2/gpu1~leaf1")
    wait = np.full(topo.size("link"), 1e-4)
    wait[victim] = 0.1
    found = det.update(fab.tick(wait=wait, down=[fresh]))
    assert "from n0/gpu0~leaf0" in found[0].reason


def test_an_old_unrelated_failure_is_not_blamed():
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo, cause_window_s=600.0)
    run(det, fab, 3)
    run(det, fab, 1, down=[slot(topo, "n0/gpu0~leaf0")], up=[])
    run(det, fab, 1, up=[slot(topo, "n0/gpu0~leaf0")])
    run(det, fab, 700)
    wait = np.full(topo.size("link"), 1e-4)
    wait[slot(topo, "n3/gpu1~leaf1")] = 0.1
    (p,) = det.update(fab.tick(wait=wait))
    assert "likely cause" not in p.reason


def test_a_held_alarm_keeps_the_cause_it_started_with():
    """Judged afresh at every refresh, an alarm held for days blamed each later link failure
    anywhere ("went down at the same time"), and the incident engine pulled each of those faults
    into the first one's incident (a three-day simulation: three independent faults merged)."""
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    run(det, fab, 3)
    victim, sibling, elsewhere = slot(topo, "n2/gpu1~leaf1"), slot(topo, "n2/gpu0~leaf0"), slot(topo, "n0/gpu0~leaf0")
    wait = np.full(topo.size("link"), 1e-4)
    wait[victim] = 0.1
    (first,) = det.update(fab.tick(wait=wait, down=[sibling]))
    assert "traffic rerouted from n2/gpu0~leaf0" in first.reason
    later = run(det, fab, 200, wait=wait)
    later += det.update(fab.tick(wait=wait, down=[elsewhere]))  # unrelated: another node, leaf, job and rail
    later += run(det, fab, 60, wait=wait)  # the next refresh comes 40 s after it went down
    refreshes = [p for p in later if p.slot == victim]
    assert len(refreshes) >= 4 and all("traffic rerouted from n2/gpu0~leaf0" in p.reason for p in refreshes)


def test_a_down_port_is_not_scored():
    topo, fab, det, wait = _warmed(3)
    wait[0] = 0.5
    assert det.update(fab.tick(wait=wait, down=[0])) == []


def test_a_congested_port_that_goes_down_is_withdrawn_and_no_longer_counts_nearby():
    """A port flagged congested that then went down kept its prediction, and the link_congested
    gauge, for as long as it stayed down (two days in the review's case), and a lone hot port of
    its node a day later read as "spreading over 3 NIC ports"."""
    topo, fab, det, wait = _warmed(3)
    wait[[0, 1]] = 0.5
    started = det.update(fab.tick(wait=wait))
    assert {(p.slot, p.active) for p in started} == {(0, True), (1, True)}
    (gone,) = det.update(fab.tick(wait=wait, down=[0]))
    assert (gone.slot, gone.active) == (0, False) and "the port is down" in gone.reason
    assert det.gauges()["link_congested"][1][[0, 1]].tolist() == [0.0, 1.0]
    np.testing.assert_array_equal(det.s_congested_per_group, det.congested_per_group(det.s_alarm))
    for _ in range(20):
        det.update(fab.tick(wait=wait, down=[0]))
    assert det.gauges()["link_congested"][1][0] == 0.0


def _silent_port_of_leaf0(drop_rows) -> tuple[list, CongestionDetector, Fabric, Topology]:
    """Port 0 (n0/gpu0~leaf0) congested, then polled every 60 s (its rows dropped by ``drop_rows``)
    for an hour; the findings of port 0 after its start."""
    topo, fab, det, wait = _warmed(5)
    wait[0] = 0.05
    (start,) = det.update(fab.tick(wait=wait))
    assert (start.slot, start.active) == (0, True)
    later = []
    for _ in range(60):
        fab.t += 59.0
        later += det.update(drop_rows(fab.tick(wait=wait * 60.0)))  # (a tick adds one second's worth)
    return [p for p in later if p.slot == 0], det, fab, topo


@pytest.mark.parametrize("how", ["no rows", "no counters", "xmit_wait stuck at 2**32-1"])
def test_a_congested_port_that_goes_silent_is_withdrawn_saying_why(how):
    """A port that stopped reporting while congested (or whose rows came with every counter NaN)
    was never stepped again: congested for ever (a day in the review), the link_congested gauge at 1,
    and still counted on its leaf, so two unrelated ports of the leaf a day later were "spreading
    over 3". Withdrawn once unscored for silent_s (150 s), once, and no longer counted."""
    def drop_rows(frame: Frame) -> Frame:
        if how == "no rows":
            return frame.take(np.flatnonzero(frame.slot != 0))
        cols = dict(frame.columns)
        for c in (COUNTERS if how == "no counters" else ("xmit_wait",)):
            cols[c] = cols[c].copy()
            cols[c][0] = np.nan if how == "no counters" else 2.0**32 - 1
        return Frame("link", frame.ts, frame.slot, cols)

    port0, det, fab, topo = _silent_port_of_leaf0(drop_rows)
    # (stuck: the reading that confirms the climb to 2**32-1 is a real rise, a refresh, before)
    assert [p.active for p in port0] == ([True, False] if "stuck" in how else [False])
    gone = port0[-1]
    last_scored = port0[0].ts if "stuck" in how else 6.0
    assert det.silent_s() < gone.ts - last_scored <= det.silent_s() + 60.0  # the first frame past silent_s
    assert ("clear the counters (perfquery -x -R)" if "stuck" in how else "no longer reporting") in gone.reason
    assert det.gauges()["link_congested"][1][0] == 0.0
    np.testing.assert_array_equal(det.s_congested_per_group, det.congested_per_group(det.s_alarm))
    wait = np.full(topo.size("link"), 1e-4)
    wait[[2, 4]] = 0.05
    found = det.update(drop_rows(fab.tick(wait=wait)))
    assert {p.slot for p in found} == {2, 4} and all("2 ports congested nearby" in p.reason for p in found)


def test_a_port_polled_slower_than_silent_s_is_not_withdrawn_while_it_reports():
    """Jitter and a dropped scrape do not come near silent_s: a congested port polled every 60 s,
    one poll in three dropped, holds (refreshed) for the hour."""
    polls = iter(range(10**6))
    port0, det, _, _ = _silent_port_of_leaf0(lambda f: f if next(polls) % 3 else f.take(np.flatnonzero(f.slot != 0)))
    assert port0 and all(p.active for p in port0)
    assert det.gauges()["link_congested"][1][0] == 1.0


def test_an_old_checkpoint_without_last_heard_loads_and_withdraws_a_silent_port_in_time():
    topo, fab, det, wait = _warmed(5)
    wait[0] = 0.05
    det.update(fab.tick(wait=wait))
    old = det.state_dict()
    del old["s_heard"]
    restored = CongestionDetector(topo)
    restored.load_state_dict(old)
    np.testing.assert_array_equal(restored.s_heard, det.s_heard)  # the last reading of its counters
    fab.t += 100.0
    assert restored.update(fab.tick(wait=wait)) == []  # heard 101 s ago: not silent, still congested
    fab.t += 200.0
    frame = fab.tick(wait=wait)
    (gone,) = restored.update(frame.take(np.flatnonzero(frame.slot != 0)))
    assert (gone.slot, gone.active) == (0, False)


def test_firing_samples_before_a_port_went_down_do_not_count_after_it_came_back():
    """on_count=3: two firing samples, an hour down, one firing sample after: it had started."""
    topo, fab, det, wait = _warmed(3, on_count=3)
    wait[0] = 0.05
    out = run(det, fab, 2, wait=wait)
    out += run(det, fab, 1, down=[0])
    out += run(det, fab, 3600)
    out += run(det, fab, 1, up=[0], wait=wait)
    assert [p for p in out if p.slot == 0] == []
    started = run(det, fab, 3, wait=wait)  # three after it: a start
    assert [(p.slot, p.active) for p in started] == [(0, True)]


def test_a_link_down_long_ago_is_blamed_only_as_the_previous_episodes_cause():
    """A link down for an hour (cause_window_s is 600 s) was blamed for congestion starting now on
    its node's sibling NIC: any related link still down was a candidate, however long ago it failed.
    The previous episode's cause stays the cause while it is down, however long ago it failed."""
    topo, fab, det, wait = _warmed(3)
    old, victim = slot(topo, "n0/gpu1~leaf1"), slot(topo, "n0/gpu0~leaf0")
    run(det, fab, 1, down=[old])  # and stays down
    run(det, fab, 3600)
    wait[victim] = 0.1
    (p,) = det.update(fab.tick(wait=wait))
    assert p.slot == victim and "likely cause" not in p.reason
    topo, fab, det, wait = _warmed(3)
    wait[victim] = 0.1
    (first,) = det.update(fab.tick(wait=wait, down=[old]))
    assert "from n0/gpu1~leaf1" in first.reason
    run(det, fab, 40)  # cleared after off_hold_s
    run(det, fab, 900)
    (again,) = det.update(fab.tick(wait=wait))
    assert again.active and "from n0/gpu1~leaf1" in again.reason and "is still down" in again.reason


def test_a_saturated_link_downed_still_sees_the_port_go_down():
    """A legacy link_downed stuck at 255 never increases again: read as "the counter answers", the
    port going DOWN in link_state was no down, and the congestion it rerouted had no cause."""
    topo = fabric()
    fab = Fabric(topo)
    det = CongestionDetector(topo)
    dead, sibling = slot(topo, "n1/gpu0~leaf0"), slot(topo, "n1/gpu1~leaf1")
    fab.c["link_downed"][:] = 255.0
    run(det, fab, 5)
    wait = np.full(topo.size("link"), 1e-4)
    wait[sibling] = 0.1
    frame = fab.tick(wait=wait, down=[dead])
    frame.columns["link_downed"][:] = 255.0  # (Fabric counts the down: this counter no longer can)
    (p,) = det.update(frame)
    assert p.slot == sibling and "traffic rerouted from n1/gpu0~leaf0" in p.reason


def _concat(frames: list[Frame], by_link: bool = False) -> Frame:
    """One frame of ``frames``' rows: tick after tick, or (``by_link``) link after link, each link's
    rows in time order (all the input guard keeps)."""
    ts = np.concatenate([f.ts for f in frames])
    slots = np.concatenate([f.slot for f in frames])
    order = np.lexsort((ts, slots)) if by_link else np.arange(len(ts))
    cols = {k: np.concatenate([f.columns[k] for f in frames])[order] for k in frames[0].columns}
    return Frame("link", ts[order], slots[order], cols)


def _flapping_sibling(flaps: bool) -> tuple[Topology, list[Frame]]:
    """Port n0/gpu0 congested from t=5, after its sibling NIC n0/gpu1 went down at t=4; the sibling
    back at 5, and (``flaps``) down again at 6 and 8, up at 7."""
    topo = fabric()
    fab = Fabric(topo)
    sibling, victim = slot(topo, "n0/gpu1~leaf1"), slot(topo, "n0/gpu0~leaf0")
    wait = np.full(topo.size("link"), 1e-4)
    wait[victim] = 0.1
    frames = [fab.tick() for _ in range(3)] + [fab.tick(down=[sibling]), fab.tick(wait=wait, up=[sibling])]
    if flaps:
        frames += [fab.tick(wait=wait, down=[sibling]), fab.tick(wait=wait, up=[sibling]),
                   fab.tick(wait=wait, down=[sibling])]
    return topo, frames


@pytest.mark.parametrize("by_link", [False, True])
def test_a_cause_is_judged_as_of_its_own_stamp_in_a_batch(by_link):
    """A replay hands over thousands of ticks at once: the cause of an onset early in the batch was
    judged on the links' state at its end, so a sibling that flapped later in it had lost the down
    that explained the onset ("one hot port"), or another link took the blame."""
    topo, frames = _flapping_sibling(flaps=True)
    one = CongestionDetector(topo)
    tick_by_tick = [p.reason for f in frames for p in one.update(f)]
    det = CongestionDetector(topo)
    run_frames = [p for f in frames[:3] for p in det.update(f)] + det.update(_concat(frames[3:], by_link))
    assert [p.reason for p in run_frames] == tick_by_tick
    assert "traffic rerouted from n0/gpu1~leaf1, which went down 1 s before (same node" in tick_by_tick[0]
    assert "still down" not in tick_by_tick[0]


def test_a_withdrawal_says_the_port_is_down_as_of_its_stamp_in_a_batch():
    """A congested port goes down (withdrawn at once) and comes back later in the same batch: its
    withdrawal said "the port is down" or not depending on how the rows were batched."""
    topo, fab, det, wait = _warmed(3)
    wait[0] = 0.1
    frames = [fab.tick(wait=wait) for _ in range(3)] + [fab.tick(wait=wait, down=[0]), fab.tick(up=[0]), fab.tick()]
    found = det.update(_concat(frames))
    assert [(p.ts, p.active) for p in found] == [(4.0, True), (7.0, False)]
    assert found[1].reason.endswith("cleared: the port is down and carries nothing")


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_findings_do_not_depend_on_how_rows_are_batched(seed):
    """The same rows, tick by tick and cut into random multi-tick frames (some listed link by link),
    give the same findings: congestion starting, refreshed and clearing while links flap around it."""
    rng = np.random.default_rng(seed)
    topo = fabric(3, 2)
    fab = Fabric(topo)
    n = topo.size("link")
    frames = []
    for _ in range(150):
        wait = np.where(rng.random(n) < 0.1, rng.choice([0.001, 0.01, 0.1]), 1e-4)
        down = np.flatnonzero(rng.random(n) < 0.05).tolist()
        up = [u for u in np.flatnonzero(rng.random(n) < 0.3).tolist() if u not in down]
        frames.append(fab.tick(wait=wait, down=down, up=up))

    def key(p):
        return (p.ts, p.slot, p.active, p.reason, p.confidence)

    one = CongestionDetector(topo, refresh_s=5.0, off_hold_s=3.0)
    want = [key(p) for f in frames for p in one.update(f)]
    det = CongestionDetector(topo, refresh_s=5.0, off_hold_s=3.0)
    got, i = [], 0
    while i < len(frames):
        k = int(rng.integers(1, 40))
        got += [key(p) for p in det.update(_concat(frames[i:i + k], by_link=bool(rng.integers(2))))]
        i += k
    assert got == want and any("likely cause" in k[3] for k in want)
    np.testing.assert_array_equal(det.s_link, one.s_link)


# ---- kernel against a plain-Python reference ------------------------------------------------------
def naive_congestion(ts, slot, rate, delta, gauges, params, n_links):
    """Reference: scores from the module docstring, and the alarm machine written out."""
    link_rate: dict[int, float] = {}
    last_state: dict[int, float] = {}
    alarm = {s: {"active": False, "on": 0, "emit": math.nan, "off": math.nan} for s in range(n_links)}
    out = []
    for i in range(len(ts)):
        s, t = int(slot[i]), float(ts[i])
        row = [math.nan] * R_SIZE
        row[R_CODE] = 0.0
        row[R_DOWN] = 0.0
        if not 0 <= s < n_links or math.isnan(t):
            out.append(row)
            continue
        state, bps = gauges[i]
        if bps > 0:
            link_rate[s] = bps
        bps = link_rate.get(s, params["default_rate_bps"])
        downs = delta[i, COUNTERS.index("link_downed")]
        left = not math.isnan(state) and last_state.get(s) == 4.0 and state != 4.0
        if downs > 0 or (math.isnan(downs) and left):
            row[R_DOWN] = 1.0
        if not math.isnan(state):
            last_state[s] = state
        if not math.isnan(state) and state != 4.0:
            if alarm[s]["active"]:  # a port that went down while congested: withdrawn at once
                alarm[s].update(active=False, on=0, off=math.nan, emit=t)
                row[R_CODE] = 3.0
            else:  # firing samples from before it went down do not count after it
                alarm[s]["on"] = 0
            out.append(row)
            continue
        wait = rate[i, 0] * params["tick_bytes"] * 8 / bps
        pause = rate[i, 1]
        ecn = np.nanmax([rate[i, 2], rate[i, 3]]) if not np.isnan(rate[i, 2:4]).all() else math.nan
        ratios = [v / th for v, th in ((wait, params["wait_ratio_on"]), (pause, params["pause_ratio_on"]),
                                       (ecn, params["ecn_rate_on"])) if not math.isnan(v)]
        score = max(ratios) if ratios else math.nan
        row[R_WAIT], row[R_PAUSE], row[R_ECN], row[R_SCORE] = wait, pause, ecn, score
        if not math.isnan(score):
            a = alarm[s]
            firing, clear = score >= 1.0, score < params["clear_ratio"]
            code = 0
            if not a["active"]:
                a["on"] = a["on"] + 1 if firing else 0
                if a["on"] >= params["on_count"]:
                    a.update(active=True, emit=t, off=math.nan)
                    code = 1
            elif clear:
                if math.isnan(a["off"]):
                    a["off"] = t
                elif t - a["off"] >= params["off_hold_s"]:
                    a.update(active=False, on=0, off=math.nan, emit=t)
                    code = 3
            else:
                a["off"] = math.nan
                if firing and t - a["emit"] >= params["refresh_s"]:
                    a["emit"] = t
                    code = 2
            row[R_CODE] = float(code)
        out.append(row)
    return np.array(out).reshape(len(ts), R_SIZE)


@pytest.mark.kernel
@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_rows=st.integers(0, 50))
def test_kernel_matches_reference(data, n_rows):
    topo = fabric(2, 2)
    n_links = topo.size("link")
    value = st.one_of(st.just(np.nan), st.just(np.inf), st.floats(0, 1e9, allow_nan=False))
    slot = np.array(data.draw(st.lists(st.integers(-1, n_links), min_size=n_rows, max_size=n_rows)), np.int32)
    ts = np.cumsum(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 10.0, 40.0]), min_size=n_rows,
                                      max_size=n_rows))) if n_rows else np.empty(0)
    ts = np.asarray(ts, dtype=np.float64)
    rate = np.array(data.draw(st.lists(st.lists(value, min_size=5, max_size=5), min_size=n_rows,
                                       max_size=n_rows)), dtype=np.float64).reshape(n_rows, 5)
    rate[:, 0] *= 1e-2  # xmit_wait ticks: both sides of the threshold
    rate[:, 1] *= 1e-11  # pause ratio
    rate[:, 2:4] *= 1e-5  # ECN/CNP per second
    delta = rate.copy()
    gauges = np.array(data.draw(st.lists(st.tuples(st.sampled_from([np.nan, 4.0, 1.0]),
                                                   st.sampled_from([np.nan, 400e9, 800e9, 0.0])),
                                         min_size=n_rows, max_size=n_rows)), dtype=np.float64).reshape(n_rows, 2)
    det = CongestionDetector(topo)
    out = np.empty((n_rows, R_SIZE))
    state = (det.s_link, det.s_alarm, det.s_congested_per_group, det.s_heard)
    stops, start = [], 0
    while start < n_rows:  # as CongestionDetector.update: resumed where it stopped
        start = _congestion_kernel(ts, slot, rate, delta, gauges, state, det._groups, det.params, out, start)
        stops.append(start)
    want = naive_congestion(ts, slot, rate, delta, gauges, PARAMS, n_links)
    cols = [R_SCORE, R_WAIT, R_PAUSE, R_ECN, R_CODE, R_DOWN]
    np.testing.assert_allclose(out[:, cols], want[:, cols], rtol=1e-12, equal_nan=True)
    # it stops after the rows of each stamp with a finding (their causes are read as of it), else at the end
    ends = [i + 1 for i in range(n_rows) if i + 1 == n_rows or ts[i + 1] != ts[i]]  # of each stamp's rows
    want_stops = [e for e in ends if (want[ts == ts[e - 1], R_CODE] != 0).any()]
    if not want_stops or want_stops[-1] != n_rows:
        want_stops.append(n_rows)
    assert stops == (want_stops if n_rows else [])


def test_state_round_trip_gives_identical_future_output():
    topo = fabric(6, 2)
    rng = np.random.default_rng(5)
    n = topo.size("link")
    waits = np.where(rng.random((200, n)) < 0.05, 0.1, 1e-4)
    downs = [list(np.flatnonzero(rng.random(n) < 0.01)) for _ in range(200)]
    fab = Fabric(topo)
    ticks = [fab.tick(wait=waits[i], down=downs[i], up=downs[i - 3] if i >= 3 else []) for i in range(200)]
    a = CongestionDetector(topo)
    for f in ticks[:80]:
        a.update(f)
    b = CongestionDetector(topo)
    b.load_state_dict(a.state_dict())
    out_a = [x for f in ticks[80:] for x in a.update(f)]
    out_b = [x for f in ticks[80:] for x in b.update(f)]
    assert out_a == out_b and len(out_a) > 10



def _xmit_wait_frames(n: int, wraps_at: int) -> list[Frame]:
    """32-bit xmit_wait counters climbing 100 ticks a second that wrap at second ``wraps_at``."""
    frames = []
    for t in range(wraps_at + 2):
        wait = np.full(n, 2.0**32 - 100.0 * (wraps_at - t) - 50.0) if t < wraps_at else np.full(n, 50.0 + 100.0 * (t - wraps_at))
        frames.append(Frame("link", np.full(n, float(t)), np.arange(n), {"xmit_wait": wait, "link_rate": np.full(n, 400e9)}))
    return frames


def test_a_restored_32_bit_counter_still_reads_its_wrap_as_a_wrap():
    """The pace a wrap must fit (16x the counter's recent peak rate) is kept in the checkpoint: before
    2026-12-01 a restored detector knew none, and read each counter's first wrap as a reset."""
    topo = fabric()
    n = topo.size("link")
    frames = _xmit_wait_frames(n, wraps_at=6)
    never_stopped = CongestionDetector(topo, counter_bits=32)
    for f in frames:
        never_stopped.update(f)
    before = CongestionDetector(topo, counter_bits=32)
    for f in frames[:6]:  # the checkpoint just before the wrap
        before.update(f)
    restored = CongestionDetector(topo, counter_bits=32)
    restored.load_state_dict(before.state_dict())
    for f in frames[6:]:
        restored.update(f)
    assert never_stopped.counters.s_resets[:, 0].tolist() == [0] * n  # the wrap is a wrap
    assert restored.counters.s_resets[:, 0].tolist() == [0] * n
    np.testing.assert_array_equal(restored.state_dict()["s_counter_state"], never_stopped.state_dict()["s_counter_state"])


def test_a_checkpoint_saved_before_the_pace_was_kept_loads_knowing_none():
    topo = fabric()
    n = topo.size("link")
    frames = _xmit_wait_frames(n, wraps_at=6)
    before = CongestionDetector(topo, counter_bits=32)
    for f in frames[:6]:
        before.update(f)
    old = before.state_dict()
    del old["s_counter_rate"]
    restored = CongestionDetector(topo, counter_bits=32)
    restored.load_state_dict(old)
    assert np.isnan(restored.state_dict()["s_counter_rate"]).all()
    for f in frames[6:]:
        restored.update(f)
    assert restored.counters.s_resets[:, 0].tolist() == [1] * n  # no pace known: the first decrease is a reset

def test_unknown_parameter_is_refused():
    with pytest.raises(ValueError, match="unknown parameters"):
        CongestionDetector(fabric(), wait_ratio=0.1)


def test_doctests():
    assert doctest.testmod(congestion).failed == 0
