"""``foreshock_rack_gpus_throttled`` counts a rack's GPUs with a thermal or power throttle bit set
wherever they report throttle reasons: until 2026-12-05 a rack whose GPUs sent reasons and power but
no core temperature had no series at all (the temperature's count gated it; audit /tmp/s62/audit_prom/)."""

from __future__ import annotations

import numpy as np
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import make_small_topology
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.facts import THROTTLE_BITS
from foreshock.frames import Frame


def throttled(columns: dict[str, np.ndarray]) -> dict[tuple[str, str], float]:
    topo = make_small_topology()
    store = FindingStore(topo)
    registry = build_registry(store, top_k=2)
    n = len(topo.gpus)
    store.observe_frame(Frame("gpu", np.full(n, 100.0), np.arange(n), columns))
    text = generate_latest(registry).decode()
    return {(s.labels["rack"], s.labels["kind"]): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "foreshock_rack_gpus_throttled"}


def test_a_rack_reporting_reasons_without_temperatures_counts_its_throttled_gpus() -> None:
    topo = make_small_topology()
    n = len(topo.gpus)
    mask = np.zeros(n)
    braked, held = 3, n - 1  # one GPU of the first rack power-braking, one of the last thermally held
    mask[braked] = THROTTLE_BITS["hw_power_brake"]
    mask[held] = THROTTLE_BITS["hw_thermal"]
    got = throttled({"throttle_reasons": mask, "power": np.full(n, 500.0)})
    first, last = topo.racks[topo.gpu_rack[braked]], topo.racks[topo.gpu_rack[held]]
    assert first != last
    assert got[(first, "power")] == 1.0 and got[(first, "thermal")] == 0.0
    assert got[(last, "thermal")] == 1.0 and got[(last, "power")] == 0.0
    assert sum(got.values()) == 2.0


def test_a_rack_reporting_neither_has_no_throttled_series() -> None:
    topo = make_small_topology()
    assert throttled({"power": np.full(len(topo.gpus), 500.0)}) == {}
