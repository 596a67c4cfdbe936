"""What a finding says, in the incident engine's terms: a *signal*.

Every anomaly, prediction or external alert is reduced to one signal from the table below —
its family (the kind of cause it points at), whether it may open an incident by itself,
whether it means the effect has happened (``observed``) or is only expected, and the step
slowdown a synchronous job suffers when one of its GPUs shows it. The mapping from finding
fields and prediction events to signals is data (``FIELD_SIGNALS``, ``EVENT_SIGNALS``,
``EXTERNAL_KEYWORDS``), not code: a new detector's fields are added here, in one place.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from foreshock.facts import (THERMAL_THROTTLE_MASK, THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_SLOWDOWN,
                             THROTTLE_SW_POWER_CAP)
from foreshock.findings import Anomaly, Prediction

# families: the kind of cause a signal points at
THERMAL, POWER, FABRIC, LOST, JOBF, GENERIC = "thermal", "power", "fabric", "lost", "job", "generic"
FAMILIES = (THERMAL, POWER, FABRIC, LOST, JOBF, GENERIC)

STALL = math.inf
"""Step slowdown of a job that cannot step at all (a member GPU fell off the bus)."""


@dataclass(frozen=True)
class Signal:
    name: str
    family: str
    opens: bool  # may open an incident on its own (else it only joins one)
    observed: bool  # the effect has happened (else it is predicted or a precursor)
    slowdown: float  # step slowdown of a synchronous job one of whose GPUs shows it
    weight: float = 1.0  # how strongly it locates the cause (root-cause ranking)


# Slowdowns: HW slowdown and the HW power brake cut clocks at least 2x (FACTS, NVML bit docs);
# the SW thermal limiter trims clocks until the die holds at max operating, typically 10-20 %;
# the SW power cap a few percent; a GPU off the bus stalls the whole synchronous job. A link
# down moves the node's traffic to 7 of 8 NICs: communication (~1/4 of a step) takes 8/7 longer.
SIGNALS: dict[str, Signal] = {s.name: s for s in (
    Signal("thermal_predicted", THERMAL, True, False, 1.15),
    Signal("thermal_observed", THERMAL, True, True, 1.15),
    Signal("hw_slowdown_observed", THERMAL, True, True, 2.0),
    Signal("hbm_predicted", THERMAL, True, False, 1.0, weight=1.0),
    Signal("hbm_observed", THERMAL, True, True, 1.0),
    Signal("resistance_rising", THERMAL, True, False, 1.0),
    Signal("temperature_anomaly", THERMAL, False, False, 1.0, weight=0.5),
    Signal("hot_outlier", THERMAL, True, False, 1.0),
    Signal("inlet_rising", THERMAL, True, False, 1.0, weight=2.0),
    Signal("fan_degraded", THERMAL, True, True, 1.0, weight=2.0),
    Signal("power_brake", POWER, True, True, 2.0),
    Signal("power_cap", POWER, False, False, 1.05, weight=0.5),
    Signal("psu_degraded", POWER, True, True, 1.0, weight=2.0),
    Signal("gpu_error", LOST, True, True, 1.0),
    Signal("gpu_lost", LOST, True, True, STALL, weight=2.0),
    # an optic's own trend (BER, RX power, bias) is a precursor with days of margin, and healthy
    # optics wander: it joins the incident of its link but opens none; the link-down prediction
    # that names the optic does
    Signal("optic_degrading", FABRIC, False, False, 1.0, weight=2.0),
    Signal("link_errors", FABRIC, True, True, 1.0, weight=1.5),
    Signal("link_down_predicted", FABRIC, True, False, 1.04),
    Signal("link_down", FABRIC, True, True, 1.04),
    Signal("congestion", FABRIC, True, True, 1.1, weight=0.5),
    Signal("job_slowdown", JOBF, False, True, 1.0, weight=0.0),
    # (a straggler's "slower" finding carries its own: clock_deficit_slowdown)
    Signal("straggler", GENERIC, False, True, 1.0, weight=0.3),
    Signal("generic", GENERIC, False, False, 1.0, weight=0.3),
    Signal("external_thermal", THERMAL, True, True, 1.0, weight=2.0),
    Signal("external_power", POWER, True, True, 1.0, weight=2.0),
    Signal("external_fabric", FABRIC, True, True, 1.0, weight=2.0),
    Signal("external_lost", LOST, True, True, STALL, weight=2.0),
    Signal("external_other", GENERIC, True, True, 1.0, weight=1.0),
    Signal("external_info", GENERIC, False, True, 1.0, weight=0.5),
)}

CLOCK_DEFICIT_MAX = 0.75
"""The most clock deficit a straggler's "slower" finding is taken at (4x): a GPU whose busy clock
mean sits further below its job's is near stopped, which the lost-GPU signals tell."""


