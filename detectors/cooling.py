"""Cooling degradation: thermal resistance drifting up, long before anything throttles.

Each GPU's die-to-coolant resistance ``R`` is fitted online with the same first-order model
as :mod:`foreshock.detectors.thermal` (one fit serves both, see
:mod:`foreshock.detectors.thermal_fit`). Every ``peer_interval_s`` of telemetry time the
detector compares, per GPU:

- ``R`` with the GPU's own history (a slow baseline, frozen while the GPU is flagged), and
- ``R`` with its peers — the median of its rack's GPUs at about its own power (within
  ``power_band`` of it: a rack running two jobs at two loads has two sets of peers);

and flags a failing thermal interface (``gpu``), a node whose GPUs all run hot against the
other nodes of their rack — or of their cooling loop, where fewer than three of the rack's nodes
can be compared (failing fans: ``node``; against a loop, the node must also run hot against its
own history, or else its rack-mates, as a loop's median moves when some of its nodes change; with
too few nodes in its loop to compare it with, half its GPUs flagged and the node running hot against
its own history) — and a rack whose inlet rises against its own baseline,
beyond what the other cooling loops' racks rose by meanwhile (a cooling loop or CDU losing flow:
``rack``; a rise every loop shares is the facility water's, such as its daily swing; an inlet held
steady for ``inlet_hold_s`` with the rack's GPUs' R unchanged is said once to be a new level, a
changed supply setpoint, and becomes the baseline). Where node telemetry reports the chassis fans
(``fan_speed``, the slowest fan), a stopped fan flags its node at once, whatever the load.
Idle GPUs, whose R the fit cannot read, are compared by their temperature over the inlet instead,
on nodes at rest (see :meth:`CoolingDetector._idle`): a failing interface or failed fans show
before a job lands on them.
Findings are :class:`~foreshock.findings.Anomaly` (higher score = larger drift), emitted when a
flag rises and refreshed while it holds — a GPU's through :data:`UNREAD_HOLD` comparisons that could
not compare it (a stopped fan's, as long without a reading of its node), and no longer. A node's
one compared GPU (one GPU a node) running hot is said of the GPU, naming its interface and the
node's fans both: the node rule speaks from two compared GPUs up.

Only GPUs under load now, whose ``R`` the fit has been updating through most of the last
interval, are compared, each with its rack-mates within ``power_band`` of its power: the fit
learns ``R`` only under load, so an idle GPU's ``R`` is a stale reading, and ``(T - inlet) / P``
read at light load carries the temperature's fixed offsets (idle floor, integer °C readings)
divided by a small power — it reads high against peers at full load for no fault of its own.

Example (one GPU's R grows 40 % per hour from the second hour; its seven peers stay put)::

    >>> import numpy as np
    >>> from foreshock.topology import Topology
    >>> from foreshock.frames import Frame
    >>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
    ...                            "nodes": [{"name": "n", "rack": "k", "gpus": 8}]})
    >>> det, found = CoolingDetector(topo), []
    >>> r = 0.046 * np.ones(8)
    >>> for t in np.arange(0.0, 3 * 3600, 30.0):
    ...     r[0] = 0.046 * (1 + 0.4 * max(0.0, t - 3600) / 3600)
    ...     _ = det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
    ...     found += det.update(Frame("gpu", np.full(8, t), np.arange(8),
    ...                               {"gpu_temp": np.round(24 + r * 650), "power": np.full(8, 650.0)}))
    >>> first = found[0]
    >>> (first.entity_kind, first.slot, 3600 < first.ts < 3 * 3600)
    ('gpu', 0, True)
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock.fields import get_field
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import add_columns, resolve_params
from .gpu_inputs import frame_now
from .order_stats import bucket_by_group, median_of
from .thermal_fit import (FIT_SLOT_KINDS, G_SIZE, G_TS, G_UL, M_LOADED, M_PF, M_RL, M_TPREV, P_R_NOM, X_TS,
                          ThermalFitDetector, load_min_of_all)
from .thermal_fit import params_vector as thermal_params

PARAMS: dict[str, float] = {
    "peer_interval_s": 300.0,
    "warmup_s": 1800.0,  # loaded time before a GPU's R is trusted
    "recent_load_share": 0.5,  # ... and under load this share of the last interval at least
    "power_band": 0.3,  # a GPU's (a node's) peers: its rack's within this relative distance of its own power
    "tau_baseline_s": 6 * 3600.0,
    "own_drift_min": 0.15,  # R vs own baseline ...
    "peer_drift_min": 0.10,  # ... and vs rack median, both, or
    "peer_only_min": 0.30,  # ... vs rack median alone (no history yet)
    "node_drift_min": 0.10,  # node median R vs rack median
    "inlet_rise_min_c": 3.0,  # rack inlet vs its baseline
    # a flagged inlet held within inlet_hold_span_c this long, the rack's GPUs' R unchanged, is a new
    # level (a raised supply setpoint): said once, then learnt (it was re-announced for good)
    "inlet_hold_s": 2 * 3600.0,
    "inlet_hold_span_c": 1.0,
    # a held flag is said again this often: under the incident engine's quiet_s (900 s), or a
    # degraded loop or GPU left in service is announced resolved and opened again every half hour
    "refresh_s": 600.0,
    "fan_stalled_below": 0.1,  # a chassis fan under this share of full speed has stopped
    # idle GPUs (R is fitted only under load): the temperature over the inlet, whole °C readings
    "idle_rise_min_c": 1.5,  # vs its own idle history and vs its idle node-mates, both, or
    "idle_peer_only_c": 3.0,  # ... vs its idle node-mates alone (no idle history yet)
    "idle_node_rise_min_c": 2.0,  # an idle node's median vs the other idle nodes of its rack or loop
    "idle_inlet_span_c": 3.0,  # own idle history holds only within this much of the inlet it was learnt at
}
R_BASE, R_BASE_SEEN = 0, 1
# per GPU, idle (``s_idle``, float32: degrees, seconds and scores, no time of day): own baseline of
# the excess over the inlet, idle seconds it has seen (a sum of whole peer intervals: exact in
# float32 to 2**24 s, and rounded above only far past ``warmup_s``, the one bar it is held to), the
# inlet its baseline was learnt at, and the score its flag was last said with (said again with it
# at a comparison that cannot read it); under load: the score of its flag at the last comparison
# that read it (NaN where that found it normal, or read it idle and normal)
I_BASE, I_SEEN, I_INLET, I_SCORE, I_LSCORE = range(5)
I_SIZE = 5
# ... and its counts (``s_idle_count``, uint8, each held at COUNT_MAX at most: none is compared past
# 2): consecutive idle comparisons, consecutive comparisons found hot, the comparisons in a row that
# could not read it, and under load the comparisons in a row its flag has been held through since
C_RUN, C_HOT, C_UNREAD, C_HELD = range(4)
C_SIZE = 4
COUNT_MAX = 255
# ``s_idle`` as saved before its counts moved out (float64, nine columns; fewer before I_SCORE's were
# added): its columns by name, and which are counts now
OLD_IDLE = {"base": 0, "seen": 1, "run": 2, "hot": 3, "inlet": 4, "score": 5, "unread": 6, "lscore": 7, "held": 8}
OLD_IDLE_VALUES = [OLD_IDLE[k] for k in ("base", "seen", "inlet", "score", "lscore")]  # I_BASE .. I_LSCORE
OLD_IDLE_COUNTS = [OLD_IDLE[k] for k in ("run", "hot", "unread", "held")]  # C_RUN .. C_HELD
UNREAD_HOLD = 2
"""Comparisons in a row a GPU's flag is held through without a reading of it (10 minutes): one
missing reading is no recovery, a temperature dark for longer is no longer known hot. Idle, its
temperature unread; under load, not compared (its temperature unread, or its node idle between
two jobs: not yet settled for the idle comparison); a node's stopped fan, ``UNREAD_HOLD`` peer
intervals without a reading of the node."""
# per rack, while its inlet is flagged: since when its excess has held, and the lowest and highest since
H_SINCE, H_LO, H_HI = range(3)
NODE_QUORUM = 3  # nodes compared in a rack before one of them can be told to run hot
FAN_SPEED_MIN, FAN_SPEED_MAX = get_field("fan_speed").valid  # outside: not a share of full speed


def count_on(count: np.ndarray) -> np.ndarray:
    """``count`` (``s_idle_count``'s) one more, held at :data:`COUNT_MAX`."""
    return np.minimum(count, COUNT_MAX - 1) + 1  # type: ignore[no-any-return]


def follow(base: np.ndarray, x: np.ndarray, w: float) -> np.ndarray:
    """A slow baseline moved ``w`` of the way to ``x``; where it has none yet, ``x`` itself."""
    return np.where(np.isfinite(base), base + w * (x - base), x)  # type: ignore[no-any-return]


def above_usual(base: np.ndarray, x: np.ndarray, gap: float, peer_only: float, warmup_s: float, w: float,
                seen_s: float, confirmed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Nodes whose excess ``x`` over their peers is at least ``gap`` and also ``gap`` over their own
    usual excess (``base``: ``R_BASE``, and ``R_BASE_SEEN`` seconds learnt), or ``peer_only`` where
    fewer than ``warmup_s`` are learnt, and ``confirmed`` (where given); the usual excess of the
    others moves ``w`` towards ``x`` (not learnt while flagged). Returns the flags and which nodes
    had a history."""
    has_history = base[:, R_BASE_SEEN] >= warmup_s
    flag = np.where(has_history, (np.nan_to_num(x) >= gap) & (np.nan_to_num(x - base[:, R_BASE]) >= gap),
                    np.nan_to_num(x) >= peer_only)
    if confirmed is not None:
        flag &= confirmed
    learn = np.isfinite(x) & ~flag
    base[learn, R_BASE] = follow(base[:, R_BASE], x, w)[learn]
    base[learn, R_BASE_SEEN] = np.nan_to_num(base[learn, R_BASE_SEEN]) + seen_s
    return flag, has_history


def group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of ``values`` per group (NaN values ignored; NaN for empty groups and for groups
    outside ``0..n_groups-1``)."""
    out = np.full(n_groups, np.nan)
    _group_median(np.ascontiguousarray(values, dtype=np.float64), np.ascontiguousarray(groups, dtype=np.int64), out)
    return out


@jit
def _group_median(values: np.ndarray, groups: np.ndarray, out: np.ndarray) -> None:
    """Bucket the finite values by group (a counting sort), then take each bucket's median (median_of):
    linear in the GPUs (sorting (group, value) pairs instead cost 2.6 ms on 16k GPUs)."""
    n_groups = len(out)
    start = np.zeros(n_groups + 1, np.int64)
    for k in range(len(values)):
        g = groups[k]
        if 0 <= g < n_groups and abs(values[k]) < np.inf:
            start[g + 1] += 1
    for g in range(n_groups):
        start[g + 1] += start[g]
    fill = start[:n_groups].copy()
    bucket = np.empty(start[n_groups])
    for k in range(len(values)):
        g = groups[k]
        if 0 <= g < n_groups and abs(values[k]) < np.inf:
            bucket[fill[g]] = values[k]
            fill[g] += 1
    largest = 0
    for g in range(n_groups):
        largest = max(largest, start[g + 1] - start[g])
    work = np.empty(largest + 1)  # median_of's workspace: n + 1 values never fall back to np.median
    for g in range(n_groups):
        lo, hi = start[g], start[g + 1]
        if hi > lo:
            out[g] = median_of(bucket[lo:hi], hi - lo, work)


def median_at_same_power(values: np.ndarray, power: np.ndarray, groups: np.ndarray, n_groups: int,
                         band: float) -> tuple[np.ndarray, np.ndarray]:
    """Per element, the median of the finite ``values`` of its group at about its power — ``power``
    from ``p * (1 - band)`` to ``p * (1 + band)``, its own ``p``, itself included — and how many
    those were (NaN and 0 where its own value or power is not finite, or its group is outside
    ``0..n_groups-1``). A rack's one median power was the band's centre: a rack split evenly
    between a job at 660 W and one at 340 W had it at 500 W, and none of its GPUs compared."""
    n = len(values)
    out, count = np.full(n, np.nan), np.zeros(n, np.int64)
    _median_at_same_power(np.ascontiguousarray(values, dtype=np.float64), np.ascontiguousarray(power, dtype=np.float64),
                          np.ascontiguousarray(groups, dtype=np.int64), n_groups, float(band), out, count)
    return out, count


@jit
def _median_at_same_power(values: np.ndarray, power: np.ndarray, groups: np.ndarray, n_groups: int, band: float,
                          out: np.ndarray, count: np.ndarray) -> None:
    """Bucket the usable elements by group (a counting sort), order each bucket by power, and take
    each element's median over the run of its bucket inside its band (two binary searches):
    a rack's GPUs times its GPUs at one power, at most."""
    taken = np.full(len(values), -1, np.int64)  # its group where its value and power are usable
    for k in range(len(values)):
        if abs(values[k]) < np.inf and abs(power[k]) < np.inf:
            taken[k] = groups[k]
    start, member, largest = bucket_by_group(taken, n_groups)
    window = np.empty(largest)
    work = np.empty(largest + 1)  # median_of's workspace: n + 1 values never fall back to np.median
    for g in range(n_groups):
        lo, hi = start[g], start[g + 1]
        if hi == lo:
            continue
        idx = member[lo:hi][np.argsort(power[member[lo:hi]], kind="mergesort")]
        p_sorted = power[idx]
        for i in range(hi - lo):
            a, b = p_sorted[i] * (1.0 - band), p_sorted[i] * (1.0 + band)
            first = np.searchsorted(p_sorted, min(a, b), side="left")
            last = np.searchsorted(p_sorted, max(a, b), side="right")
            m = last - first
            for j in range(m):
                window[j] = values[idx[first + j]]
            out[idx[i]] = median_of(window, m, work)
            count[idx[i]] = m


def median_of_others(values: np.ndarray) -> tuple[np.ndarray, float]:
    """For each element, the median of the *other* finite values (NaN where there are none);
    and the median of all finite values. Equal to ``np.median`` of ``np.delete(values, k)`` (a
    zero's sign aside: -0.0 where NumPy's mean gives 0.0), from one sort rather than one per
    element: a loop per cooling loop, each deleting and taking a
    median, cost 4.6 ms per comparison on the benchmark's 128 loops (12 ns per GPU observation
    at 10-s sampling, more than the straggler's whole per-sample pass)."""
    finite = np.flatnonzero(np.isfinite(values))
    order = finite[np.argsort(values[finite], kind="stable")]
    v = values[order]
    k = len(v)
    every = _sorted_median(v)
    out = np.full(len(values), every)  # a non-finite element: every finite one is an other
    if k < 2:
        out[order] = np.nan
        return out, every
    rank = np.arange(k)
    m = k - 1  # the others' count; others[j] = v[j] below the removed rank, v[j + 1] from it
    def other(j: int) -> np.ndarray:
        return np.where(j < rank, v[j], v[j + 1])  # type: ignore[no-any-return]
    out[order] = other(m // 2) if m % 2 else (other(m // 2 - 1) + other(m // 2)) / 2.0
    return out, every


def _sorted_median(v: np.ndarray) -> float:
    """``np.median`` of sorted values (NaN for none), without its checks."""
    k = len(v)
    if k == 0:
        return np.nan
    return float(v[k // 2]) if k % 2 else float((v[k // 2 - 1] + v[k // 2]) / 2.0)


class CoolingDetector(ThermalFitDetector):
    """Flags thermal resistance and inlet drift per GPU, node and rack."""

    slot_kinds: ClassVar[Mapping[str, str]] = {
        **FIT_SLOT_KINDS, "s_gpu_base": "gpu", "s_gpu_loaded": "gpu", "s_gpu_flag": "gpu", "s_idle": "gpu",
        "s_idle_count": "gpu", "s_rack_base": "rack", "s_rack_flag": "rack", "s_rack_hold": "rack",
        "s_node_flag": "node", "s_fan_flag": "node", "s_idle_node_hot": "node", "s_fan_speed": "node",
        "s_fan_ts": "node", "s_node_base": "node", "s_idle_node_base": "node"}
    name: ClassVar[str] = "cooling"
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "rack", "node")
    state_scalars: ClassVar[tuple[str, ...]] = ("next_peer_ts",)

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.p = resolve_params("cooling", PARAMS, params)
        n = topology.size("gpu")
        self.gpu_rack = topology.gpu_rack.astype(np.int64)
        self.gpu_node = topology.gpu_node.astype(np.int64)
        self.node_gpus = np.bincount(self.gpu_node, minlength=topology.size("node"))
        self.rack_loop = topology.rack_loop.astype(np.int64)
        self.node_rack = topology.node_rack.astype(np.int64)
        self.node_loop = self.rack_loop[self.node_rack]
        self.init_fit(thermal_params({}), consumer=False)  # reads the fitted R once per peer interval
        self.s_gpu_base = np.full((n, 2), np.nan, dtype=np.float32)  # R_BASE (°C/W), R_BASE_SEEN (s, as I_SEEN)
        self.s_gpu_loaded = np.zeros(n)  # the fit's loaded seconds at the last comparison
        self.s_rack_base = np.full(topology.size("rack"), np.nan)
        # flag state per entity: time the flag rose / was last reported (NaN = not flagged)
        self.s_gpu_flag = np.full(n, np.nan)
        self.s_node_flag = np.full(topology.size("node"), np.nan)
        self.s_rack_flag = np.full(topology.size("rack"), np.nan)
        self.s_rack_hold = np.full((topology.size("rack"), 3), np.nan)  # H_SINCE, H_LO, H_HI
        self.s_fan_flag = np.full(topology.size("node"), np.nan)
        self.s_idle = np.full((n, I_SIZE), np.nan, dtype=np.float32)
        self.s_idle[:, I_SEEN] = 0.0
        self.s_idle_count = np.zeros((n, C_SIZE), dtype=np.uint8)
        self.s_idle_node_hot = np.zeros(topology.size("node"))  # consecutive comparisons an idle node ran hot
        self.s_fan_speed = np.full(topology.size("node"), np.nan)  # each node's last reading
        self.s_fan_ts = np.full(topology.size("node"), np.nan)  # ... and its time
        # per node: how hot it usually runs against its peers (R_BASE) and the seconds learnt (R_BASE_SEEN)
        self.s_node_base = np.full((topology.size("node"), 2), np.nan)
        # ... and how much warmer over the inlet it usually idles than its idle peers (°C), seconds learnt
        self.s_idle_node_base = np.full((topology.size("node"), 2), np.nan)
        self.next_peer_ts = -np.inf

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... and the node baselines and rack holds added to a state saved before them (no history:
        learnt from the next comparison on)."""
        state = super().upgrade_state(state)
        for key in ("s_node_base", "s_idle_node_base"):  # no history: learnt from now on
            if key not in state and "s_node_flag" in state:
                state = {**state, key: np.full((len(np.asarray(state["s_node_flag"])), 2), np.nan)}
        if "s_rack_hold" not in state and "s_rack_flag" in state:  # a flagged inlet's hold starts now
            state = {**state, "s_rack_hold": np.full((len(np.asarray(state["s_rack_flag"])), 3), np.nan)}
        if "s_fan_ts" not in state and "s_fan_flag" in state:  # a stopped fan: read when last said, at least
            state = {**state, "s_fan_ts": np.array(state["s_fan_flag"], dtype=np.float64)}
        return self._upgrade_idle(state)

    @staticmethod
    def _upgrade_idle(state: dict[str, Any]) -> dict[str, Any]:
        """``s_idle`` saved before its counts moved out to ``s_idle_count`` (told by that key's absence,
        not by a width: five columns were once the old layout too), split: its values kept (cast to
        float32 on load), its counts as counts (NaN, none yet: 0), a larger one than :data:`COUNT_MAX`
        held there, where no comparison tells them apart. Columns added since it was saved start as
        ``add_columns`` makes them: I_SCORE, none said yet; unread, read; I_LSCORE, no flag under
        load to hold; held, none held."""
        idle = np.asarray(state.get("s_idle"))
        if "s_idle_count" in state or idle.ndim != 2 or idle.shape[1] > len(OLD_IDLE):
            return state
        old = np.asarray(add_columns(state, "s_idle", len(OLD_IDLE))["s_idle"], dtype=np.float64)
        counts = np.clip(np.nan_to_num(old[:, OLD_IDLE_COUNTS], nan=0.0), 0, COUNT_MAX).astype(np.uint8)
        return {**state, "s_idle": old[:, OLD_IDLE_VALUES], "s_idle_count": counts}

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... and ``s_idle`` as kept before its counts moved out (:meth:`_upgrade_idle` undone): nine
        float64 columns (:data:`OLD_IDLE`), the counts back among the values; no ``s_idle_count``.
        Exact for a fresh state; of a state that ran, the values read back at float32's precision
        (what this version keeps) and a count past :data:`COUNT_MAX` as that (none is compared past 2)."""
        out = {k: v for k, v in super().previous_layout_state(state).items() if k != "s_idle_count"}
        idle, counts = np.asarray(state.get("s_idle")), np.asarray(state.get("s_idle_count"))
        if idle.ndim == 2 and counts.ndim == 2:
            old = np.empty((len(idle), len(OLD_IDLE)))
            old[:, OLD_IDLE_VALUES] = np.asarray(idle, dtype=np.float64)
            old[:, OLD_IDLE_COUNTS] = np.asarray(counts, dtype=np.float64)
            out["s_idle"] = old
        return out

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind == "rack":
            self.update_fit(frame)
            return []
        if frame.kind == "node":
            return self._fans(frame)
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        self.update_fit(frame)
        if not self.fit.n_rows:
            return []
        now = frame_now(self.fit.obs[X_TS], self.p["peer_interval_s"])
        if now < self.next_peer_ts:
            return []
        first = not np.isfinite(self.next_peer_ts)
        self.next_peer_ts = now + self.p["peer_interval_s"]
        return [] if first else self._compare(now)

    def _fans(self, frame: Frame) -> list[Finding]:
        """A chassis fan that reads stopped (the BMC's "fan speed critical"; ``fan_speed`` is the
        node's slowest fan): flagged at its first reading, loaded or idle. The resistance
        comparison sees failed fans only once the node's GPUs work (seed 817: node70 idled through
        its failure, its GPUs 5 °C warmer, and nothing compared them)."""
        speed = frame.columns.get("fan_speed")
        if speed is None or len(frame) == 0:
            return []
        # rows of a node outside the topology, or without a time, are read nowhere (as the GPU and
        # rack rows are, gpu_inputs.gpu_obs): a slot past the last node raised out of the bank, -1
        # set the last node's fan, and a NaN time re-reported a stopped fan at every frame
        slot, ts = frame.slot, frame.ts
        valid = (slot >= 0) & (slot < len(self.s_fan_speed)) & np.isfinite(ts)
        bad = int(len(valid) - np.count_nonzero(valid))
        if bad:
            self.health.problem(self.name, f"{frame.kind} rows with unknown slot or non-finite ts", bad)
            if not valid.any():
                return []
            slot, ts, speed = slot[valid], ts[valid], np.asarray(speed)[valid]
        # a share of full speed: anything else (a raw RPM, a sentinel such as -1) is not a reading
        speed = np.asarray(speed, dtype=np.float64)
        garbage = np.isfinite(speed) & ((speed < FAN_SPEED_MIN) | (speed > FAN_SPEED_MAX))
        self.health.problem(self.name, f"fan_speed outside {FAN_SPEED_MIN:g}..{FAN_SPEED_MAX:g} of full speed: ignored",
                            int(np.count_nonzero(garbage)))
        if len(np.unique(slot)) == len(slot):  # one reading per node (a live poll): one step
            return self._fan_poll(slot, ts, speed, garbage)
        # several polls in one frame (a batched source, a replay window wider than the sampling): each
        # poll in turn, in time order, as if each came alone. Read at once, a node's last reading
        # stood for all of them — a fan stopped at the frame's first poll was flagged at its end, and
        # one stopped and back within the frame was never flagged (until 2026-12-05)
        order = np.argsort(ts, kind="stable")
        slot, ts, speed, garbage = slot[order], ts[order], speed[order], garbage[order]
        nth = np.zeros(len(slot), dtype=np.int64)  # each row's place among its node's rows
        counts = np.unique(slot, return_counts=True)[1]
        by_node = np.argsort(slot, kind="stable")  # rows grouped by node, each in time order
        nth[by_node] = np.arange(len(slot)) - np.repeat(np.cumsum(counts) - counts, counts)
        found: list[Finding] = []
        for k in range(int(nth.max()) + 1):
            rows = nth == k
            found += self._fan_poll(slot[rows], ts[rows], speed[rows], garbage[rows])
        return found

    def _fan_poll(self, slot: np.ndarray, ts: np.ndarray, speed: np.ndarray, garbage: np.ndarray) -> list[Finding]:
        """:meth:`_fans` of one poll: at most one reading per node, stamped ``ts``."""
        read = np.isfinite(speed) & ~garbage
        self.s_fan_speed[slot[read]] = speed[read]
        self.s_fan_ts[slot[read]] = np.fmax(self.s_fan_ts[slot[read]], ts[read])
        seen = np.zeros(len(self.s_fan_speed), dtype=bool)
        seen[slot[read]] = True
        now = frame_now(ts, self.p["peer_interval_s"])
        # a node this frame does not read keeps its flag, UNREAD_HOLD peer intervals after its last
        # reading at most: one missing reading is no repair, but a BMC dark for longer (taken down for
        # the repair) had its one reading of 0 % said again every refresh_s for good (36 times in 6 h)
        recent = now - self.s_fan_ts <= UNREAD_HOLD * self.p["peer_interval_s"]
        stalled = np.where(seen, self.s_fan_speed < self.p["fan_stalled_below"],
                           np.isfinite(self.s_fan_flag) & recent)
        return [Anomaly(now, "node", int(nd), "fan_speed", float(1.0 - self.s_fan_speed[nd]), self.name,
                        f"a chassis fan of {self.topology.nodes[nd]} "
                        + (f"reads {self.s_fan_speed[nd]:.0%} of full speed" if seen[nd] else
                           f"read {self.s_fan_speed[nd]:.0%} of full speed {now - self.s_fan_ts[nd]:.0f} s ago, "
                           "not read since") + ": stopped — its GPUs lose airflow and run hot under load")
                for nd in self._raise(self.s_fan_flag, stalled, now, self.p["refresh_s"])]

    # ---- periodic comparison with own history and peers -----------------------------------
    def _compare(self, now: float) -> list[Finding]:
        p = self.p
        dt = p["peer_interval_s"]
        topo = self.topology
        r = self.s_model[:, G_SIZE + M_RL].copy()
        quiet = self.s_model[:, G_SIZE + M_LOADED] == self.s_gpu_loaded  # no load since the last comparison
        trusted = self._under_load(now)
        idle_x, idle_own, idle_peer, idle_hot, idle_node_rise, idle_node_hot, idle_by_rack, idle_normal = \
            self._idle(now, quiet)
        r[~trusted] = np.nan
        power = np.where(trusted, self.s_model[:, G_SIZE + M_PF], np.nan)
        peer_ref, _ = median_at_same_power(r, power, self.gpu_rack, topo.size("rack"), p["power_band"])
        peer = r / peer_ref - 1.0
        base = self.s_gpu_base[:, R_BASE]
        own = r / base - 1.0
        has_history = self.s_gpu_base[:, R_BASE_SEEN] >= p["warmup_s"]
        flagged = ((own >= p["own_drift_min"]) & has_history & (peer >= p["peer_drift_min"])) \
            | (peer >= p["peer_only_min"])
        flagged &= trusted
        own_known = np.where(has_history, own, np.nan)  # (the nodes' and racks' checks read it)
        score = np.fmax(peer, np.where(has_history, own, 0.0))
        w = 1.0 - np.exp(-dt / p["tau_baseline_s"])
        n_nodes = topo.size("node")
        compared = np.bincount(self.gpu_node[np.isfinite(r)], minlength=n_nodes)
        gpus_flagged = np.bincount(self.gpu_node[flagged], minlength=n_nodes)
        findings: list[Finding] = []
        # nodes: the median GPU of the node runs hot against its rack (fans, node airflow). A node
        # speaks for itself with half its GPUs compared, and a rack is a reference with three such
        # nodes, else the rack's cooling loop is: against one other node, "this one runs hot"
        # cannot be told from "that one runs cool" (seed 815: node37 flagged +10 % against the mean
        # of itself and node39, whose R was still settling after its fans came back)
        node_med = group_median(r, self.gpu_node, n_nodes)
        node_med[2 * compared < self.node_gpus] = np.nan
        node_power = group_median(power, self.gpu_node, n_nodes)
        node_ref, by_rack, rack_ref, rack_nodes = self._node_reference(node_med, node_power)
        node_peer = node_med / node_ref - 1.0
        node_drift = node_med / rack_ref - 1.0  # (its rack's median node at its power: itself included)
        # ... and against how hot the node usually runs, as a GPU is (peer_only_min without a history
        # yet): a node of another chassis or cold-plate make, or in a warmer spot, runs some tens
        # of percent hotter per watt than its rack for good (an H100 node among H200s, read from the
        # real captures at a shared inlet: +25 %; +15 % from day one was flagged "node fans or
        # airflow" and refreshed every refresh_s, never cleared — until 2026-12-01). Failed fans
        # (R x1.8-2.5 in the simulator) clear either bar. Not learnt while flagged.
        node_base = self.s_node_base
        node_own = group_median(own_known, self.gpu_node, n_nodes)
        confirmed = by_rack | self._hot_against_itself(node_own, node_drift, rack_nodes, p["node_drift_min"])
        node_flag, node_history = above_usual(node_base, node_peer, p["node_drift_min"], p["peer_only_min"],
                                              p["warmup_s"], w, dt, confirmed)
        # ... and a node with no other nodes to be told against (fewer than NODE_QUORUM compared in
        # its rack and in its loop: a cluster of a rack or two) whose GPUs are flagged one by one,
        # half of them at least, and run hot against their own history: the GPUs' evidence is the
        # node's (a node's failed fans in a rack of two had been eight "thermal interface" GPUs)
        alone = ~np.isfinite(node_ref) & np.isfinite(node_med) & (2 * gpus_flagged >= compared) \
            & (np.nan_to_num(node_own, nan=-np.inf) >= p["node_drift_min"])
        # ... from two compared GPUs up: a node's one compared GPU (one GPU a node, GH200-style) running
        # hot is that GPU's interface or its node's fans, one as likely as the other: a failing
        # interface was said "node fans or airflow" (with four racks of one such node, that alone),
        # against its GPU's "thermal interface" (until 2026-12-05). Said of the GPU, naming both
        lone = (node_flag | alone) & (compared < 2)
        lone_gpu = lone[self.gpu_node] & np.isfinite(r)
        node_flag &= ~lone
        alone &= ~lone
        node_score = np.where(np.isfinite(node_peer), node_peer, node_own)
        # own baseline: slow, and frozen while flagged so a drift cannot teach itself normal — nor
        # while its node or rack is: its history tells a node hot against its loop, and a rack's
        # new inlet level, from a moved reference
        learn = trusted & ~flagged & ~lone_gpu & ~np.isfinite(self.s_node_flag[self.gpu_node]) \
            & ~np.isfinite(self.s_rack_flag[self.gpu_rack])
        base_new = follow(base, r, w)
        self.s_gpu_base[learn, R_BASE] = base_new[learn]
        seen = np.nan_to_num(self.s_gpu_base[:, R_BASE_SEEN])
        self.s_gpu_base[:, R_BASE_SEEN] = np.where(learn, seen + dt, seen)
        # a flag raised under load holds through UNREAD_HOLD comparisons in a row that could not
        # compare the GPU (its temperature unread, its node idle between two jobs and not yet settled
        # for the idle comparison), its last score said again: one comparison missed had dropped it,
        # the GPU silent for 1,200 s, past the incident engine's quiet_s (900 s), and a still
        # degrading GPU's incident was told resolved and reopened (until 2026-12-05). It ends at a
        # comparison that finds the GPU normal, loaded or idle
        st, counts = self.s_idle, self.s_idle_count
        said_loaded = flagged | lone_gpu
        st[said_loaded, I_LSCORE] = np.where(flagged, score, node_score[self.gpu_node])[said_loaded]
        st[(trusted & ~said_loaded) | idle_normal, I_LSCORE] = np.nan
        held = np.isfinite(self.s_gpu_flag) & np.isfinite(st[:, I_LSCORE]) & ~said_loaded & ~idle_hot \
            & (counts[:, C_HELD] < UNREAD_HOLD)
        counts[:, C_HELD] = np.where(held, count_on(counts[:, C_HELD]), 0)
        for g in self._raise(self.s_gpu_flag, said_loaded | idle_hot | held, now, p["refresh_s"]):
            nd = self.gpu_node[g]
            if held[g]:
                findings.append(Anomaly(
                    now, "gpu", int(g), "gpu_temp", float(st[g, I_LSCORE]), self.name,
                    "not compared at this comparison (its temperature unread, or idle between jobs); at the last, "
                    f"under load, its thermal resistance ran {st[g, I_LSCORE]:+z.0%} hot — thermal interface or "
                    "cold plate degrading"))
            elif not said_loaded[g] and not np.isfinite(idle_x[g]):  # held through a comparison that cannot read it
                findings.append(Anomaly(
                    now, "gpu", int(g), "gpu_temp", float(np.nan_to_num(self.s_idle[g, I_SCORE])), self.name,
                    "idle, its temperature not read at this comparison; at the last it ran warm for its power "
                    "against its idle node-mates — thermal interface or cold plate degrading"))
            elif flagged[g]:
                # half a node's GPUs or more at once: its fans or airflow rather than each interface
                cause = (f"as {gpus_flagged[nd]} of the {compared[nd]} compared GPUs of {topo.nodes[nd]}: node fans "
                         "or airflow more likely than its own interface") if 2 * gpus_flagged[nd] >= compared[nd] > 1 \
                    else (f"thermal interface or cold plate degrading, or the fans of {topo.nodes[nd]} (its only GPU "
                          "compared: the two cannot be told apart)") if compared[nd] == 1 \
                    else "thermal interface or cold plate degrading"
                findings.append(Anomaly(
                    now, "gpu", int(g), "gpu_temp", float(score[g]), self.name,
                    f"thermal resistance {r[g]:.4f} °C/W: {peer[g]:+z.0%} vs rack "
                    f"{topo.racks[self.gpu_rack[g]]} median at the same power"
                    + (f", {own[g]:+z.0%} vs own baseline" if has_history[g] else "") + f" — {cause}"))
            elif lone_gpu[g]:
                vs = (f"{node_peer[nd]:+z.0%} vs the other nodes of {self._peer_nodes(nd, by_rack)} at its power"
                      if np.isfinite(node_peer[nd]) else
                      f"{node_own[nd]:+z.0%} vs own baseline (too few nodes on {topo.racks[self.node_rack[nd]]} "
                      f"and loop {topo.loops[self.node_loop[nd]]} to compare it with others)")
                findings.append(Anomaly(
                    now, "gpu", int(g), "gpu_temp", float(node_score[nd]), self.name,
                    f"thermal resistance {r[g]:.4f} °C/W: {vs} — the only GPU of {topo.nodes[nd]} compared: "
                    "its thermal interface or cold plate degrading, or the node's fans (the two cannot be told apart)"))
            else:
                idle_score = float(idle_peer[g] / max(idle_x[g] - idle_peer[g], 1.0))
                self.s_idle[g, I_SCORE] = idle_score  # (float32: said again rounded, where it cannot be read)
                findings.append(Anomaly(
                    now, "gpu", int(g), "gpu_temp", idle_score, self.name,
                    f"idle, {idle_x[g]:.1f} °C over its inlet at {self.s_model[g, G_SIZE + M_PF]:.0f} W: "
                    f"{idle_peer[g]:+z.1f} °C vs its idle node-mates at the same power"
                    + (f", {idle_own[g]:+z.1f} °C vs its own idle history" if np.isfinite(idle_own[g]) else "")
                    + " — thermal interface or cold plate degrading (it will run hot once loaded)"))
        for nd in self._raise(self.s_node_flag, node_flag | alone | idle_node_hot, now, p["refresh_s"]):
            if alone[nd] and not node_flag[nd]:
                findings.append(Anomaly(
                    now, "node", int(nd), "fan_speed", float(node_own[nd]), self.name,
                    f"all GPUs of {topo.nodes[nd]} run {node_own[nd]:+z.0%} hotter per watt than their own history, "
                    f"{gpus_flagged[nd]} of {compared[nd]} flagged against their rack (too few nodes on "
                    f"{topo.racks[self.node_rack[nd]]} and loop {topo.loops[self.node_loop[nd]]} to compare the "
                    "node with others) — node fans or airflow"))
            elif node_flag[nd]:
                findings.append(Anomaly(
                    now, "node", int(nd), "fan_speed", float(node_peer[nd]), self.name,
                    f"all GPUs of {topo.nodes[nd]} run {node_peer[nd]:+z.0%} hotter per watt than the "
                    f"other nodes of {self._peer_nodes(nd, by_rack)} (node median {node_drift[nd]:+z.0%} vs rack"
                    + (f"; it usually runs {node_base[nd, R_BASE]:+z.0%}" if node_history[nd] else "")
                    + ") — node fans or airflow"))
            else:
                findings.append(Anomaly(
                    now, "node", int(nd), "fan_speed", float(idle_node_rise[nd]), self.name,
                    f"idle, all GPUs of {topo.nodes[nd]} run {idle_node_rise[nd]:+z.1f} °C warmer over the inlet "
                    f"than the other idle nodes of {self._peer_nodes(nd, idle_by_rack)} — node fans or airflow"))
        # racks: inlet above its own baseline (a loop or CDU losing flow), beyond what the racks of
        # the other loops rose by together: they share the facility water, whose daily swing (a
        # few °C where dry coolers follow the weather) otherwise read as every loop losing capacity
        inlet = self.s_rack[:, 1]
        inlet_fresh = np.isfinite(inlet) & ((now - self.s_rack[:, 0]) <= 3 * dt)
        rise = inlet - self.s_rack_base
        facility = self._other_loops_rise(np.where(inlet_fresh, rise, np.nan))
        excess = rise - np.maximum(np.nan_to_num(facility), 0.0)
        rack_flag = inlet_fresh & (np.nan_to_num(excess) >= p["inlet_rise_min_c"])
        new_level = self._held(rack_flag, excess, group_median(own_known, self.gpu_rack, topo.size("rack")), now)
        learn_rack = inlet_fresh & ~rack_flag
        self.s_rack_base = np.where(
            learn_rack, follow(self.s_rack_base, inlet, w), self.s_rack_base)
        self.s_rack_base[new_level] += excess[new_level]  # learnt at once: its excess is 0 from now on
        rack_flag &= ~new_level
        for rk in np.flatnonzero(new_level):
            findings.append(Anomaly(
                now, "rack", int(rk), "inlet_temp", float(excess[rk]), self.name,
                f"inlet {inlet[rk]:.1f} °C, {rise[rk]:+z.1f} °C over its baseline, held within "
                f"{p['inlet_hold_span_c']:g} °C for {p['inlet_hold_s'] / 3600:g} h, the rack's GPUs' thermal resistance "
                "unchanged: a new level (the supply setpoint changed?), its baseline from now on"))
        loops = self.rack_loop
        for rk in self._raise(self.s_rack_flag, rack_flag, now, p["refresh_s"]):
            same_loop = loops == loops[rk]
            share = int(np.count_nonzero(rack_flag & same_loop))
            scope = (f"{share} of {int(same_loop.sum())} racks on loop {topo.loops[loops[rk]]} rising: "
                     "the cooling loop (CDU) is losing capacity") if share > 1 else "this rack only: rack flow or manifold"
            common = (f" ({facility[rk]:+z.1f} °C on the other loops)" if np.isfinite(facility[rk])
                      and facility[rk] > 0.05 else "")
            findings.append(Anomaly(
                now, "rack", int(rk), "inlet_temp", float(excess[rk]), self.name,
                f"inlet {inlet[rk]:.1f} °C, {rise[rk]:+z.1f} °C over its baseline{common}; {scope}"))
        return findings

    def _held(self, flag: np.ndarray, excess: np.ndarray, r_drift: np.ndarray, now: float) -> np.ndarray:
        """Flagged racks whose inlet excess has held within ``inlet_hold_span_c`` for ``inlet_hold_s``
        while their GPUs' median R stayed within ``own_drift_min`` of its history (``r_drift``):
        a new level, such as a raised supply setpoint (the dies follow; nothing degrades), which
        was flagged "losing capacity" and re-announced for good. A loop that loses flow and then
        holds steady is taken for one too, after the hold. Updates ``s_rack_hold``."""
        p = self.p
        hold = self.s_rack_hold
        lo, hi = np.fmin(hold[:, H_LO], excess), np.fmax(hold[:, H_HI], excess)
        restart = flag & (np.isnan(hold[:, H_SINCE]) | ~(hi - lo <= p["inlet_hold_span_c"]))
        hold[:, H_LO], hold[:, H_HI] = lo, hi
        hold[restart, H_SINCE] = now
        hold[restart, H_LO] = hold[restart, H_HI] = excess[restart]
        hold[~flag] = np.nan
        steady = flag & (now - hold[:, H_SINCE] >= p["inlet_hold_s"])
        new_level = steady & (np.abs(r_drift) < p["own_drift_min"])
        hold[new_level] = np.nan
        return new_level  # type: ignore[no-any-return]

    def _other_loops_rise(self, rise: np.ndarray) -> np.ndarray:
        """Per rack, the median over the other cooling loops of each loop's median rack rise
        (NaN where no other loop has a fresh rack): what the facility water did meanwhile. A
        single-loop cluster has no such reference, and its racks are judged on their own rise.
        The price: a loss the loops share — the facility's chiller, or two loops failing at once
        where there are only two — is read as the facility water's, and not flagged here."""
        loops = self.rack_loop
        n_loops = int(loops.max()) + 1 if len(loops) else 0
        if n_loops < 2:
            return np.full(len(rise), np.nan)
        per_loop = group_median(rise, loops, n_loops)  # (racks without a loop: in no group)
        others, every = median_of_others(per_loop)
        return np.where(loops >= 0, others[np.maximum(loops, 0)], every)  # (no loop: every loop's)

    def _idle(self, now: float, quiet: np.ndarray) -> tuple[np.ndarray, ...]:
        """The idle side of the comparison: the fit reads R only under load, so an idle GPU whose
        interface degrades, or an idle node whose fans fail, shows only as its temperature over the
        inlet rising (untuned seeds 783 and 792: two failing interfaces idled at ~78 W through their
        hour, 26 -> 30 °C). Compared are GPUs of nodes idle for two whole intervals (cooled down to
        where idle settles them, and no neighbour's heat), in °C (whole-degree readings at ~80 W).
        A GPU is hot against its own idle history and its idle node-mates, or against its node-mates
        alone by more; a node against the other idle nodes of its rack or loop; either for two
        comparisons running. Returns per GPU the excess, its rise over its own history and over its
        node-mates, and whether it is hot; per node its rise, whether it is hot and whether its rack
        was the reference."""
        p = self.p
        topo = self.topology
        m = self.s_model
        st, counts = self.s_idle, self.s_idle_count
        n_nodes = topo.size("node")
        fresh = (now - m[:, G_TS]) <= 3 * p["peer_interval_s"]
        idle_now = fresh & quiet & (m[:, G_SIZE + M_PF] < load_min_of_all(m, self.fit.params))
        counts[:, C_RUN] = np.where(idle_now, count_on(counts[:, C_RUN]), 0)
        settled = counts[:, C_RUN] >= 2
        node_idle = np.bincount(self.gpu_node[settled], minlength=n_nodes) == self.node_gpus
        usable = settled & node_idle[self.gpu_node]
        inlet = m[:, G_UL]
        x = m[:, G_SIZE + M_TPREV] - inlet  # over its inlet, as read (the reason quotes it)
        x[~usable] = np.nan
        # ... compared with what the nominal resistance gives at its own power: "idle" is any load
        # under the fit's load_min (200 W), and a GPU at 170 W (light inference) runs 4 °C warmer
        # over its inlet than node-mates idling at 78 W, a node at 180 W 4.5 °C warmer than the
        # rack's idle ones: both were flagged failing, refreshed for as long as the light load
        # lasted, and no history learnt while flagged (until 2026-12-04)
        power = np.where(usable, m[:, G_SIZE + M_PF], np.nan)
        xc = x - self.fit.params[P_R_NOM] * power
        # ... and compared only with the node-mates within power_band of its power (as the loaded side
        # is): the nominal resistance is no GPU's own, and a healthy air-cooled H100 (R 0.065) at 190 W
        # ran 3 °C over its idle mates at 78 W after that correction: flagged "thermal interface
        # degrading" 12 times in 2 hours, a whole node at 190 W "node fans or airflow" 10 times (until
        # 2026-12-05). Alone at its power it has no peer, and is not compared
        mates, n_mates = median_at_same_power(xc, power, self.gpu_node, n_nodes, p["power_band"])
        peer = np.where(n_mates >= 2, xc - mates, np.nan)
        node_med = group_median(xc, self.gpu_node, n_nodes)
        own = xc - st[:, I_BASE]
        # an idle history holds at the coolant it was learnt at: on a warming loop leakage raises
        # idle power with the temperature, and the excess over the inlet with it (the demo's
        # failing loop: node19/gpu0 read +5.2 °C over its own idle history, 40 °C of inlet later)
        own[(st[:, I_SEEN] < p["warmup_s"]) | ~(np.abs(inlet - st[:, I_INLET]) <= p["idle_inlet_span_c"])] = np.nan
        hot = usable & (((own >= p["idle_rise_min_c"]) & (peer >= p["idle_rise_min_c"]))
                        | (peer >= p["idle_peer_only_c"]))
        # a comparison that could not read it (its temperature missing at the time, or its fit just
        # switched inlet source) neither counts nor ends its run of hot ones, UNREAD_HOLD in a row
        # at most: ended, its flag
        # lapsed for two comparisons (20 min), past the incident engine's quiet_s, and its
        # incident was told resolved and growing again (until 2026-12-04)
        unread = usable & ~np.isfinite(xc)
        counts[:, C_UNREAD] = np.where(unread, count_on(counts[:, C_UNREAD]), 0)
        held = unread & (counts[:, C_UNREAD] <= UNREAD_HOLD)
        counts[:, C_HOT] = np.where(hot, count_on(counts[:, C_HOT]), np.where(held, counts[:, C_HOT], 0))
        # not learnt while its node is flagged either: its history tells a node hot against its loop
        # from a moved reference (below), and failed fans warm every GPU alike, none of them hot;
        # nor from no reading (it had made the history NaN: learnt afresh from the next)
        learn = usable & ~hot & ~unread & ~np.isfinite(self.s_node_flag[self.gpu_node])
        w = 1.0 - np.exp(-p["peer_interval_s"] / p["tau_baseline_s"])
        # a history is for one coolant: where the inlet has moved on, a new one starts
        moved = usable & (np.abs(inlet - st[:, I_INLET]) > p["idle_inlet_span_c"])
        st[moved, I_BASE], st[moved, I_INLET], st[moved, I_SEEN] = np.nan, np.nan, 0.0
        base, base_inlet = st[:, I_BASE], st[:, I_INLET]
        st[learn, I_BASE] = follow(base, xc, w)[learn]
        st[learn, I_INLET] = follow(base_inlet, inlet, w)[learn]
        st[learn, I_SEEN] += p["peer_interval_s"]
        node_ref, by_rack, rack_ref, rack_nodes = self._node_reference(
            node_med, group_median(power, self.gpu_node, n_nodes))  # (the nodes at its power, as its GPUs)
        rise = node_med - node_ref
        # against how much warmer the node usually idles, too (idle_peer_only_c without a history):
        # a node that idles warmer than its rack for good — higher in an air-cooled rack, another
        # chassis — was flagged "node fans or airflow" and refreshed every refresh_s while it idled
        # (+2.5 °C from the start: 23 times in 4 hours, until 2026-12-01). Against a loop, it must
        # also idle warmer than its own history or its rack-mates, as a loaded node must (one rack's
        # inlet sensor re-based 8 °C high dropped the loop's median, and the other rack's untouched
        # nodes were flagged "+4 °C warmer" for hours, their own idle history flat)
        confirmed = by_rack | self._hot_against_itself(group_median(own, self.gpu_node, n_nodes), node_med - rack_ref,
                                                       rack_nodes, p["idle_node_rise_min_c"])
        node_hot, _ = above_usual(self.s_idle_node_base, rise, p["idle_node_rise_min_c"], p["idle_peer_only_c"],
                                  p["warmup_s"], w, p["peer_interval_s"], confirmed)
        self.s_idle_node_hot = np.where(node_hot, self.s_idle_node_hot + 1, 0)
        normal = usable & np.isfinite(xc) & (counts[:, C_HOT] == 0)  # read, and not hot (a loaded flag ends)
        return x, own, peer, counts[:, C_HOT] >= 2, rise, self.s_idle_node_hot >= 2, by_rack, normal

    def _node_reference(self, node_med: np.ndarray, node_power: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per node, the median of the compared nodes' medians in its rack, or in its cooling loop
        where fewer than :data:`NODE_QUORUM` of the rack's were compared (NaN where the loop has
        fewer too), over the nodes within ``power_band`` of its ``node_power`` (all, without);
        whether the rack was the reference; and its rack's median, however few, and how many
        nodes that was (itself included)."""
        power = np.ones(len(node_med)) if node_power is None else node_power
        band = self.p["power_band"]
        rack_ref, rack_nodes = median_at_same_power(node_med, power, self.node_rack, self.topology.size("rack"), band)
        loop_ref, loop_nodes = median_at_same_power(node_med, power, self.node_loop, len(self.topology.loops), band)
        by_rack = rack_nodes >= NODE_QUORUM
        ref = np.where(by_rack, rack_ref, np.where(loop_nodes >= NODE_QUORUM, loop_ref, np.nan))
        return ref, by_rack, rack_ref, rack_nodes

    def _hot_against_itself(self, node_own: np.ndarray, node_drift: np.ndarray, rack_nodes: np.ndarray,
                            gap: float) -> np.ndarray:
        """Nodes that run hot against themselves, for a node compared against its loop: its GPUs'
        median against their own history (``node_own``, NaN without one) by ``gap``, else against its
        rack-mates where it has any (``node_drift``: its rack's median node holds itself, so half
        the bar is the bar against one mate), else true — under load in R (relative), idle in °C
        over the inlet (differences). A loop's median moves when some of its nodes change: two
        nodes re-pasted (R -25 %), or a rack's inlet sensor reading 8 °C high, had flagged the
        untouched nodes of the loop "+11-15 % hotter per watt" (idle: "+4 °C warmer") for hours,
        their own history flat."""
        mates = np.where(rack_nodes >= 2, np.nan_to_num(node_drift, nan=-np.inf) >= gap / 2, True)
        return np.where(np.isfinite(node_own), node_own >= gap, mates)  # type: ignore[no-any-return]

    def _peer_nodes(self, node: int, by_rack: np.ndarray) -> str:
        """What a node was compared against, for the reason: its rack, or its cooling loop."""
        topo = self.topology
        return topo.racks[self.node_rack[node]] if by_rack[node] else f"loop {topo.loops[self.node_loop[node]]}"

    def _under_load(self, now: float) -> np.ndarray:
        """GPUs whose fitted R can be compared now (see the module doc): fresh, warmed up, under
        load now and through most of the last interval (each is compared with the rack-mates at
        its power). Called once per comparison: it moves the mark the next interval's load is
        counted from."""
        p = self.p
        loaded = self.s_model[:, G_SIZE + M_LOADED]
        recent = loaded - self.s_gpu_loaded >= p["recent_load_share"] * p["peer_interval_s"]
        self.s_gpu_loaded = loaded.copy()
        power = self.s_model[:, G_SIZE + M_PF]
        fresh = (now - self.s_model[:, G_TS]) <= 3 * p["peer_interval_s"]
        return fresh & (loaded >= p["warmup_s"]) & recent & (  # type: ignore[no-any-return]
            power > load_min_of_all(self.s_model, self.fit.params))

    @staticmethod
    def _raise(flag_ts: np.ndarray, flagged: np.ndarray, now: float, refresh_s: float) -> np.ndarray:
        """Entities to report now (flag rose, or due for a refresh); updates ``flag_ts``."""
        was = np.isfinite(flag_ts)
        due = flagged & (~was | (now - np.where(was, flag_ts, now) >= refresh_s))
        flag_ts[due] = now
        flag_ts[~flagged] = np.nan
        return np.flatnonzero(due)
