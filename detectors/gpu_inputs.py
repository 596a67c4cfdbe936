"""Inputs shared by the per-GPU detectors: the observations and the inlet temperature.

The GPU kernels on the hot path (the thermal fit, thermal, power, straggler) read a frame's own
columns, ``(ts, slot, field...)`` as a tuple of arrays indexed ``obs[X][row]``
(:func:`gpu_columns`: no copy); the baselines and the rack inlets read a contiguous
``(rows, 2 + k)`` matrix ``[ts, slot, field...]`` (:func:`gpu_obs`). Either way, rows with a slot
outside the topology or a non-finite time are counted as a pipeline problem and left out, never
passed to a kernel.

The thermal model needs the coolant or air temperature at the GPU's inlet. It comes from the
rack frames (``inlet_temp``, else ``coolant_temp``) through the topology's ``gpu_rack``. Where
no rack reports one (dcgm-exporter alone), :func:`gpu_inlet` falls back on a proxy: the node's
coolest GPU, ``min(T - R_nominal * P)`` over the node's GPUs at the previous tick — a healthy
GPU sits at ``inlet + R·P``, so the coolest one bounds the inlet from above by little.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import numba
import numpy as np

from foreshock import facts
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import JIT_OPTIONS
from foreshock.topology import Topology

from .base import add_columns

F = TypeVar("F", bound=Callable[..., Any])


def kernel(func: F) -> F:
    """foreshock's serial Numba options, without the reference-counting runtime.

    The per-GPU kernels touch a dozen state arrays per sample through small helpers; with the
    runtime on, every helper call increments and decrements each array's reference count
    (atomic operations) and that, not the arithmetic, dominated their cost (4x measured). These
    kernels never allocate: arrays are borrowed from the caller, scratch is passed in."""
    return numba.njit(**KERNEL_OPTIONS)(func)  # type: ignore[no-any-return]


def inline(func: F) -> F:
    """:func:`kernel`, inlined into its callers at Numba-IR level (small per-sample helpers)."""
    return numba.njit(**INLINE_OPTIONS)(func)  # type: ignore[no-any-return]


# numpy's error model: a float division by zero gives inf or NaN, where Python's model checks every
# divisor and raises (the kernels check their inputs first; a raise would have ended the pipeline).
# The checks cost 3-4 % of the bank's tick (a micro bench by turns: 245 -> 234 ns per GPU at 10 s)
KERNEL_OPTIONS: dict[str, Any] = {**JIT_OPTIONS, "_nrt": False, "error_model": "numpy"}
INLINE_OPTIONS: dict[str, Any] = {**KERNEL_OPTIONS, "inline": "always"}

# rack state columns: time of the last inlet sample and its value; the inlet one and two
# windows ago (and when) and the loop time constant learnt from them (NaN until seen)
# ... and the coolant flow now, its baseline, the inlet at baseline flow, and the loop's
# coolant rise at baseline flow learnt from a flow loss that settled (with its count); 1 from a
# flow loss until, the flow back, the inlet is back at its baseline too (else 0); and the rack's
# heat (its PDU's power, else its GPUs': see RACK_HEAT_SRC) smoothed over tens of seconds and over
# the loop's lag, and the heat the rise was learnt at (NaN where none is known); then, for racks that
# report no inlet, the proxy
# (the median of its steady nodes' proxies) and the tick it was last taken at, the tick it was
# last looked for at, and the first of the rack's nodes (a list threaded through the node state's
# NODE_NEXT; NaN: none linked)
(RACK_TS, RACK_INLET, RACK_U1, RACK_U2, RACK_U1_TS, RACK_DAMP, RACK_DAMP_N, RACK_FLOW, RACK_FLOW0,
 RACK_U0, RACK_RISE, RACK_RISE_N, RACK_FLOW_SLOPE, RACK_F1, RACK_LOSS, RACK_HEAT, RACK_HEAT_SLOW,
 RACK_RISE_HEAT, RACK_PROXY, RACK_PROXY_TS, RACK_PROXY_AT, RACK_NODE0, RACK_FLOW_TS) = range(23)
# RACK_FLOW_TS: when the flow was last read (a flow sensor can go dark with the inlet still read)
# ... and a reading held back as a jump no loop makes (see INLET_JUMP_RATE_C_PER_S), with its time,
# and how many such jumps the next reading confirmed (level shifts: each is a new source of inlet)
RACK_HELD, RACK_HELD_TS, RACK_SHIFTS = 23, 24, 25
# ... and a flow reading held back as a jump above the baseline (see FLOW_JUMP), and 1 while the
# baseline is a single reading the next one has yet to confirm (0 or NaN: confirmed, or none yet)
RACK_FLOW_HELD, RACK_FLOW0_NEW = 26, 27
# ... and, while a baseline a jump raised is on trial (FLOW_TRIAL_S), the baseline before it and
# when the trial ends (NaN: none on trial)
RACK_FLOW0_BEFORE, RACK_FLOW0_TRIAL_END = 28, 29
# ... and where the rack's heat comes from (HEAT_PDU, HEAT_GPUS; NaN: none yet), when it was last read
# from there, and the heat under which it shows no work (0 for a PDU's, which tells no idle level; NaN:
# not known)
RACK_HEAT_SRC, RACK_HEAT_TS, RACK_HEAT_FLOOR = 30, 31, 32
# ... and, for the proxy's nodes re-based on their own work (see PROXY_STEP_C), how far the inlet
# moved since the tick in RACK_MOVE_FROM (the median move of the nodes that kept their work from tick to
# tick; NaN: none yet), and the rack's last tick that looked for its proxy
RACK_MOVE, RACK_MOVE_FROM, RACK_SEEN_AT = 33, 34, 35
RACK_SIZE = 36
HEAT_PDU, HEAT_GPUS = 1.0, 2.0
"""The rack's heat comes from its PDU's power (``pdu_power``) where the rack reports it, else from
the power its GPUs draw (the thermal fit's sum, :func:`update_rack_inlet`). The GPUs miss the CPUs,
fans and power-supply losses (a tenth to a third of a rack's draw), but the rules read the heat
against itself: whether it is steady (``HEAT_STEADY``), and now against when the rise was learnt
(:func:`new_work_heat`). One source throughout a rack's history keeps those ratios true; a switch
starts the averages over and drops the learnt rise with the heat it was learnt at (the site's rise
stands in until a loss settles again). Without the overhead the GPUs' heat moves more with their work
(idle to loaded: about 9x against a PDU's 6x), so a loop scaled by it is forecast warmer, not cooler
(at most ``HEAT_RATIO_MAX``)."""
HEAT_SOURCE_STALE_S = 300.0
"""A PDU silent this long hands its rack's heat to the GPUs' (the fit's ``inlet_stale_s``); a reading
or a few missed keep it (the averages hold), as a switch starts them over (see ``HEAT_PDU``)."""
INLET_JUMP_C = 5.0
INLET_JUMP_RATE_C_PER_S = 1.0
"""A rack's inlet that moves more than ``max(INLET_JUMP_C, INLET_JUMP_RATE_C_PER_S * dt)`` from its
last reading is held back for a reading: dropped as a glitch unless the next one is near it. Then the
reading moved to another level (a sensor swapped or recalibrated, the BMC reading another probe):
read on from there, as from another source (``read_inlet``: the fit re-bases on it, as where a
rack's GPUs move to the node proxy). A loop that loses all flow warms a few tenths of a degree per
second (the simulator's worst cooling loss: 0.21 °C/s); one poll of a BMC's sensor reading 58 °C among 28s
(until 2026-12-01) was taken for the loop warming 30 °C, its trend carried ahead: 5 of a rack's 32
loaded GPUs were predicted to throttle and all 32 to meet their power cap."""
HEAT_TAU_S = 20.0
HEAT_SLOW_TAU_S = 180.0
"""The inlet follows the heat over the loop's lag (about this): the heat a settled inlet reflects."""
HEAT_STEADY = 0.1
"""A rise is learnt only while the heat is this close to its slow average (the inlet has caught up)."""
HEAT_JUMP = 1.5
"""A rack whose heat is this many times the heat its learnt rise was measured at carries new work
(leakage on a warming loop adds a tenth or two, a synchronous job's steps a few percent): only
then is the learnt rise scaled by the heat."""
HEAT_RATIO_MAX = 6.0
FLOW_SLOPE_TAU_S = 60.0
FLOW_DROP_MAX = 0.25
"""A falling flow is carried ahead (the forecast's ``lag``), but to no less than this share of itself."""
BASELINE_TAU_S = 1800.0
FLOW_NOMINAL = 0.9  # flow above this share of its baseline is "nominal"
FLOW_JUMP = 2.0
"""A flow reading above this many times its rack's baseline is held back for a reading: dropped as a
glitch unless the next one agrees with it (each nominal against the other), and then the baseline
moves there (a pump upgraded, a second pump started). Readings below it are read at once: a loss
must be seen on its first reading. The guard passes any flow up to 1e5 L/s, and one BMC reading
65535 (its 'unreadable') on a 1.2 L/s loop lifted the baseline, which follows nominal readings, to
364 L/s: the loop read as a loss at 0.3 % of baseline for good and every loaded GPU of the rack was
predicted to throttle (until 2026-12-02). Below twice the baseline one reading moves it by at most
``1 - exp(-dt / BASELINE_TAU_S)`` times its value: 0.6 % at a 10 s poll."""
FLOW_TRIAL_S = 1800.0
"""A baseline a confirmed jump raised (``FLOW_JUMP``) is on trial this long, the baseline before it kept: a
reading back at that baseline or under it (no more than nominal above it), with the inlet under
``RECOVERED_C`` over the baseline's (the loop no warmer), undoes the jump (a jump upon a jump in the
trial goes back to the first one's baseline) and is read against the baseline before; one between the
two is a loss against the raised one (a pump upgraded, then losing some of its flow). Two readings that
agree are not always the loop's: a flow meter reading 3x a 1.2 L/s loop twice in a row lifted the
baseline to 3.6 L/s for good (it follows nominal readings only, and the loop's own flow, a third of it,
lies above ``FLOW_UNFELT``'s depth, where 65535 put it at a three-hundredth): every later reading was a
loss at 33 % of baseline, all 16 of the rack's loaded GPUs were predicted to throttle, and a noisy inlet
settling there taught the loop a coolant rise of 0.05 °C that would have hidden a real loss (until
2026-12-02). Undone, the flow is read against a level the loop ran on until minutes ago: a real loss is
a loss against it, at its true depth. The price: a loop whose flow was raised for more heat (a CDU
following its load) and falls back to its old level within the trial reads nominal, its inlet warming
seen as it warms. Half an hour, the baseline's own time constant: an episode of agreeing glitches that
outlasts it stays the baseline (``FLOW_UNFELT`` takes it back from 5x, on a rack whose heat shows work)."""
FLOW_UNFELT = 0.2
"""A loss below this share of the baseline that settles with the inlet within ``RECOVERED_C`` of the
baseline's, on a rack whose heat shows work (over ``RACK_HEAT_FLOOR``), is a baseline the loop does
not have (a glitch it learnt, a checkpoint's): the baseline starts over from the reading. At a fifth
of its flow a loop's coolant rise is five times its baseline's: 4 °C more on an idle rack carrying a
sixth of the heat of a loaded one whose loop runs 6 °C over its supply water (a 30 kW rack at
1.2 L/s). A PDU's heat counts whatever it reads (it carries the rack's idle overhead); the GPUs'
(a rack without PDU power) only once they draw ``load_min_w`` each on average, over a quarter of
their 700 W: at 4 °C of rise at load (the design's), 4.6 °C or more of warming at a fifth of the
flow. Idle GPUs (78 W, a ninth) put in too little to tell: a pump that failed under them leaves the
inlet where it was, and starting over there would read the failed flow as nominal, blind to the loss
when work lands. Until 2026-12-02 a rack without PDU power kept such a baseline for good: its loop's
own flow a loss at a sixth or less, every loaded GPU of the rack predicted to throttle."""
DAMP_MIN_OBS = 4.0
"""Windows a rack's learnt loop time constant needs before it is used."""
DAMP_WINDOW_S = 60.0
DAMP_MIN_STEP_C = 1.0
SETTLED_C = 0.3
"""An inlet that moved less than this over the last window (and since) has settled."""
RECOVERED_C = 1.0
"""A loop is back from a flow loss once its inlet is this close to its baseline's (or settled)."""
RISE_MIN_C = 0.5
"""A coolant rise at baseline flow under this, measured where a loss settled, is noise, not learnt.
A loop's rise is its heat over its coolant's heat-capacity flow: the design's 4 °C at load
(``design_rise_c``), an idle rack's a sixth of it (0.7 °C: CPUs, fans and idle GPUs), learnable still.
A settled inlet moves by up to ``SETTLED_C`` a window, reads in tenths and follows the facility water:
at half the flow, the shallowest loss learnt (``flow0 / flow - 1 = 1``), that alone reads as a rise of
0.3 °C or more. A false loss (a flow meter's 3x pair lifting the baseline, a noisy inlet settling)
taught a loop 0.05 °C, which would have forecast every later real loss of it 80 times too cool
(until 2026-12-02). Refused, the site's rise or the design's stands in: the loop forecast warmer than
it may run, never cooler."""
# node state columns: the proxy of the previous tick and the minimum being gathered now; the
# next node of the same rack (-1: the last; NaN: not linked); how far from steady the node's
# GPUs were over the previous tick and over this one (see node_feed)
NODE_PROXY_TS, NODE_PROXY, NODE_ACC_TS, NODE_ACC, NODE_NEXT, NODE_PROXY_DEV, NODE_ACC_DEV = range(7)
# ... and the least (filtered) power of its GPUs over the previous tick and over this one; the excess
# resistance learnt for it (°C/W; 0 or NaN: none, the proxy read as it is) and the base that carries its
# re-based proxy on (see PROXY_STEP_C); the rack's last tick it counted at, its re-based proxy and its
# least power then; at its last such tick before its work moved (its anchor: the step is read from
# there once the proxy settled), that tick, its proxy, its re-based proxy, its least power and the
# rack's RACK_MOVE; the tick its work was first seen moved from there, and 1 while it sits out of the
# median meanwhile (else 0)
NODE_PROXY_P, NODE_ACC_P, NODE_EXCESS, NODE_BASE = 7, 8, 9, 10
NODE_LAST_AT, NODE_LAST_C, NODE_LAST_P = 11, 12, 13
NODE_ANCHOR_AT, NODE_ANCHOR_V, NODE_ANCHOR_C, NODE_ANCHOR_P, NODE_ANCHOR_MOVE = 14, 15, 16, 17, 18
NODE_MOVED_AT, NODE_OUT = 19, 20
NODE_SIZE = 21
RACK_PROXY_MIN_NODES = 3
"""A rack's proxy needs this many steady nodes with a fresh proxy of their own."""
RACK_PROXY_STEADY_C = 2.0
"""A node counts for its rack's proxy while none of its GPUs' ``R_nominal * |P - P_f|`` exceeds
this: its work starting or stopping. Through those minutes its proxy swings by up to R times the
step (the fitted lag of ``P_f`` trails the die's), and 3 of a rack's 4 nodes starting work moved
the median 9 °C in a sample."""
PROXY_STEP_W, PROXY_STEP_C, PROXY_EXCESS_MAX = 300.0, 4.0, 0.7
"""A node's proxy sits ``(R - R_nominal) * P`` over the inlet (``P``: its coolest GPU's power, its least
where R is over nominal): where R is nominal that is noise (a few percent of R between boards), but on
boards over it the proxy steps when the node starts or stops work, the coolant unchanged, and the rack's
median with it. Then a node whose own work never changed read its rack's *other* nodes starting work as
its inlet warming: on boards at 1.45 x R_nominal 13 °C, and a steadily loaded node, 71 °C at 700 W, was
predicted to throttle on all 8 GPUs (loop_warming at 1.2x: a false alarm, or 6 min of lead lost when the
neighbours went idle; until 2026-12-05). So where a node's least power moves by ``PROXY_STEP_W`` or more
from where it last stood, its step is read against the inlet's move meanwhile (RACK_MOVE: the median
move of the rack's nodes that kept their work): a step of ``PROXY_STEP_C`` or more the way the power
went, at most ``PROXY_EXCESS_MAX`` times R_nominal per watt, is the node's boards' excess resistance
(:func:`rebase_nodes`): its proxy is then read less that excess times its least power, on a base that
carries it on from where it stood. Otherwise the proxy is read as it is, as before: on the simulator's
boards (R within a few percent of nominal) a node's step on its own work read -4.3 to +2.1 °C the
power's way (its coolest GPU changes, temperatures read in whole degrees; 840 steps of seeds 789, 794,
811, 831, 1233 and 34), and a node whose fans failed (R 1.8x to 2.5x there; seed 34's read 31.6 °C, 1.3x
R_nominal per watt) is an outlier the median leaves out. The inlet's move is read from the other nodes,
so a loop warming while a node's work changes is not taken for its step: a re-base that held each such
node's proxy where it last stood for 150 s instead (2026-12-05, reverted) kept what the loop warmed
meanwhile out of it for good: on seed 831 (1,024 GPUs, GPU telemetry alone) a job started on idle nodes
13 min into a loop's loss of flow, their proxies were held while the coolant rose 20 °C, the racks'
proxies read up to 19 °C low and 31 of the seed's 216 cooling-loss throttles went unpredicted (811
lost recall too)."""
PROXY_SETTLE_S = 120.0
"""... the step is read this long after the node's work was first seen moved (four of the fit's initial
30-s time constants): its dies and the fit's filtered power settle meanwhile. Read at once, the lag
fitted with a time constant not yet learnt was read into the excess: the proxy came back 3 °C under
where it stood; and where every node counts as steady (``gpu_inlet``: the sample's own power,
unfiltered) a starting node's proxy first dips by ``R·ΔP`` (its power is read at once, its die lags).
Meanwhile a node whose step already reads ``PROXY_STEP_C`` or more the power's way sits out of the
rack's median (NODE_OUT): only a node over nominal R steps that far; the others count as before."""

TICK_EPS_S = 0.5
"""Samples of one node closer than this in time belong to the same scrape (tick)."""

INLET_MIN_C, INLET_MAX_C = 0.0, 1e6
"""A coolant or air inlet reads above freezing (bound excluded): 0 is what a BMC reports for a
sensor it could not read, and no inlet is at or below it: a rack whose inlet read 0 °C for a
minute came back to 28 °C as the loop warming by as much, and the power detector predicted every
one of its 32 loaded GPUs to meet its cap through leakage (until 2026-12-01). (Above: garbage only
— the guard drops what no sensor reads, such as 0xFFFF tenths.)"""


def upgrade_rack_state(state: dict[str, Any]) -> dict[str, Any]:
    """A detector state whose ``s_rack`` was saved before racks kept when their flow was last read
    (``RACK_FLOW_TS``): read at the rack's last sample, which carried it where the rack reports a
    flow at all (``Detector.upgrade_state``); or before they held flow jumps back (``RACK_FLOW_HELD``,
    ``RACK_FLOW0_NEW``: NaN, nothing held and the baseline in use as confirmed) or put a raised
    baseline on trial (``RACK_FLOW0_BEFORE``, ``RACK_FLOW0_TRIAL_END``: NaN, none on trial) or kept
    where their heat came from (``RACK_HEAT_SRC``: the PDU's, the only source then, where a heat was
    known, read at the rack's last sample, its floor 0; else none); or racks and nodes saved before
    the proxy's nodes re-based (``RACK_MOVE``, ``NODE_PROXY_P`` on: NaN, none re-based nor seen yet)."""
    saved = np.asarray(state.get("s_rack"))
    state = add_columns(state, "s_rack", RACK_SIZE, {RACK_FLOW_TS: RACK_TS, RACK_HEAT_TS: RACK_TS})
    state = add_columns(state, "s_node", NODE_SIZE)
    if saved.ndim == 2 and saved.shape[1] <= RACK_HEAT_SRC and state["s_rack"] is not saved:
        rack = state["s_rack"]
        known = np.isfinite(rack[:, RACK_HEAT_SLOW])
        rack[:, RACK_HEAT_SRC] = np.where(known, HEAT_PDU, np.nan)
        rack[:, RACK_HEAT_FLOOR] = np.where(known, 0.0, np.nan)
    return state


def new_rack_state(n_racks: int) -> np.ndarray:
    state = np.full((n_racks, RACK_SIZE), np.nan)
    state[:, RACK_DAMP_N] = 0.0
    state[:, RACK_RISE_N] = 0.0
    state[:, RACK_LOSS] = 0.0
    return state


def site_loop_rise(rack_state: np.ndarray) -> float:
    """The median learnt coolant rise at baseline flow over racks that learnt one (NaN if none)."""
    ok = rack_state[:, RACK_RISE_N] >= 3.0
    return float(np.median(rack_state[ok, RACK_RISE])) if ok.any() else float("nan")


def site_loop_tau(rack_state: np.ndarray) -> float:
    """The median learnt loop time constant over racks that learnt one (NaN if none)."""
    ok = rack_state[:, RACK_DAMP_N] >= DAMP_MIN_OBS
    return float(np.median(rack_state[ok, RACK_DAMP])) if ok.any() else float("nan")


def new_node_state(n_nodes: int) -> np.ndarray:
    state = np.full((n_nodes, NODE_SIZE), np.nan)
    state[:, NODE_ACC] = np.inf
    state[:, NODE_ACC_TS] = -np.inf
    state[:, NODE_ACC_DEV] = 0.0
    return state


def new_inlet_states(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """The rack and node state that :func:`read_inlet` reads (rack inlets, node proxies), each
    physical rack's nodes linked for its proxy."""
    rack_state, node_state = new_rack_state(topology.size("rack")), new_node_state(topology.size("node"))
    _link_rack_nodes(rack_state, node_state, topology.node_rack, topology.physical_racks)
    return rack_state, node_state


def relinked_inlet_states(rack_state: np.ndarray, node_state: np.ndarray,
                          topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Copies of a rack and node state moved row by row onto ``topology`` (``Detector.remap_state``)
    with each rack's list of nodes threaded anew for it. The links are node *indices*: copied with
    their rows they name the old numbering's nodes, a node can come to point at itself, and the
    rack proxy's walk of the list (:func:`rack_proxy`) then never ends (until 2026-12-02)."""
    rack_state, node_state = np.array(rack_state, dtype=np.float64), np.array(node_state, dtype=np.float64)
    _link_rack_nodes(rack_state, node_state, topology.node_rack, topology.physical_racks)
    return rack_state, node_state


def _link_rack_nodes(rack_state: np.ndarray, node_state: np.ndarray, node_rack: np.ndarray,
                     physical: np.ndarray) -> None:
    """Thread each rack's nodes into a list (RACK_NODE0, then NODE_NEXT) for the rack proxy; only
    ``physical`` racks: an importer's ``unknown`` rack holds every node of the cluster, across
    loops whose inlets differ (its GPUs read their nodes' proxies)."""
    rack_state[:, RACK_NODE0] = np.nan
    node_state[:, NODE_NEXT] = np.nan
    for node in range(len(node_rack) - 1, -1, -1):  # pushed at the head: the list runs in node order
        rack = int(node_rack[node])
        if 0 <= rack < len(rack_state) and physical[rack]:
            head = rack_state[rack, RACK_NODE0]
            node_state[node, NODE_NEXT] = head if head == head else -1.0
            rack_state[rack, RACK_NODE0] = node


class Scratch:
    """Memory kept from frame to frame for per-frame arrays.

    A frame of 16k GPUs needs megabytes of matrices and emission buffers; fresh allocations of
    that size are fresh pages each time, and faulting them in cost 0.4 ms a frame (measured),
    more than most kernels. An array taken here is valid until the next ``take`` of its name."""

    def __init__(self) -> None:
        self._flat: dict[str, np.ndarray] = {}

    def take(self, name: str, shape: tuple[int, int], order: str = "C", dtype: type = np.float64) -> np.ndarray:
        size = shape[0] * shape[1]
        flat = self._flat.get(name)
        if flat is None or len(flat) < size or flat.dtype != dtype:
            flat = self._flat[name] = np.empty(size, dtype)
        if order == "F":
            return flat[:size].reshape(shape[::-1]).T
        return flat[:size].reshape(shape)


def gpu_obs(frame: Frame, fields: Sequence[str], n_slots: int, health: PipelineHealth,
            stage: str) -> np.ndarray:
    """``[ts, slot, fields...]`` as one C-contiguous float64 matrix, valid slots only (the GPU
    detectors on the hot path read the frame's columns in place instead: :func:`gpu_columns`)."""
    slot = frame.slot
    ok = (slot >= 0) & (slot < n_slots) & np.isfinite(frame.ts)
    bad = int(len(ok) - np.count_nonzero(ok))
    out = np.empty((len(frame), 2 + len(fields)), dtype=np.float64)
    out[:, 0] = frame.ts
    out[:, 1] = slot
    for j, name in enumerate(fields):
        out[:, 2 + j] = frame.columns[name]
    if bad:
        health.problem(stage, f"{frame.kind} rows with unknown slot or non-finite ts", bad)
        out = np.ascontiguousarray(out[ok])
    return out


def gpu_columns(frame: Frame, fields: Sequence[str], n_slots: int, health: PipelineHealth, stage: str,
                scratch: Scratch) -> tuple[np.ndarray, ...]:
    """``(ts, slot, fields...)`` as a tuple of float64 columns, valid slots only: the frame's own
    column arrays where every row is valid (only ``slot`` is converted, into ``scratch``), else
    compacted copies. What :func:`gpu_obs` gives, without its copy of every column: a kernel
    reads ``obs[X][row]`` as it read ``matrix[row, X]`` from the Fortran-ordered matrix, one
    column stream each (gathering 14 columns of a 16k-GPU frame cost ~11 ns per GPU).

    A read-only column (a frame built on ``np.frombuffer`` or a memory-mapped file) is copied:
    Numba types a read-only array apart from a writable one, and a tuple mixing them is
    heterogeneous, which a kernel indexing it by a variable cannot compile (read-only views of
    every column instead cost the bank ~3 %)."""
    slot = frame.slot
    ok = (slot >= 0) & (slot < n_slots) & np.isfinite(frame.ts)
    bad = int(len(ok) - np.count_nonzero(ok))
    slot_f = scratch.take("slot", (len(frame), 1))[:, 0]
    slot_f[:] = slot
    columns = (frame.ts, slot_f) + tuple(np.ascontiguousarray(frame.columns[name], dtype=np.float64)
                                         for name in fields)
    if bad:
        health.problem(stage, f"{frame.kind} rows with unknown slot or non-finite ts", bad)
        columns = tuple(column[ok] for column in columns)
    return tuple(column if column.flags.writeable else column.copy() for column in columns)


def frame_now(ts: np.ndarray, slack_s: float) -> float:
    """The time a frame's rows speak for (``ts``: finite, not empty): its latest stamp, unless that lies
    more than ``slack_s`` (a detector's cadence) past the frame's median stamp, then the latest one
    within it. One GPU's row stamped a day ahead (a host's clock wrong for a poll) set the straggler's
    and the cooling detector's timers a day ahead: neither compared any GPU until then. Stamps within
    ``slack_s`` of each other (a frame of one scrape) cost two passes, no median."""
    hi = float(ts.max())
    if hi - float(ts.min()) <= slack_s:
        return hi
    return float(ts[ts <= np.median(ts) + slack_s].max())


def rack_inlet_obs(frame: Frame, n_racks: int, health: PipelineHealth, stage: str) -> np.ndarray:
    """``[ts, slot, inlet, flow, heat]`` for rack frames: ``inlet_temp`` (else ``coolant_temp``),
    ``coolant_flow`` and ``pdu_power`` (the heat the rack puts into its loop). The thermal fit adds
    the rack's GPUs' heat (see :func:`update_rack_inlet`)."""
    obs = gpu_obs(frame, ("inlet_temp", "coolant_temp", "coolant_flow", "pdu_power"), n_racks, health, stage)
    inlet = obs[:, 2]
    with np.errstate(invalid="ignore"):
        missing = ~((inlet > INLET_MIN_C) & (inlet < INLET_MAX_C))  # (NaN: missing too)
    inlet[missing] = obs[missing, 3]
    obs[:, 3] = obs[:, 4]
    obs[:, 4] = obs[:, 5]
    return np.ascontiguousarray(obs[:, :5])


@kernel
def update_rack_inlet(obs: np.ndarray, rack_state: np.ndarray) -> None:
    """Keep the latest inlet per rack (rows in time order; a value outside ``INLET_MIN_C`` to
    ``INLET_MAX_C`` is none); learn the loop's time constant.

    ``obs`` rows are ``[ts, slot, inlet, flow, heat]`` (:func:`rack_inlet_obs`), optionally followed
    by ``gpu_heat, gpu_floor``: the power the rack's GPUs draw and the heat under which that shows
    no work (:func:`track_heat`; NaN: not known). Without a column its value is unknown, as where a
    rack reports no PDU power."""
    width = obs.shape[1]
    for i in range(obs.shape[0]):
        v = obs[i, 2]
        if INLET_MIN_C < v < INLET_MAX_C:  # (False for NaN)
            r = int(obs[i, 1])
            if not rack_state[r, RACK_TS] > obs[i, 0] and not inlet_jump_held(rack_state, r, obs[i, 0], v):
                dt = obs[i, 0] - rack_state[r, RACK_TS]
                rack_state[r, RACK_TS] = obs[i, 0]
                rack_state[r, RACK_INLET] = v
                track_heat(rack_state, r, obs[i, 0], dt, obs[i, 4] if width > 4 else np.nan,
                           obs[i, 5] if width > 6 else np.nan, obs[i, 6] if width > 6 else np.nan)
                if track_flow(rack_state, r, obs[i, 0], dt, v, obs[i, 3]):
                    rack_state[r, RACK_FLOW_TS] = obs[i, 0]
                learn_loop_tau(rack_state, r, obs[i, 0], v)


REASON_BITS_LIMIT = 2.0 ** 40
"""A throttle-reasons value at or above this is not a bitmask: no driver defines 40 bits."""


@inline
def reason_bits(reasons: float) -> int:
    """A sample's throttle-reasons bitmask as an int, or -1 where it is missing or not one (NaN,
    negative, or beyond the 40 bits any driver defines)."""
    if reasons == reasons and 0.0 <= reasons < REASON_BITS_LIMIT:
        return int(reasons)
    return -1


@inline
def reported_core_limit(max_op: float, slowdown: float) -> float:
    """The core limit a sample's own thresholds give: its max operating temperature, else its HW
    slowdown temperature less the 2 °C between them; NaN where it reports neither (a value outside
    ``facts.OWN_LIMIT_MIN_C``..``OWN_LIMIT_MAX_C``, such as nvidia-smi's T.Limit offsets or 0, is no
    report). The thermal fit keeps the same rule per GPU (``thermal_fit.core_limit``)."""
    if facts.OWN_LIMIT_MIN_C < max_op < facts.OWN_LIMIT_MAX_C:
        return max_op
    if facts.OWN_LIMIT_MIN_C < slowdown < facts.OWN_LIMIT_MAX_C:
        return slowdown - (facts.HW_SLOWDOWN_TEMP_C - facts.MAX_OPERATING_TEMP_C)
    return np.nan


def reason_bits_column(reasons: np.ndarray) -> np.ndarray:
    """:func:`reason_bits` of a whole column (int64, -1 where a value is not a bitmask) — for code
    that reads a frame's column at once rather than a sample in a kernel."""
    r = np.asarray(reasons, dtype=float)
    with np.errstate(invalid="ignore"):
        ok = (r >= 0.0) & (r < REASON_BITS_LIMIT)  # False for NaN
    return np.where(ok, r, -1.0).astype(np.int64)


READ, HELD, SHIFTED = 0, 1, 2
"""What :func:`reading_jump` made of a reading: read it; hold it back; read it, confirming the one
held before it (the sensor reads at another level now)."""


@inline
def reading_jump(state: np.ndarray, r: int, ts: float, v: float, last: float, last_ts: float, held_col: int,
                 held_ts_col: int) -> int:
    """Whether an inlet reading ``v`` at ``ts`` is read (``READ``, ``SHIFTED``) or held back
    (``HELD``): it is held when it jumps from the ``last`` reading (at ``last_ts``) further than a
    loop moves (``INLET_JUMP_C``, ``INLET_JUMP_RATE_C_PER_S``) and has not been seen there before.
    The held reading is kept in row ``r`` of ``state`` (columns ``held_col``, ``held_ts_col``): one
    that the next reading confirms is read (``SHIFTED``), and one near the last reading drops what
    was held (a glitch). No ``last`` yet (NaN): read.

    The held reading is tried first: a reading near it, and nearer it than the last, confirms it.
    The last reading is older, and the loop's allowance over ``ts - last_ts`` spans the held poll
    too: tried against the last first (until 2026-12-02), a 10-20 °C step's confirming reading was
    read as the loop warming, its trend carried ahead (every GPU of the rack predicted to throttle).
    "Nearer": at a long poll the allowance can take in both, and a reading back at the last one is
    a glitch undone."""
    held = state[r, held_col]
    to_held = abs(v - held)
    if to_held <= max(INLET_JUMP_C, INLET_JUMP_RATE_C_PER_S * (ts - state[r, held_ts_col])) \
            and to_held < abs(v - last):  # (False with nothing held)
        state[r, held_col] = np.nan  # confirmed: the reading is at another level now
        return SHIFTED
    if not abs(v - last) > max(INLET_JUMP_C, INLET_JUMP_RATE_C_PER_S * (ts - last_ts)):
        state[r, held_col] = np.nan
        return READ
    state[r, held_col] = v
    state[r, held_ts_col] = ts
    return HELD


@inline
def inlet_jump_held(rack_state: np.ndarray, r: int, ts: float, v: float) -> bool:
    """True when the rack's inlet reading ``v`` at ``ts`` is held back (:func:`reading_jump`, against
    its last inlet; ``RACK_HELD``); a level shift it confirms is counted (``RACK_SHIFTS``)."""
    seen = reading_jump(rack_state, r, ts, v, rack_state[r, RACK_INLET], rack_state[r, RACK_TS], RACK_HELD,
                        RACK_HELD_TS)
    if seen == SHIFTED:
        shifts = rack_state[r, RACK_SHIFTS]
        rack_state[r, RACK_SHIFTS] = shifts + 1.0 if shifts == shifts else 1.0
    return seen == HELD


@inline
def flows_agree(a: float, b: float) -> bool:
    """Two flow readings of one level: each nominal against the other (False with a NaN)."""
    return a >= FLOW_NOMINAL * b and b >= FLOW_NOMINAL * a  # type: ignore[no-any-return]


@inline
def track_heat(rack_state: np.ndarray, r: int, ts: float, dt: float, pdu: float, gpus: float,
               gpus_floor: float) -> None:
    """The rack's heat at ``ts`` (``dt`` after its last inlet), smoothed over ``HEAT_TAU_S`` and
    ``HEAT_SLOW_TAU_S``: its PDU's power ``pdu`` where it reads one (> 0), else its GPUs' ``gpus``
    once the PDU has been silent ``HEAT_SOURCE_STALE_S`` (or never spoke), with ``gpus_floor``, the
    heat under which they show no work (``FLOW_UNFELT``); neither: the averages hold. A switch of
    source starts the averages over and drops the learnt rise (see ``HEAT_PDU``)."""
    src = rack_state[r, RACK_HEAT_SRC]
    if pdu == pdu and pdu > 0.0:
        heat, new_src, floor = pdu, HEAT_PDU, 0.0
    elif gpus == gpus and gpus > 0.0 and not (src == HEAT_PDU
                                              and ts - rack_state[r, RACK_HEAT_TS] <= HEAT_SOURCE_STALE_S):
        heat, new_src, floor = gpus, HEAT_GPUS, gpus_floor
    else:
        return
    if src == src and src != new_src:  # never one average over two sources
        rack_state[r, RACK_HEAT] = np.nan
        rack_state[r, RACK_HEAT_SLOW] = np.nan
        forget_rise(rack_state, r)
    rack_state[r, RACK_HEAT_SRC] = new_src
    rack_state[r, RACK_HEAT_TS] = ts
    rack_state[r, RACK_HEAT_FLOOR] = floor
    # smoothed: a synchronous job swings a rack's power with its steps
    for col, tau in ((RACK_HEAT, HEAT_TAU_S), (RACK_HEAT_SLOW, HEAT_SLOW_TAU_S)):
        old = rack_state[r, col]
        w = 1.0 - np.exp(-dt / tau) if dt == dt and dt > 0.0 else 1.0
        rack_state[r, col] = heat if old != old else old + w * (heat - old)


@inline
def track_flow(rack_state: np.ndarray, r: int, ts: float, dt: float, inlet: float, flow: float) -> bool:
    """Coolant flow now (read at ``ts``, ``dt`` after the rack's last inlet) and its baseline (with
    the inlet it gives); learn the loop's coolant rise once a flow loss has settled, with the heat it
    was learnt at (:func:`track_heat`). True where ``flow`` was read: a finite flow >= 0 not held
    back as a jump (``FLOW_JUMP``).

    The baseline starts from a reading the next one agrees with (:func:`flows_agree`; one that
    does not starts it over); a jump above it is read once the next reading confirms it, and the
    baseline moves there, the rise learnt at the old one dropped, on trial: a reading back at the
    old one in the trial undoes the jump (``FLOW_TRIAL_S``); and a baseline starts over where a
    deep loss against it settles without the inlet feeling it (``FLOW_UNFELT``).

    Heat balance: the coolant warms over the facility water by ``Q / (m_dot c_p)`` — the rise
    scales as ``1 / flow`` at a given heat. So ``inlet = u0 + rise0 * (flow0 / flow - 1)`` at a
    lower flow, where ``rise0`` is the loop's rise at its baseline flow (its approach
    temperature). The rack's own PDU power, else its GPUs', stands in for its loop's heat
    (:func:`track_heat`; NaN where neither is known). A rise under ``RISE_MIN_C`` is not learnt."""
    if not (flow == flow and 0.0 <= flow < np.inf):
        return False
    f0 = rack_state[r, RACK_FLOW0]
    new = rack_state[r, RACK_FLOW0_NEW] > 0.0  # (False for NaN: a baseline saved before the flag)
    moved = undone = False
    before = rack_state[r, RACK_FLOW0_BEFORE]
    if before == before:  # a raised baseline on trial
        if not ts < rack_state[r, RACK_FLOW0_TRIAL_END]:
            rack_state[r, RACK_FLOW0_BEFORE] = np.nan  # it held: the loop's
        elif FLOW_NOMINAL * flow <= before and inlet - rack_state[r, RACK_U0] < RECOVERED_C:
            # back at the baseline before it (or under), the loop no warmer: the jump was a glitch,
            # or a level the loop left for the one it ran on before (read against it below: a loss
            # under it is one)
            f0 = before
            rack_state[r, RACK_FLOW0] = before
            rack_state[r, RACK_FLOW0_BEFORE] = np.nan
            undone = True
    if f0 == f0 and not new:
        if flow > FLOW_JUMP * f0:
            if not flows_agree(flow, rack_state[r, RACK_FLOW_HELD]):
                rack_state[r, RACK_FLOW_HELD] = flow
                return False
            moved = True  # the jump confirmed: the loop runs at another flow now
        rack_state[r, RACK_FLOW_HELD] = np.nan
    prev = rack_state[r, RACK_FLOW]
    if prev == prev and dt == dt and dt > 0.0:
        w = 1.0 - np.exp(-dt / FLOW_SLOPE_TAU_S)
        old = rack_state[r, RACK_FLOW_SLOPE]
        d = (flow - prev) / dt
        rack_state[r, RACK_FLOW_SLOPE] = d if old != old else old + w * (d - old)
    if undone:  # no trend through readings of a level the loop no longer runs at
        rack_state[r, RACK_FLOW_SLOPE] = np.nan
    rack_state[r, RACK_FLOW] = flow
    if f0 != f0 or (new and not flows_agree(flow, f0)):
        if flow > 0.0:
            if new:  # the reading before was a glitch, or the flow moved: no trend between the two
                rack_state[r, RACK_FLOW_SLOPE] = np.nan
            rack_state[r, RACK_FLOW0] = flow
            rack_state[r, RACK_U0] = inlet
            rack_state[r, RACK_FLOW0_NEW] = 1.0
        return True
    rack_state[r, RACK_FLOW0_NEW] = 0.0
    if moved:
        if rack_state[r, RACK_FLOW0_BEFORE] != rack_state[r, RACK_FLOW0_BEFORE]:  # (else: a jump upon a jump)
            rack_state[r, RACK_FLOW0_BEFORE] = f0
            rack_state[r, RACK_FLOW0_TRIAL_END] = ts + FLOW_TRIAL_S
        f0 = flow
        rack_state[r, RACK_FLOW0] = flow
        forget_rise(rack_state, r)
    if flow >= FLOW_NOMINAL * f0:
        if rack_state[r, RACK_LOSS] > 0.0:
            # back from a loss: the inlet settles back to the baseline's, which holds meanwhile
            # (learning it from a cooling inlet would raise it); it is back once there, or once
            # settled elsewhere (the facility water moved during the loss)
            if inlet - rack_state[r, RACK_U0] < RECOVERED_C or inlet_settled(rack_state, r, inlet):
                rack_state[r, RACK_LOSS] = 0.0
            return True
        if dt == dt and dt > 0.0:  # nominal: follow slow changes (load, facility water)
            w = 1.0 - np.exp(-dt / BASELINE_TAU_S)
            rack_state[r, RACK_FLOW0] = f0 + w * (flow - f0)
            rack_state[r, RACK_U0] = rack_state[r, RACK_U0] + w * (inlet - rack_state[r, RACK_U0])
        return True
    rack_state[r, RACK_LOSS] = 1.0
    # settled: the inlet no longer moving over a whole window and since, and the flow steady —
    # against the window's start and by its trend: the window may have started a sample ago, and
    # a mild loss's ramp moves the flow under 1 % a sample (seed 804 at 8,192 GPUs learnt a rise
    # of 1.7 °C from an inlet still lagging its falling flow, 13 min into the ramp)
    slope = rack_state[r, RACK_FLOW_SLOPE]
    settled = inlet_settled(rack_state, r, inlet) and rack_state[r, RACK_F1] == rack_state[r, RACK_F1] \
        and abs(flow - rack_state[r, RACK_F1]) < 0.01 * f0 and slope == slope \
        and abs(slope) * DAMP_WINDOW_S < 0.01 * f0
    # ... and the heat steady too: work that just started or stopped has not reached the inlet yet
    h_fast, h_slow = rack_state[r, RACK_HEAT], rack_state[r, RACK_HEAT_SLOW]
    if h_slow == h_slow and abs(h_fast - h_slow) > HEAT_STEADY * h_slow:
        settled = False
    if settled and 0.0 < flow < FLOW_UNFELT * f0 and h_slow > rack_state[r, RACK_HEAT_FLOOR] \
            and inlet - rack_state[r, RACK_U0] < RECOVERED_C:
        # a loss this deep warms a loop carrying heat by several of its rises: this one's inlet
        # did not move, so its baseline is not the loop's (only a rack whose heat shows work: an
        # idle loop losing its flow does not warm either)
        rack_state[r, RACK_FLOW0] = flow
        rack_state[r, RACK_U0] = inlet
        rack_state[r, RACK_LOSS] = 0.0
        forget_rise(rack_state, r)
        return True
    if settled and flow < 0.5 * f0 and flow > 0.0:
        k_obs = (inlet - rack_state[r, RACK_U0]) / (f0 / flow - 1.0)
        if k_obs >= RISE_MIN_C:
            old = rack_state[r, RACK_RISE]
            rack_state[r, RACK_RISE] = k_obs if old != old else old + 0.2 * (k_obs - old)
            rack_state[r, RACK_RISE_N] += 1.0
            old = rack_state[r, RACK_RISE_HEAT]
            rack_state[r, RACK_RISE_HEAT] = h_slow if old != old else old + 0.2 * (h_slow - old)
    return True


@inline
def forget_rise(rack_state: np.ndarray, r: int) -> None:
    """Drop the coolant rise a rack learnt at its baseline flow (the baseline moved: the rise is
    another until a loss settles again; meanwhile the site's rise stands for it)."""
    rack_state[r, RACK_RISE] = np.nan
    rack_state[r, RACK_RISE_N] = 0.0
    rack_state[r, RACK_RISE_HEAT] = np.nan


@inline
def new_work_heat(rack_state: np.ndarray, r: int) -> float:
    """The rack's heat over the heat its learnt rise was measured at, where work has landed on it
    since (at least ``HEAT_JUMP`` times, at most ``HEAT_RATIO_MAX``); else 1. Leakage and a job's
    rhythm move a rack's heat by a tenth or so; scaling the rise by those too forecast warming
    loops hotter and called more mild losses (docs/throttling.md, seed 803)."""
    h, h_rise = rack_state[r, RACK_HEAT], rack_state[r, RACK_RISE_HEAT]
    if not (h == h and h_rise == h_rise and h_rise > 0.0) or h < HEAT_JUMP * h_rise:
        return 1.0
    return min(h / h_rise, HEAT_RATIO_MAX)  # type: ignore[no-any-return]


@inline
def inlet_settled(rack_state: np.ndarray, r: int, inlet: float) -> bool:
    """True when the rack's inlet moved less than ``SETTLED_C`` over its last whole window and
    since: a window's two ends, not the last few seconds (a ramp of a few °C per minute moves
    less than that in one sample)."""
    u1, u2 = rack_state[r, RACK_U1], rack_state[r, RACK_U2]
    return u1 == u1 and u2 == u2 and abs(u1 - u2) < SETTLED_C and abs(inlet - u1) < SETTLED_C  # type: ignore[no-any-return]


@inline
def flow_asymptote(rack_state: np.ndarray, r: int, prior_rise: float, lag: float,
                   plan_floor: float = 0.0, now: float = np.nan, stale_s: float = np.inf) -> float:
    """Where the inlet settles at the rack's coolant flow ``lag`` seconds ahead — the flow's
    trend carried that far (at most a fourfold drop, not below ``plan_floor`` of baseline unless
    the flow is already there, never below 2 % of baseline); NaN at nominal flow (unless the loop
    is still coming back from a loss: its inlet heads back to the baseline's, whatever its own
    trend still says) or without flow telemetry. A rise learnt where the loss settled is scaled
    by the rack's heat where work landed on the loop since (:func:`new_work_heat`). A flow last
    read more than ``stale_s`` before ``now`` says nothing: until 2026-12-01 a flow sensor (or a
    whole rack's exporter) that went dark at 8 % of baseline kept its loop's GPUs forecast to
    throttle long after the pump was repaired."""
    if r < 0 or now - rack_state[r, RACK_FLOW_TS] > stale_s:
        return np.nan
    flow = rack_state[r, RACK_FLOW]
    f0 = rack_state[r, RACK_FLOW0]
    if not (flow == flow and f0 == f0 and (flow < FLOW_NOMINAL * f0 or rack_state[r, RACK_LOSS] > 0.0)):
        return np.nan
    slope = rack_state[r, RACK_FLOW_SLOPE]
    if slope == slope and slope < 0.0:
        flow = max(flow + slope * lag, FLOW_DROP_MAX * flow, min(flow, plan_floor * f0))
    rise, h = prior_rise, 1.0
    if rack_state[r, RACK_RISE_N] >= 3.0:
        # the rise learnt where the rack's loss settled holds the heat its loop carried then:
        # jobs starting on a loop that settled idle put their full heat on the low flow (seed 805
        # at 8,192 GPUs, cdu46). Only a jump in heat counts: scaling the rise by every change of
        # the rack's heat called more mild losses and restored loops (docs/throttling.md: seeds 803 and 777)
        rise = rack_state[r, RACK_RISE]
        if rack_state[r, RACK_FLOW] < FLOW_NOMINAL * f0:
            h = new_work_heat(rack_state, r)
    return rack_state[r, RACK_U0] + min(rise * (h * f0 / max(flow, 0.02 * f0) - 1.0), 70.0)  # type: ignore[no-any-return]


@inline
def learn_loop_tau(rack_state: np.ndarray, r: int, ts: float, inlet: float) -> None:
    """Learn the cooling loop's time constant from the rack inlet itself.

    Every ``DAMP_WINDOW_S`` the inlet's change over the last window is compared with the one
    before: a first-order loop settling toward a new level shrinks it by ``exp(-W / tau)``.
    Only clear, same-sign, shrinking steps count (a loss of flow settling, or its repair)."""
    last = rack_state[r, RACK_U1_TS]
    if last == last and ts - last < DAMP_WINDOW_S:
        return
    if last == last and ts - last <= 2.0 * DAMP_WINDOW_S:
        d_new = inlet - rack_state[r, RACK_U1]
        d_old = rack_state[r, RACK_U1] - rack_state[r, RACK_U2]
        if d_new * d_old > 0.0 and abs(d_old) >= DAMP_MIN_STEP_C:
            ratio = d_new / d_old
            if 0.05 < ratio < 0.95:
                tau_obs = -(ts - last) / np.log(ratio)
                old = rack_state[r, RACK_DAMP]
                rack_state[r, RACK_DAMP] = tau_obs if old != old else np.exp(
                    np.log(old) + 0.3 * (np.log(tau_obs) - np.log(old)))
                rack_state[r, RACK_DAMP_N] += 1.0
        rack_state[r, RACK_U2] = rack_state[r, RACK_U1]
    else:
        rack_state[r, RACK_U2] = np.nan  # first window, or a gap: not consecutive
    rack_state[r, RACK_U1] = inlet
    rack_state[r, RACK_F1] = rack_state[r, RACK_FLOW]
    rack_state[r, RACK_U1_TS] = ts


@inline
def node_tick(ts: float, node: int, node_state: np.ndarray) -> None:
    """At a node's first sample of a new tick, the minimum gathered over the last tick becomes
    its proxy, and gathering starts again."""
    if ts > node_state[node, NODE_ACC_TS] + TICK_EPS_S:
        if node_state[node, NODE_ACC] < np.inf:
            node_state[node, NODE_PROXY] = node_state[node, NODE_ACC]
            node_state[node, NODE_PROXY_TS] = node_state[node, NODE_ACC_TS]
            node_state[node, NODE_PROXY_DEV] = node_state[node, NODE_ACC_DEV]
            node_state[node, NODE_PROXY_P] = node_state[node, NODE_ACC_P]
        node_state[node, NODE_ACC] = np.inf
        node_state[node, NODE_ACC_TS] = ts
        node_state[node, NODE_ACC_DEV] = 0.0
        node_state[node, NODE_ACC_P] = np.nan


@inline
def node_feed(node: int, temp: float, power_f: float, node_state: np.ndarray, r_nominal: float,
              unsteady_c: float) -> None:
    """Feed a GPU's ``T - R_nominal * P`` into its node's proxy for the current tick. ``power_f``
    is the power passed through the die's lag (the first-order filter with its time constant)
    *including this sample*: the temperature read now answers the heat up to now. A filter one
    sample behind read a job's first loaded sample as the inlet jumping (~13 °C on the simulator's
    10-s die), which the thermal forecast carried ahead as a failing loop. ``unsteady_c``: how far
    this GPU is from steady, ``R_nominal * |P - P_f|`` (0 where unknown)."""
    if temp == temp and power_f == power_f:
        # min() without a branch: which of a node's GPUs is coolest is a coin toss per sample
        node_state[node, NODE_ACC] = min(temp - r_nominal * power_f, node_state[node, NODE_ACC])
        # ... and its least power: the coolest GPU's where R is over nominal (see PROXY_STEP_C)
        least = node_state[node, NODE_ACC_P]
        node_state[node, NODE_ACC_P] = power_f if not power_f >= least else least  # (NaN: none yet)
    # the node's worst over the tick (see RACK_PROXY_STEADY_C)
    node_state[node, NODE_ACC_DEV] = max(unsteady_c, node_state[node, NODE_ACC_DEV])


@inline
def node_proxy_now(ts: float, node: int, node_state: np.ndarray) -> tuple[float, float, float, float]:
    """A node's latest complete proxy at ``ts``, when it was gathered, how far from steady its
    GPUs were then and their least power: the minimum of its last tick — still held as the running
    minimum if this tick has not reached the node yet."""
    acc = node_state[node, NODE_ACC]
    if node_state[node, NODE_ACC_TS] < ts - TICK_EPS_S and acc < np.inf:
        return (acc, node_state[node, NODE_ACC_TS], node_state[node, NODE_ACC_DEV],  # type: ignore[return-value]
                node_state[node, NODE_ACC_P])
    return (node_state[node, NODE_PROXY], node_state[node, NODE_PROXY_TS],  # type: ignore[return-value]
            node_state[node, NODE_PROXY_DEV], node_state[node, NODE_PROXY_P])


@inline
def _counts_for_rack(ts: float, v: float, vts: float, dev: float, stale_s: float) -> bool:
    return v == v and ts - vts <= stale_s and dev <= RACK_PROXY_STEADY_C  # type: ignore[no-any-return]


@inline
def rebased_proxy(v: float, power: float, node: int, node_state: np.ndarray) -> float:
    """A node's proxy ``v`` at its least power ``power`` less its boards' learnt excess (see
    PROXY_STEP_C), carried on from its base; ``v`` itself where none is learnt."""
    excess = node_state[node, NODE_EXCESS]
    if excess == excess and excess != 0.0:
        return v - excess * power + node_state[node, NODE_BASE]  # type: ignore[no-any-return]
    return v


MEMBER_PROXY, MEMBER_MOVE = 0, 1
"""What :func:`_rack_member` gives for a node: its re-based proxy where it counts for its rack now;
unless it sits out while its step settles (NODE_OUT); or its re-based proxy's move since the rack's
last tick (``seen_at``) where it counted then too, its least power within ``PROXY_STEP_W`` of what it
was then and at its anchor (its work kept)."""


@inline
def _rack_member(ts: float, k: int, node_state: np.ndarray, stale_s: float, what: int,
                 seen_at: float) -> tuple[bool, float]:
    v, vts, dev, power = node_proxy_now(ts, k, node_state)
    if not _counts_for_rack(ts, v, vts, dev, stale_s):
        return False, np.nan
    c = rebased_proxy(v, power, k, node_state)
    if what == MEMBER_PROXY:
        return not node_state[k, NODE_OUT] > 0.0, c  # (NaN: in)
    if node_state[k, NODE_LAST_AT] == seen_at and abs(power - node_state[k, NODE_LAST_P]) < PROXY_STEP_W \
            and abs(power - node_state[k, NODE_ANCHOR_P]) < PROXY_STEP_W:
        return True, c - node_state[k, NODE_LAST_C]
    return False, np.nan


@inline
def _rack_median(ts: float, rack: int, rack_state: np.ndarray, node_state: np.ndarray, stale_s: float,
                 what: int, min_nodes: int) -> float:
    """The median of :func:`_rack_member`'s values over the rack's nodes (NaN under ``min_nodes`` of
    them). O(n^2) over a rack's nodes, once per rack and tick (no allocation in a kernel)."""
    first = rack_state[rack, RACK_NODE0]
    if first != first:
        return np.nan
    seen_at = rack_state[rack, RACK_SEEN_AT]
    n = 0
    k = int(first)
    while k >= 0:
        n += 1 if _rack_member(ts, k, node_state, stale_s, what, seen_at)[0] else 0
        k = int(node_state[k, NODE_NEXT])
    if n < min_nodes:
        return np.nan
    lo_rank, hi_rank = (n - 1) // 2, n // 2
    lo = hi = np.nan
    k = int(first)
    while k >= 0:
        ok, v = _rack_member(ts, k, node_state, stale_s, what, seen_at)
        if ok:
            below = 0
            tied = 0
            j = int(first)
            while j >= 0:
                ok_j, w = _rack_member(ts, j, node_state, stale_s, what, seen_at)
                if ok_j:
                    below += 1 if w < v else 0
                    tied += 1 if w == v else 0
                j = int(node_state[j, NODE_NEXT])
            if below <= lo_rank < below + tied:
                lo = v
            if below <= hi_rank < below + tied:
                hi = v
        k = int(node_state[k, NODE_NEXT])
    return 0.5 * (lo + hi)  # type: ignore[no-any-return]


@inline
def rebase_nodes(ts: float, rack: int, rack_state: np.ndarray, node_state: np.ndarray, stale_s: float) -> None:
    """Follow the inlet's move (RACK_MOVE: the median move of the re-based proxies of the nodes that
    counted at the rack's last tick and now, their work kept; none such: it starts over from this
    tick) and re-base each node counted now whose least power moved by ``PROXY_STEP_W`` from its
    anchor, ``PROXY_SETTLE_S`` after that was first seen: its step from the anchor less the inlet's
    move meanwhile, over its power's, is its boards' excess resistance where it tells (see
    PROXY_STEP_C): its proxy then goes on from where it stood (re-based, plus the inlet's move), else
    it is read as it is. Without a move to read the step against (no node kept its work through it)
    the node keeps what it had: every node of the rack changed its work."""
    seen_at = rack_state[rack, RACK_SEEN_AT]
    move = _rack_median(ts, rack, rack_state, node_state, stale_s, MEMBER_MOVE, 1)
    moved = rack_state[rack, RACK_MOVE] + move
    if moved != moved:  # (NaN: no node kept its work from the last tick, or none seen yet)
        moved = 0.0
        rack_state[rack, RACK_MOVE_FROM] = ts
    rack_state[rack, RACK_MOVE] = moved
    r_nominal = facts.THERMAL_RESISTANCE_C_PER_W  # (as RACK_PROXY_STEADY_C reads it)
    k = int(rack_state[rack, RACK_NODE0])
    while k >= 0:
        v, vts, dev, power = node_proxy_now(ts, k, node_state)
        if _counts_for_rack(ts, v, vts, dev, stale_s):
            settled = True
            node_state[k, NODE_OUT] = 0.0
            step_w = power - node_state[k, NODE_ANCHOR_P]
            if abs(step_w) >= PROXY_STEP_W:  # (False for NaN) its work moved
                if not node_state[k, NODE_MOVED_AT] > node_state[k, NODE_ANCHOR_AT]:
                    node_state[k, NODE_MOVED_AT] = ts  # first seen now
                settled = ts - node_state[k, NODE_MOVED_AT] >= PROXY_SETTLE_S
                inlet_moved = moved - node_state[k, NODE_ANCHOR_MOVE]
                step_c = (v - node_state[k, NODE_ANCHOR_V] - inlet_moved) * (1.0 if step_w > 0.0 else -1.0)
                if node_state[k, NODE_ANCHOR_AT] >= rack_state[rack, RACK_MOVE_FROM]:  # the step can be read
                    excess = step_c / abs(step_w)
                    if not settled:
                        node_state[k, NODE_OUT] = 1.0 if step_c >= PROXY_STEP_C else 0.0
                    elif step_c >= PROXY_STEP_C and excess <= PROXY_EXCESS_MAX * r_nominal:
                        node_state[k, NODE_EXCESS] = excess
                        node_state[k, NODE_BASE] = node_state[k, NODE_ANCHOR_C] + inlet_moved - v + excess * power
                    else:
                        node_state[k, NODE_EXCESS] = 0.0
                        node_state[k, NODE_BASE] = 0.0
            c = rebased_proxy(v, power, k, node_state)
            if settled:
                node_state[k, NODE_ANCHOR_AT] = ts
                node_state[k, NODE_ANCHOR_V] = v
                node_state[k, NODE_ANCHOR_C] = c
                node_state[k, NODE_ANCHOR_P] = power
                node_state[k, NODE_ANCHOR_MOVE] = moved
            node_state[k, NODE_LAST_AT] = ts
            node_state[k, NODE_LAST_C] = c
            node_state[k, NODE_LAST_P] = power
        k = int(node_state[k, NODE_NEXT])
    rack_state[rack, RACK_SEEN_AT] = ts


@inline
def rack_proxy(ts: float, rack: int, rack_state: np.ndarray, node_state: np.ndarray, stale_s: float) -> float:
    """The median of the fresh proxies of the rack's steady nodes, each re-based where its boards
    read over nominal R (:func:`rebase_nodes`; NaN under RACK_PROXY_MIN_NODES of them).

    A node's own proxy moves with whatever heats that node alone: failed fans raise all its GPUs
    at the same power, just as a warmer inlet would, and read as its inlet rising. The loop's
    inlet moves every node of the rack."""
    if rack_state[rack, RACK_NODE0] != rack_state[rack, RACK_NODE0]:
        return np.nan  # no nodes linked (an importer's unknown rack)
    rebase_nodes(ts, rack, rack_state, node_state, stale_s)
    return _rack_median(ts, rack, rack_state, node_state, stale_s, MEMBER_PROXY, RACK_PROXY_MIN_NODES)


INLET_RACK, INLET_RACK_PROXY, INLET_NODE_PROXY = 1.0, 2.0, 3.0
INLET_SOURCES = 4.0
"""Where :func:`read_inlet`'s value came from: the rack's own reading, the rack's proxy, the node's;
the rack's reading after ``k`` level shifts (``RACK_SHIFTS``) is source
``INLET_RACK + k * INLET_SOURCES``.
The proxies sit where ``R_nominal`` puts the inlet, not where it is: on GPUs whose resistance is
not nominal (another SKU, air cooling, a rack sensor on the facility side) they read several °C
off the rack's reading, and a switch between sources is a step that the inlet's trend must not
take for the loop warming (see ``thermal_fit.observe``)."""


@inline
def read_inlet(ts: float, node: int, rack: int, rack_state: np.ndarray, node_state: np.ndarray,
               stale_s: float) -> tuple[float, float]:
    """The inlet temperature a GPU sees at ``ts`` and where it came from (``INLET_*``; NaN, NaN
    when none is fresh): its rack's; else the rack's proxy (the median of its steady nodes'
    proxies, each re-based where its boards read over nominal R: :func:`rebase_nodes`; looked for
    at the rack's first sample of a tick and held while too few nodes are steady); else its node's
    proxy of the last tick."""
    if rack >= 0:
        inlet = rack_state[rack, RACK_INLET]
        if inlet == inlet and ts - rack_state[rack, RACK_TS] <= stale_s:
            shifts = rack_state[rack, RACK_SHIFTS]
            return inlet, INLET_RACK + (shifts * INLET_SOURCES if shifts == shifts else 0.0)
        if not ts <= rack_state[rack, RACK_PROXY_AT] + TICK_EPS_S:
            rack_state[rack, RACK_PROXY_AT] = ts
            median = rack_proxy(ts, rack, rack_state, node_state, stale_s)
            if median == median:
                rack_state[rack, RACK_PROXY] = median
                rack_state[rack, RACK_PROXY_TS] = ts
        proxy = rack_state[rack, RACK_PROXY]
        if proxy == proxy and ts - rack_state[rack, RACK_PROXY_TS] <= stale_s:
            return proxy, INLET_RACK_PROXY
    proxy = node_state[node, NODE_PROXY]
    if proxy == proxy and ts - node_state[node, NODE_PROXY_TS] <= stale_s:
        return proxy, INLET_NODE_PROXY
    return np.nan, np.nan


@inline
def gpu_inlet(ts: float, node: int, rack: int, temp: float, power_f: float, rack_state: np.ndarray,
              node_state: np.ndarray, r_nominal: float, stale_s: float) -> float:
    """The inlet temperature this GPU sees at ``ts`` (NaN when unknown), feeding this sample
    into its node's proxy first (:func:`node_tick`, :func:`node_feed`, :func:`read_inlet`). Its
    callers pass the sample's own power as ``power_f``, unfiltered: every node counts as steady."""
    node_tick(ts, node, node_state)
    node_feed(node, temp, power_f, node_state, r_nominal, 0.0)
    return read_inlet(ts, node, rack, rack_state, node_state, stale_s)[0]
