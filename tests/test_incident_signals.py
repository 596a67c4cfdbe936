"""What a finding means to the incident engine (``incident_signals.classify``) and where it sits
(``incident_domains.Domains.ancestors``): a Mahalanobis episode on a throttle-time or replay rate
is no observed throttle or error, whichever way the rate moved; a throttle-reasons finding the
reason text decides is not given an earlier finding's signal; an out-of-range slot is refused."""

from __future__ import annotations

import re

import numpy as np
import pytest

from foreshock.detectors.incident_domains import MEMBER_KINDS, Domains
from foreshock.detectors.incident_signals import SIGNALS, classify
from foreshock.detectors.mahalanobis import FIELDS, MahalanobisDetector
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.simulator.topology_gen import build_topology
from foreshock.topology import Topology

COUNTER_FIELDS = ("thermal_throttle_time", "power_throttle_time", "pcie_replays")


def test_a_mahalanobis_episode_where_thermal_throttling_stopped_is_no_observed_throttle():
    """Throttling at ~50 % of the time, then none: the episode's top field is
    ``thermal_throttle_time``, below its mean. It was ``thermal_observed``: an incident opened,
    and the GPU's job charged a 1.15 slowdown, for a GPU that had just stopped throttling."""
    rng = np.random.default_rng(0)
    det = MahalanobisDetector(Topology.from_gpu_hosts([("n0", 0)]),
                              gpu_fields="gpu_temp,power,thermal_throttle_time", warmup=100)
    held, found = 0.0, []
    for t in range(1200):
        held += max(0.5 + 0.05 * rng.normal(), 0.0) if t < 1000 else 0.0
        found += det.update(Frame("gpu", [float(t)], [0], {
            "gpu_temp": [80 + 0.3 * rng.normal()], "power": [600 + 5 * rng.normal()],
            "thermal_throttle_time": [held]}))
    assert [f.field for f in found] == ["thermal_throttle_time"]
    assert re.search(r"top: thermal_throttle_time \d+% \(below mean: 0 vs 0\.\d+ seconds/s\)", found[0].reason)
    sig = SIGNALS[classify(found[0])]
    assert not sig.opens and not sig.observed and sig.slowdown == 1.0


@pytest.mark.parametrize("field", (*COUNTER_FIELDS, "sm_clock"))
@pytest.mark.parametrize("where", ["above", "below"])
def test_a_mahalanobis_episode_on_a_throttle_time_or_replay_rate_is_only_an_anomaly(field, where):
    """Up or down, a joint-distance episode led by one of these rates (or by the clock) says the
    field is unusual, not that the GPU throttled, errored or straggled (``gpu_error`` and
    ``thermal_observed`` opened incidents; ``power_cap`` charged a slowdown; a clock back up
    after a throttle was an observed ``straggler``)."""
    reason = (f"fields jointly unusual: Mahalanobis D^2 95.5 over 8 fields (alarm above 44.3); "
              f"top: {field} 96% ({where} mean: 0 vs 0.4943 seconds/s)")
    sig = SIGNALS[classify(Anomaly(0.0, "gpu", 0, field, 5.6, "mahalanobis", reason))]
    assert not sig.opens and not sig.observed and sig.slowdown == 1.0


@pytest.mark.parametrize(("kind", "field"), [(kind, field) for kind, fields in FIELDS.items() for field in fields])
def test_no_mahalanobis_episode_opens_an_incident_by_itself(kind, field):
    """A node's fans spinning up led an episode as far out as fans stalling: ``fan_degraded``
    (observed, opening) either way, as ``psu_degraded`` for a node drawing more."""
    assert not SIGNALS[classify(Anomaly(0.0, kind, 0, field, 5.6, "mahalanobis", "jointly unusual"))].opens


def test_a_throttle_reasons_finding_the_reason_text_decides_gets_its_own_signal():
    """A score below 1 is no bitmask: the reason text decides. The signal was cached by score,
    so every later finding with that score got the first one's (all three ``power_brake``)."""
    for score in (0.0, -1.0):
        findings = [Anomaly(float(i), "gpu", i, "throttle_reasons", score, "robust_zscore", reason)
                    for i, reason in enumerate(("HW power brake engaged", "thermal slowdown", "nothing special"))]
        assert [classify(f) for f in findings] == ["power_brake", "thermal_observed", "generic"], score


def test_a_throttle_bitmask_is_still_classified_by_its_bits_whatever_the_reason():
    brake, sw_thermal = 128.0, 32.0
    assert [classify(Anomaly(0.0, "gpu", 0, "throttle_reasons", bits, "throttle_bits", reason))
            for bits, reason in ((brake, "thermal"), (sw_thermal, "power brake"), (brake, ""))] == [
        "power_brake", "thermal_observed", "power_brake"]


@pytest.fixture(scope="module")
def domains() -> Domains:
    return Domains(build_topology(64))


@pytest.mark.parametrize("kind", MEMBER_KINDS)
def test_ancestors_refuses_a_slot_out_of_range_for_every_kind(domains, kind):
    """A negative slot indexed the precomputed lists from the end (GPUs, nodes, racks, jobs):
    the last entity's ancestors, silently; a slot past the end was an ``IndexError``."""
    n = domains.sizes[kind]
    assert n > 0
    assert domains.ancestors(kind, n - 1)[0] == domains.ancestors(kind, np.int64(n - 1))[0]
    for slot in (-1, -n, n, n + 99):
        with pytest.raises(ValueError, match=f"no {kind} with slot {slot}"):
            domains.ancestors(kind, slot)
