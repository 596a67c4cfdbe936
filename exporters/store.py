"""The finding store: the exporter's view of the pipeline, updated by the pipeline, read at scrape.

The pipeline calls :meth:`FindingStore.observe_frame` and :meth:`FindingStore.observe_findings`;
the Prometheus collector and the console summary read a consistent snapshot under a lock.
Everything here is bounded: latest values are arrays indexed by slot, active findings are
keyed by (entity, event) and expire, incidents are keyed by id.

**The store's clock.** Staleness, exported ETAs and the lapse of findings are measured on one
clock. By default it is telemetry time (``last_ts``, the newest row of the last frame): right for
a replay, an evaluation or a demo, which run hundreds of times faster than real time. A live
pipeline (``foreshock watch``, the Kafka worker) reads sources whose clocks differ (a BMC a
minute behind its nodes, an agent minutes fast): there ``last_ts`` see-sawed from frame to frame
with whichever source spoke last, ETAs jumped by the skew, and a fast agent's frame made every
other entity read stale and lapsed everyone's findings. A live store (``wall_clock``, or
:meth:`FindingStore.use_wall_clock`) measures on the wall clock instead — moved on by the
monotonic clock (:class:`SteadyClock`), so that a step of the host's clock is no time passing: an
entity is fresh while it was heard from (a row of it reached the store) recently, a finding ages
from when the store received it; whose clock stamped the rows no longer matters.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from foreshock.detectors.congestion import params_vector, xmit_wait_limits
from foreshock.detectors.cooling import PARAMS as COOLING_PARAMS
from foreshock.detectors.counters import CounterRates
from foreshock.detectors.straggler import PARAMS as STRAGGLER_PARAMS
from foreshock.detectors.xid import xid_events
from foreshock.facts import OWN_LIMIT_MAX_C, OWN_LIMIT_MIN_C, XID_SEVERITY
from foreshock.findings import BOARD_FOLLOWED, Anomaly, Finding, Incident, Prediction
from foreshock.frames import Frame
from foreshock.guard import kernel_column
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.remap import Remap
from foreshock.topology import Topology

LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)

# Latest value kept per entity, by kind: (field in frames, exported metric suffix).
LATEST_FIELDS: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu_temp", "hbm_temp", "power", "power_limit", "sm_clock", "throttle_reasons", "util",
            "slowdown_temp", "max_op_temp", "hbm_max_op_temp"),
    "link": ("link_state", "xmit_wait"),
    "optic": ("rx_power", "prefec_ber"),
    "rack": ("inlet_temp", "coolant_flow"),
    "node": ("fan_speed",),
    "job": ("step_time",),
}
NOT_A_REPORT = frozenset({"xid_last", "board_id"})
"""Fields whose reading alone says nothing of an entity being read: NVML and nvidia-smi keep a GPU
lost off the bus (XID 79) as a row of NaN with its last XID (and its board's identity)."""
REPORT_GAP_FRAMES = 9
"""A live store's frames of a kind whose report gaps (``StoreSnapshot.report_interval_s``) are
kept: the lower median of these is the kind's interval."""
OWN_LIMIT_FIELDS = frozenset({"slowdown_temp", "max_op_temp", "hbm_max_op_temp"})
"""A GPU's own thresholds: a value outside ``OWN_LIMIT_MIN_C``..``OWN_LIMIT_MAX_C`` is no report
(nvidia-smi's T.Limit offsets, a 0), so it neither becomes the latest value nor replaces a limit
kept from an earlier poll — the detectors' rule (``thermal_fit``'s kept thresholds)."""
XID_OUTSIDE_TOPOLOGY = "XID code of a GPU outside the topology: not counted"
"""The store's problem for the codes of a slot outside its arrays (a frame fed past the guard, which counts
and drops them as ``unknown_entity``): counted, as nothing is dropped silently."""


HELD_FLAG_REFRESH_S = {"cooling": COOLING_PARAMS["refresh_s"], "straggler": STRAGGLER_PARAMS["refresh_s"]}
"""Detectors that say a held flag (an anomaly: anomalies are never withdrawn) again every
``refresh_s`` rather than at each sample, by name: their flags are kept 1.5 refreshes (a refresh
comes at the detector's next tick, a frame or two late), not ``anomaly_ttl_s``. Kept 300 s, a
cooling or straggler flag still held had gone from /metrics for 300 of every 600 s, and a flagged
GPU outside the top K with it (until 2026-12-04). A ``--param DET.refresh_s`` reaches the store
through its ``flag_refresh_s``."""


class SteadyClock:
    """The wall clock as it read when this was made, moved on by the monotonic clock since: a
    live store's clock (:meth:`FindingStore.use_wall_clock`). Everything a live store measures on
    its clock is a duration (how long since an entity was heard, since a prediction arrived, since
    a finding was said), and a step of the host's clock — NTP correcting a drifted clock, ``date
    -s``, a VM resynced — is no time passing: read on ``time.time`` (until 2026-12-04) a step back
    of an hour kept a dead node "reporting" for that hour, a step forward read every ETA short and
    lapsed every finding at once. NTP's slewing moves the monotonic clock as it moves the wall
    clock, so the two agree but for steps."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._wall_at, self._monotonic_at = wall(), monotonic()

    def __call__(self) -> float:
        return self._wall_at + (self._monotonic() - self._monotonic_at)


PredictionKey = tuple[str, str, int, str]
"""An active prediction's key in the store: (event, entity kind, slot, detector)."""


def prediction_key(p: Prediction) -> PredictionKey:
    """``p``'s key among the active predictions. The detector is part of it: two detectors
    predicting one event of one entity (``--detectors thermal,threshold``) are two predictions,
    exported as two series (``detector`` label), each withdrawn by its own detector only."""
    return p.event, p.entity_kind, p.slot, p.detector


@dataclass
class StoreSnapshot:
    """A consistent copy of the store for one scrape or one summary."""

    topology: Topology
    latest: dict[str, dict[str, np.ndarray]]
    seen: dict[str, np.ndarray]
    predictions: list[Prediction]
    anomalies: list[Anomaly]
    incidents: list[Incident]
    gauges: dict[str, tuple[str, np.ndarray, str]]
    problems: dict[tuple[str, str], int]
    samples: dict[str, int]
    findings: dict[str, int]
    dead_letters: int
    xids: dict[tuple[int, int], int]
    last_seen: dict[str, np.ndarray]
    latency_counts: list[int]
    latency_sum: float
    latency_count: int
    last_ts: float
    ingest_lag_s: float
    # the newest timestamp of every row processed (``last_ts`` is the last frame's: the store's
    # telemetry clock): ``foreshock_last_telemetry_timestamp_seconds``
    newest_ts: float = float("nan")
    predictions_raised: dict[str, int] = field(default_factory=dict)
    xmit_wait_increase: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # by leaf name: what the links this store no longer lists under that leaf had risen by
    # (``FindingStore.move_to``), still part of the leaf's counter
    xmit_wait_dropped: dict[str, float] = field(default_factory=dict)
    # the store's clock (see the module docstring) at this snapshot, and on that clock when each
    # entity was last heard from and when each active prediction (by its key,
    # :func:`prediction_key`) was made: ``last_ts``, ``last_seen`` and the predictions' own ``ts``
    # on the telemetry clock; the wall clock, and arrival times, in a live store
    clock: float = float("nan")
    heard: dict[str, np.ndarray] = field(default_factory=dict)
    predictions_heard: dict[PredictionKey, float] = field(default_factory=dict)
    # a live store's: by kind, how long its entities typically go unheard between two of their
    # reports, on the wall clock (NaN: not known yet; empty on the telemetry clock) — the
    # collector widens its staleness window to a few of these (``ForeshockCollector.stale_after``)
    report_interval_s: dict[str, float] = field(default_factory=dict)
    # a Kafka worker's: by (topic, partition) of its assignment, the records not yet processed
    # (``FindingStore.set_consumer_lag``); empty elsewhere
    consumer_lag: dict[tuple[str, int], int] = field(default_factory=dict)


class FindingStore:
    """Sink for frames and findings; the single source of truth for exporters."""

    def __init__(self, topology: Topology, health: PipelineHealth | None = None,
                 anomaly_ttl_s: float = 300.0, wall_clock: Callable[[], float] | None = None,
                 congestion_params: Mapping[str, float] | None = None,
                 flag_refresh_s: Mapping[str, float] | None = None) -> None:
        """``wall_clock``: make this a live store, measuring staleness, ETAs and the lapse of
        findings on that clock (a :class:`SteadyClock`) by arrival; None (the default): on telemetry time,
        for replays, evaluations and demos (see the module docstring).

        ``congestion_params``: the congestion detector's parameter overrides (``counter_bits``,
        ``tick_bytes``, ``default_rate_bps``), so that the leaf counters read each link's
        ``xmit_wait`` as that detector does (:func:`xmit_wait_counter`); None: its defaults.
        ``flag_refresh_s``: detectors' ``refresh_s`` overrides, over :data:`HELD_FLAG_REFRESH_S`."""
        self.topology = topology
        self.health = health or PipelineHealth()
        self.anomaly_ttl_s = anomaly_ttl_s
        # how long each detector's anomalies are kept: anomaly_ttl_s, or 1.5 refreshes of a held flag
        self._flag_ttl = {name: max(anomaly_ttl_s, 1.5 * refresh)
                          for name, refresh in {**HELD_FLAG_REFRESH_S, **(flag_refresh_s or {})}.items()}
        self._lock = threading.Lock()
        # latest values as one (fields, slots) block per kind, so one kernel pass updates them;
        # ``_latest`` gives the same arrays by field name (rows of the block)
        self._latest_block = {kind: np.full((len(fields), topology.size(kind)), np.nan)
                              for kind, fields in LATEST_FIELDS.items()}
        self._latest = {kind: dict(zip(fields, self._latest_block[kind])) for kind, fields in LATEST_FIELDS.items()}
        self._seen = {kind: np.zeros(topology.size(kind), dtype=bool) for kind in LATEST_FIELDS}
        self._last_xid = np.full(topology.size("gpu"), np.nan)
        self._last_seen = {kind: np.full(topology.size(kind), -np.inf) for kind in LATEST_FIELDS}
        self._wall_clock = wall_clock  # None: telemetry time is the store's clock
        # a live store's: when each entity was last heard from (a timestamped row of it arrived),
        # on the wall clock; unused (left at -inf) on the telemetry clock
        self._heard = {kind: np.full(topology.size(kind), -np.inf) for kind in LATEST_FIELDS}
        # per link, what its xmit_wait counter has risen by since this store first saw it, across
        # the port's counter resets: what a per-leaf sum exported as a counter may add up (a sum
        # of the raw counters falls whenever one port's counter resets, and rate() reads that
        # fall as a reset of the sum: a spike of the whole sum). Each reading is judged as the
        # congestion detector judges it (a glitch, a wrap, a reset, a rise past the line rate):
        # read as Prometheus reads a counter, one reading of 0 between two of 2.49e9 added the
        # port's whole total to its leaf's counter (a false congestion spike on the fabric board)
        self._congestion_params = dict(congestion_params or {})
        self._xmit_wait = xmit_wait_counter(topology.size("link"), self._congestion_params)
        self._xmit_wait_increase = np.zeros(topology.size("link"))
        # by leaf name, the increase of links dropped from under that leaf (``move_to``): the
        # leaf's counter keeps it, or it would fall (rate() reads a fall as a reset: a spike)
        self._xmit_wait_dropped: dict[str, float] = {}
        # a live store's: per kind, for each of its last frames, the median time its entities had
        # gone unheard (``_hear``); see ``StoreSnapshot.report_interval_s``
        self._report_gaps: dict[str, deque[float]] = {kind: deque(maxlen=REPORT_GAP_FRAMES) for kind in LATEST_FIELDS}
        self._predictions: dict[PredictionKey, Prediction] = {}
        self._anomalies: dict[tuple[str, int, str, str], Anomaly] = {}
        # when each active finding was made, on the store's clock (by the same keys): its own
        # ``ts`` on the telemetry clock, when it reached the store on the wall clock
        self._prediction_heard: dict[PredictionKey, float] = {}
        self._anomaly_heard: dict[tuple[str, int, str, str], float] = {}
        # no active finding lapses before this time of the store's clock (a lower bound):
        # ``_expire`` scans only once the clock reaches it, not after every batch of findings
        self._next_expiry = -np.inf
        self._incidents: dict[str, Incident] = {}
        self._gauges: dict[str, tuple[str, np.ndarray, str]] = {}
        self._xids: Counter[tuple[int, int]] = Counter()  # (gpu slot, code)
        self._raised: Counter[str] = Counter()
        self._latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self._latency_sum = 0.0
        self._latency_count = 0
        self.last_ts = float("nan")
        self.newest_ts = float("nan")  # never goes back: a source stamping behind the others (a BMC a
        # minute late) moved the exported "newest sample processed" back at each of its frames
        self._lag = 0.0
        self._consumer_lag: dict[tuple[str, int], int] = {}

    # ---- the clock -------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """Whether this store measures on the wall clock (see the module docstring)."""
        return self._wall_clock is not None

    def use_wall_clock(self, clock: Callable[[], float] | None = None) -> None:
        """Measure on ``clock`` from now on (None: a :class:`SteadyClock`), as a store made with
        ``wall_clock``: for a live caller handed a store made elsewhere (``foreshock watch``'s comes
        with its sinks, a Kafka worker's with its server). What was heard before counts as heard now."""
        if clock is None:
            clock = SteadyClock()
        with self._lock:
            now = clock()
            self._wall_clock = clock
            for kind, last in self._last_seen.items():
                self._heard[kind] = np.where(np.isneginf(last), -np.inf, now)
            self._prediction_heard = dict.fromkeys(self._predictions, now)
            self._anomaly_heard = dict.fromkeys(self._anomalies, now)
            for gaps in self._report_gaps.values():
                gaps.clear()  # "heard now" above is no report: the next gaps are not the sources' interval
            self._next_expiry = -np.inf  # rescan on the new clock

    def _now(self) -> float:
        """The store's clock: the wall clock in a live store, else telemetry time (``last_ts``)."""
        return self._wall_clock() if self._wall_clock is not None else self.last_ts

    # ---- updates from the pipeline ---------------------------------------------------------
    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
        """Keep the latest value per entity and count new XIDs (vectorised)."""
        if len(frame) == 0:
            return
        self.health.processed(frame.kind, len(frame))
        with self._lock:
            fields = LATEST_FIELDS.get(frame.kind, ())
            if fields:
                columns = tuple(_own_limit(frame.columns[name]) if name in OWN_LIMIT_FIELDS
                                else kernel_column(frame.columns[name]) for name in fields)  # no (fields, rows) copy
                valued = np.empty(len(frame), dtype=np.bool_)
                newest = _observe_latest(frame.ts, frame.slot, columns, self._latest_block[frame.kind],
                                         self._seen[frame.kind], self._last_seen[frame.kind], valued)
                self._seen_by_other_fields(frame, fields, valued)
            else:
                newest = _newest(frame.ts)
                valued = None
            if frame.kind == "gpu":
                self._count_xids(frame)
            elif frame.kind == "link" and "xmit_wait" in frame.columns:
                self._accumulate_xmit_wait(frame)
            if newest[1]:  # some timestamp is finite: the newest (NaN skipped) is the clock
                self.last_ts = float(newest[0])
                if not self.newest_ts >= self.last_ts:  # (True for NaN)
                    self.newest_ts = self.last_ts
            if self._wall_clock is not None:
                self._hear(frame, valued)
            if received_wall is not None:  # (time.time when the batch came: the host's own clock)
                own = self._wall_clock is not None and not isinstance(self._wall_clock, SteadyClock)
                wall = self._wall_clock() if own and self._wall_clock is not None else time.time()
                self._lag = max(0.0, wall - received_wall)
            # findings lapse with the store's clock, not only when more findings come: a quiet
            # cluster after a burst kept exporting the burst's anomalies (and alerts) for good
            self._expire()

    def _seen_by_other_fields(self, frame: Frame, latest_fields: Sequence[str], valued: np.ndarray) -> None:
        """The rows ``_observe_latest`` found no latest value in that hold a reading of another field
        are reports all the same: their entity is seen then (and ``valued`` for :meth:`_hear`). The
        latest values are what the store shows, not what proves an entity alive: an ``ethtool -S``
        source's link rows carry byte, pause and discard counters and neither ``link_state`` nor
        ``xmit_wait``, and a dcgm page of error fields alone a GPU's ECC and PCIe counters (read as
        reports, since 2026-12-05, only as they hold one). Not ``NOT_A_REPORT``: a lost GPU's row keeps
        its last XID. Only the few rows without a latest value are looked at again."""
        slot = frame.slot
        seen = self._seen[frame.kind]
        rest = np.flatnonzero(~valued & (slot >= 0) & (slot < len(seen)))
        if not len(rest):
            return
        held = np.zeros(len(rest), dtype=bool)
        for name, column in frame.columns.items():
            if name not in latest_fields and name not in NOT_A_REPORT:
                held |= ~np.isnan(np.asarray(column, dtype=np.float64)[rest])
        rows = rest[held]
        if not len(rows):
            return
        valued[rows] = True
        seen[slot[rows]] = True
        ts = frame.ts[rows]
        stamped = ~np.isnan(ts)
        big = np.finfo(np.float64).max
        np.maximum.at(self._last_seen[frame.kind], slot[rows][stamped], np.clip(ts[stamped], -big, big))

    def _hear(self, frame: Frame, valued: np.ndarray | None) -> None:
        """A live store's: the entities of ``frame`` were heard from now — those of its rows
        with a timestamp (a row without one refreshes no ``last_seen`` either), a slot in
        the arrays and a value (``valued``, as ``_observe_latest`` found them: a lost GPU's row of
        NaN is no report)."""
        heard = self._heard.get(frame.kind)
        if heard is None:
            return
        slot = frame.slot
        rows = ~np.isnan(frame.ts) & (slot >= 0) & (slot < len(heard))
        if valued is not None:
            rows &= valued
        now = self._now()
        slots = slot[rows]
        before = heard[slots]
        gaps = now - before[np.isfinite(before)]  # the never-heard (and forgotten) have no gap
        gaps = gaps[gaps > 0]  # a second frame of the same instant is no new report
        if len(gaps):
            # the frame's median: a host back after a day's outage is one entity of many
            self._report_gaps[frame.kind].append(float(np.median(gaps)))
        heard[slots] = now

    def _accumulate_xmit_wait(self, frame: Frame) -> None:
        """Add what each link's xmit_wait rose by in ``frame``'s rows, read by the congestion
        detector's rules (:func:`xmit_wait_counter`), to ``_xmit_wait_increase``.

        The problems the reading finds (a glitch, a reset, a refused rise) are not counted here: the
        congestion detector (in the default bank) is handed the same guarded rows, judges them by the
        same rules and counts each in ``foreshock_input_problems_total``; counted here too, each bad
        reading would count twice (an alert divides the problems by the samples)."""
        values = kernel_column(frame.columns["xmit_wait"])[:, np.newaxis]
        delta, _, _ = self._xmit_wait.update(frame.ts, frame.slot, values)  # problems: see above
        risen = delta[:, 0]
        rows = risen > 0.0  # NaN: nothing known to have risen (a first reading, a refused or stale one)
        np.add.at(self._xmit_wait_increase, frame.slot[rows], risen[rows])

    def _count_xids(self, frame: Frame) -> None:
        # dcgm's XID field is the *last* XID and never resets: a new event is a change of value.
        # The first value seen for a GPU is not counted: it may be latched from long ago.
        # A reading that is no code (the detector's rule, ``is_xid_code``) is neither counted nor
        # remembered: 79.5 was served as a critical xid="79", and a -1 (an exporter's N/A) or DCGM's
        # not-supported sentinel remembered made the next reading of the latched code a new XID.
        # A code of a GPU outside the topology (a frame fed past the guard) is skipped and counted: read, it
        # was read and written out of the arrays' bounds. One pass (``xid_events``) finds the changes and
        # counts what it did not take.
        column = kernel_column(frame.columns["xid_last"])
        events = np.empty((len(column), 3))
        n, outside, fractional, out_of_range = xid_events(frame.slot, column, self._last_xid, events)
        for row, _, code in events[:n]:  # (codes > 0: a change to 0, no XID, is no event)
            self._xids[(int(frame.slot[int(row)]), int(code))] += 1
        if fractional:
            self.health.problem("store", "XID code not a whole number: not counted", fractional)
        if out_of_range:
            self.health.problem("store", "XID code outside the guard's range: not counted", out_of_range)
        if outside:
            self.health.problem("store", XID_OUTSIDE_TOPOLOGY, outside)

    def observe_findings(self, findings: Iterable[Finding]) -> None:
        with self._lock:
            for f in findings:
                self.health.emitted(f.type)
                if isinstance(f, Prediction):
                    key = prediction_key(f)
                    if f.active:
                        # raised: the first of its key; one a board swap carried (BOARD_FOLLOWED) was
                        # raised where the board was before: counted again, every move read as a raise
                        if key not in self._predictions and not BOARD_FOLLOWED.search(f.reason):
                            self._raised[f.event] += 1
                        self._predictions[key] = f
                        self._prediction_heard[key] = heard = self._made(f)
                        self._lower_expiry(self._prediction_expiry(f, heard))
                    else:
                        self._predictions.pop(key, None)
                        self._prediction_heard.pop(key, None)
                elif isinstance(f, Anomaly):
                    akey = (f.entity_kind, f.slot, f.field, f.detector)
                    self._anomalies[akey] = f
                    self._anomaly_heard[akey] = heard = self._made(f)
                    self._lower_expiry(heard + self._anomaly_ttl(f.detector))
                elif isinstance(f, Incident):
                    if f.state == "resolved":
                        self._incidents.pop(f.incident_id, None)
                    else:
                        self._incidents[f.incident_id] = f
            self._expire()

    def hold_incidents(self, incidents: Iterable[Incident]) -> None:
        """Open incidents a stage loaded from a checkpoint holds (a Kafka worker restarted, or taking
        the incident stage over in a rebalance): kept as :meth:`observe_findings` keeps them, not
        counted as emitted again (they were, when first reported). An engine reports an incident
        only as it changes: a steady one loaded so was missing from /metrics until it next changed
        or resolved (until 2026-12-04)."""
        with self._lock:
            for inc in incidents:
                if inc.state != "resolved":
                    self._incidents[inc.incident_id] = inc

    def _made(self, f: Anomaly | Prediction) -> float:
        """When ``f`` was made, on the store's clock: now in a live store (it has just come),
        else its own telemetry time."""
        return self._wall_clock() if self._wall_clock is not None else f.ts

    def forget(self, owned: dict[str, np.ndarray]) -> None:
        """Drop what is known of the entities that left this store's care (kind -> boolean mask by
        slot): a Kafka worker whose partition moves to another worker must stop exporting those
        entities' latest values, active findings and estimates, or the cluster's sums (GPUs
        reporting, throttled GPUs) would count them twice — and for as long as this worker's own
        telemetry clock stood still. XID counters stay: they must only grow; and so does what each
        link's xmit_wait rose by (its leaf's counter): frozen here, it adds nothing more to
        rate(), and the new owner counts the link from 0, so nothing is counted twice."""
        with self._lock:
            for kind, mask in owned.items():
                mask = np.asarray(mask, dtype=bool)
                if kind in self._latest_block:
                    self._latest_block[kind][:, mask] = np.nan
                    self._seen[kind][mask] = False
                    self._last_seen[kind][mask] = -np.inf
                    self._heard[kind][mask] = -np.inf
                if kind == "gpu":
                    self._last_xid[mask] = np.nan
                if kind == "link":
                    # the next reading of a link back in this store's care is a first reading:
                    # what it rose by meanwhile was counted by its owner then (no pace, no
                    # pending low reading either: they were of readings long past)
                    for link_state in (self._xmit_wait.s_state, self._xmit_wait.s_rate, self._xmit_wait.s_drop):
                        link_state[mask] = np.nan
            self._predictions = {k: p for k, p in self._predictions.items()
                                 if not _owned(owned, p.entity_kind, p.slot)}
            self._anomalies = {k: a for k, a in self._anomalies.items()
                               if not _owned(owned, a.entity_kind, a.slot)}
            self._prediction_heard = {k: self._prediction_heard[k] for k in self._predictions}
            self._anomaly_heard = {k: self._anomaly_heard[k] for k in self._anomalies}
            for name, (kind, values, help_text) in list(self._gauges.items()):
                if kind in owned and values.shape == np.shape(owned[kind]):
                    self._gauges[name] = (kind, np.where(owned[kind], np.nan, values), help_text)

    def active_predictions(self, kind: str, slots: Sequence[int] | np.ndarray) -> list[Prediction]:
        """The active predictions about entities ``slots`` of ``kind``."""
        wanted = set(np.asarray(slots, dtype=np.int64).tolist())
        with self._lock:
            return [p for (_, k, slot, _), p in self._predictions.items() if k == kind and slot in wanted]

    def forget_limits(self, slots: Sequence[int] | np.ndarray) -> None:
        """Forget the limits GPU ``slots``' boards reported (``OWN_LIMIT_FIELDS``): their boards
        were swapped, and the new ones are exported and alerted on against their own, or the
        defaults, not the old ones'; their other latest values stay. Their last XID is forgotten
        too: a new board's first reading is a first value (``_count_xids``), which may be latched
        from long ago, not a change from the old board's."""
        slots = np.asarray(slots, dtype=np.int64)
        with self._lock:
            gpu_fields = LATEST_FIELDS["gpu"]
            for row in (gpu_fields.index(name) for name in OWN_LIMIT_FIELDS):
                self._latest_block["gpu"][row, slots] = np.nan
            self._last_xid[slots] = np.nan

    def follow_gpu_boards(self, take_from: np.ndarray) -> None:
        """Move the active anomalies about GPUs with their boards. ``take_from``: per GPU slot, the
        slot whose board it holds now — itself where nothing changed, -1 where a new board (an RMA)
        or none is there (``BoardSwap.take_from``). A moved board's flags go to its new slot, its
        reason saying where from; a slot with a new board, or none, keeps none of the flags about
        the board that was there: the detectors' state for it starts afresh and never refreshes
        nor clears them, so a cooling flag stood up to 900 s on the board that mended it, and a
        renumbered node's flag on the board now in its old index. (Predictions follow the boards
        in the pipeline, which tells the sinks: ``DetectorBank.follow_predictions``.)"""
        take_from = np.asarray(take_from, dtype=np.int64)
        changed = np.flatnonzero(take_from != np.arange(len(take_from)))
        if not len(changed):
            return
        went = {int(take_from[s]): int(s) for s in changed.tolist() if take_from[s] >= 0}
        touched = set(changed.tolist())
        with self._lock:
            anomalies: dict[tuple[str, int, str, str], Anomaly] = {}
            heard: dict[tuple[str, int, str, str], float] = {}
            for key, a in self._anomalies.items():
                if a.entity_kind == "gpu" and a.slot in went:
                    a = dataclasses.replace(a, slot=went[a.slot], reason=f"{BOARD_FOLLOWED.sub('', a.reason)} "
                                            f"(its board moved from {self.topology.name('gpu', a.slot)})")
                elif a.entity_kind == "gpu" and a.slot in touched:
                    continue
                new_key = (a.entity_kind, a.slot, a.field, a.detector)
                anomalies[new_key], heard[new_key] = a, self._anomaly_heard[key]
            self._anomalies, self._anomaly_heard = anomalies, heard

    def move_to(self, topology: Topology, remap: Remap | None = None) -> None:
        """Index everything by ``topology`` from now on: what is known of each entity (latest
        values, active findings, estimates, XID counts) follows it by name (``remap``: from this
        store's topology to ``topology``; made here when not given), a new entity starts unseen.
        For ``foreshock watch``, whose live source took in new GPUs or forgot a host: the /metrics
        server keeps this store (and its port and counters) and exports the new entities at the
        next scrape. What belonged to an entity ``topology`` no longer lists is dropped, XID counts
        too (they cannot be labelled without it), but for what a link's xmit_wait rose by: its
        leaf's counter keeps it (``_move_xmit_wait``). Incidents name their entities and stay as
        they are (the pipeline resolves those the move left without an engine's incident)."""
        with self._lock:
            remap = remap if remap is not None else Remap(self.topology, topology)
            self._latest_block = {kind: self._moved(remap, topology, kind, block, np.nan, axis=1)
                                  for kind, block in self._latest_block.items()}
            self._latest = {kind: dict(zip(LATEST_FIELDS[kind], block)) for kind, block in self._latest_block.items()}
            self._seen = {kind: self._moved(remap, topology, kind, seen, False) for kind, seen in self._seen.items()}
            self._last_seen = {kind: self._moved(remap, topology, kind, last, -np.inf)
                               for kind, last in self._last_seen.items()}
            self._heard = {kind: self._moved(remap, topology, kind, heard, -np.inf)
                           for kind, heard in self._heard.items()}
            self._last_xid = self._moved(remap, topology, "gpu", self._last_xid, np.nan)
            self._xmit_wait_increase = self._move_xmit_wait(topology, remap)
            self._xmit_wait = self._moved_xmit_wait_counter(topology, remap)
            gpu_slot = remap.new_of_old["gpu"]
            xids: Counter[tuple[int, int]] = Counter()
            for (slot, code), n in self._xids.items():
                if 0 <= slot < len(gpu_slot) and gpu_slot[slot] >= 0:
                    xids[(int(gpu_slot[slot]), code)] += n
            self._xids = xids
            predictions = list(_moved_findings(remap, self._predictions, self._prediction_heard))
            self._predictions = {prediction_key(p): p for p, _ in predictions}
            self._prediction_heard = {prediction_key(p): heard for p, heard in predictions}
            anomalies = list(_moved_findings(remap, self._anomalies, self._anomaly_heard))
            self._anomalies = {(a.entity_kind, a.slot, a.field, a.detector): a for a, _ in anomalies}
            self._anomaly_heard = {(a.entity_kind, a.slot, a.field, a.detector): heard for a, heard in anomalies}
            self._gauges = {name: (kind, self._moved(remap, topology, kind, values, np.nan), help_text)
                            for name, (kind, values, help_text) in self._gauges.items()
                            if len(values) == self.topology.size(kind)}  # the next publish sets the rest
            self.topology = topology

    def _move_xmit_wait(self, topology: Topology, remap: Remap) -> np.ndarray:
        """What each link's xmit_wait rose by, renumbered for ``topology``. A link's total counts
        in its leaf's counter (``foreshock_leaf_xmit_wait_ticks_total``), which must never fall:
        the total of a link gone, or no longer under the same leaf (another leaf, or none), stays
        with its old leaf (``_xmit_wait_dropped``, by name), and a link now under another leaf
        starts there from 0 (its old total added to the new leaf would read as a burst)."""
        old = self.topology
        increase = self._moved(remap, topology, "link", self._xmit_wait_increase, 0.0)
        old_of_new = remap.old_of_new["link"]
        new_of_old = np.full(old.size("link"), -1, dtype=np.int64)  # where each old link's total went
        took = np.flatnonzero(old_of_new >= 0)
        new_of_old[old_of_new[took]] = took
        for s in np.flatnonzero(self._xmit_wait_increase > 0).tolist():
            leaf = _leaf_name(old, s)
            n = int(new_of_old[s])
            if n >= 0 and _leaf_name(topology, n) == leaf:
                continue  # the same link under the same leaf: its total went with it
            if leaf is not None:
                total = float(self._xmit_wait_increase[s])
                self._xmit_wait_dropped[leaf] = self._xmit_wait_dropped.get(leaf, 0.0) + total
            if n >= 0:
                increase[n] = 0.0
        return increase

    def _moved_xmit_wait_counter(self, topology: Topology, remap: Remap) -> CounterRates:
        """The links' xmit_wait reader for ``topology``: each link's last reading, pace and pending
        low reading follow it (its next reading is judged as it would have been), a new link has
        none (its first reading adds nothing)."""
        counter = xmit_wait_counter(topology.size("link"), self._congestion_params)
        state = self._xmit_wait.state_dict()
        counter.bind(*(self._moved(remap, topology, "link", state[name], 0 if name == "s_resets" else np.nan)
                       for name in ("s_state", "s_resets", "s_rate", "s_drop")))
        return counter

    @staticmethod
    def _moved(remap: Remap, topology: Topology, kind: str, saved: np.ndarray, fill: float | bool,
               axis: int = 0) -> np.ndarray:
        """``saved`` (by ``kind``'s slots along ``axis``) renumbered for ``topology``: a new entity
        gets ``fill``. Jobs are not hardware: they keep their rows while their number stays."""
        shape = list(saved.shape)
        shape[axis] = topology.size(kind)
        fresh = np.full(shape, fill, dtype=saved.dtype)
        if kind in remap.old_of_new:
            return remap.rows(kind, saved, fresh, axis=axis)
        return saved if saved.shape == fresh.shape else fresh

    def _prediction_expiry(self, p: Prediction, heard: float) -> float:
        # a prediction that was never refreshed nor withdrawn lapses after its horizon, counted
        # from when it was made (``heard``, on the store's clock)
        return heard + max(p.eta_s, 0.0) + self.anomaly_ttl_s

    def _anomaly_ttl(self, detector: str) -> float:
        """How long an anomaly of ``detector`` is kept after it was said (:data:`HELD_FLAG_REFRESH_S`)."""
        return self._flag_ttl.get(detector, self.anomaly_ttl_s)

    def _lower_expiry(self, expiry: float) -> None:
        if expiry < self._next_expiry:  # False for NaN: such a finding never lapses
            self._next_expiry = expiry

    def _expire(self) -> None:
        now = self._now()
        # the margin keeps the exact test below in charge at the boundary (rounding)
        if not np.isfinite(now) or now < self._next_expiry - 1e-3:
            return
        for akey, heard in list(self._anomaly_heard.items()):
            if now - heard > self._anomaly_ttl(akey[3]):
                del self._anomalies[akey], self._anomaly_heard[akey]
        for pkey, heard in list(self._prediction_heard.items()):
            if now - heard > max(self._predictions[pkey].eta_s, 0.0) + self.anomaly_ttl_s:
                del self._predictions[pkey], self._prediction_heard[pkey]
        self._next_expiry = np.inf
        for akey, heard in self._anomaly_heard.items():
            self._lower_expiry(heard + self._anomaly_ttl(akey[3]))
        for pkey, heard in self._prediction_heard.items():
            self._lower_expiry(self._prediction_expiry(self._predictions[pkey], heard))

    def set_gauges(self, gauges: dict[str, tuple[str, np.ndarray, str]],
                   owned: dict[str, np.ndarray] | None = None) -> None:
        """Per-entity estimates published by detectors: name -> (kind, values by slot, help).

        ``owned`` (kind -> boolean mask by slot) restricts the update to the slots this caller
        owns: a Kafka worker runs one pipeline per partition over one shared store, and each
        partition must update only its own entities.
        """
        with self._lock:
            for name, (kind, values, help_text) in gauges.items():
                values = np.asarray(values, dtype=np.float64)
                current = self._gauges.get(name)
                if owned is None or kind not in owned or current is None or current[1].shape != values.shape:
                    merged = values.copy() if owned is None or kind not in owned else np.where(owned[kind], values, np.nan)
                else:
                    merged = np.where(owned[kind], values, current[1])
                self._gauges[name] = (kind, merged, help_text)

    def observe_latency(self, seconds: float) -> None:
        with self._lock:
            i = bisect.bisect_left(LATENCY_BUCKETS, seconds)  # np.searchsorted's bucket, without an array
            self._latency_counts[i] += 1
            self._latency_sum += seconds
            self._latency_count += 1

    # ---- reads -----------------------------------------------------------------------------
    def snapshot(self) -> StoreSnapshot:
        with self._lock:
            if self._wall_clock is not None:
                self._expire()  # a scrape of a quiet live store sees what lapsed since the last frame
            last_seen = {k: v.copy() for k, v in self._last_seen.items()}
            return StoreSnapshot(
                topology=self.topology,
                latest={k: {f: v.copy() for f, v in d.items()} for k, d in self._latest.items()},
                seen={k: v.copy() for k, v in self._seen.items()},
                predictions=list(self._predictions.values()),
                anomalies=list(self._anomalies.values()),
                incidents=list(self._incidents.values()),
                gauges=dict(self._gauges),
                problems=dict(self.health.problems),
                samples=dict(self.health.samples),
                findings=dict(self.health.findings),
                dead_letters=self.health.dead_letters,
                xids=dict(self._xids),
                last_seen=last_seen,
                latency_counts=list(self._latency_counts),
                latency_sum=self._latency_sum,
                latency_count=self._latency_count,
                last_ts=self.last_ts,
                newest_ts=self.newest_ts,
                ingest_lag_s=self._lag,
                predictions_raised=dict(self._raised),
                xmit_wait_increase=self._xmit_wait_increase.copy(),
                xmit_wait_dropped=dict(self._xmit_wait_dropped),
                clock=self._now(),
                heard={k: v.copy() for k, v in self._heard.items()} if self._wall_clock is not None else last_seen,
                predictions_heard=dict(self._prediction_heard),
                report_interval_s={kind: _lower_median(gaps) for kind, gaps in self._report_gaps.items()}
                if self._wall_clock is not None else {},
                consumer_lag=dict(self._consumer_lag),
            )

    def set_consumer_lag(self, topic: str, partition: int, records: int | None) -> None:
        """A Kafka worker's count of ``topic``/``partition``'s records it has not processed yet (its
        high watermark less the next offset to process; ``foreshock_consumer_lag_records``); None: the
        partition left this worker (its series goes with it)."""
        with self._lock:
            if records is None:
                self._consumer_lag.pop((topic, partition), None)
            else:
                self._consumer_lag[(topic, partition)] = records

    def incidents(self) -> list[Incident]:
        """The incidents exported now (not resolved)."""
        with self._lock:
            return list(self._incidents.values())

    def forget_incidents(self) -> None:
        """Drop the incidents: this worker no longer runs the incident stage (its new owner
        publishes them, and resolves them: this store would never hear of it)."""
        with self._lock:
            self._incidents.clear()


_EntityFinding = TypeVar("_EntityFinding", Anomaly, Prediction)
_Key = TypeVar("_Key")


def _moved_findings(remap: Remap, findings: dict[_Key, _EntityFinding],
                    heard: dict[_Key, float]) -> Iterator[tuple[_EntityFinding, float]]:
    """``findings`` (by key; ``heard``: when each was made, by the same keys) with each entity's
    slot in the new numbering, and when it was made; those of entities gone, left out."""
    for key, f in findings.items():
        when = heard[key]
        table = remap.new_of_old.get(f.entity_kind)
        if table is None:  # a job: jobs are not renumbered by a change of hardware
            yield f, when
        elif 0 <= f.slot < len(table) and table[f.slot] >= 0:
            yield dataclasses.replace(f, slot=int(table[f.slot])), when


def xmit_wait_counter(links: int, congestion_params: Mapping[str, float] | None = None) -> CounterRates:
    """A reader of ``links`` links' ``xmit_wait`` counters by the congestion detector's rules, with
    its parameter overrides ``congestion_params`` (:func:`~foreshock.detectors.congestion.xmit_wait_limits`),
    so that a reading is a glitch, a wrap, a reset or refused for the store's leaf counters exactly
    when it is for that detector."""
    modulus, max_rate = xmit_wait_limits(params_vector(dict(congestion_params or {})))
    return CounterRates(links, ("xmit_wait",), modulus=modulus, max_rate=max_rate)


def _leaf_name(topology: Topology, link: int) -> str | None:
    """The name of the leaf switch link ``link`` of ``topology`` serves (None: not a GPU's link)."""
    leaf = int(topology.link_leaf[link])
    return topology.switches[leaf] if leaf >= 0 else None


def _lower_median(values: Iterable[float]) -> float:
    """The lower median of ``values`` (NaN for none). Of the last few frames' report gaps, it
    is the sources' interval however a few of them read: a pipeline pause, or one poll that took
    long, is one long gap of many and is not it — and leaves the kept frames a few frames later,
    so it never widens the window for good; of two (early on), the shorter."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else float("nan")


def _owned(owned: dict[str, np.ndarray], kind: str, slot: int) -> bool:
    mask = owned.get(kind)
    return mask is not None and 0 <= slot < len(mask) and bool(mask[slot])


def _own_limit(column: np.ndarray) -> np.ndarray:
    """A threshold column with every value that is no report (see ``OWN_LIMIT_FIELDS``) as NaN."""
    with np.errstate(invalid="ignore"):
        reported = (column > OWN_LIMIT_MIN_C) & (column < OWN_LIMIT_MAX_C)  # False for NaN
    return np.where(reported, column, np.nan)


def xid_severity(code: int) -> str:
    return XID_SEVERITY.get(code, "info")


@jit
def _observe_latest(ts: np.ndarray, slot: np.ndarray, columns: tuple[np.ndarray, ...], latest: np.ndarray,
                    seen: np.ndarray, last_seen: np.ndarray, valued: np.ndarray) -> tuple[float, bool]:
    """Per row (time-ordered): each non-NaN value of ``columns`` (one array per field, in the
    order of ``latest``'s rows) becomes the slot's latest value; a row with one is ``valued`` and its
    slot seen, at its newest timestamp. A row with none is no report of its entity unless it holds
    another field's reading (the caller's to judge: ``FindingStore._seen_by_other_fields``): the sources keep
    a lost GPU's row with every reading NaN (XID 79, fallen off the bus: ``streams/nvml.py``,
    ``streams/nvidia_smi.py``) and a job that ended its row with no step time, and such rows kept
    the last values exported for good (a GPU lost braking at 93 °C kept ForeshockPowerBrake and
    ForeshockHbmTemperatureNearLimit firing and ForeshockGpuMissing from firing, until 2026-12-05).
    Returns the frame's newest timestamp (NaN skipped; infinities count, as in ``np.nanmax``) and
    whether any is finite. Rows with a slot outside the arrays are skipped."""
    fields = len(columns)
    newest = -np.inf
    any_finite = False
    big = np.finfo(np.float64).max
    for i in range(len(slot)):
        t = ts[i]
        if t == t:
            if t > newest:
                newest = t
            if np.isfinite(t):
                any_finite = True
        valued[i] = False
        s = slot[i]
        if s < 0 or s >= len(seen):  # the guard lets none through; never write outside the arrays
            continue
        for j in range(fields):
            v = columns[j][i]
            if v == v:
                latest[j, s] = v
                valued[i] = True
        if not valued[i]:
            continue
        seen[s] = True
        if t == t:
            clipped = min(max(t, -big), big)  # what np.nan_to_num made of infinities
            if clipped > last_seen[s]:
                last_seen[s] = clipped
    return newest, any_finite


@jit
def _newest(ts: np.ndarray) -> tuple[float, bool]:
    """``_observe_latest``'s clock alone, for kinds without latest values."""
    newest = -np.inf
    any_finite = False
    for t in ts:
        if t != t:
            continue
        if t > newest:
            newest = t
        if np.isfinite(t):
            any_finite = True
    return newest, any_finite