def clock_deficit_slowdown(finding: Anomaly | Prediction) -> float:
    """The step slowdown a straggler's "slower" finding measured (its score: the relative clock
    deficit against its job's median, ``1 / (1 - deficit)``), else 1. In synchronous training the
    slowest rank sets the step: a GPU 30 % slower makes its job's steps 1.43x longer. Taken as the
    table's 1.0, its incident's job cost read x1.0 and no GPU-hour at risk. Its other measures
    (hotter, throttling more) carry no clock deficit and stay at the table's."""
    if not isinstance(finding, Anomaly) or finding.detector != "straggler" or finding.field != "sm_clock":
        return 1.0
    deficit = float(finding.score)
    if not deficit > 0.0:  # (NaN too)
        return 1.0
    return 1.0 / (1.0 - min(deficit, CLOCK_DEFICIT_MAX))


EVENT_SIGNALS: dict[str, str] = {
    "thermal_throttle": "thermal_predicted",
    "hbm_overheat": "hbm_predicted",
    "power_cap": "power_cap",
    "power_brake": "power_brake",
    "link_down": "link_down_predicted",
    "congestion": "congestion",
    "job_slowdown": "job_slowdown",
    "gpu_lost": "gpu_lost",
}
"""Prediction event -> signal."""

FIELD_SIGNALS: dict[tuple[str, str], str] = {
    ("gpu", "gpu_temp"): "temperature_anomaly",
    ("gpu", "hbm_temp"): "temperature_anomaly",  # a z-score blip on HBM temperature (job starts move it too)
    ("gpu", "thermal_resistance"): "resistance_rising",
    ("gpu", "r_core"): "resistance_rising",
    ("gpu", "r_hbm"): "hbm_predicted",
    ("gpu", "thermal_throttle_time"): "thermal_observed",
    ("gpu", "power_throttle_time"): "power_cap",
    ("gpu", "power"): "generic",
    ("gpu", "power_limit"): "power_cap",
    ("gpu", "xid_last"): "gpu_error",
    ("gpu", "ecc_dbe"): "gpu_error",
    ("gpu", "remapped_rows"): "gpu_error",
    ("gpu", "pcie_replays"): "gpu_error",
    ("gpu", "missing"): "gpu_lost",
    ("gpu", "reporting"): "gpu_lost",
    ("gpu", "step_share"): "straggler",
    ("node", "fan_speed"): "fan_degraded",
    ("node", "psu_power"): "psu_degraded",
    ("rack", "inlet_temp"): "inlet_rising",
    ("rack", "coolant_temp"): "inlet_rising",
    ("rack", "coolant_flow"): "inlet_rising",
    ("rack", "pdu_power"): "psu_degraded",
    ("link", "link_downed"): "link_down",
    ("link", "link_state"): "link_down",
    ("link", "link_flaps"): "link_down",
    ("link", "symbol_error"): "link_errors",
    ("link", "link_error_recovery"): "link_errors",
    ("link", "rcv_errors"): "link_errors",
    ("link", "link_integrity_errors"): "link_errors",
    ("link", "buffer_overrun_errors"): "link_errors",
    ("link", "link_rate"): "link_errors",  # retrained slower (speed or width fallback): degraded, up
    ("link", "xmit_wait"): "congestion",
    ("link", "pfc_pause_duration"): "congestion",
    ("link", "ecn_marked"): "congestion",
    ("link", "cnp_sent"): "congestion",
    ("link", "cnp_handled"): "congestion",
    ("link", "xmit_discards"): "congestion",
    ("link", "congestion"): "congestion",
    ("optic", "rx_power"): "optic_degrading",
    ("optic", "tx_power"): "optic_degrading",
    ("optic", "tx_bias"): "optic_degrading",
    ("optic", "prefec_ber"): "optic_degrading",
    ("optic", "rx_corrected_bits"): "optic_degrading",
    ("optic", "rx_symbol_errors"): "optic_degrading",
    ("optic", "los"): "optic_degrading",
    ("optic", "module_temp"): "optic_degrading",
    ("job", "step_time"): "job_slowdown",
}
"""(entity kind, anomaly field) -> signal; anything else is ``generic``."""

