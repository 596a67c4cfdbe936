"""The evaluation harness: run detectors over a recording and score them against its ground truth.

What "predict" means here (DESIGN.md): a prediction is a hit when the predicted event happens
within its horizon, and its lead time is how early it came. Concretely, per *event kind*
(:data:`EVENT_KINDS`, the extension point — later issues add ``link_down``, ``congestion``):

- **Episodes**: the kind's start events per entity; a start within ``merge_gap_s`` of the
  previous episode's end continues it (a throttle that releases for a moment is one episode),
  unless it names a fault (``fault_id``) other than that episode's: then it starts an episode of
  its own (until 2026-12-02 a PSU failure's power cap 90 s after a fault-free one let go merged
  into it, and was scored as that one: fault-free, and inside the warm-up). Two starts of one
  entity at the same instant naming two faults (hand-written ground truth: the simulator gives one
  cause) are two episodes, the first ending as it starts, and an alarm's claim predicts only the
  first (an audit, 2026-12-05: recall 0.5 where the tests' naive reference says 1.0; not mended,
  as an episode has one fault type). Each episode keeps
  its fault type (``none`` for consequences without a fault, such as the power cap under full
  load). A kind with no end event (``end_type`` None) has instants: each
  ends where it starts, so only instants within ``merge_gap_s`` of each other are one episode
  (until 2026-12-02 an instant never ended, and all of an entity's merged into one episode).
- **Alarms**: a detector's prediction for an entity is active from its first ``active=True``
  until its withdrawal (``active=False``) or the end of the recording; refreshes are part of it.
- **Ground truth** (:func:`read_ground_truth`): an event naming an entity the topology lacks
  (``node99/gpu0`` in a smaller cluster) is set aside, counted in the report's meta
  (``events_unknown_entity``) and logged: no detector can predict it (until 2026-12-02 it ended
  the run with a ``KeyError``, or counted as a missed episode). A recording without
  ``events.jsonl`` (a real capture) is scored as one where nothing happened — every alarm a false
  one — with meta ``ground_truth: false`` and a warning.
- **Warm-up**: episodes that start within ``warmup_s`` of the recording's first sample are not
  scored (under way before the detectors saw the entity, or too early to predict).
- **Recall**: an alarm's claim is about the first episode of its entity that starts after the
  alarm was raised, and that episode is predicted when one of the alarm's statements (one at its
  start and one per horizon it stays active, as the precision rule below counts them) covers its
  onset: raised at ``s`` and active until ``w``, it predicts the episode starting at ``start``
  when ``s < start <= s + horizon * max(ceil((w - s) / horizon), 1)`` — strictly after it was
  raised (firing once the throttle bit is set predicts nothing) and within its last statement's
  horizon. Its lead is ``start - max(s, start - horizon)``, from the earliest such alarm. So an
  alarm earns at most one episode — kept up past the merge gap after it, from its next statement
  on it is scored as an alarm raised then (below), which may earn the next — and one that earns it
  is a true positive for precision wherever its statement is judged; a statement precision leaves
  unjudged (its horizon outlives the recording, its job stopped) still predicts the episode it
  covers. (Until 2026-12-01 an
  alarm kept up through an episode earned the next one too, with the full horizon as its lead —
  the same "it may happen again" claim the precision rule below leaves unjudged; until
  2026-12-02 an episode was predicted by an alarm active at some time in
  ``[start - horizon, start)``: one raised before an earlier episode still earned an episode
  within a horizon after that one's onset, and one withdrawn early earned an episode its last
  statement's horizon had ended before — a hit for recall and a false alarm for precision.)
- **Precision**: an alarm that starts inside an episode (or within ``merge_gap_s`` after it) is
  not scored — for precision nor for recall (it cannot earn the entity's next episode) — unless
  it starts after that episode ended and the entity's next episode starts within the gap: that
  one is another fault's, split off (a PSU failure's cap 90 s after a fault-free cap let go), and
  the alarm is judged by it (until 2026-12-04 such an episode could never be predicted, and was
  scored as missed). A statement that comes true on an episode recall does not score (one in the
  warm-up) is not judged either (until 2026-12-04 it was a true positive). Nor is
  a statement during which the GPU's job stopped (ground truth ``job_slowdown_start``,
  reason ``interrupted``, or an XID 79 on one of its GPUs: a member fell off the bus or shut
  down; or ``job_end``: the job finished), unless its episode came first: an
  idle GPU cannot confirm or refute a claim about its load. That holds for a stop after the alarm
  was withdrawn too, within its last statement's horizon, and for every stop its statements
  reach (until 2026-12-04 only the first). Any other alarm states "the event comes within the
  horizon" once per horizon it stays active; each such statement is a true positive when an
  episode of that entity starts within the horizon after it, otherwise a false alarm. An alarm whose claim an episode settled
  (it came true on it, or the alarm was raised in it) and that is still up at its first statement
  after that episode's merge gap claims anew from that statement, as one raised again then would:
  judged statement by statement, and able to predict the entity's next episode (:func:`_continued`;
  until 2026-12-04 nothing it stated after its first hit was judged however long it stayed up, so
  an alarm never withdrawn had no false alarm after its first true one).
- **Censoring** (``censor_at_end``: the thermal kinds and link-down): a statement whose horizon
  outlives the recording is not judged — a 30-minute claim made in its last 30 minutes cannot be
  checked, whether or not its event came (until 2026-12-01 one that came counted as a hit, and
  one that did not was left out: precision leaned up).
- **False alarms per 1000 GPU-hours** (entity-hours for other kinds): false statements over
  the entities' observed time: the recording's span times the entities of the kind it observed —
  those with a row the input guard let through (a link: its own or one of its optics', from which
  its going down is predicted; :attr:`RunResult.observed`), not every entity
  its topology lists (until 2026-12-03 a capture of part of a fleet, a topology listing spare
  nodes, or a scrape with half the nodes down diluted the rate by the GPUs that never reported).
  Each observed entity counts the whole span, not its own first to last row: on the simulator's
  recordings every GPU reports from the first tick, and a GPU lost mid-run (an XID 79) still
  counts the hours after it, as it always has, so their figures are unchanged.

``by_fault`` repeats the figures per fault type: episodes by the fault they started under;
false alarms on an entity the fault affected while it was active, or within the simulator's
aftermath after its repair (``AFTERMATH_S``: the window it attributes consequences in, a loop
still cooling down; a node's PSU or fans have none, as in the simulator since 2026-12-05), are
charged to that fault, the rest to ``none``. Each fault's false-alarm
rate divides by the same entity-hours as the total, so the faults' rates add up to it. Under
several such faults at once, a false alarm is charged to a fault still active over one in its
aftermath, then to the latest to begin (until 2026-12-02 to the earliest, then to the latest to
begin whether active or in its aftermath). The simulator names the active fault that raises the
GPU's temperature most (the later on a tie, since 2026-12-04): the two differ only where the later
fault is the weaker, which the scorer cannot see (it reads events, not the physics).

Additive keys (the documented shape above stays as it is):

- ``leads_s``: the lead of each predicted scored episode, ascending (seconds) — what
  ``lead_median_s`` and ``lead_p10_s`` summarise, and what the lead-time plot draws.
- ``recall_at_min_lead`` (kinds with ``min_lead_s``): the share of scored episodes predicted at
  least that far ahead — 5 minutes for thermal kinds, 30 s for the power cap. A hit with a few
  seconds' warning (an alarm at 85 °C) counts for recall, not here.
- ``by_onset`` (kinds with ``classify_onset``: the power cap): recall and lead per
  :data:`ONSET_CLASSES` — what the GPU's own telemetry shows before the onset. **Rule: the
  power-cap target (recall >= 0.9, median lead >= 30 s) is judged on ``steady_load`` episodes**
  (loaded for at least a minute, no power brake or thermal throttle, no step in the workload);
  ``job_start`` episodes (the GPU was idle within a minute of the onset: work hit the limit from
  its first steps) and ``load_step`` episodes (mean power jumped >= 20 % in the last minute) have
  nothing in telemetry before them to predict from, and ``power_brake`` ones (the HW power
  brake held the clock just before: a PSU event) and ``thermal_throttled`` ones (a thermal
  limiter held it) are the power limiter taking over from the brake or that limiter, not a
  slowdown.
  Precision and false alarms are not split by class (a false alarm predicts no episode); each
  class repeats recall and lead ``by_fault``.
- ``by_onset[class]["clock_change"]`` (where the frames carry ``sm_clock``): how the SM clock
  changed across the class's onsets, first sample at or after the onset less the last before —
  ``median_mhz``, the shares of onsets where it ``rose`` and ``fell``, and how many ``onsets``
  had both readings (None: none had).
- ``by_onset[class]["by_capped_time"]`` (where the GPU frames carry the power-throttle
  counter, ``power_throttle_time``: NVML's power violation time): recall and lead per
  :data:`CAPPED_TIME_CLASSES` — how long the power limiter actually held the clock over the
  episode, the counter's increase from the last sample before its onset to the first after its
  end. An episode whose limiter held for under a second in all (a compute phase touching the
  limit at its hottest instant, then letting go) is a different thing to predict from one
  that holds for minutes; the split shows which of them a detector misses.
- ``matched`` (baselines that score samples against a threshold): the best recall the baseline
  reaches at precision >= the ``foreshock`` set's precision for that kind, its alarm threshold
  swept over its own logged scores and its alarms replayed by its own alarm rule
  (:func:`matched_threshold`) — the precision-matched comparison.

Report sections (:data:`SECTION_SCORERS`) score what is not a timed prediction of an event kind:
``congestion`` (:mod:`.evaluation_fabric`), ``incidents`` (:mod:`.incident_eval`), and ``cooling``
and ``straggler`` (:mod:`.evaluation_anomalies`: how early a failing thermal interface or fan is
flagged; whether the GPU that sets a slowed job's pace is named).

The harness runs the detectors in one bank over time-aligned windows of the recording (racks
and nodes before GPUs, so a GPU's inlet is the one measured at the same tick), behind the same
input guard as the embedded pipeline. Detector *sets* (:data:`DETECTOR_SETS`) name what is
compared side by side: ``foreshock`` (the default bank) and the baselines.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from foreshock import facts
from foreshock.events import Event
from foreshock.fields import ENTITY_KINDS
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import EVENTS_FILE, Recording
from foreshock.topology import Topology

from .alarm import prediction_spans
from .bank import DetectorBank
from .baselines import ScoredBaseline, ScoreLog
from .gpu_inputs import reason_bits_column
from .incident_eval import AFTERMATH_S, INCIDENT_SET
from .incidents import IncidentEngine
from .registry import DEFAULT_BANK, create
from .thermal import holds_thermally


# ---- the extension point: what is scored ---------------------------------------------------
@dataclass(frozen=True)
class EventKind:
    """One kind of predicted event: which ground-truth events, which prediction, which entities."""

    name: str
    start_type: str  # events.jsonl type that starts an episode
    end_type: str | None  # ... and ends it (None: episodes are instants)
    prediction: str  # Prediction.event that predicts it
    entity_kind: str  # gpu, link, ...
    horizon_s: float  # a prediction claims the event within this
    merge_gap_s: float = 600.0
    warmup_s: float = 600.0  # episodes starting this soon after the recording starts are not scored
    censor_at_end: bool = False  # a claim whose horizon outlives the recording is not judged
    classify_onset: bool = False  # report recall by what precedes an episode (ONSET_CLASSES)
    min_lead_s: float | None = None  # the lead a prediction needs to be useful (recall_at_min_lead)


EVENT_KINDS: dict[str, EventKind] = {
    # a 30-minute claim made in the recording's last 30 minutes cannot be checked: not judged
    "thermal_throttle": EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end",
                                  "thermal_throttle", "gpu", horizon_s=1800.0, min_lead_s=300.0,
                                  censor_at_end=True),
    "hbm_overheat": EventKind("hbm_overheat", "hbm_overheat_start", "hbm_overheat_end",
                              "hbm_overheat", "gpu", horizon_s=1800.0, min_lead_s=300.0, censor_at_end=True),
    "power_cap": EventKind("power_cap", "power_cap_start", "power_cap_end", "power_cap", "gpu",
                           horizon_s=300.0, merge_gap_s=120.0, classify_onset=True, min_lead_s=30.0),
}
"""Event kinds scored, by name. Add a kind with one entry (or :func:`register_event_kind`)."""


def register_event_kind(kind: EventKind) -> None:
    EVENT_KINDS[kind.name] = kind


DETECTOR_SETS: dict[str, tuple[str, ...] | None] = {
    "foreshock": None,  # None: the registry's DEFAULT_BANK, whatever it holds today
    # the default bank with the opt-in cooling-loss warning from GPU telemetry alone (loop_warming)
    "foreshock+loop_warming": (*DEFAULT_BANK, "loop_warming"),
    "river": ("river_hst",),
    "sklearn": ("sklearn",),
    "threshold": ("threshold",),
}
"""Detector sets compared side by side: name -> registry names of the detectors in the set."""

log = logging.getLogger("foreshock.evaluation")

SectionScorer = Callable[["RunResult"], dict[str, Any]]
SECTION_SCORERS: dict[str, SectionScorer] = {}
"""Extra report sections (e.g. incident scoring): name -> function of the run's result whose
output lands in ``report.json`` under that name."""

METRICS = ("episodes", "recall", "precision", "lead_median_s", "lead_p10_s",
           "false_alarms_per_1000_gpu_hours")
NO_FAULT = "none"


def set_members(name: str) -> tuple[str, ...]:
    if name not in DETECTOR_SETS:
        raise ValueError(f"unknown detector set {name!r}; known: {sorted(DETECTOR_SETS)}")
    members = DETECTOR_SETS[name]
    return tuple(DEFAULT_BANK) if members is None else members


# ---- what precedes an episode ---------------------------------------------------------------
ONSET_CLASSES = ("job_start", "power_brake", "thermal_throttled", "load_step", "steady_load")
"""How a GPU episode begins, judged from the GPU's own telemetry before its onset
(:func:`classify_onsets`; where several apply, the first listed):

