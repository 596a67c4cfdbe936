"""Fabric congestion per port, whether it spreads, and what caused it.

Per link, from counter rates (:mod:`.counters`, wraps and resets handled):

- ``xmit_wait`` as the **fraction of time** the port had data queued and sent none: ticks per
  second × the tick length at the port's rate (one tick = ``tick_bytes`` at ``link_rate``;
  ``foreshock.facts.XMIT_WAIT_TICK_BYTES``; the IB spec leaves the tick to the vendor);
- the **PFC pause duration ratio** (seconds paused per second, RoCE), summed over the priorities
  (``ethtool -S``'s ``rx_prioN_pause_duration``): two lossless classes paused throughout read 2 s/s;
- the **ECN/CNP rate** (ECN-marked packets or CNPs per second, whichever is higher).

The port's score is the largest of the three over its threshold; a port is congested when the
score reaches 1 for ``on_count`` samples (1 by default: rerouted traffic congests at once and
must be seen within a sample or two), and clears once it stays under ``clear_ratio`` for
``off_hold_s``. Each congested port is a :class:`~foreshock.findings.Prediction` ``congestion``
with ``eta_s = 0`` (it is happening), refreshed and withdrawn like every prediction.

**Spreading vs one hot port.** At onset the detector counts congested ports on the same leaf
(``Topology.link_leaf``; an uplink counts on its leaf) and on the same node's NICs: several at
once is congestion spreading (a reroute or an incast), one alone is a hot port.

**Cause.** The detector also watches every link going down (``link_downed`` increments, or
``link_state`` leaving ACTIVE). Rerouting is immediate, so congestion that starts within
``coincide_s`` after a link went down is blamed on that link first; then the link blamed for
the port's previous episode, while it stays down; then the closest link that went down within
``cause_window_s``. Closeness, best first: same node (NCCL's PXN moves a dead NIC's traffic
through NVLink to a sibling NIC), same leaf (ECMP spreads a dead uplink's share over the
others), same job (the job's collective traffic now crosses another rail), same rail. The
reason names the link and why.

>>> import numpy as np
>>> from foreshock.frames import Frame
>>> from foreshock.topology import Topology, take_or
>>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
...     "nodes": [{"name": "n0", "rack": "k", "gpus": 2}],
...     "switches": [{"name": "leaf0", "rail": 0}, {"name": "leaf1", "rail": 1}],
...     "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"},
...               {"name": "n0/gpu1~leaf1", "a": "n0/gpu1", "b": "leaf1"}]})
>>> det = CongestionDetector(topo)
>>> ticks = 400e9 / 8 / 64           # xmit_wait ticks per second at 400 Gb/s
>>> wait, found = np.zeros(2), []
>>> for t in range(10):
...     down = t >= 5                 # gpu0's link dies; its traffic moves to gpu1's NIC
...     wait += [ticks * 1e-4, ticks * (0.05 if down else 1e-4)]
...     found += det.update(Frame("link", [t, t], [0, 1], {"xmit_wait": wait.copy(),
...         "link_state": [1.0 if down else 4.0, 4.0], "link_rate": [400e9, 400e9]}))
>>> p = found[0]
>>> p.event, p.slot, p.ts, "n0/gpu0~leaf0" in p.reason
('congestion', 1, 5.0, True)
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock import facts
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.remap import Remap
from foreshock.topology import Topology, take_or

from .alarm import (A_ACTIVE, A_ON, CODE_START, CODE_WITHDRAW, alarm_step, alarm_withdraw, new_alarm_columns,
                    silent_reason, withdraw_silent_in_frame)
from .base import Detector, resolve_params
from .counters import (EVENTS_MAX_PER_S, LINK_DOWNS_MAX_PER_S, MAX_PORT_RATE_BPS, SATURATED_AT, STAMP_SLACK,
                       TIME_MAX_PER_S, CounterRates, modulus_for_bits, report_problems, with_counter_pace_and_drop)
from .link_errors import DOWNED_MAX

COUNTERS = ("xmit_wait", "pfc_pause_duration", "ecn_marked", "cnp_sent", "link_downed")
C_WAIT, C_PAUSE, C_ECN, C_CNP, C_DOWNED = range(len(COUNTERS))

PFC_PRIORITIES = 8
"""Priorities ``pfc_pause_duration`` can add up (802.1Qbb's eight; mlx5's ``NUM_PPORT_PRIO``): the
ethtool source sums each printed priority's pause time, so it can rise by this many seconds a
second, and its physical bound is this times ``TIME_MAX_PER_S``. Bound at ``TIME_MAX_PER_S`` alone,
a PFC storm pausing 5 or more priorities (4 read a little late) was refused at every poll as
``implausible_rise``: never raised, and a storm that spread to them withdrawn as "exporter hung"."""

PARAMS: dict[str, float] = {
    "tick_bytes": facts.XMIT_WAIT_TICK_BYTES,  # one xmit_wait tick = this many bytes at the port rate
    "default_rate_bps": facts.LINK_RATE_GPU_BPS,  # until the port reports link_rate
    "wait_ratio_on": 0.002,  # 0.2 % of the time stalled with data queued
    "pause_ratio_on": 0.002,  # 0.2 % of the time paused by PFC
    "ecn_rate_on": 1000.0,  # ECN marks or CNPs per second
    "clear_ratio": 0.5,  # a congested port clears below this fraction of the thresholds ...
    "off_hold_s": 30.0,  # ... held this long
    "on_count": 1.0,  # samples at or over threshold to start
    "refresh_s": 60.0,
    "cause_window_s": 600.0,  # a link down this recently can explain new congestion
    "coincide_s": 60.0,  # ... and one that went down this shortly before it almost surely does
    "spread_min_ports": 3.0,  # congested ports on one leaf or node that make it "spreading"
    "counter_bits": 64.0,  # 32 for classic PortCounters that wrap (data counters only)
}
PARAM_NAMES = tuple(PARAMS)
(P_TICK, P_RATE, P_WAIT_ON, P_PAUSE_ON, P_ECN_ON, P_CLEAR, P_OFF_HOLD, P_ON, P_REFRESH, P_CAUSE,
 P_COINCIDE, P_SPREAD, P_BITS) = range(len(PARAMS))

RELATIONS = (
    "went down at the same time",
    "same rail",
    "same job: its collective traffic was rerouted onto this rail",
    "same leaf: ECMP moved its share to this port",
    "same node: PXN moved its traffic to this NIC",
)

# per-row outputs of the kernel (the congested ports per leaf and node a finding names are counted
# as of all the rows of its stamp, not of the row itself: CongestionDetector._congested_nearby)
R_SCORE, R_WAIT, R_PAUSE, R_ECN, R_CODE, R_DOWN = range(6)
R_SIZE = 6
# per-link state columns (besides the alarm): last known rate and state, the last two times
# it went down and the last time it came back (a batch can hold many ticks: causes are
# resolved as of each onset's own timestamp)
L_RATE, L_STATE, L_DOWN_TS, L_PREV_DOWN_TS, L_UP_TS = range(5)
L_SIZE = 5


def params_vector(overrides: dict[str, float]) -> np.ndarray:
    vec = np.array(list(resolve_params("congestion", PARAMS, overrides).values()))
    if min(vec[P_TICK], vec[P_RATE], vec[P_WAIT_ON], vec[P_PAUSE_ON], vec[P_ECN_ON]) <= 0:
        raise ValueError("congestion: tick_bytes, default_rate_bps and the thresholds must be > 0")
    if not 0 < vec[P_CLEAR] <= 1:
        raise ValueError("congestion: clear_ratio must be in (0, 1]")
    return vec


def xmit_wait_limits(params: np.ndarray) -> tuple[float, float]:
    """The wrap modulus (0: never wraps, every fall a reset) and the physical bound (ticks per
    second) ``xmit_wait`` is read with under ``params`` (:func:`params_vector`): by this detector,
    and by the store's per-leaf counters, which must call a reading a glitch, a wrap or a reset
    exactly when this detector does. xmit_wait is a data-path counter (it wraps with 32-bit
    PortCounters) that counts a tick per tick_bytes at the fastest port rate, times STAMP_SLACK
    for a port read late in its poll (a 1.6T port stalled throughout had been refused)."""
    bits = int(params[P_BITS])
    modulus = modulus_for_bits(bits) if bits < 64 else 0.0
    return modulus, STAMP_SLACK * max(MAX_PORT_RATE_BPS, params[P_RATE]) / (8.0 * params[P_TICK])


def _signals_text(rec: np.ndarray) -> str:
    """The congestion signals a finding's row measured, as its reason shows them: a port reads only
    some (InfiniBand through sysfs has no PFC counter, RoCE through ethtool no xmit_wait, a NIC without
    ECN no CNP count), and one not read is left out rather than shown as "nan"."""
    shown = []
    if np.isfinite(rec[R_WAIT]):
        shown.append(f"xmit_wait {rec[R_WAIT]:.2%} of time")
    if np.isfinite(rec[R_PAUSE]):  # summed over priorities (PFC_PRIORITIES): over 100 % is several paused at once
        shown.append(f"PFC pause {rec[R_PAUSE]:.2%} (summed over priorities)")
    if np.isfinite(rec[R_ECN]):
        shown.append(f"ECN/CNP {rec[R_ECN]:.3g}/s")
    return ", ".join(shown)


@jit
def _congestion_kernel(ts: np.ndarray, slot: np.ndarray, rate: np.ndarray, delta: np.ndarray,
                       gauges: np.ndarray, state: tuple, groups: np.ndarray,  # type: ignore[type-arg]
                       params: np.ndarray, out: np.ndarray, start: int = 0) -> int:
    """Score rows from ``start``, advance each port's alarm, note links going down and coming back.

    rate/delta (rows, COUNTERS); gauges (rows, 2) = [link_state, link_rate];
    state = (link (links, L_SIZE), alarm (links, A_SIZE), congested ports per group, the time each
    link was last scored (links,)); groups (links, 2) = the port's leaf group and node group
    (indices into the per-group counts, -1 for none). Everything is updated in place; out (rows, R_SIZE).

    Rows come in time order. Returns where it stopped: after the rows of the first timestamp with
    a finding (a start, refresh or withdrawal: a nonzero R_CODE), or at the end. A finding's cause
    and text are read from every link's state as of its stamp, and a frame can hold many ticks
    (a replay): read after the whole frame, a link that flapped later in it had lost the down that
    explained an earlier onset. Findings are rare, so the caller resumes here a few times a frame.
    """
    link, alarm, per_group, heard = state
    n_links = link.shape[0]
    found_at = np.nan  # the stamp of the first finding: stop once its rows are done
    for i in range(start, len(ts)):
        if found_at == found_at and ts[i] != found_at:
            return i
        for c in range(R_SIZE):
            out[i, c] = np.nan
        out[i, R_CODE] = 0.0
        out[i, R_DOWN] = 0.0
        s = slot[i]
        t = ts[i]
        if s < 0 or s >= n_links or t != t:
            continue
        state = gauges[i, 0]
        bps = gauges[i, 1]
        if bps == bps and bps > 0.0:
            link[s, L_RATE] = bps
        bps = link[s, L_RATE] if link[s, L_RATE] == link[s, L_RATE] else params[P_RATE]
        # going down: the counter sees downs shorter than a sample; the state is the fallback
        downs = delta[i, C_DOWNED]
        left_active = state == state and link[s, L_STATE] == 4.0 and state != 4.0
        if downs > 0.0 or (downs != downs and left_active):
            out[i, R_DOWN] = 1.0
            link[s, L_PREV_DOWN_TS] = link[s, L_DOWN_TS]
            link[s, L_DOWN_TS] = t
        if state == state:
            came_back = link[s, L_STATE] == link[s, L_STATE] and link[s, L_STATE] != 4.0
            # a down the counter saw while the port reads ACTIVE is one it is back from (a flap
            # within the sample): left without an up, it read "still down" for good and was blamed
            # for the node's congestion hours later
            if state == 4.0 and (came_back or downs > 0.0):
                link[s, L_UP_TS] = t
            link[s, L_STATE] = state
        if state == state and state != 4.0:
            # a port that is not ACTIVE carries nothing: its counters say nothing, and a congestion
            # it was flagged for is over (left held, it stayed "congested" for as long as the port
            # was down and counted as a congested neighbour of every port of its leaf and node)
            if alarm[s, A_ACTIVE] != 1.0:
                # nor do firing samples from before it went down count towards a start after it
                # comes back (with on_count > 1, two before an hour down and one after had started one)
                alarm[s, A_ON] = 0.0
                continue
            code = alarm_withdraw(alarm, s, 0, t)
        else:
            wait = rate[i, C_WAIT] * params[P_TICK] * 8.0 / bps
            pause = rate[i, C_PAUSE]
            ecn = rate[i, C_ECN]
            cnp = rate[i, C_CNP]
            if cnp == cnp and not cnp <= ecn:
                ecn = cnp
            score = np.nan
            for v, th in ((wait, params[P_WAIT_ON]), (pause, params[P_PAUSE_ON]), (ecn, params[P_ECN_ON])):
                if v == v and not v / th <= score:
                    score = v / th
            out[i, R_WAIT] = wait
            out[i, R_PAUSE] = pause
            out[i, R_ECN] = ecn
            out[i, R_SCORE] = score
            if score != score:
                continue  # no rate yet (first sample, missing counters): no decision either way
            heard[s] = t  # (a port not scored for long is withdrawn as silent: CongestionDetector.silent_s)
            firing = score >= 1.0
            clear = score < params[P_CLEAR]
            code = alarm_step(alarm, s, 0, t, firing, clear, params[P_ON], params[P_OFF_HOLD], params[P_REFRESH])
        # (written out here, not called: a helper, even inlined, halved the kernel's speed)
        out[i, R_CODE] = code
        change = 1.0 if code == CODE_START else (-1.0 if code == CODE_WITHDRAW else 0.0)
        for k in range(2):
            g = groups[s, k]
            if g >= 0:
                per_group[g] += change
        if code != 0:
            found_at = t
    return len(ts)


class CongestionDetector(Detector):
    """Congested ports (xmit_wait, PFC, ECN/CNP), spreading vs hot port, rerouting cause."""

    slot_kinds: ClassVar[Mapping[str, str]] = {name: "link" for name in (
        "s_counter_state", "s_counter_resets", "s_counter_rate", "s_counter_drop", "s_link", "s_alarm", "s_cause",
        "s_heard")}
    name: ClassVar[str] = "congestion"
    kinds: ClassVar[tuple[str, ...]] = ("link",)

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.params = params_vector(params)
        n = topology.size("link")
        # PFC duration and the mlx5 ECN/CNP counters are 64-bit; link_downed saturates (no wrap).
        # What each can count at most (a reading above it is a bad one, not taken): xmit_wait by
        # xmit_wait_limits, PFC pause time summed over up to PFC_PRIORITIES priorities, the others as
        # counters.py says.
        wait_modulus, wait_ticks_max = xmit_wait_limits(self.params)
        modulus = [wait_modulus, 0.0, 0.0, 0.0, 0.0]
        max_rate = [wait_ticks_max, PFC_PRIORITIES * TIME_MAX_PER_S, EVENTS_MAX_PER_S, EVENTS_MAX_PER_S,
                    LINK_DOWNS_MAX_PER_S]
        self.counters = CounterRates(n, COUNTERS, modulus=modulus, max_rate=max_rate)
        # the counters' state, with the pace a 32-bit xmit_wait's wrap must fit (s_counter_rate) and
        # the value before a low reading (s_counter_drop): kept in the checkpoint, or each restored
        # counter's first decrease would be read as a reset, and a low reading just before the
        # checkpoint as a reset followed by the counter's whole total
        self.s_counter_state, self.s_counter_resets = self.counters.s_state, self.counters.s_resets
        self.s_counter_rate, self.s_counter_drop = self.counters.s_rate, self.counters.s_drop
        self.s_link = np.full((n, L_SIZE), np.nan)
        self.s_alarm = new_alarm_columns(n, 1)
        self.s_heard = np.full(n, np.nan)  # when each link was last scored (NaN: never)
        # topology relations, resolved once
        t = topology
        gpu = t.link_gpu
        self.link_node = take_or(t.gpu_node, gpu)
        leaf = t.link_leaf.astype(np.int64)
        uplink_leaf = np.where((gpu < 0) & (t.link_a_switch >= 0), t.link_a_switch, -1)
        self.port_leaf = np.where(leaf >= 0, leaf, uplink_leaf)
        rails = np.asarray(t.switch_rail, dtype=np.int64)
        self.port_rail = take_or(rails, self.port_leaf)
        self.port_rail = np.where(self.port_rail >= 0, self.port_rail, -1)
        self.link_job = take_or(t.gpu_job, gpu)
        self.s_cause = np.full(n, -1, dtype=np.int64)  # the link blamed for each port's last episode
        # congested-port counts per leaf (groups 0..switches-1) and per node (after them)
        n_sw = len(t.switches)
        self._groups = np.ascontiguousarray(np.stack(
            [self.port_leaf, np.where(self.link_node >= 0, n_sw + self.link_node, -1)], axis=1).astype(np.int64))
        self.s_congested_per_group = np.zeros(n_sw + len(t.nodes))

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind != "link" or len(frame) == 0:
            return []
        cols = frame.columns
        raw = np.stack([cols[c] for c in COUNTERS], axis=1)
        delta, rate, problems = self.counters.update(frame.ts, frame.slot, raw)
        report_problems(self.health, self.name, problems)
        # a port whose xmit_wait stopped at 2**32-1 (its rate unknown: counters.SATURATED_AT) is not
        # scored: its other signals (often none but ECN counts on InfiniBand) would clear a congestion
        # they never showed. Unscored, it is withdrawn once silent_s has passed, saying why.
        stuck = (raw[:, C_WAIT] == SATURATED_AT) & np.isnan(rate[:, C_WAIT])
        if stuck.any():
            rate[stuck] = np.nan  # (delta stays: link_downed still tells a port going down)
        # a link_downed stopped at its 8-bit maximum sees no down any more: the row is one without
        # the counter, and link_state leaving ACTIVE tells the down (its climb to 255 still counts)
        downed_stuck = (raw[:, C_DOWNED] == DOWNED_MAX) & ~(delta[:, C_DOWNED] > 0.0)
        if downed_stuck.any():
            delta[downed_stuck, C_DOWNED] = np.nan
        gauges = np.ascontiguousarray(np.stack([cols["link_state"], cols["link_rate"]], axis=1))
        ts, slot = frame.ts, frame.slot
        if np.any(ts[1:] < ts[:-1]):
            # one frame may list its rows link by link (each link's in time order: the guard); the kernel
            # takes them stamp by stamp, so each finding is judged on the state as of its stamp
            order = np.argsort(ts, kind="stable")
            ts, slot, rate, delta, gauges = ts[order], slot[order], rate[order], delta[order], gauges[order]
        out = np.empty((len(ts), R_SIZE))
        state = (self.s_link, self.s_alarm, self.s_congested_per_group, self.s_heard)
        rows_found: list[np.ndarray] = []
        why: list[str] = []  # each finding's cause, or a withdrawal's "port down" text, as of its stamp
        start = 0
        while start < len(ts):
            stop = _congestion_kernel(ts, slot, rate, delta, gauges, state, self._groups, self.params, out, start)
            rows = start + np.flatnonzero(out[start:stop, R_CODE] != 0)
            rows_found.append(rows)
            why += [self._why(float(ts[r]), int(slot[r]), int(out[r, R_CODE])) for r in rows.tolist()]
            start = stop
        silent = self._withdraw_silent(frame.ts)
        rows = np.concatenate(rows_found) if rows_found else np.empty(0, np.int64)
        nearby = self._congested_nearby(ts, slot, out, rows)
        return [self._finding(float(ts[r]), int(slot[r]), out[r], nearby[k], why[k])
                for k, r in enumerate(rows.tolist())] + silent

    def silent_s(self) -> float:
        """How long a congested port may go unscored (no rows, rows with no counters, or its xmit_wait
        stuck at 2**32-1) before it is withdrawn: two refreshes and the clear hold (150 s by default).
        A port that reports is refreshed while it fires and withdrawn after off_hold_s once it clears,
        by its own rows, well within it; it is 5 polls at the 30-s collect interval (FACTS), so jitter
        or a dropped scrape does not come near it, and the link_congested gauge and the per-leaf
        counts no longer hold a port nothing speaks for (a silent one held for ever, and made later
        unrelated ports of its leaf "spreading")."""
        return float(2.0 * self.params[P_REFRESH] + self.params[P_OFF_HOLD])

    def _withdraw_silent(self, ts: np.ndarray) -> list[Finding]:
        """Withdraw each congested port not scored for :meth:`silent_s` before the frame's time
        (:func:`~.alarm.withdraw_silent`, one pass per frame), uncount it from its leaf and node, and
        say why: its xmit_wait stuck at 2**32-1, or no report."""
        now, slots, _ = withdraw_silent_in_frame(self.s_alarm, 1, self.s_heard, ts, self.silent_s())
        for k in range(self._groups.shape[1]):
            group = self._groups[slots, k]
            np.subtract.at(self.s_congested_per_group, group[group >= 0], 1.0)
        found: list[Finding] = []
        for port in slots.tolist():
            since = now - float(self.s_heard[port])
            if self.counters.s_state[port, C_WAIT, 0] == SATURATED_AT:
                why = (f"xmit_wait saturated at 2**32-1 for {since / 60:.0f} min, its rate unknown: "
                       f"clear the counters (perfquery -x -R); withdrawn, not a recovery")
            else:
                why = silent_reason(since, "its exporter hung, its switch or host down, or its counters missing")
            found.append(Prediction(ts=now, entity_kind="link", slot=port, event="congestion", eta_s=0.0,
                                    confidence=1.0, detector=self.name, active=False,
                                    reason=f"congestion on {self.topology.links[port]} withdrawn: {why}"))
        return found

    def _congested_nearby(self, ts: np.ndarray, slot: np.ndarray, out: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(rows, 2): congested ports on each emitting row's leaf and node once every row of the frame
        stamped no later than it is scored (1: the port has none). Ports starting in one scrape
        are scored one after another: counted as of each row, the first of four said "one hot
        port" and the last "spreading over 4". Ports withdrawn as silent in the frame do not count."""
        ts, code = ts[rows], out[rows, R_CODE]
        ports = slot[rows].astype(np.int64)
        change = np.where(code == CODE_START, 1.0, np.where(code == CODE_WITHDRAW, -1.0, 0.0))
        nearby = np.ones((len(rows), 2))
        for when in np.unique(ts):
            counts = self.s_congested_per_group.copy()  # after the whole frame: take back what came later
            later = (ts > when) & (change != 0)
            for k in range(self._groups.shape[1]):
                group = self._groups[ports[later], k]
                np.subtract.at(counts, group[group >= 0], change[later][group >= 0])
            mine = ts == when
            group = self._groups[ports[mine]]
            nearby[mine] = np.where(group >= 0, counts[np.maximum(group, 0)], 1.0)
        return nearby

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved before the counters' pace was kept (no ``s_counter_rate``) knows none: each
        counter's next decrease is read as a reset, as it was then. One saved before the value
        before a low reading was kept (no ``s_counter_drop``) has none pending. One saved before
        the last time each link was scored was kept (no ``s_heard``) takes the last time any of its
        counters was read (a reading after the first is scored): never, a congested port would be
        withdrawn as silent at the first frame after the restore."""
        state = with_counter_pace_and_drop(state, "s_counter_state", "s_counter_rate", "s_counter_drop")
        counters = state.get("s_counter_state")
        if "s_heard" not in state and counters is not None and np.ndim(counters) == 3:
            read = np.asarray(counters, dtype=np.float64)[:, :, 1]
            heard = np.full(len(read), np.nan)
            np.fmax.reduce(read, axis=1, out=heard)  # (NaN only where none was ever read)
            state = {**state, "s_heard": heard}
        return state

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """Rows follow their links; the blamed link is a slot value, renumbered; the per-leaf and
        per-node counts of congested ports are recounted from the alarms carried over (a port
        left out or moved to another partition no longer counts here)."""
        out = super().remap_state(state, remap)
        out["s_cause"] = remap.slots("link", out["s_cause"])
        out["s_congested_per_group"] = self.congested_per_group(out["s_alarm"])
        return out

    def congested_per_group(self, alarm: np.ndarray) -> np.ndarray:
        """What the kernel keeps in ``s_congested_per_group``, counted afresh from the alarms."""
        counts = np.zeros_like(self.s_congested_per_group)
        active = alarm[:, A_ACTIVE] == 1.0
        for k in range(self._groups.shape[1]):
            group = self._groups[:, k]
            np.add.at(counts, group[active & (group >= 0)], 1.0)
        return counts

    # ---- explanation ---------------------------------------------------------------------------
    def _why(self, ts: float, port: int, code: int) -> str:
        """What a finding at ``ts`` says from the links' state, called as of its stamp (the kernel stops
        there): a start's or refresh's cause, a withdrawal's "the port is down" (or nothing)."""
        if code == CODE_WITHDRAW:
            return ": the port is down and carries nothing" if self._down(port) else ""
        return self._cause(port, ts, running=code != CODE_START)

    def _finding(self, ts: float, port: int, rec: np.ndarray, nearby: np.ndarray, cause: str) -> Prediction:
        code = int(rec[R_CODE])
        links = self.topology.links
        if code == CODE_WITHDRAW:
            return Prediction(ts=ts, entity_kind="link", slot=port, event="congestion", eta_s=0.0, confidence=1.0,
                              detector=self.name, reason=f"congestion on {links[port]} cleared{cause}", active=False)
        signals = _signals_text(rec)
        spread = self._spread(port, int(nearby[0]), int(nearby[1]))
        reason = f"congestion on {links[port]} ({signals}); {spread}"
        if cause:
            reason += f"; likely cause: {cause}"
        conf = float(min(1.0, 0.5 + 0.25 * rec[R_SCORE])) if np.isfinite(rec[R_SCORE]) else 0.5
        return Prediction(ts=ts, entity_kind="link", slot=port, event="congestion", eta_s=0.0,
                          confidence=round(conf, 3), detector=self.name, reason=reason)

    def _down(self, port: int) -> bool:
        state = self.s_link[port, L_STATE]
        return bool(state == state and state != 4.0)

    def _spread(self, port: int, on_leaf: int, on_node: int) -> str:
        need = int(self.params[P_SPREAD])
        leaf, node = int(self.port_leaf[port]), int(self.link_node[port])
        if on_node >= need and on_node >= on_leaf:
            return f"spreading over {on_node} NIC ports of {self.topology.nodes[node]}"
        if on_leaf >= need:
            return f"spreading over {on_leaf} ports of {self.topology.switches[leaf]}"
        return "one hot port" if max(on_leaf, on_node) <= 1 else f"{max(on_leaf, on_node)} ports congested nearby"

    def _cause(self, port: int, ts: float, running: bool = False) -> str:
        """The link whose going down most plausibly caused congestion starting at ``ts``.

        Best first: a link that went down within ``coincide_s`` before (rerouting is
        immediate), closest in the topology, latest; else the cause of this port's previous
        episode if that link is still down; else the closest related link that went down within
        ``cause_window_s`` (one down for longer explains no new congestion).

        ``running``: a refresh of an episode that started earlier. It keeps the cause found at
        its start while that link is down or came back less than ``cause_window_s`` ago, and takes
        a new one only from links related to the port: a link anywhere that merely went down
        shortly before a refresh did not start this congestion. Judged afresh at every refresh, an
        alarm held for days blamed each later, unrelated link failure, and the incident engine,
        which follows the links a reason names, pulled every one of those faults into the first
        one's incident.
        """
        kept = int(self.s_cause[port])
        if running and kept >= 0:
            up = self.s_link[kept, L_UP_TS]
            back_long_ago = up >= self.s_link[kept, L_DOWN_TS] and ts - up > self.params[P_CAUSE]
            if not back_long_ago:
                one = np.array([kept])
                down, still_down = self._last_down(ts, one)
                return self._describe_cause(kept, ts, float(down[0]), bool(still_down[0]),
                                            int(self._relation(port, one)[0]))
        down_ts, down_now = self._last_down(ts, slice(None))
        # went down within cause_window_s; one down longer is a candidate only as the previous
        # episode's cause while it stays down (any related link down for an hour had been blamed)
        recent = down_ts >= ts - self.params[P_CAUSE]
        if kept >= 0:
            recent[kept] |= down_now[kept]
        cand = np.flatnonzero(recent & (np.arange(len(down_ts)) != port))
        if len(cand) == 0:
            self.s_cause[port] = -1
            return ""
        relation = self._relation(port, cand)
        coincident = down_ts[cand] >= ts - self.params[P_COINCIDE]
        still = down_now[cand]
        last = down_ts[cand]
        pick = -1
        if coincident.any() and (relation[coincident].max() > 0 or (coincident.sum() == 1 and not running)):
            sub = np.flatnonzero(coincident)
            pick = int(sub[np.lexsort((last[sub], relation[sub]))[-1]])
        elif self.s_cause[port] in cand:
            pick = int(np.flatnonzero(cand == self.s_cause[port])[0])
        elif relation.max() > 0:
            pick = int(np.lexsort((last, still, relation))[-1])
        if pick < 0:
            self.s_cause[port] = -1
            return ""
        best = int(cand[pick])
        self.s_cause[port] = best
        return self._describe_cause(best, ts, float(last[pick]), bool(still[pick]), int(relation[pick]))

    def _last_down(self, ts: float, links: Any) -> tuple[np.ndarray, np.ndarray]:
        """When each of ``links`` last went down at or before ``ts`` (NaN: not by then), and whether it
        is still down at ``ts``. (The kernel stops at each finding's stamp, so no later down is known
        yet; the check costs nothing and keeps this true if it is called otherwise.)"""
        lk = self.s_link[links]
        down = np.where(lk[:, L_DOWN_TS] <= ts, lk[:, L_DOWN_TS], lk[:, L_PREV_DOWN_TS])
        down = np.where(down <= ts, down, np.nan)
        up = lk[:, L_UP_TS]  # up at the down's own stamp: down and back within one sample
        return down, (down <= ts) & ~((up >= down) & (up <= ts))

    def _describe_cause(self, link: int, ts: float, down: float, still_down: bool, relation: int) -> str:
        since = (f"went down {ts - down:.0f} s before" if down <= ts else "went down") + \
            (" and is still down" if still_down else "")
        return f"traffic rerouted from {self.topology.links[link]}, which {since} ({RELATIONS[relation]})"

    def _relation(self, port: int, cand: np.ndarray) -> np.ndarray:
        """How close each candidate link is to ``port``: an index into ``RELATIONS``."""
        def same(attr: np.ndarray) -> np.ndarray:
            return (attr[cand] == attr[port]) & (attr[port] >= 0)  # type: ignore[no-any-return]

        return np.select([same(self.link_node), same(self.port_leaf), same(self.link_job), same(self.port_rail)],
                         [4, 3, 2, 1], 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.counters.bind(self.s_counter_state, self.s_counter_resets, self.s_counter_rate, self.s_counter_drop)

    def gauges(self) -> dict[str, tuple[str, Any, str]]:
        return {"link_congested": ("link", self.s_alarm[:, A_ACTIVE].copy(),
                                   "1 while the congestion detector holds the port congested")}
