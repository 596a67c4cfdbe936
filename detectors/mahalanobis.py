"""Multivariate anomalies: each GPU's (and node's) fields scored together, each anomaly naming
the fields that broke their usual relation.

Per entity, :class:`~foreshock.detectors.multivariate.OnlineMahalanobis` keeps a robust
exponentially weighted mean and covariance of the entity's field vector (the fields in
:data:`FIELDS`; counters enter as per-second rates) and scores every sample by its squared
Mahalanobis distance ``D^2``, split into per-field contributions that sum to it. Power and
temperature that usually move together and suddenly do not (temperature flat while power rises:
a stuck sensor; temperature up at steady power: failing cooling) each look normal alone and are
far out together.

Deciding is separate from scoring: an entity alarms once ``D^2`` has passed the
``quantile`` of a chi-square with one degree of freedom per field on ``on_count``
consecutive samples, and re-arms once ``D^2`` has stayed below the ``clear_quantile`` for
``off_hold_s`` of telemetry time (:func:`foreshock.detectors.alarm.alarm_step`). One alarm
episode is one :class:`~foreshock.findings.Anomaly`: ``field`` is the top contributing field,
``reason`` the top three with their share of ``D^2`` and whether each sat above or below its
learnt mean. Nothing is predicted, and a field is not scored before ``warmup`` samples of its own
(one that appears late, or a counter's rate, absent from an entity's first row, warms up alone).

While an entity's alarm holds, its model does not learn (for at most ``freeze_s`` of telemetry
time), so the anomaly is measured against the normal it broke from and the episode lasts as long
as the break — even the down-weighted robust update would otherwise make a break the new normal
within a minute, and blunt the next one. A change that outlasts ``freeze_s`` is then learnt (as
a new normal, down-weighted), the episode ends, and the detector re-arms. In a frame with several
rows per entity, the rows after an episode's start still learn (the freeze is read per frame).

Missing fields (NaN) are imputed at the entity's mean — they add nothing to ``D^2`` — and the
rows that had any are counted in ``imputed_rows`` (the input guard already reports the gaps
to pipeline health). A row with none of the fields is not scored: counted in ``skipped_rows``
and, when other rows of the frame do report the fields, as a pipeline problem. A counter reading
further above the last one than the counter can physically count (:data:`MAX_RATE`: energy at the
most a board draws, throttle time at 4x the time elapsed, ...) is refused and counted
(``implausible_rise``, :mod:`~foreshock.detectors.counters`); its rate is imputed like a gap, and
the next reading's rate is taken from the last good one, or from the refused one where the next
goes on from it (``rebased``: an ``energy`` read 0 at the second poll costs two polls).

Not in the default bank: run it with ``--detectors mahalanobis`` (or next to others).

State per GPU with the 8 default fields: mean 8 + covariance 64 + count 1 + per-field counts 8 +
alarm 4 float64, plus 3 counters x (last value, last time, pace, and a pending drop's 6 columns)
float64 and 3 int64 reset counts = 115 x 8 = **920 bytes** (``fields^2 + 2 fields + 5`` floats +
10 words per counter); 942 kB for 1,024 GPUs.

>>> import numpy as np
>>> from foreshock.frames import Frame
>>> from foreshock.topology import Topology
>>> topo = Topology.from_gpu_hosts([("n0", 0)])
>>> det = MahalanobisDetector(topo, gpu_fields="gpu_temp,power", warmup=100)
>>> rng = np.random.default_rng(0)
>>> load = rng.uniform(300, 700, 600)
>>> power = load + rng.normal(0, 5, 600)
>>> temp = 30 + 0.05 * load + rng.normal(0, 0.3, 600)
>>> power[500:] += 150                      # power up, temperature does not follow
>>> found = []
>>> for t in range(600):
...     found += det.update(Frame("gpu", [float(t)], [0], {"gpu_temp": [temp[t]], "power": [power[t]]}))
>>> len(found), found[0].field, found[0].ts >= 500
(1, 'power', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from foreshock.fields import field_names, get_field
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .alarm import A_ACTIVE, A_EMIT_TS, CODE_START, alarm_step, new_alarm_columns
from .base import Detector, resolve_params
from .counters import EVENTS_MAX_PER_S, TIME_MAX_PER_S, CounterRates, report_problems, with_counter_pace_and_drop
from .multivariate import OnlineMahalanobis, with_field_counts
from .xid import DBE_MAX_PER_S

FIELDS: dict[str, tuple[str, ...]] = {
    # Every numeric GPU field that varies with the GPU's state. Left out: slowdown_temp,
    # power_limit and sm_clock_max (configured limits: constant, a change is a configuration
    # event); energy (its rate is the power again, a collinear copy); throttle_reasons and
    # xid_last (a bitmask and a latched code, not magnitudes); ecc_dbe and remapped_rows
    # (rates that are zero almost always: the first event would be an unbounded distance; the
    # xid detector and the counters themselves report those).
    "gpu": ("gpu_temp", "hbm_temp", "power", "sm_clock", "util",
            "power_throttle_time", "thermal_throttle_time", "pcie_replays"),
    "node": ("fan_speed", "psu_power"),
}
"""The fields scored together, per entity kind (counters enter as per-second rates)."""

MIN_SCALE: dict[str, float] = {
    # A field's smallest meaningful standard deviation, in its base unit (per second for a
    # counter's rate): a field that sat still (util pinned at 1, an integer temperature
    # reading) must not turn its first small move into an unbounded distance.
    "gpu_temp": 0.5, "hbm_temp": 0.5,           # integer readings
    "power": 5.0, "psu_power": 20.0,            # watts
    "sm_clock": 15e6,                           # one clock bin
    "util": 0.02, "fan_speed": 0.01,            # ratios
    "power_throttle_time": 0.02, "thermal_throttle_time": 0.02,  # seconds held per second
    "pcie_replays": 0.1,                        # replays per second
}
"""Variance floor per field (as a standard deviation); a field not listed has none."""

MAX_RATE: dict[str, float] = {
    # The fastest each GPU counter can physically count, in its base unit per second: a reading
    # further above the last one is a bad one, not taken (counters.py, "One high reading"). Taken, one
    # garbage reading was a rate that alone passed the alarm line, and its fall back a reset that
    # re-added the counter's whole total. Every counter of a scored kind is listed (a test holds it).
    "energy": get_field("power").valid[1],  # joules/s: the most any board draws (5 kW, the guard's power range)
    "power_throttle_time": TIME_MAX_PER_S,  # seconds held per second
    "thermal_throttle_time": TIME_MAX_PER_S,
    # a replay resends at least one TLP, longer than 64 bits, on a link slower than the fastest
    # port (PCIe 6.0 x16: 1 Tb/s)
    "pcie_replays": EVENTS_MAX_PER_S,
    "ecc_dbe": DBE_MAX_PER_S,  # as the xid detector reads it
    "remapped_rows": DBE_MAX_PER_S,  # a row is remapped for an uncorrectable error: at most one each
}
"""Physical bound per counter field (``CounterRates``' ``max_rate``); a counter not listed has none."""

PARAMS: dict[str, float] = {
    "alpha": 0.005,           # EWMA rate of mean and covariance (~200 samples of memory)
    "ridge": 0.01,            # shrinkage of the correlations towards 0
    "clip": 3.0,              # robust learning bound, chi-square standard deviations
    "warmup": 300.0,          # samples per entity before it is scored
    "quantile": 0.99999,      # alarm: D^2 above this chi-square quantile (d = fields) ...
    "on_count": 3.0,          # ... on this many consecutive samples
    "clear_quantile": 0.99,   # re-arm: D^2 below this quantile ...
    "off_hold_s": 60.0,       # ... for this long (telemetry time)
    "freeze_s": 600.0,        # an alarmed entity is not learnt for at most this long
}
ON_D2, CLEAR_D2, ON_COUNT, OFF_HOLD = range(4)


@jit
def _episodes(ts: np.ndarray, slot: np.ndarray, d2: np.ndarray, alarm: np.ndarray, limits: np.ndarray,
              starts: np.ndarray) -> int:
    """Advance each row's entity alarm on its D^2; write the rows that start an episode into
    ``starts`` and return how many. A row with no score (no finite field) decides nothing."""
    n = 0
    for i in range(len(ts)):
        v = d2[i]
        if v != v:
            continue
        code = alarm_step(alarm, slot[i], 0, ts[i], v > limits[ON_D2], v < limits[CLEAR_D2],
                          limits[ON_COUNT], limits[OFF_HOLD], np.inf)
        if code == CODE_START:
            starts[n] = i
            n += 1
    return n


def _field_list(kind: str, fields: str | Sequence[str] | None) -> tuple[str, ...]:
    """``fields`` as a tuple (a comma-separated string as ``--param`` gives it), validated."""
    if fields is None:
        return FIELDS[kind]
    names = tuple(f.strip() for f in fields.split(",")) if isinstance(fields, str) else tuple(fields)
    names = tuple(f for f in names if f)
    known = field_names(kind)
    bad = [f for f in names if f not in known or get_field(f).unit in ("bitmask", "code")]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"mahalanobis: {kind} fields must be distinct numeric fields of the kind; "
                         f"not usable: {bad or sorted(names)}")
    return names