- ``job_start``: the GPU reported idle (utilisation < 0.5 or the idle reason bit) within
  :data:`JOB_START_S` before the onset — work started and hit the limit at once; nothing in
  telemetry precedes it, so no detector can be expected to predict it.
- ``power_brake``: the GPU's last sample before the onset carried the HW power brake bit (0x80):
  the node braked it (a failed PSU), and the power cap took over as the brake let go — a power
  event, not a thermal one, and not a throttle to forecast. The brake also sets HW slowdown
  (0x88); a thermal bit beside it does not make the onset ``thermal_throttled``, as the brake
  held the clock at its floor, beneath where a thermal limiter would hold it.
- ``thermal_throttled``: the GPU's last sample before the onset carried a thermal throttle bit
  (SW or HW thermal, or HW slowdown without the power brake: :func:`thermally_held`): a thermal
  limiter already held its clock, and the power cap took over as that limiter let go — on the
  simulator's recordings the SM clock *rose* across 85-95 % of these onsets and across none of
  the ``steady_load`` ones. Not a slowdown, so not a throttle to forecast; a cooling fault makes
  many of them (report key ``clock_change``).
- ``load_step``: loaded throughout that window, but its mean power (energy counter) over the
  last :data:`JOB_START_S` is at least :data:`LOAD_STEP_RATIO` above the mean over the
  :data:`LOAD_BEFORE_S` before — the workload itself stepped up (a job's pace recovering).
- ``steady_load``: loaded, no power brake or thermal throttle, and no such step: the onset
  follows minutes of unthrottled running under load, so the trend that leads to it is in the
  telemetry. The power-cap target (recall >= 0.9, median lead >= 30 s) is judged on this
  class."""
JOB_START_S = 60.0
LOAD_BEFORE_S = 300.0
LOAD_STEP_RATIO = 0.2
PREDICTABLE_ONSET = "steady_load"
CAPPED_TIME_CLASSES: dict[str, tuple[float, float]] = {"under_1s": (0.0, 1.0), "1s_or_more": (1.0, math.inf)}
"""Episodes by the seconds the power limiter held the clock over them (``[low, high)``);
``unknown`` where the counter is missing or went backwards (a reset)."""


def thermally_held(bits: np.ndarray) -> np.ndarray:
    """Per throttle-reason bitmask (int64; -1 where not reported, read as False): whether a thermal
    limiter held the clock — SW thermal (0x20) or HW thermal (0x40), or HW slowdown (0x8) the HW
    power brake (0x80) does not explain (the thermal detector's rule, ``thermal.holds_thermally``).
    A braking PSU sets 0x88: HW slowdown, but no heat."""
    bits = np.asarray(bits, dtype=np.int64)
    return (bits >= 0) & holds_thermally(bits)


@dataclass
class OnsetTelemetry:
    """What the harness keeps of every GPU sample to classify onsets: columns sorted by
    (slot, ts) once :meth:`finish` ran."""

    slot: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ts: np.ndarray = field(default_factory=lambda: np.empty(0))
    energy: np.ndarray = field(default_factory=lambda: np.empty(0))
    idle: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    held: np.ndarray = field(default_factory=lambda: np.empty(0))  # power-throttle counter (s)
    thermal: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # a thermal limiter held the clock
    brake: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # the HW power brake held it (0x80)
    clock: np.ndarray = field(default_factory=lambda: np.empty(0))  # SM clock (Hz)
    keys: np.ndarray = field(default_factory=lambda: np.empty(0))  # (slot, ts) search keys, sorted
    t0: float = 0.0  # the first sample's time, the keys' origin
    _parts: list[tuple[np.ndarray, ...]] = field(default_factory=list)

    def add(self, frame: Frame) -> None:
        n = len(frame)
        nan = np.full(n, np.nan)

        def column(name: str) -> np.ndarray:
            return np.asarray(frame.columns.get(name, nan), dtype=float).copy()

        util = column("util")
        bits = reason_bits_column(column("throttle_reasons"))  # -1: not reported
        known = bits >= 0
        self._parts.append((frame.slot.astype(np.int64), frame.ts.astype(float), column("energy"),
                            (util < 0.5) | (known & ((bits & facts.THROTTLE_IDLE) != 0)),
                            column("power_throttle_time"),
                            known & thermally_held(bits),
                            column("sm_clock"),
                            known & ((bits & facts.THROTTLE_HW_POWER_BRAKE) != 0)))

    def finish(self) -> "OnsetTelemetry":
        if self._parts:
            slot, ts, energy, idle, held, thermal, clock, brake = (np.concatenate(c) for c in zip(*self._parts))
            order = np.lexsort((ts, slot))
            self.slot, self.ts, self.energy, self.idle = slot[order], ts[order], energy[order], idle[order]
            self.held, self.thermal, self.clock = held[order], thermal[order], clock[order]
            self.brake = brake[order]
            self.t0 = float(np.min(self.ts))
            self.keys = _key(self.slot, self.ts, self.t0)
            self._parts = []
        return self

    def index(self, slot: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Per GPU ``slot`` and time ``t``: the index of its first sample at or after ``t``; past
        its last sample, the next GPU's first (or the end)."""
        return np.searchsorted(self.keys, _key(slot, t, self.t0), side="left")

    def around(self, slot: np.ndarray, onset: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per episode (GPU ``slot``, ``onset`` time): the index of the GPU's last sample before the
        onset and of its first at or after it, and whether each exists."""
        if not len(self.ts):
            z, no = np.zeros(len(slot), np.int64), np.zeros(len(slot), bool)
            return z, z, no, no
        i = self.index(slot, onset)
        last = len(self.ts) - 1
        before, after = np.clip(i - 1, 0, last), np.clip(i, 0, last)
        return (before, after, (i >= 1) & (self.slot[before] == slot),
                (i <= last) & (self.slot[after] == slot))


def classify_onsets(tel: OnsetTelemetry, slot: np.ndarray, onset: np.ndarray) -> np.ndarray:
    """:data:`ONSET_CLASSES` code of each episode (GPU ``slot``, ``onset`` time), from the GPU's
    samples strictly before its onset. A GPU never seen idle counts as loaded; without energy
    readings no step is seen."""
    out = np.full(len(slot), ONSET_CLASSES.index("steady_load"), dtype=np.int64)
    if not len(tel.ts) or not len(slot):
        return out
    keys = tel.keys

    def same(i: np.ndarray) -> np.ndarray:
        ok = (i >= 0) & (i < len(keys))
        return ok & (tel.slot[np.clip(i, 0, len(keys) - 1)] == slot)

    def mean_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        i, j = tel.index(slot, a), tel.index(slot, b) - 1  # the GPU's samples in [a, b)
        ok = same(i) & same(j) & (j > i)
        i, j = np.clip(i, 0, len(keys) - 1), np.clip(j, 0, len(keys) - 1)
        dt = tel.ts[j] - tel.ts[i]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok & (dt > 0), (tel.energy[j] - tel.energy[i]) / np.where(dt > 0, dt, 1.0), np.nan)

    idle_keys = keys[tel.idle]
    j = np.searchsorted(idle_keys, _key(slot, onset, tel.t0), side="left") - 1
    jj = np.clip(j, 0, max(len(idle_keys) - 1, 0))
    idle_slot, idle_ts = tel.slot[tel.idle], tel.ts[tel.idle]
    if len(idle_keys):
        last_idle = np.where((j >= 0) & (idle_slot[jj] == slot), idle_ts[jj], -np.inf)
    else:
        last_idle = np.full(len(slot), -np.inf)
    recent = mean_power(onset - JOB_START_S, onset)
    earlier = mean_power(onset - JOB_START_S - LOAD_BEFORE_S, onset - JOB_START_S)
    with np.errstate(invalid="ignore"):
        step = recent >= earlier * (1.0 + LOAD_STEP_RATIO)
    out[step] = ONSET_CLASSES.index("load_step")
    before, _, has_before, _ = tel.around(slot, onset)
    out[has_before & tel.thermal[before]] = ONSET_CLASSES.index("thermal_throttled")
    out[has_before & tel.brake[before]] = ONSET_CLASSES.index("power_brake")
    out[onset - last_idle <= JOB_START_S] = ONSET_CLASSES.index("job_start")
    return out


def clock_change(tel: OnsetTelemetry, slot: np.ndarray, onset: np.ndarray) -> np.ndarray:
    """SM clock (Hz) at each episode's first sample at or after its onset less at its last one
    before: negative where the limiter cut the clock. NaN without both readings."""
    if not len(tel.ts):
        return np.full(len(slot), np.nan)
    before, after, has_before, has_after = tel.around(slot, onset)
    return np.where(has_before & has_after, tel.clock[after] - tel.clock[before], np.nan)


def capped_seconds(tel: OnsetTelemetry, slot: np.ndarray, onset: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Seconds the power limiter held each episode's GPU (``slot``) from ``onset`` to ``end``
    (inf: still capped when the recording ends): the power-throttle counter's increase from
    the GPU's last sample before the onset to its first at or after the end (its last sample
    for an open episode). NaN without both readings, or where the counter went backwards."""
    out = np.full(len(slot), np.nan)
    if not len(tel.ts) or not len(slot):
        return out
    b, _, has_before, _ = tel.around(slot, onset)
    _, a, _, has_after = tel.around(slot, end)  # none after an open episode's end (inf)
    gpu_last = np.clip(np.searchsorted(tel.slot, slot, side="right") - 1, 0, len(tel.ts) - 1)
    a = np.where(has_after, a, gpu_last)
    ok = has_before & (tel.slot[a] == slot) & (a > b)
    with np.errstate(invalid="ignore"):
        held = tel.held[a] - tel.held[b]
        ok &= held >= 0.0
    out[ok] = held[ok]
    return out


# ---- ground truth -------------------------------------------------------------------------
@dataclass
class GroundTruth:
    """A recording's ground-truth events as scoring and training read them."""

    events: list[Event]  # every event whose entity the topology knows (or whose kind it does not index)
    unknown_entity: list[Event]  # set aside: naming an entity the topology lacks
    present: bool  # the recording has an events file (a real capture may have none)


UNKNOWN_SHOWN = 3
"""Events named in the warning about events of unknown entities (the rest counted)."""


def read_ground_truth(recording: Recording, *, warn_missing: bool = True, warn_unknown: bool = True) -> GroundTruth:
    """``recording``'s events (``events.jsonl``) less those naming an entity its topology lacks: no
    detector can predict one (it has no slot to be predicted on), and every reader of the events
    looked its name up. The one place such events are dropped, for scoring (:func:`run_recording`,
    :func:`pick_trace_gpus`), training (:func:`foreshock.detectors.train.build_dataset`) and
    ``foreshock incidents``. Entities of a kind the topology does not index (none in the
    simulator's events) are kept: no reader looks them up.

    With ``warn_unknown``, a warning names a few events set aside; with ``warn_missing``, one says
    the recording has no events file and every alarm then counts as a false one — true where
    alarms are scored (``evaluate``, ``train``), not where none are (``incidents``)."""
    events = recording.events()
    present = (recording.path / EVENTS_FILE).is_file()
    topo = recording.topology
    resolve = topo.slots_resolver()
    named = {"loop": set(topo.loops), "cooling_loop": set(topo.loops), "switch": set(topo.switches)}

    def unknown(ev: Event) -> bool:
        if ev.entity_kind in ENTITY_KINDS:
            return resolve(ev.entity_kind, ev.entity) < 0
        return ev.entity_kind in named and ev.entity not in named[ev.entity_kind]

    known: list[Event] = []
    lacking: list[Event] = []
    for ev in events:
        (lacking if unknown(ev) else known).append(ev)
    truth = GroundTruth(known, lacking, present)
    if warn_unknown and lacking:
        shown = ", ".join(f"{ev.type} of {ev.entity_kind} {ev.entity!r}" for ev in lacking[:UNKNOWN_SHOWN])
        more = f" and {len(lacking) - UNKNOWN_SHOWN} more" if len(lacking) > UNKNOWN_SHOWN else ""
        log.warning("%s: %d ground-truth events name entities its topology lacks, set aside (no detector "
                    "can predict them): %s%s", recording.path / EVENTS_FILE, len(lacking), shown, more)
    if warn_missing and not present:
        log.warning("%s: no ground truth (no %s): scored as if nothing happened, every alarm a false one",
                    recording.path, EVENTS_FILE)
    return truth


# ---- running ------------------------------------------------------------------------------
KIND_ORDER = ("rack", "node", "job", "link", "optic", "gpu")
"""Within one window: the environment first, GPUs last (they read their inlet)."""


def aligned_frames(recording: Recording, kinds: Iterable[str], window_s: float | None = None,
                   batch_rows: int = 262_144) -> Iterator[Frame]:
    """Frames of ``kinds`` cut into time windows, ordered by :data:`KIND_ORDER` inside each
    (see :meth:`Recording.iter_frames`: a window never carries samples from after its end)."""
    return recording.iter_frames(window_s, batch_rows, kinds=kinds, order=KIND_ORDER)


@dataclass
class RunResult:
    recording: Recording
    findings: dict[str, list[Finding]]  # by detector set
    events: list[Event]
    start: float
    end: float
    wall_s: float
    samples: int
    traces: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # gpu slot -> series
    health: PipelineHealth = field(default_factory=PipelineHealth)
    onsets: OnsetTelemetry | None = None  # to classify episodes by what precedes them
    score_logs: dict[str, list[ScoreLog]] = field(default_factory=dict)  # set -> its baselines' scores
    telemetry: tuple[str, ...] = ()  # the entity kinds fed to the detectors or the incident engine
    # what the incidents section replays beside the findings (IncidentEngine.frame_fields' kinds the
    # run was given), read again from the recording in the windows the detectors saw
    incident_telemetry: tuple[str, ...] = ()
    window_s: float | None = None
    ground_truth: bool = True  # the recording has an events file (false: nothing happened, as far as it says)
    events_unknown_entity: int = 0  # ground-truth events set aside: their entity is not in the topology
    # entity kind -> how many of its entities the recording observed, for every kind an event kind
    # scores (run_recording); the denominator of the false-alarm rates
    observed: dict[str, int] = field(default_factory=dict)
    # the entity kinds fed to the detectors themselves (not the incident engine's): what ``samples``
    # counts, the rows of these kinds the input guard let through
    detector_kinds: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        span = self.end - self.start
        return span if span > 0.0 else 0.0  # (0 for a recording with no samples: NaN start and end)

    def entities_observed(self, entity_kind: str) -> int:
        """The entities of ``entity_kind`` the false-alarm rates count: those the run observed
        (:attr:`observed`), or, for a result built without a run, every one the topology lists."""
        if entity_kind in self.observed:
            return self.observed[entity_kind]
        return self.recording.topology.size(entity_kind)


def run_recording(recording: Recording, sets: Sequence[str],
                  params: dict[str, dict[str, Any]] | None = None,
                  trace_gpus: Sequence[int] = (), window_s: float | None = None,
                  progress: Callable[[float, float], None] | None = None,
                  log_scores: bool = True, telemetry: Sequence[str] | None = None) -> RunResult:
    """Run every detector of ``sets`` in one bank over the recording; findings split by set.

    ``telemetry`` limits the entity kinds fed to the detectors (default: every kind the bank
    reads): ``("gpu", "job")`` is what a GPU exporter alone (dcgm-exporter) gives a deployment —
    no rack inlet or coolant flow, so the thermal model reads its inlet from the GPUs themselves
    (:func:`foreshock.detectors.gpu_inputs.read_inlet`). The same limit holds for the telemetry
    the incidents section gives the incident engine (``RunResult.incident_telemetry``).

    With ``log_scores`` every baseline that scores samples against a threshold keeps its scores
    (:class:`~foreshock.detectors.baselines.ScoreLog`) for the precision-matched comparison."""
    params = params or {}
    topo = recording.topology
    health = PipelineHealth()
    names: list[str] = []
    for s in sets:
        names.extend(m for m in set_members(s) if m not in names)
    detectors = [create(n, topo, **params.get(n, {})) for n in names]
    # a finding names its detector; route it to every set that holds that detector
    sets_of = {det.name: [s for s in sets if n in set_members(s)] for n, det in zip(names, detectors)}
    bank = DetectorBank(topo, detectors)
    score_logs: dict[str, list[ScoreLog]] = {s: [] for s in sets}
    if log_scores:
        for det in detectors:
            log = det.log_scores() if isinstance(det, ScoredBaseline) else None
            for s in sets_of[det.name] if log is not None else ():
                score_logs[s].append(log)  # type: ignore[arg-type]
    onsets = OnsetTelemetry()
    truth = read_ground_truth(recording)
    found: dict[str, list[Finding]] = {s: [] for s in sets}
    meta_start, meta_end = recording.meta.get("start"), recording.meta.get("end")
    start = float(meta_start) if meta_start is not None else math.nan
    end = float(meta_end) if meta_end is not None else math.nan
    traces: dict[int, dict[str, list[float]]] = {int(g): {"ts": [], "gpu_temp": [], "hbm_temp": []}
                                                 for g in trace_gpus}
    trace_idx = np.array(sorted(traces), dtype=np.int64)
    samples = 0
    wall0 = time.perf_counter()
    first = last = math.nan
    fed = tuple(k for k in bank.kinds if telemetry is None or k in telemetry)
    # the entities a row of which the guard let through: what the false-alarm rates count
    accepted = {k: np.zeros(topo.size(k), dtype=bool) for k in fed}
    for clean, findings in guarded_updates(recording, bank, fed, health, window_s):
        samples += len(clean)
        accepted[clean.kind][clean.slot] = True
        if clean.kind == "gpu":
            onsets.add(clean)
        for f in findings:
            for s in sets_of.get(getattr(f, "detector", ""), ()):
                found[s].append(f)
        t_hi = float(clean.ts[-1])
        first = t_hi if math.isnan(first) else min(first, float(clean.ts[0]))
        last = t_hi if math.isnan(last) else max(last, t_hi)
        if clean.kind == "gpu" and len(trace_idx):
            hit = np.isin(clean.slot, trace_idx)
            for row in np.flatnonzero(hit):
                tr = traces[int(clean.slot[row])]
                tr["ts"].append(float(clean.ts[row]))
                tr["gpu_temp"].append(float(clean.columns["gpu_temp"][row]))
                tr["hbm_temp"].append(float(clean.columns["hbm_temp"][row]))
        if progress is not None and not math.isnan(end):
            progress(t_hi - (start if not math.isnan(start) else first), end - start)
    start = first if math.isnan(start) else start
    end = last if math.isnan(end) else end
    # the engine reads telemetry of its own (job step times, link load) that no detector may read;
    # only the foreshock set's findings go through it (see incident_eval.score_run)
    incident_fed = tuple(k for k in IncidentEngine.frame_fields if (telemetry is None or k in telemetry)
                         and k in recording.kinds()) if INCIDENT_SET in sets else ()
    fed_kinds = tuple(k for k in ENTITY_KINDS if k in recording.kinds() and (k in fed or k in incident_fed))
    scored_kinds = sorted({kind.entity_kind for kind in EVENT_KINDS.values()} & set(ENTITY_KINDS))
    # (a kind scored but fed to no detector - links where no set reads the fabric, or `--telemetry
    # gpu,job` - has no alarm, and its observed entities are those with a row in the recording)
    seen = {k: accepted[k] if k in accepted else recording.reported_slots(k) for k in scored_kinds}
    if "link" in seen:
        # a link is observed through its optics too: the optics detector predicts a link's going
        # down from their rows alone (a DOM capture, the Alibaba series: no link row at all)
        optics = accepted["optic"] if "optic" in accepted else recording.reported_slots("optic")
        seen["link"] = seen["link"].copy()
        seen["link"][topo.optic_link[optics]] = True
    observed = {k: int(v.sum()) for k, v in seen.items()}
    return RunResult(recording, found, truth.events, start, end, time.perf_counter() - wall0,
                     samples, traces, health, onsets.finish(), {s: v for s, v in score_logs.items() if v},
                     fed_kinds, incident_fed, window_s, truth.present, len(truth.unknown_entity), observed,
                     tuple(k for k in ENTITY_KINDS if k in fed))


def guarded_updates(recording: Recording, bank: DetectorBank, kinds: Iterable[str], health: PipelineHealth,
                    window_s: float | None = None) -> Iterator[tuple[Frame, list[Finding]]]:
    """``bank`` fed ``recording``'s frames of ``kinds`` as the pipeline feeds its detectors: each
    frame through a fresh input guard (what it sets aside counted in ``health``) and the board-swap
    handling (:class:`_BoardSwaps`). Per frame the guard let a row of: that clean frame and what
    the bank found in it. What ``evaluate`` runs, and ``foreshock train`` to take
    its features. The guard holds rows to the recording's :attr:`~Recording.stream_anchor`, as a
    replay's does: a first tick stamped by a clock not set (1970) is counted, not taken as the
    entities' first samples."""
    guard = InputGuard(recording.topology, health)
    guard.stream_anchor = recording.stream_anchor
    swaps = _BoardSwaps(bank, guard)
    for frame in aligned_frames(recording, kinds, window_s):
        clean = guard.check(frame)
        if len(clean):
            yield clean, swaps.update(clean)


class _BoardSwaps:
    """``bank.update`` of guarded rows, as the embedded pipeline runs it where a GPU's board changes
    (``EmbeddedPipeline.process_rows``): the rows stamped before the change first, then the GPU's
    detector state restarted as a new GPU's, or, for a board moved from another slot of its node
    (``InputGuard.follow_boards``), moved with it, what was predicted of what left a slot withdrawn
    (the restarted detectors would never withdraw it: in the scoring it would stay a claim to the
    end) and what was predicted of a moved board made again in its new slot, a displaced board's
    state and predictions parked for when it is read again, there made again
    (``DetectorBank.park_gpus``, ``DetectorBank.follow_predictions``), and the rest. Keeps the
    predictions active so far, by finding, for that."""

    def __init__(self, bank: DetectorBank, guard: InputGuard) -> None:
        self.bank, self.guard = bank, guard
        self.fresh = bank.state_dict()["detectors"]  # as built: a new GPU's rows
        self.active: dict[tuple[str, str, str, int], Prediction] = {}

    def update(self, clean: Frame) -> list[Finding]:
        found: list[Finding] = []
        for rows, swap in self.guard.split_by_board(clean):
            if swap is None or len(rows):
                found += self._keep(self.bank.update(rows))
            if swap is None:
                continue
            told = self.bank.take_swap(swap, self.fresh)
            changed: list[Finding] = list(self.bank.follow_predictions(
                swap, self.active.values(), lambda slot: self.bank.topology.name("gpu", slot)))
            found += self._keep(told + (changed + self.bank.pass_on(changed, swap.ts) if changed else []))
        return found

    def _keep(self, findings: list[Finding]) -> list[Finding]:
        for f in findings:
            if isinstance(f, Prediction):
                key = (f.detector, f.event, f.entity_kind, f.slot)
                if f.active:
                    self.active[key] = f
                else:
                    self.active.pop(key, None)
        return findings


# ---- scoring ------------------------------------------------------------------------------
@dataclass
class Episode:
    entity: str
    start: float
    end: float
    fault_id: str
    fault_type: str
    lead_s: float = math.nan  # set when predicted


def episodes(events: Iterable[Event], kind: EventKind) -> list[Episode]:
    """Merge a kind's start/end events into episodes per entity. A kind without an end event
    (``end_type`` None) has instants: each ends where it starts, and instants within
    ``merge_gap_s`` of each other are one episode ending at the last. A start naming a fault other
    than the open episode's (``fault_id``) begins an episode of its own, gap or none."""
    per_entity: dict[str, list[Event]] = {}
    for ev in events:
        if ev.entity_kind == kind.entity_kind and ev.type in (kind.start_type, kind.end_type):
            per_entity.setdefault(ev.entity, []).append(ev)
    out: list[Episode] = []
    for entity, evs in per_entity.items():
        evs.sort(key=lambda e: (e.time, e.type != kind.end_type))
        current: Episode | None = None
        for ev in evs:
            if ev.type == kind.start_type:
                # an instant ends as it starts; a start otherwise leaves its episode open until its end
                # event (until 2026-12-02 an instant stayed open too, so every later one merged into it)
                end = ev.time if kind.end_type is None else math.inf
                # a start naming another fault is that fault's consequence: an episode of its own, even
                # within the merge gap (merged, it took the earlier one's fault, onset and warm-up)
                other_fault = current is not None and bool(ev.fault_id) and ev.fault_id != current.fault_id
                if current is not None and not other_fault and (math.isinf(current.end)
                                                                or ev.time - current.end <= kind.merge_gap_s):
                    current.end = end  # continues
                    continue
                if current is not None:
                    if math.isinf(current.end):  # still open: ends where the next fault's begins
                        current.end = ev.time
                    out.append(current)
                current = Episode(entity, ev.time, end, ev.fault_id, ev.fault_type or NO_FAULT)
            elif current is not None and math.isinf(current.end):
                current.end = ev.time
        if current is not None:
            out.append(current)
    return out


def alarm_intervals(findings: Iterable[Finding], kind: EventKind, topology: Topology,
                    end: float) -> dict[str, list[tuple[float, float]]]:
    """Active intervals of the predictions for ``kind``, per entity name: the union of each
    detector's own (one detector withdrawing its prediction does not end another's, which a
    single on/off stream of all of them had)."""
    per_source: dict[tuple[int, str], list[Prediction]] = {}
    for f in findings:
        if isinstance(f, Prediction) and f.event == kind.prediction and f.entity_kind == kind.entity_kind:
            per_source.setdefault((f.slot, f.detector), []).append(f)
    per_slot: dict[int, list[tuple[float, float, str]]] = {}
    for (slot, detector), preds in per_source.items():
        preds.sort(key=lambda p: p.ts)
        per_slot.setdefault(slot, []).extend((a, b, detector) for a, b in prediction_spans(preds, end))
    return {topology.name(kind.entity_kind, slot): _union(spans) for slot, spans in per_slot.items()}


def _union(spans: list[tuple[float, float, str]]) -> list[tuple[float, float]]:
    """Intervals ``(start, stop, detector)`` merged where they overlap, or touch with the claim
    handed to another detector at the same instant (thermal withdrawing at 4,100 s as loop_warming
    raises: never unclaimed, one alarm; until 2026-12-05 two, two false statements where none
    followed); in time order. One detector's own, which never overlap, come out as they went in (a
    withdrawal and a new raise at the same instant are its two claims)."""
    out: list[tuple[float, float]] = []
    last = ""  # the detector whose span ends the last interval
    for start, stop, detector in sorted(spans):
        if out and (start < out[-1][1] or (start == out[-1][1] and detector != last)):
            if stop >= out[-1][1]:
                last = detector
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
            last = detector
    return out


@dataclass
class FaultScope:
    """Which entities a fault affects, and when (for charging false alarms to faults)."""

    fault_type: str
    entities: frozenset[str]
    onset: float
    end: float  # the end of its aftermath (inf: never repaired)
    repaired: float  # active from ``onset`` until here, in its aftermath from here to ``end``


def fault_scopes(recording: Recording, events: Iterable[Event], entity_kind: str) -> list[FaultScope]:
    """Entities of ``entity_kind`` under each fault, from its onset event and the recording's
    fault list (durations). GPU faults reach the GPU, node faults its GPUs, loop faults the
    GPUs of every rack on the loop; link/optic faults their link. A fault is active until its
    repair (onset + duration), then in its aftermath for ``AFTERMATH_S`` — but a node's (a PSU,
    its fans): as the simulator has it, their repair lifts the brake, the derated limit or the lost
    cooling at once and leaves nothing behind (``ClusterSimulator._attribute``), so their scope ends there."""
    topo = recording.topology
    durations = {f.get("id"): f.get("duration_s") for f in recording.meta.get("faults", []) or []
                 if isinstance(f, dict)}
    scopes = []
    for ev in events:
        if ev.type != "fault_onset":
            continue
        names: set[str] = set()
        try:
            if entity_kind == "gpu":
                if ev.entity_kind == "gpu":
                    names = {ev.entity}
                elif ev.entity_kind == "node":
                    names = {topo.gpus[g] for g in topo.gpus_of_node(topo.slot("node", ev.entity))}
                elif ev.entity_kind == "rack":
                    names = {topo.gpus[g] for g in topo.gpus_of_rack(topo.slot("rack", ev.entity))}
                elif ev.entity_kind in ("loop", "cooling_loop"):
                    loop = topo.loops.index(ev.entity)
                    racks = np.flatnonzero(topo.rack_loop == loop)
                    names = {topo.gpus[g] for g in np.flatnonzero(np.isin(topo.gpu_rack, racks))}
            elif entity_kind == "link":
                if ev.entity_kind == "link":
                    names = {ev.entity}
                elif ev.entity_kind == "optic":
                    names = {ev.entity.rsplit("#", 1)[0]}
        except (KeyError, ValueError):
            names = set()
        dur = durations.get(ev.fault_id)
        repaired = ev.time + float(dur) if isinstance(dur, (int, float)) else math.inf
        aftermath = 0.0 if ev.entity_kind == "node" else AFTERMATH_S
        scopes.append(FaultScope(ev.fault_type or NO_FAULT, frozenset(names), ev.time, repaired + aftermath,
                                 repaired))
    return scopes


def _finish(acc: dict[str, Any], entity_hours: float) -> dict[str, Any]:
    leads = np.asarray(acc["leads"], dtype=float)
    n_alarm = acc["tp"] + acc["fp"]

    def num(x: float) -> float | None:
        return None if x is None or not np.isfinite(x) else round(float(x), 4)

    return {
        "episodes": int(acc["episodes"]),
        "recall": num(acc["hits"] / acc["episodes"]) if acc["episodes"] else None,
        "precision": num(acc["tp"] / n_alarm) if n_alarm else None,
        "lead_median_s": num(float(np.median(leads))) if len(leads) else None,
        "lead_p10_s": num(float(np.percentile(leads, 10))) if len(leads) else None,
        "false_alarms_per_1000_gpu_hours": num(acc["fp"] / entity_hours * 1000.0) if entity_hours > 0 else None,
    }


KEY_SCALE = 1e9
"""Columnar scoring puts every entity's times in one sorted key space: ``entity * KEY_SCALE +
(t - t0)`` (times within ±KEY_SCALE/4 s of the recording's start)."""


def _key(ent: np.ndarray, t: np.ndarray, t0: float) -> np.ndarray:
    return ent * KEY_SCALE + np.clip(np.asarray(t, dtype=float) - t0, -KEY_SCALE / 4, KEY_SCALE / 4)


@dataclass
class EpisodeTable:
    """A kind's episodes as columns, sorted by (entity, start); entities and faults as codes."""

    entity: np.ndarray  # int64 code into ``names``
    start: np.ndarray
    end: np.ndarray
    fault: np.ndarray  # int64 code into ``faults``
    scored: np.ndarray  # bool: counts for recall (after the warm-up)
    names: dict[str, int]
    faults: list[str]
    onset_class: np.ndarray | None = None  # int64 code into ONSET_CLASSES, where classified
    capped_s: np.ndarray | None = None  # seconds the limiter held over it (capped_seconds)
    clock_step: np.ndarray | None = None  # SM clock change across the onset, Hz (clock_change)

    @classmethod
    def build(cls, eps: Sequence[Episode], names: dict[str, int], scored_from: float) -> "EpisodeTable":
        for ep in eps:
            names.setdefault(ep.entity, len(names))
        faults = sorted({ep.fault_type for ep in eps} | {NO_FAULT})
        code = {f: i for i, f in enumerate(faults)}
        ent = np.array([names[ep.entity] for ep in eps], dtype=np.int64)
        start = np.array([ep.start for ep in eps], dtype=float)
        order = np.lexsort((start, ent))
        return cls(ent[order], start[order], np.array([ep.end for ep in eps], dtype=float)[order],
                   np.array([code[ep.fault_type] for ep in eps], dtype=np.int64)[order],
                   (start >= scored_from)[order], names, faults)


@dataclass
class SpanTable:
    """Alarm spans as columns (entity code, start, end), sorted by (entity, start); an entity's
    spans never overlap (:func:`prediction_spans`)."""

    entity: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def from_intervals(cls, alarms: dict[str, list[tuple[float, float]]], names: dict[str, int]) -> "SpanTable":
        ent: list[int] = []
        s: list[float] = []
        w: list[float] = []
        for entity, spans in alarms.items():
            code = names.setdefault(entity, len(names))
            ent.extend([code] * len(spans))
            s.extend(a for a, _ in spans)
            w.extend(b for _, b in spans)
        return cls.of(np.array(ent, dtype=np.int64), np.array(s, dtype=float), np.array(w, dtype=float))

    @classmethod
    def of(cls, ent: np.ndarray, start: np.ndarray, end: np.ndarray) -> "SpanTable":
        order = np.lexsort((start, ent))
        return cls(ent[order], start[order], end[order])


def score_spans(spans: SpanTable, eps: EpisodeTable, kind: EventKind, scopes: Sequence[FaultScope],
                start: float, end: float, entities: int,
                interrupts: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """Metrics (with ``by_fault`` and, where episodes are classified, ``by_onset``) of alarm spans
    against episodes — the rules of the module docstring, as column operations. ``entities``: the
    kind's observed entities; the false-alarm rates are per their hours over ``start`` to ``end``."""
    horizon, gap, t0 = kind.horizon_s, kind.merge_gap_s, start
    n_f = len(eps.faults)
    none_code = eps.faults.index(NO_FAULT)
    n_e = len(eps.start)
    # an alarm still up at its first statement past the merge gap after the episode settling its
    # claim (or the one it was raised in) claims anew from that statement, as one raised again then
    spans, (during, _, q, has_next, n_stmt, k_hit) = _continued(spans, eps, horizon, gap, t0)
    live = ~during
    # recall: an episode is predicted by the judged spans whose claim is about it and that made the
    # statement covering its onset — the rule precision judges a statement by, so no span is a hit
    # for one and a false alarm for the other; kept up through it, a span does not earn the next
    # episode too. The lead is from the earliest such span (spans and episodes are sorted alike, so
    # it is the first span naming that episode)
    covered = live & (k_hit < n_stmt)
    ep_q, first = np.unique(q[covered], return_index=True)
    ep_lead = np.full(n_e, np.nan)
    ep_lead[ep_q] = np.minimum(eps.start[ep_q] - spans.start[covered][first], horizon)
    sc = np.flatnonzero(eps.scored)
    leads = ep_lead[sc]
    hit = ~np.isnan(leads)
    if kind.censor_at_end:  # statements whose horizon outlives the recording are not judged
        judged = np.maximum(np.floor((end - horizon - spans.start) / horizon) + 1.0, 0.0)
    else:
        judged = np.full(len(spans.start), np.inf)
    # a statement during which the entity's job was interrupted (any interruption within the span's
    # statements) is not judged either, unless its episode came before the interruption
    i_span, i_k, i_t = _interrupted_statements(spans, interrupts, horizon, t0)
    t_hit = np.full(len(spans.start), np.inf)  # the first interruption within the hit's statement
    at_hit = i_k == k_hit[i_span]
    np.minimum.at(t_hit, i_span[at_hit], i_t[at_hit])
    censored_hit = np.isfinite(t_hit) & ~(eps.start[q] < t_hit) if n_e else np.zeros(len(spans.start), bool)
    # a hit on an episode recall does not score (the warm-up's) is left unjudged, as the episode is
    tp = covered & (k_hit < judged) & ~censored_hit & (eps.scored[q] if n_e else True)
    n_claims = np.where(live, np.minimum(np.minimum(k_hit, n_stmt), judged), 0.0).astype(np.int64)
    # the false statements (each made at fp_t), charged to the fault its entity's state is put down to then
    fp_span = np.repeat(np.arange(len(n_claims)), n_claims)
    fp_k = np.arange(len(fp_span)) - np.repeat(np.cumsum(n_claims) - n_claims, n_claims)
    per_span = int(max(n_claims.max(initial=0), i_k.max(initial=0))) + 1
    keep = ~np.isin(fp_span * per_span + fp_k, i_span * per_span + i_k)
    fp_span, fp_k = fp_span[keep], fp_k[keep]
    fp_t = spans.start[fp_span] + horizon * fp_k
    fp_ent = spans.entity[fp_span]
    fp_fault = np.full(len(fp_span), -1, dtype=np.int64)
    fault_code = {f: i for i, f in enumerate(eps.faults)}
    extra: list[str] = []
    # of the scopes holding the entity then, as the simulator puts a GPU's state down to a fault:
    # every aftermath in onset order, then every active fault in onset order, the later
    # overwriting the earlier (an active fault names its entity over a repaired one's aftermath)
    by_onset = sorted(scopes, key=lambda sc: sc.onset)  # stable: equal onsets keep the events' order
    for in_aftermath in (True, False):
        for scope in by_onset:
            if not len(fp_span):
                break
            codes = [eps.names[n] for n in scope.entities if n in eps.names]
            if not codes:
                continue
            if scope.fault_type not in fault_code:
                fault_code[scope.fault_type] = n_f + len(extra)
                extra.append(scope.fault_type)
            if in_aftermath:
                when = (scope.repaired <= fp_t) & (fp_t <= scope.end)
            else:  # active from its onset up to its repair (the instant of the repair is aftermath)
                when = (scope.onset <= fp_t) & (fp_t < scope.repaired)
            m = when & np.isin(fp_ent, codes)
            fp_fault[m] = fault_code[scope.fault_type]
    fp_fault[fp_fault < 0] = none_code
    faults = list(eps.faults) + extra
    n_all = len(faults)
    ep_fault = eps.fault[sc]
    counts = {
        "episodes": np.bincount(ep_fault, minlength=n_all),
        "hits": np.bincount(ep_fault[hit], minlength=n_all),
        "tp": np.bincount(eps.fault[q][tp], minlength=n_all) if n_e else np.zeros(n_all, np.int64),
        "fp": np.bincount(fp_fault, minlength=n_all),
    }
    # every observed entity counts the whole span (by_fault's rates too: they add up to the total)
    hours = max(end - start, 0.0) / 3600.0 * entities

    def acc(idx: int | None) -> dict[str, Any]:
        if idx is None:
            return {"episodes": int(counts["episodes"].sum()), "hits": int(counts["hits"].sum()),
                    "tp": int(counts["tp"].sum()), "fp": int(counts["fp"].sum()), "leads": leads[hit]}
        return {"episodes": int(counts["episodes"][idx]), "hits": int(counts["hits"][idx]),
                "tp": int(counts["tp"][idx]), "fp": int(counts["fp"][idx]),
                "leads": leads[hit & (ep_fault == idx)]}

    result = _finish(acc(None), hours)
    result["leads_s"] = [round(float(x), 4) for x in np.sort(leads[hit])]  # what write_plots draws
    if kind.min_lead_s is not None:  # a hit with a few seconds' warning predicts little
        result["recall_at_min_lead"] = (round(float(np.mean(np.nan_to_num(leads, nan=-1.0) >= kind.min_lead_s)), 4)
                                        if len(sc) else None)
    result["by_fault"] = {faults[i]: _finish(acc(i), hours) for i in sorted(range(n_all), key=lambda i: faults[i])
                          if counts["episodes"][i] or counts["tp"][i] or counts["fp"][i]}
    if eps.onset_class is not None:
        cls = eps.onset_class[sc]
        result["by_onset"] = {}
        for c, name in enumerate(ONSET_CLASSES):
            m = cls == c
            # an alarm's onset class is that of the episode it predicts; false alarms have none
            sub = _recall_of(m, hit, leads, kind)
            sub["by_fault"] = {faults[i]: _finish({"episodes": int((m & (ep_fault == i)).sum()),
                                                   "hits": int((hit & m & (ep_fault == i)).sum()), "tp": 0, "fp": 0,
                                                   "leads": leads[hit & m & (ep_fault == i)]}, 0.0)
                               for i in sorted(range(n_all), key=lambda i: faults[i]) if (m & (ep_fault == i)).any()}
            if eps.clock_step is not None:
                sub["clock_change"] = _clock_change_summary(eps.clock_step[sc][m])
            if eps.capped_s is not None:
                sub["by_capped_time"] = _by_capped_time(eps.capped_s[sc], m, hit, leads, kind)
            result["by_onset"][name] = sub
    return result


def _recall_of(sel: np.ndarray, hit: np.ndarray, leads: np.ndarray, kind: EventKind) -> dict[str, Any]:
    """Recall and lead of the scored episodes selected by ``sel`` (and, for kinds with a minimum
    lead, the share predicted that far ahead); no precision: a false alarm predicts no episode."""
    sub = _finish({"episodes": int(sel.sum()), "hits": int((hit & sel).sum()), "tp": 0, "fp": 0,
                   "leads": leads[hit & sel]}, 0.0)
    if kind.min_lead_s is not None:
        sub["recall_at_min_lead"] = (round(float(np.mean(np.nan_to_num(leads[sel], nan=-1.0) >= kind.min_lead_s)), 4)
                                     if sel.any() else None)
    return sub


def _clock_change_summary(hz: np.ndarray) -> dict[str, Any] | None:
    """Median SM clock change (MHz) across onsets, and the shares where the clock rose and fell;
    None without readings."""
    hz = hz[np.isfinite(hz)]
    if not len(hz):
        return None
    return {"median_mhz": round(float(np.median(hz)) / 1e6, 1), "rose": round(float(np.mean(hz > 0)), 4),
            "fell": round(float(np.mean(hz < 0)), 4), "onsets": int(len(hz))}


def _by_capped_time(held: np.ndarray, m: np.ndarray, hit: np.ndarray, leads: np.ndarray,
                    kind: EventKind) -> dict[str, Any]:
    """:func:`_recall_of` the scored episodes selected by ``m``, split by
    :data:`CAPPED_TIME_CLASSES` of their ``held`` seconds (``unknown``: NaN); empty groups left out."""
    groups = [(name, (held >= lo) & (held < hi)) for name, (lo, hi) in CAPPED_TIME_CLASSES.items()]
    groups.append(("unknown", np.isnan(held)))
    return {name: _recall_of(g & m, hit, leads, kind) for name, g in groups if (g & m).any()}


def _statements(spans: SpanTable, horizon: float) -> np.ndarray:
    """How many statements each span makes: one at its start and one per horizon it stays active."""
    return np.maximum(np.ceil((spans.end - spans.start) / horizon), 1.0)  # type: ignore[no-any-return]


Claims = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
""":func:`_claims`' columns: ``(during, p, q, has_next, n_stmt, k_hit)``."""


def _claims(spans: SpanTable, eps: EpisodeTable, horizon: float, gap: float, t0: float) -> Claims:
    """Per span: ``(during, p, q, has_next, n_stmt, k_hit)`` — whether it was raised in an episode
    (or within the merge gap after it: not judged), that episode (``p``, where ``during``), the
    episode its claim is about (``q``, where ``has_next``: the entity's first after it starts), how
    many statements it makes, and the one covering that episode's onset (``k_hit``; inf: none)."""
    # spans raised during an episode (or within the merge gap after it) are not judged: neither
    # for precision nor for recall — else "it may happen again" said as each episode lets go
    # would earn the next episode at no cost in precision
    n_e = len(eps.start)
    e_key = _key(eps.entity, eps.start, t0)
    s_key = _key(spans.entity, spans.start, t0)
    prev = np.searchsorted(e_key, s_key, side="right") - 1
    p = np.maximum(prev, 0)
    during = (prev >= 0) & (eps.entity[p] == spans.entity) if n_e else np.zeros(len(s_key), bool)
    if n_e:
        during &= spans.start <= eps.end[p] + gap
    # the entity's first episode after each span starts: the span's claim is about that one
    nxt = prev + 1
    q = np.minimum(nxt, max(n_e - 1, 0))
    has_next = (nxt < n_e) & (eps.entity[q] == spans.entity) if n_e else np.zeros(len(s_key), bool)
    if n_e:
        # ... and a span raised after its previous episode ended is judged by the next one where
        # that one starts within the gap: another fault's, split off (:func:`episodes`: the same
        # fault's would have merged). Taken as "during" the earlier one, such an episode (a PSU
        # failure's cap 90 s after a fault-free cap let go) could never be predicted, yet was
        # scored as missed
        during &= ~(has_next & (spans.start > eps.end[p]) & (eps.start[q] - eps.end[p] <= gap))
    # a span states its claim at s, s + h, ... while active (the statement made at s + k*h covers
    # (s + k*h, s + (k + 1)*h]); the claim is about that first episode, which statement k_hit covers
    n_stmt = _statements(spans, horizon)
    k_hit = np.where(has_next, np.ceil((eps.start[q] - spans.start) / horizon) - 1.0, np.inf) if n_e \
        else np.full(len(s_key), np.inf)
    return during, p, q, has_next, n_stmt, k_hit


def _continued(spans: SpanTable, eps: EpisodeTable, horizon: float, gap: float,
               t0: float) -> tuple[SpanTable, Claims]:
    """``spans`` with each one still up at its first statement after the merge gap that follows
    the episode settling its claim split there: the episode it came true on (its statement covering
    the onset), or the one it was raised in (not judged). From that statement on (its own grid, ``s +
    k*h``) it claims anew, as an alarm raised again then would, and is judged so — each statement
    true where an episode starts within its horizon, else a false alarm — and may predict the
    entity's next episode. Its statements between the settling episode and that one stay unjudged
    ("it may happen again"), as before; an alarm withdrawn with a detector's hysteresis after its
    episode makes no new claim. (Until 2026-12-04 a span's statements after its first hit were never
    judged, however long it stayed up: an alarm never withdrawn had no false alarm after its first
    true one, one withdrawn and raised again was charged for the same claims; and one raised in an
    episode was never judged at all.) The split repeats on the continuations (each starts after
    the last). Returns them with their :func:`_claims`."""
    claims = _claims(spans, eps, horizon, gap, t0)
    if not len(eps.start) or not len(spans.start):
        return spans, claims
    for _ in range(len(eps.start) + 1):  # each round moves every continuation past another episode
        during, p, q, has_next, n_stmt, k_hit = claims
        release = np.full(len(spans.start), np.inf)
        release[during] = eps.end[p[during]] + gap
        settled = ~during & has_next & (k_hit < n_stmt)
        release[settled] = eps.end[q[settled]] + gap
        # its next statement after that: the span's own grid goes on (s + k*h)
        anew = spans.start + horizon * (np.floor((release - spans.start) / horizon) + 1.0)
        cont = spans.end > anew
        if not cont.any():
            break
        spans = SpanTable.of(np.concatenate([spans.entity, spans.entity[cont]]),
                             np.concatenate([spans.start, anew[cont]]),
                             np.concatenate([np.where(cont, anew, spans.end), spans.end[cont]]))
        claims = _claims(spans, eps, horizon, gap, t0)
    return spans, claims


def _interrupted_statements(spans: SpanTable, interrupts: tuple[np.ndarray, np.ndarray] | None, horizon: float,
                            t0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every interruption of an entity's job within the reach of one of its spans' statements, as
    ``(span, statement index, time)``: a statement made at ``s + k*h`` covers ``(s + k*h, s + (k + 1)*h]``
    (an interruption at ``s`` itself, the first). Within the reach of the span's last statement,
    also after a withdrawal: a claim made before it still stands until its horizon (a throttle then
    would count as its hit). Every interruption, not only the span's first (until 2026-12-04 a
    statement during a later one was judged: a job that finished, then the next one interrupted)."""
    n = len(spans.start)
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    if interrupts is None or not len(interrupts[0]) or not n:
        return none
    ent, when = interrupts
    order = np.lexsort((when, ent))
    ent, when = ent[order], when[order]
    keys = _key(ent, when, t0)
    reach = spans.start + horizon * _statements(spans, horizon)
    lo = np.searchsorted(keys, _key(spans.entity, spans.start, t0), side="left")
    hi = np.searchsorted(keys, _key(spans.entity, reach, t0), side="right")
    count = np.maximum(hi - lo, 0)
    span = np.repeat(np.arange(n), count)
    at = np.repeat(lo, count) + np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    t = when[at]
    inside = (ent[at] == spans.entity[span]) & (t >= spans.start[span]) & (t <= reach[span])
    span, t = span[inside], t[inside]
    k = np.maximum(np.ceil((t - spans.start[span]) / horizon) - 1.0, 0.0).astype(np.int64)
    return span, k, t


def job_interruptions(events: Iterable[Event], recording: Recording, kind: EventKind,
                      names: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(entity code, time) of every GPU whose job stopped: ground truth ``job_slowdown_start``
    with reason ``interrupted``, an XID 79 (fell off the bus, or a thermal shutdown) on one of
    the job's GPUs, or ``job_end`` (the job finished). A GPU of a stopped job goes idle: a claim
    that it would throttle under its load can be neither confirmed nor refuted, like a claim whose
    horizon outlives the recording. (The XID matters when the job was already in a slowdown
    episode — a member throttling, then shutting down — which starts no new
    ``job_slowdown_start``.)"""
    if kind.entity_kind != "gpu":
        return np.zeros(0, np.int64), np.zeros(0)
    topo = recording.topology
    ent: list[int] = []
    when: list[float] = []
    for e in events:
        detail = e.detail or {}
        if (e.type == "job_slowdown_start" and detail.get("reason") == "interrupted") or e.type == "job_end":
            job = topo.slot("job", e.entity) if e.entity in topo.jobs else -1
        elif e.type == "xid" and detail.get("code") == 79 and e.entity_kind == "gpu" and e.entity in topo.gpus:
            job = int(topo.gpu_job[topo.slot("gpu", e.entity)])
        else:
            continue
        if job < 0:
            continue
        for g in np.flatnonzero(topo.gpu_job == job):
            code = names.get(topo.gpus[int(g)])
            if code is not None:
                ent.append(code)
                when.append(float(e.time))
    return np.array(ent, dtype=np.int64), np.array(when, dtype=float)


def score_kind(findings: Iterable[Finding], events: Sequence[Event], kind: EventKind,
               recording: Recording, start: float, end: float,
               onsets: "OnsetTelemetry | None" = None, entities: int | None = None) -> dict[str, Any]:
    """Metrics of one detector set for one event kind, with ``by_fault`` (and ``by_onset`` for
    kinds whose episodes are classified by what precedes them, given the run's telemetry).
    ``entities``: how many of the kind's entities were observed (:meth:`RunResult.entities_observed`),
    the false-alarm rates' denominator; None: every one the topology lists."""
    return score_intervals(alarm_intervals(findings, kind, recording.topology, end), events, kind, recording,
                           start, end, onsets, entities)


def score_intervals(alarms: dict[str, list[tuple[float, float]]], events: Sequence[Event], kind: EventKind,
                    recording: Recording, start: float, end: float,
                    onsets: "OnsetTelemetry | None" = None, entities: int | None = None) -> dict[str, Any]:
    """:func:`score_kind` for claims given as time spans per entity name (sorted, disjoint; as
    :func:`alarm_intervals` gives them): scores a rule that is not a detector — an analysis of
    what a signal could predict — by exactly the rules a detector is scored by."""
    table = episode_table(events, kind, recording, start, onsets)
    spans = SpanTable.from_intervals(alarms, table.names)
    return score_spans(spans, table, kind, fault_scopes(recording, events, kind.entity_kind), start, end,
                       recording.topology.size(kind.entity_kind) if entities is None else entities,
                       job_interruptions(events, recording, kind, table.names))


def episode_table(events: Sequence[Event], kind: EventKind, recording: Recording, start: float,
                  onsets: "OnsetTelemetry | None" = None) -> EpisodeTable:
    table = EpisodeTable.build(episodes(events, kind), {}, start + kind.warmup_s)
    if kind.classify_onset and onsets is not None and kind.entity_kind == "gpu":
        topo = recording.topology
        by_code = {c: n for n, c in table.names.items()}
        slots = np.array([topo.slot("gpu", by_code[int(c)]) for c in table.entity], dtype=np.int64)
        table.onset_class = classify_onsets(onsets, slots, table.start)
        table.clock_step = clock_change(onsets, slots, table.start)
        if np.isfinite(onsets.held).any():
            table.capped_s = capped_seconds(onsets, slots, table.start, table.end)
    return table


def score(result: RunResult, kinds: Sequence[str] | None = None, reference: str = "foreshock") -> dict[str, Any]:
    """The report: ``{"detectors": {set: {kind: metrics + by_fault [+ by_onset] [+ matched]}},
    "meta": ..., **sections}``. ``matched`` (:func:`matched_threshold`) appears on the baselines
    that logged scores, judged against the ``reference`` set's precision."""
    kinds = list(EVENT_KINDS) if kinds is None else list(kinds)
    report: dict[str, Any] = {"detectors": {}}
    for set_name, findings in result.findings.items():
        report["detectors"][set_name] = {
            k: score_kind(findings, result.events, EVENT_KINDS[k], result.recording, result.start, result.end,
                          result.onsets, result.entities_observed(EVENT_KINDS[k].entity_kind))
            for k in kinds
        }
    ref = report["detectors"].get(reference, {})
    for set_name, logs in result.score_logs.items():
        if set_name == reference:
            continue
        for k in kinds:
            target = ref.get(k, {}).get("precision")
            if target is not None and k in report["detectors"].get(set_name, {}):
                m = matched_threshold(result, logs, EVENT_KINDS[k], float(target))
                if m is not None:
                    m["reference_recall"] = ref[k].get("recall")
                    m["reference_recall_at_min_lead"] = ref[k].get("recall_at_min_lead")
                    report["detectors"][set_name][k]["matched"] = m
    report["meta"] = {
        "recording": str(result.recording.path),
        "gpus": result.recording.topology.size("gpu"),
        # of each scored entity kind, those the recording observed: what the false-alarm rates count
        "entities_observed": {k: result.entities_observed(k)
                              for k in sorted({EVENT_KINDS[kind].entity_kind for kind in kinds})},
        "simulated_hours": round(result.duration_s / 3600.0, 3),
        "ground_truth": result.ground_truth,  # false: no events file, every alarm counted false
        "events_unknown_entity": result.events_unknown_entity,
        "interval_s": result.recording.interval,
        "seed": result.recording.meta.get("seed"),
        "scenario": result.recording.meta.get("scenario"),
        "horizons_s": {k: EVENT_KINDS[k].horizon_s for k in kinds},
        "wall_s": round(result.wall_s, 2),
        "samples": result.samples,
        "telemetry": list(result.telemetry),
        "input_problems": {f"{s}:{r}": n for (s, r), n in result.health.problems.items()},
        # GPUs found with another board in their slot, restarted as new GPUs (_BoardSwaps)
        "gpus_replaced": sum(result.health.gpus_replaced.values()),
        "gpus_moved": sum(result.health.gpus_moved.values()),
        "onset_classes": {"classes": list(ONSET_CLASSES), "predictable": PREDICTABLE_ONSET,
                          "job_start_s": JOB_START_S, "load_before_s": LOAD_BEFORE_S,
                          "load_step_ratio": LOAD_STEP_RATIO},
        "matched_reference": reference,
    }
    for name, scorer in SECTION_SCORERS.items():
        report[name] = scorer(result)
    return report


# ---- precision-matched comparison -----------------------------------------------------------
SWEEP_TAILS = np.geomspace(0.5, 1e-6, 48)
"""Threshold candidates: the score quantiles that leave these shares of samples above them. The
grid is coarse (each step ~32 % fewer samples above); :func:`refine_crossings` then searches the
scores between a level short of the target precision and the next one reaching it."""


def _columns(logs: Sequence[ScoreLog], kind: EventKind) -> list[tuple[ScoreLog, int]]:
    return [(log, col) for log in logs for col, events in enumerate(log.columns)
            if kind.prediction in events and len(log.arrays()[0])]


def _usable(log: ScoreLog, col: int) -> np.ndarray:
    """The column's finite scores from the rows its detector alarms on (after ``valid_from``)."""
    obs, scores = log.arrays()
    x = scores[:, col]
    return x[np.isfinite(x) & (obs[:, 0] >= log.valid_from)]


def usable_scores(logs: Sequence[ScoreLog], kind: EventKind) -> np.ndarray:
    """The distinct scores, ascending, of the columns that predict ``kind``: every level at which
    their alarms can change."""
    parts = [_usable(log, col) for log, col in _columns(logs, kind)]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0)


def threshold_sweep(result: RunResult, logs: Sequence[ScoreLog], kind: EventKind,
                    levels: Sequence[float] | None = None,
                    score_at: LevelScorer | None = None) -> tuple[list[tuple[float, dict[str, Any]]], float | None]:
    """Each alarm level's figures for ``kind`` (:func:`score_spans`, the rules of :func:`score_kind`),
    replayed from a baseline's logged scores: at ``levels``, or by default at quantiles of each
    score column that predicts ``kind`` and at the detector's own level. Returns ``[(level,
    figures)]`` and the detector's own level (None where no column predicts ``kind``).
    ``score_at``: the run's :func:`level_scorer` for ``kind``, where the caller scores more levels."""
    score_at = score_at or level_scorer(result, kind)
    tried: list[tuple[float, dict[str, Any]]] = []
    live_level: float | None = None
    for log, col in _columns(logs, kind):
        live_level = float(log.levels[col])
        if levels is None:
            x = _usable(log, col)
            swept = np.unique(np.quantile(x, 1.0 - SWEEP_TAILS)) if len(x) else np.empty(0)
            chosen = [*swept.tolist(), live_level]
        else:
            chosen = list(levels)
        tried.extend((float(level), score_at(log, col, level)) for level in chosen if np.isfinite(level))
    return tried, live_level


LevelScorer = Callable[[ScoreLog, int, float], dict[str, Any]]


def level_scorer(result: RunResult, kind: EventKind) -> LevelScorer:
    """``score_at(log, column, level)``: the figures of ``kind`` were the column's detector to alarm
    at ``level`` (the episode table and fault scopes built once for every level)."""
    rec = result.recording
    topo = rec.topology
    table = episode_table(result.events, kind, rec, result.start, result.onsets)
    codes = np.array([table.names.setdefault(topo.name(kind.entity_kind, s), len(table.names))
                      for s in range(topo.size(kind.entity_kind))], dtype=np.int64)
    scopes = fault_scopes(rec, result.events, kind.entity_kind)
    interrupts = job_interruptions(result.events, rec, kind, table.names)
    n_ent = result.entities_observed(kind.entity_kind)

    def score_at(log: ScoreLog, col: int, level: float) -> dict[str, Any]:
        slot, s, w = log.spans(col, level, result.end)
        return score_spans(SpanTable.of(codes[slot], s, w), table, kind, scopes, result.start, result.end,
                           n_ent, interrupts)

    return score_at


def refine_crossings(figures: dict[float, dict[str, Any]], reaches: Callable[[dict[str, Any]], bool],
                     candidates: np.ndarray, score: Callable[[float], dict[str, Any]]) -> dict[float, dict[str, Any]]:
    """``figures`` (level -> figures) with, between each level that does not ``reach`` the target and
    the next higher one that does, the lowest candidate level found to reach it: a bisection over
    the ``candidates`` (ascending distinct scores) strictly between the two, each step ``score``d.

    The quantile grid alone missed the best level wherever the target precision is crossed
    between two grid levels — at precision 0.97-1.00, where the comparison is decided, the grid is
    coarsest. Recall falls as the level rises, so the lowest level reaching the target is the one
    to find; precision need not rise steadily, so each crossing is searched (a bisection finds a
    level reaching it, the lowest if precision rises steadily in between). Adds at most
    ~log2(len(candidates)) levels per crossing; never removes one."""
    levels = sorted(figures)
    for lo, hi in zip(levels, levels[1:]):
        if reaches(figures[lo]) or not reaches(figures[hi]):
            continue
        i = int(np.searchsorted(candidates, lo, side="right"))
        j = int(np.searchsorted(candidates, hi, side="left"))
        while i < j:  # candidates[j] (or hi) reaches the target, those below i were found not to
            mid = (i + j) // 2
            level = float(candidates[mid])
            figures[level] = score(level)
            if reaches(figures[level]):
                j = mid
            else:
                i = mid + 1
    return figures


def matched_threshold(result: RunResult, logs: Sequence[ScoreLog], kind: EventKind,
                      target_precision: float, exact: bool = False) -> dict[str, Any] | None:
    """Sweep a baseline's alarm threshold over its logged scores and report the best recall it
    reaches at precision >= ``target_precision`` (the reference set's), scored by exactly the
    rules of :func:`score_kind`. ``None`` when no logged score column predicts ``kind``.

    Returns ``{"target_precision", "threshold", "recall", "precision", "lead_median_s",
    "false_alarms_per_1000_gpu_hours", "recall_at_min_lead", "by_onset_recall", "at_min_lead",
    "levels_tried", "best_precision", "live"}`` — ``at_min_lead`` is the level with the best
    ``recall_at_min_lead`` at that precision (and, from :func:`score`, the reference's recall beside it); ``threshold`` is ``None`` when no level reaches the target (``best_precision`` then
    says how close it came), ``live`` is the replay at the detector's own level. Thresholds are
    rounded to 6 decimals for the report, or, with ``exact``, the levels as swept (to alarm at: a
    classifier's best level may be 0.99999997, which rounds to a 1.0 no score reaches)."""
    score_at = level_scorer(result, kind)
    tried, live_level = threshold_sweep(result, logs, kind, score_at=score_at)
    columns = _columns(logs, kind)
    if len(columns) == 1:  # (several columns: their levels are not one scale to search between)
        (log, col), = columns
        refined = refine_crossings(dict(tried), lambda m: m["precision"] is not None and m["precision"] >= target_precision,
                                   usable_scores(logs, kind), lambda level: score_at(log, col, level))
        tried = sorted(refined.items())
    live: dict[str, Any] | None = None
    for level, m in tried:
        m["threshold"] = float(level) if exact else round(float(level), 6)
        if level == live_level:
            live = {"threshold": m["threshold"], "recall": m["recall"], "precision": m["precision"]}
    if not tried:
        return None
    ok = [m for _, m in tried if m["precision"] is not None and m["precision"] >= target_precision]
    best = max(ok, key=lambda m: (m["recall"] or 0.0, m.get("recall_at_min_lead") or 0.0, m["precision"])) if ok else None
    # recall saturates with leads of seconds; the level that gives the most useful warnings may differ
    ahead = max(ok, key=lambda m: (m.get("recall_at_min_lead") or 0.0, m["recall"] or 0.0, m["precision"])) \
        if ok and kind.min_lead_s is not None else None
    top = max((m for _, m in tried if m["precision"] is not None), key=lambda m: (m["precision"], m["recall"] or 0.0),
              default=None)
    out: dict[str, Any] = {"target_precision": round(target_precision, 4), "threshold": None, "recall": None,
                           "precision": None, "lead_median_s": None, "false_alarms_per_1000_gpu_hours": None,
                           "recall_at_min_lead": None, "by_onset_recall": None}
    if best is not None:
        out.update({k: best.get(k) for k in ("threshold", "recall", "precision", "lead_median_s",
                                             "false_alarms_per_1000_gpu_hours", "recall_at_min_lead")})
        if "by_onset" in best:
            out["by_onset_recall"] = {c: v["recall"] for c, v in best["by_onset"].items()}
    out["at_min_lead"] = None if ahead is None else {k: ahead.get(k) for k in ("threshold", "recall_at_min_lead",
                                                                                "recall", "precision")}
    out["levels_tried"] = len(tried)
    out["best_precision"] = None if top is None else {k: top[k] for k in ("threshold", "precision", "recall")}
    out["live"] = live
    return out


def pick_trace_gpus(recording: Recording, count: int = 4) -> list[int]:
    """A few GPUs worth plotting: thermal episodes of different fault types first."""
    topo = recording.topology
    picked: list[int] = []
    seen_types: set[str] = set()
    # (the run reads the ground truth again, and warns about it there)
    evs = [e for e in read_ground_truth(recording, warn_missing=False, warn_unknown=False).events
           if e.entity_kind == "gpu"
           and e.type.endswith("_start")
           and e.type.split("_start")[0] in ("thermal_throttle", "hbm_overheat")]
    for ev in sorted(evs, key=lambda e: e.time):
        key = ev.fault_type or NO_FAULT
        g = topo.slot("gpu", ev.entity)
        # (a GPU picked already, for an earlier fault: another GPU shows this one; a GPU picked
        # twice took two of the places and one plot fewer came out)
        if key in seen_types or g in picked:
            continue
        seen_types.add(key)
        picked.append(g)
        if len(picked) >= count:
            break
    for ev in evs:
        if len(picked) >= count:
            break
        g = topo.slot("gpu", ev.entity)
        if g not in picked:
            picked.append(g)
    return picked


# ---- output -------------------------------------------------------------------------------
REPORT_FILES = ("report.json", "lead_times.png", "gpu_*.png")
"""What an evaluation writes in its report folder (:func:`clear_report`)."""


def clear_report(out_dir: str | Path) -> list[Path]:
    """Remove an earlier evaluation's files from ``out_dir`` (:data:`REPORT_FILES`; nothing else),
    before a new one writes there. They had stayed beside the new report: another recording's GPU
    plots, a ``--no-plots`` run's old plots, and, where the new run wrote no report (nothing to
    evaluate), the old ``report.json`` of another recording. Returns what was removed."""
    out = Path(out_dir)
    removed = [path for pattern in REPORT_FILES for path in sorted(out.glob(pattern)) if path.is_file()]
    for path in removed:
        path.unlink()
    return removed


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """``report.json`` in ``out_dir``: strict JSON, a non-finite number written as null (a bare NaN
    is not JSON: strict readers, ``jq`` among them, refuse the file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_text(json.dumps(finite_or_none(report), indent=2, sort_keys=False, allow_nan=False),
                    encoding="utf-8")
    return path


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float in it (in dicts, lists and tuples) replaced by None."""
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


LEAD_PLOT_KINDS = ("thermal_throttle", "power_cap")
"""The event kinds whose lead times ``lead_times.png`` draws."""


def write_plots(result: RunResult, report: dict[str, Any], out_dir: str | Path,
                kinds: Sequence[str] = LEAD_PLOT_KINDS) -> list[Path]:
    """PNG plots: a few GPUs (temperature, predicted ETA, actual throttles) and, for the ``kinds``
    the report scored, its lead times (``leads_s``) per detector set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    topo = result.recording.topology
    written: list[Path] = []
    t0 = result.start
    for slot, tr in result.traces.items():
        if not tr["ts"]:
            continue
        name = topo.gpus[slot]
        fig, ax = plt.subplots(figsize=(10, 4))
        ts = (np.asarray(tr["ts"]) - t0) / 60.0
        ax.plot(ts, tr["gpu_temp"], lw=1, label="core °C")
        ax.plot(ts, tr["hbm_temp"], lw=1, label="HBM °C")
        # the H200's limits (FACTS.md): core max operating 87 °C, HBM 95 °C. A GPU is picked for
        # its thermal throttles or its HBM overheating (pick_trace_gpus): both are drawn
        ax.axhline(87, color="tab:red", ls=":", lw=1)
        ax.axhline(95, color="tab:purple", ls=":", lw=1)
        for event, colour, what in (("thermal_throttle", "tab:red", "thermal throttle"),
                                    ("hbm_overheat", "tab:purple", "HBM overheat")):
            for ep in episodes(result.events, EVENT_KINDS[event]):
                if ep.entity == name:
                    end = ep.end if np.isfinite(ep.end) else result.end
                    ax.axvspan((ep.start - t0) / 60, (end - t0) / 60, color=colour, alpha=0.15,
                               label=f"{what} ({ep.fault_type})")
        ax.set_xlabel("minutes")
        ax.set_ylabel("°C")
        ax2 = ax.twinx()
        for set_name, findings in result.findings.items():
            for event, marker, what in (("thermal_throttle", "o", "throttle ETA"), ("hbm_overheat", "^", "HBM ETA")):
                pts = [(p.ts, p.eta_s) for p in findings if isinstance(p, Prediction) and p.slot == slot
                       and p.entity_kind == "gpu" and p.event == event and p.active and p.eta_s >= 0]
                if pts:
                    arr = np.asarray(pts)
                    ax2.scatter((arr[:, 0] - t0) / 60, arr[:, 1] / 60, s=8, marker=marker, label=f"{set_name} {what}")
        ax2.set_ylabel("predicted ETA (min)")
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
        uniq = dict(zip(handles[1] + handles2[1], handles[0] + handles2[0]))
        ax.legend(uniq.values(), uniq.keys(), loc="upper left", fontsize=8)
        ax.set_title(f"{name}: temperature, predicted ETA, actual throttle / HBM overheat")
        fig.tight_layout()
        path = out / f"gpu_{name.replace('/', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    # lead-time histograms per detector set: the report's own leads (``leads_s``), of the kinds it scored
    # (until 2026-12-02 the plot found its own, by an older rule than the report's)
    shown = [k for k in kinds if any(k in per_kind for per_kind in report["detectors"].values())]
    # no lead at all (a recording without ground truth, or every episode missed): no file, as no
    # gpu_*.png is written without a GPU worth plotting; it had been two blank 0-1 axes
    if not any(per_kind.get(k, {}).get("leads_s") for k in shown for per_kind in report["detectors"].values()):
        return written
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.5), squeeze=False)
    for ax, kind_name in zip(axes[0], shown):
        kind = EVENT_KINDS[kind_name]
        none = []  # the sets scored on this kind that predicted no episode ahead
        for set_name, per_kind in report["detectors"].items():
            if kind_name not in per_kind:
                continue  # (not scored there: the sklearn model's kinds)
            leads = per_kind[kind_name].get("leads_s")
            if leads:
                ax.hist(np.asarray(leads) / 60.0, bins=20, range=(0, kind.horizon_s / 60), alpha=0.5, label=set_name)
            else:
                none.append(set_name)
        ax.set_title(f"{kind_name}: lead time")
        ax.set_xlabel("minutes before onset")
        ax.set_ylabel("episodes")
        if none and not ax.get_legend_handles_labels()[0]:  # an empty axes says why it is empty
            ax.text(0.5, 0.5, "no predicted episodes", transform=ax.transAxes, ha="center", va="center")
            ax.set_xlim(0, kind.horizon_s / 60)
        elif none:  # beside the others' bars, in the legend: a set missing from it read as not run
            ax.plot([], [], " ", label=f"{', '.join(none)}: no predicted episodes")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "lead_times.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


CAPPED_TIME_LABELS = {"under_1s": "< 1 s in all", "1s_or_more": ">= 1 s", "unknown": "(no counter)"}


RENDER_COLUMNS = ("eps", "recall", "@lead", "prec", "lead", "p10", "FA/1kh")
RENDER_CAPTION = ("eps: episodes; @lead: recall with at least the kind's useful lead (5 min thermal, 30 s power "
                  "cap); prec: precision; lead, p10: median and 10th-percentile lead; FA/1kh: false alarms per "
                  "1000 entity-hours (GPU-hours for GPU kinds); by onset: recall by what the GPU showed before "
                  "the onset (*: the class the target is judged on), and the share of those onsets across which "
                  "the SM clock rose")


def lead_text(seconds: float) -> str:
    """A lead as the table prints it, rounded down (to the second, or to a tenth of a minute from
    one minute on): a 299-s median read "5.0 min" beside a useful lead of 5 minutes it missed."""
    whole = math.floor(seconds)
    return f"{math.floor(seconds / 6) / 10:.1f} min" if whole >= 60 else f"{whole:.0f} s"


def share_text(share: float, digits: int = 2) -> str:
    """A recall or precision as the table prints it, rounded down to two decimals: rounded to the
    nearest, 26 of 29 (0.8966) read "0.90" beside a target of 0.9 it missed (as ``lead_text``).
    A matched precision takes three (``digits``), as its target does."""
    scale = 10 ** digits
    return f"{math.floor(round(share * scale, 6)) / scale:.{digits}f}"


def rate_text(rate: float) -> str:
    """A false-alarm rate as the table prints it, rounded up to two decimals: 1.004 per 1000
    GPU-hours read "1.00" beside a target of at most 1 it missed."""
    return f"{math.ceil(round(rate * 100, 6)) / 100:.2f}"


def render_table(report: dict[str, Any], kinds: Sequence[str] | None = None, by_fault: bool = True) -> Any:
    """A rich table of the report (returned, so the caller decides where to print it).

    One label column — each detector set and event kind, then its indented per-fault, per-onset
    and matched rows — and short figure headings explained in the caption: an 80-column terminal
    shows every figure whole and folds only long labels (with a column each for set, kind and
    fault it folded every name to "fore…", "powe…")."""
    from rich import box
    from rich.table import Table

    table = Table(title="foreshock evaluation", caption=RENDER_CAPTION, box=box.SIMPLE_HEAD, collapse_padding=True,
                  pad_edge=False)
    table.add_column("set, event kind / fault", min_width=20, ratio=1, overflow="fold")
    for col in RENDER_COLUMNS:
        table.add_column(col, justify="right", no_wrap=True)

    def fmt(v: Any, kind: str = "") -> str:
        if v is None:
            return "—"
        if kind == "s":
            return lead_text(v)
        if kind == "p":  # a matched precision, to the target's three decimals, rounded down as a share
            return share_text(v, 3)
        if kind == "share":
            return share_text(v)
        if kind == "rate":
            return rate_text(v)
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    for det, per_kind in report["detectors"].items():
        for kind, m in per_kind.items():
            if kinds is not None and kind not in kinds:
                continue
            rows = [(f"[bold]{det}[/] {kind}", m)]
            rows += [(f"  {fault}", mm) for fault, mm in sorted(m.get("by_fault", {}).items())] if by_fault else []
            # recall by what precedes the onset; the target is judged on the predictable class. A
            # heading row, then a class a row with its clock's rise on a line of its own: on one
            # line ("onset: thermal_throttled, clock rose 82%") 80 columns folded it mid-word
            if m.get("by_onset"):
                rows.append(("  by onset (*: target)", None))
            for c, mm in m.get("by_onset", {}).items():
                clock = mm.get("clock_change")
                rows.append((f"    {c}" + ("*" if c == PREDICTABLE_ONSET else "")
                             + (f"\n      clock rose {clock['rose']:.0%}" if clock is not None else ""), mm))
                if c == PREDICTABLE_ONSET:  # ... and how long the limiter held those episodes
                    rows += [(f"      held {CAPPED_TIME_LABELS.get(h, h)}", hm)
                             for h, hm in mm.get("by_capped_time", {}).items()]
            for label, mm in rows:
                if mm is None:
                    table.add_row(label, *[""] * len(RENDER_COLUMNS))
                    continue
                table.add_row(label, fmt(mm["episodes"]), fmt(mm["recall"], "share"),
                              fmt(mm.get("recall_at_min_lead"), "share"), fmt(mm["precision"], "share"),
                              fmt(mm["lead_median_s"], "s"), fmt(mm["lead_p10_s"], "s"),
                              fmt(mm["false_alarms_per_1000_gpu_hours"], "rate"))
            mt = m.get("matched")
            if mt is not None:
                best = (mt["best_precision"] or {}).get("precision")
                # a met target rounded down as its precision is: a precision that met it never reads
                # under it (and the best of a missed one stays under the target, rounded as before)
                label = (f"  matched: P >= {share_text(mt['target_precision'], 3)} at {mt['threshold']:.4g}"
                         if mt["threshold"] is not None else
                         f"  matched: never P >= {mt['target_precision']:.3f} (best "
                         f"{'—' if best is None else share_text(best, 3)})")
                # shares and rates as the main rows give them (rounded down, the rate up): rounded
                # to the nearest, sklearn's matched 0.2162 read "0.22" under foreshock's "0.21"
                table.add_row(label, "", fmt(mt["recall"], "share"), fmt(mt.get("recall_at_min_lead"), "share"),
                              fmt(mt["precision"], "p"), fmt(mt["lead_median_s"], "s"), "",
                              fmt(mt["false_alarms_per_1000_gpu_hours"], "rate"))
                al = mt.get("at_min_lead")
                if al is not None and al["threshold"] != mt["threshold"]:
                    table.add_row(f"  matched, most warned ahead: at {al['threshold']:.4g}", "",
                                  fmt(al["recall"], "share"), fmt(al["recall_at_min_lead"], "share"),
                                  fmt(al["precision"], "p"), "", "", "")
            table.add_section()
    return table


# Fabric kinds (issue 5): link_down, and congestion as a report section.
from .evaluation_fabric import register as _register_fabric  # noqa: E402

_register_fabric(register_event_kind, SECTION_SCORERS)

# Incidents (issue 6): the "foreshock" set's findings through the incident engine.
from .incident_eval import score_run as _score_incidents  # noqa: E402

SECTION_SCORERS["incidents"] = _score_incidents

# Issue 4's anomaly detectors: how early a failing thermal interface or fan is flagged (cooling),
# and whether a slowed job's pacer is named (straggler).
from .evaluation_anomalies import score_cooling as _score_cooling  # noqa: E402
from .evaluation_anomalies import score_straggler as _score_straggler  # noqa: E402

SECTION_SCORERS["cooling"] = _score_cooling
SECTION_SCORERS["straggler"] = _score_straggler