DETECTOR_SIGNALS: dict[tuple[str, str, str], str] = {
    ("cooling", "gpu", "gpu_temp"): "resistance_rising",  # R drifting against own history and rack peers
    ("power", "gpu", "throttle_reasons"): "power_brake",  # score 1.0, not the bitmask
    ("straggler", "gpu", "gpu_temp"): "hot_outlier",  # hotter than its job peers at the same load: its own cooling
    ("straggler", "gpu", "*"): "straggler",  # slower or throttling more than peers: a symptom, not a cause
    # the field that moved most in a joint-distance episode, up or down (throttling that stopped
    # is as far out as throttling that started): an oddity, not an observed throttle or error
    # (the throttle-bit and xid detectors observe those)
    ("mahalanobis", "gpu", "thermal_throttle_time"): "generic",
    ("mahalanobis", "gpu", "power_throttle_time"): "generic",
    ("mahalanobis", "gpu", "pcie_replays"): "generic",
    ("mahalanobis", "gpu", "sm_clock"): "generic",  # clocks back up after a throttle as far out as down
    # fans spinning up, or a node drawing more, are as far out as a stalled fan or a failed supply
    ("mahalanobis", "node", "fan_speed"): "generic",
    ("mahalanobis", "node", "psu_power"): "generic",
}
"""(detector, entity kind, field or ``*``) -> signal, for detectors whose fields mean more (or
less) than the raw telemetry field they are named after. Tried before ``FIELD_SIGNALS``."""

# Substrings of unknown field names that still say what they are about (a new detector's
# derived estimates, e.g. ``r_drift`` or ``cooling_resistance``), tried in order.
FIELD_HINTS: tuple[tuple[str, str, str], ...] = (
    ("gpu", "hbm", "hbm_predicted"),
    ("gpu", "resist", "resistance_rising"),
    ("gpu", "cooling", "resistance_rising"),
    ("gpu", "xid", "gpu_error"),
    ("gpu", "straggl", "straggler"),
    ("gpu", "clock", "straggler"),
    ("link", "congest", "congestion"),
    ("link", "error", "link_errors"),
    ("link", "down", "link_down"),
    ("link", "flap", "link_down"),
    ("optic", "", "optic_degrading"),
    ("rack", "inlet", "inlet_rising"),
    ("rack", "coolant", "inlet_rising"),
    ("node", "fan", "fan_degraded"),
    ("node", "psu", "psu_degraded"),
    ("job", "", "job_slowdown"),
)

EXTERNAL_LOST_PHRASES: tuple[tuple[str, ...], ...] = (
    ("xid", "79"),
    ("off", "the", "bus"),
    ("off", "bus"),
    ("uncorrectable", "ecc"),
    ("ecc", "uncorrectable"),
    ("gpu", "missing"),
)
"""Words in a row in an external event's ``type`` that mean a GPU is gone (the job it runs cannot
step): XID 79, fallen off the bus, an uncorrectable ECC error. Other XIDs (43: the application's
own fault) and correctable ECC counts are not, nor is a node that is merely *busy*."""

EXTERNAL_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("fan", "external_thermal"),
    ("fans", "external_thermal"),
    ("temp", "external_thermal"),
    ("temperature", "external_thermal"),
    ("overtemp", "external_thermal"),
    ("overheat", "external_thermal"),
    ("thermal", "external_thermal"),
    ("cool", "external_thermal"),
    ("cooling", "external_thermal"),
    ("coolant", "external_thermal"),
    ("psu", "external_power"),
    ("power", "external_power"),
    ("pdu", "external_power"),
    ("link", "external_fabric"),
    ("nic", "external_fabric"),
    ("port", "external_fabric"),
    ("ib", "external_fabric"),
    ("infiniband", "external_fabric"),
    ("cable", "external_fabric"),
    ("optic", "external_fabric"),
    ("optics", "external_fabric"),
    ("transceiver", "external_fabric"),
)
"""Word of an external event's ``type`` (lower case) -> signal, first in this order wins. Whole
words, not substrings: ``health_report`` is no port, ``reboot_attempt_failed`` no PDU."""