@dataclass
class _KindModel:
    """Everything the detector keeps for one entity kind."""

    kind: str
    fields: tuple[str, ...]
    counters: tuple[str, ...]
    model: OnlineMahalanobis
    rates: CounterRates
    alarm: np.ndarray
    limits: np.ndarray

    def inputs(self, frame: Frame) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
        """(rows, fields) with counters as per-second rates; the raw values' finiteness; the
        counter problems."""
        raw = np.stack([frame.columns[f] for f in self.fields], axis=1)
        x = raw.copy()
        problems: dict[str, int] = {}
        if self.counters:
            cols = [self.fields.index(c) for c in self.counters]
            _, rate, problems = self.rates.update(frame.ts, frame.slot, raw[:, cols])
            x[:, cols] = rate
        return x, np.isfinite(raw), problems


class MahalanobisDetector(Detector):
    """Per-entity online Mahalanobis distance over many fields; one anomaly per episode."""

    slot_kinds: ClassVar[Mapping[str, str]] = {
        f"s_{kind}_{part}": kind for kind in ("gpu", "node")
        for part in ("mean", "cov", "count", "seen", "counter_state", "counter_resets", "counter_rate", "counter_drop",
                     "alarm")}
    name: ClassVar[str] = "mahalanobis"
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "node")
    state_scalars: ClassVar[tuple[str, ...]] = ("imputed_rows", "skipped_rows")

    def __init__(self, topology: Topology, health: PipelineHealth | None = None,
                 gpu_fields: str | Sequence[str] | None = None, node_fields: str | Sequence[str] | None = None,
                 **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.p = resolve_params(self.name, PARAMS, params)
        p = self.p
        if not (0.0 < p["clear_quantile"] <= p["quantile"] < 1.0):
            raise ValueError("mahalanobis: need 0 < clear_quantile <= quantile < 1")
        if p["on_count"] < 1 or p["off_hold_s"] < 0 or p["freeze_s"] < 0:
            raise ValueError("mahalanobis: on_count must be >= 1, off_hold_s and freeze_s >= 0")
        from scipy.stats import chi2  # only here: the thresholds, once

        self.imputed_rows = 0
        self.skipped_rows = 0
        self.models: dict[str, _KindModel] = {}
        for kind, chosen in (("gpu", gpu_fields), ("node", node_fields)):
            fields = _field_list(kind, chosen)
            n = topology.size(kind)
            if not fields or n == 0:
                continue
            d = len(fields)
            model = OnlineMahalanobis(n, d, alpha=p["alpha"], ridge=p["ridge"], clip=p["clip"],
                                      warmup=int(p["warmup"]), field_names=fields,
                                      min_scale=[MIN_SCALE.get(f, 0.0) for f in fields])
            counters = tuple(f for f in fields if get_field(f).is_counter)
            limits = np.array([chi2.ppf(p["quantile"], d), chi2.ppf(p["clear_quantile"], d),
                               p["on_count"], p["off_hold_s"]])
            rates = CounterRates(n, counters, max_rate=[MAX_RATE.get(c, np.inf) for c in counters])
            m = _KindModel(kind, fields, counters, model, rates, new_alarm_columns(n, 1), limits)
            self.models[kind] = m
            # the state the base class saves and restores, by reference (loading writes in place)
            setattr(self, f"s_{kind}_mean", model.s_mean)
            setattr(self, f"s_{kind}_cov", model.s_cov)
            setattr(self, f"s_{kind}_count", model.s_count)
            setattr(self, f"s_{kind}_seen", model.s_seen)
            setattr(self, f"s_{kind}_counter_state", m.rates.s_state)
            setattr(self, f"s_{kind}_counter_resets", m.rates.s_resets)
            # the counters' pace and a low reading pending (a glitch or a reset): without them a
            # glitch across a restore read as a reset, the next reading as the counter's whole total
            setattr(self, f"s_{kind}_counter_rate", m.rates.s_rate)
            setattr(self, f"s_{kind}_counter_drop", m.rates.s_drop)
            setattr(self, f"s_{kind}_alarm", m.alarm)

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved before the counters' pace and pending drops were kept knows none (NaN); one
        saved before the model counted each field's values has them derived (:func:`with_field_counts`)."""
        for kind in self.models:
            state = with_counter_pace_and_drop(state, f"s_{kind}_counter_state", f"s_{kind}_counter_rate",
                                               f"s_{kind}_counter_drop")
            state = with_field_counts(state, f"s_{kind}_mean", f"s_{kind}_cov", f"s_{kind}_count",
                                      f"s_{kind}_seen")
        return state

    def update(self, frame: Frame) -> list[Finding]:
        m = self.models.get(frame.kind)
        if m is None or len(frame) == 0:
            return []
        known = (frame.slot >= 0) & (frame.slot < len(m.alarm))
        if not known.all():  # the input guard drops these first in both pipelines; used directly, count them
            self.health.problem(self.name, f"{frame.kind} rows with an unknown slot", int(np.count_nonzero(~known)))
            frame = frame.take(known)
            if len(frame) == 0:
                return []
        x, finite, problems = m.inputs(frame)
        report_problems(self.health, self.name, problems)
        alarm = m.alarm[frame.slot]
        frozen = (alarm[:, A_ACTIVE] == 1.0) & (frame.ts - alarm[:, A_EMIT_TS] < self.p["freeze_s"])
        res = m.model.update_rows(frame.slot, x, learn=~frozen)
        d = len(m.fields)
        d2 = np.ascontiguousarray(res.score ** 2 * d)
        self._count_missing(frame.kind, finite)
        starts = np.empty(len(frame), np.int64)
        n = _episodes(frame.ts, frame.slot, d2, m.alarm, m.limits, starts)
        out: list[Finding] = []
        for row in starts[:n]:
            contrib = res.contributions[row]
            top = int(np.argmax(contrib))
            out.append(Anomaly(ts=float(frame.ts[row]), entity_kind=frame.kind, slot=int(frame.slot[row]),
                               field=m.fields[top], score=float(res.score[row]), detector=self.name,
                               reason=self._reason(m, float(d2[row]), contrib, res.residuals[row], x[row])))
        return out

    def _count_missing(self, kind: str, finite: np.ndarray) -> None:
        per_row = finite.sum(axis=1)
        d = finite.shape[1]
        skipped = int(np.count_nonzero(per_row == 0))
        self.imputed_rows += int(np.count_nonzero((per_row > 0) & (per_row < d)))
        self.skipped_rows += skipped
        # a frame with none of the fields anywhere comes from a source that does not report them
        if skipped and skipped < len(per_row):
            self.health.problem(self.name, f"{kind} rows with none of the scored fields (not scored)", skipped)

    @staticmethod
    def _reason(m: _KindModel, d2: float, contrib: np.ndarray, resid: np.ndarray, x: np.ndarray) -> str:
        parts = []
        for i in np.argsort(-contrib)[:3]:
            name = m.fields[i]
            unit = get_field(name).unit + ("/s" if name in m.counters else "")
            where = "above" if resid[i] > 0 else "below" if resid[i] < 0 else "at"
            parts.append(f"{name} {contrib[i] / d2:.0%} ({where} mean: {x[i]:.4g} vs {x[i] - resid[i]:.4g} {unit})")
        return (f"fields jointly unusual: Mahalanobis D^2 {d2:.1f} over {len(m.fields)} fields "
                f"(alarm above {m.limits[ON_D2]:.1f}); top: " + "; ".join(parts))