_TYPE_WORD_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
"""The words of an event type: ``fan_failure``, ``FanFailure`` and ``XID79`` split alike."""

INFO_SEVERITIES = frozenset({"info", "informational", "notice", "debug", "ok", "resolved"})


def external_signal(event_type: str, severity: str) -> str:
    if severity.strip().lower() in INFO_SEVERITIES:
        return "external_info"
    words = [w.lower() for w in _TYPE_WORD_RE.findall(event_type)]
    for phrase in EXTERNAL_LOST_PHRASES:
        n = len(phrase)
        if any(tuple(words[i:i + n]) == phrase for i in range(len(words) - n + 1)):
            return "external_lost"
    present = set(words)
    for word, sig in EXTERNAL_KEYWORDS:
        if word in present:
            return sig
    return "external_other"


_XID_RE = re.compile(r"xid\D{0,3}(\d+)", re.IGNORECASE)


def xid_code(finding: Anomaly) -> int:
    """The XID code an anomaly is about (its score for ``xid_last``, else one named in the reason)."""
    if finding.field == "xid_last" and finding.score >= 1 and float(finding.score).is_integer():
        return int(finding.score)
    m = _XID_RE.search(finding.reason)
    return int(m.group(1)) if m else 0


def _is_bitmask(score: float) -> bool:
    """Whether a ``throttle_reasons`` score is the throttle bits (else the reason text decides)."""
    return score >= 1 and float(score).is_integer()


def _throttle_signal(finding: Anomaly) -> str:
    """Throttle-bit anomalies carry the new bits as their score; fall back to the reason text."""
    if _is_bitmask(finding.score):
        bits = int(finding.score)
        if bits & THROTTLE_HW_POWER_BRAKE:
            return "power_brake"
        if bits & THROTTLE_HW_SLOWDOWN:
            return "hw_slowdown_observed"
        if bits & THERMAL_THROTTLE_MASK:
            return "thermal_observed"
        if bits & THROTTLE_SW_POWER_CAP:
            return "power_cap"
        return "generic"
    text = finding.reason.lower()
    if "brake" in text:
        return "power_brake"
    if "thermal" in text or "slowdown" in text:
        return "thermal_observed"
    if "power" in text:
        return "power_cap"
    return "generic"


_cache: dict[tuple[str, str], str] = {}
_throttle_cache: dict[tuple[str, str, float], str] = {}


def classify(finding: Anomaly | Prediction) -> str:
    """The signal name of a detector finding."""
    if isinstance(finding, Prediction):
        return EVENT_SIGNALS.get(finding.event, "generic")
    kind, field = finding.entity_kind, finding.field
    by_detector = DETECTOR_SIGNALS.get((finding.detector, kind, field)) or DETECTOR_SIGNALS.get(
        (finding.detector, kind, "*"))
    if by_detector is not None:
        return by_detector
    if field == "throttle_reasons":
        if not _is_bitmask(finding.score):
            return _throttle_signal(finding)  # the reason text decides: a cache by score would not see it
        tk = (finding.detector, kind, finding.score)  # a bitmask: few distinct values
        sig = _throttle_cache.get(tk)
        if sig is None:
            sig = _throttle_signal(finding)
            if len(_throttle_cache) < 4096:
                _throttle_cache[tk] = sig
        return sig
    if field == "xid_last" and xid_code(finding) == 79:
        return "gpu_lost"
    k = (kind, field)
    sig = _cache.get(k)
    if sig is None:
        sig = FIELD_SIGNALS.get(k)
        if sig is None:
            low = field.lower()
            sig = next((s for kd, word, s in FIELD_HINTS if kd == kind and word in low), "generic")
        if len(_cache) < 4096:  # bounded: field names come from detectors, a short list
            _cache[k] = sig
    return sig
