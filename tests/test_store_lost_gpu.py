"""A GPU lost off the bus keeps its row with every reading NaN; it must leave /metrics all the same.

Audit finding (2026-12-05): NVML and nvidia-smi keep a lost GPU's row (XID 79: "the rest of its row
NaN", streams/nvml.py; "keeps its row, those cells NaN", streams/nvidia_smi.py), and the store counted
every stamped row as a report of its entity: the lost GPU's last readings (braking at 690 W, HBM at
93 °C) stayed exported, in its rack's aggregates too, and in ``foreshock_gpus_reporting`` — keeping
ForeshockPowerBrake and ForeshockHbmTemperatureNearLimit firing and ForeshockGpuMissing, whose runbook
names a GPU fallen off the bus, from firing. A GPU whose rows stop altogether was already dropped; the
lost one is now dropped alike, in a replay's store (telemetry time) and in a live one (wall clock).
The same holds for a job that ended, whose rows carry no step time.
"""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.frames import Frame

from conftest import make_small_topology

T0 = 1.7e9
LOST, SILENT, OTHER = "node0/gpu0", "node0/gpu1", "node0/gpu2"
HOT_HBM_C, BRAKING_W, BRAKE_BIT = 93.0, 690.0, float(0x80)


def _labels(topo, name: str) -> dict[str, str]:
    node, gpu = name.split("/gpu")
    return {"cluster": topo.cluster, "rack": topo.racks[topo.node_rack[topo.slot("node", node)]], "node": node,
            "gpu": gpu}


@pytest.mark.parametrize("live", [False, True])
def test_a_lost_gpu_s_rows_of_nan_are_no_report(live: bool) -> None:
    topo = make_small_topology()
    n = topo.size("gpu")
    wall = [T0]
    store = FindingStore(topo, wall_clock=(lambda: wall[0]) if live else None)
    registry = build_registry(store)
    lost, silent = topo.slot("gpu", LOST), topo.slot("gpu", SILENT)
    for t in np.arange(0.0, 1300.0, 10.0):
        wall[0] = T0 + t
        cols = {"gpu_temp": np.full(n, 50.0), "hbm_temp": np.full(n, 60.0), "power": np.full(n, 400.0),
                "throttle_reasons": np.zeros(n), "xid_last": np.zeros(n)}
        slots = np.arange(n)
        if t == 90.0:  # both braking hot at their last reading
            for s in (lost, silent):
                cols["hbm_temp"][s], cols["power"][s], cols["throttle_reasons"][s] = HOT_HBM_C, BRAKING_W, BRAKE_BIT
        if t >= 100.0:
            for column in cols.values():
                column[lost] = np.nan  # lost: its row kept, every reading NaN ...
            cols["xid_last"][lost] = 79.0  # ... and the XID it fell off the bus with
            keep = slots != silent  # silent: no row at all
            slots, cols = slots[keep], {k: v[keep] for k, v in cols.items()}
        store.observe_frame(Frame("gpu", np.full(len(slots), T0 + t), slots, cols))
    value = registry.get_sample_value
    for name in (LOST, SILENT):  # 20 minutes on, neither is reported: no series of their last readings
        for metric in ("foreshock_gpu_memory_temperature_celsius", "foreshock_gpu_power_watts",
                       "foreshock_gpu_throttle_reasons"):
            assert value(metric, _labels(topo, name)) is None, (name, metric)
    assert value("foreshock_gpu_power_watts", _labels(topo, OTHER)) == 400.0  # the others are
    assert value("foreshock_gpus_reporting", {"cluster": topo.cluster}) == n - 2
    rack = {"cluster": topo.cluster, "rack": _labels(topo, LOST)["rack"]}
    gpus_in_rack = int(np.sum(topo.gpu_rack == topo.gpu_rack[lost]))
    assert value("foreshock_rack_gpu_power_watts", rack) == 400.0 * (gpus_in_rack - 2)
    assert value("foreshock_rack_gpu_memory_temperature_max_celsius", rack) == 60.0
    # the XID it fell off the bus with (0, then 79 in its rows of NaN) is counted all the same
    assert value("foreshock_xid_events_total", {**_labels(topo, LOST), "xid": "79", "severity": "critical"}) == 1


def test_a_job_that_ended_leaves_its_step_time() -> None:
    """A job's rows after its end carry no step time: its last one (7.5 s) is no longer served once
    the window passes, as a job whose rows stop."""
    topo = make_small_topology()
    store = FindingStore(topo)
    registry = build_registry(store)
    jobs = topo.size("job")
    assert jobs >= 1
    for t in np.arange(0.0, 600.0, 10.0):
        step = np.full(jobs, 7.5 if t < 200.0 else np.nan)
        store.observe_frame(Frame("job", np.full(jobs, T0 + t), np.arange(jobs), {"step_time": step}))
        # the GPUs go on reporting: the store's clock moves on
        store.observe_frame(Frame("gpu", np.full(topo.size("gpu"), T0 + t), np.arange(topo.size("gpu")),
                                  {"gpu_temp": np.full(topo.size("gpu"), 50.0)}))
    labels = {"cluster": topo.cluster, "training_job": topo.jobs[0]}
    assert registry.get_sample_value("foreshock_job_step_time_seconds", labels) is None


@pytest.mark.parametrize("live", [False, True])
def test_rows_with_other_fields_than_the_latest_values_are_reports(live: bool) -> None:
    """What proves an entity read is any reading, not only the fields the store shows as latest
    values: an ``ethtool -S`` source's link rows carry byte, pause and discard counters and neither
    ``link_state`` nor ``xmit_wait`` (core/fields.csv), and a dcgm page of error fields alone a GPU's
    ECC and PCIe counters. Both were read as no report by the first form of the lost-GPU rule (every
    link of a RoCE fleet dropped, healthy GPUs counted missing): a review of it found them."""
    topo = make_small_topology()
    n, links = topo.size("gpu"), topo.size("link")
    assert links > 0
    wall = [T0]
    store = FindingStore(topo, wall_clock=(lambda: wall[0]) if live else None)
    registry = build_registry(store)
    for t in np.arange(0.0, 600.0, 10.0):
        wall[0] = T0 + t
        store.observe_frame(Frame("gpu", np.full(n, T0 + t), np.arange(n),
                                  {"ecc_dbe": np.zeros(n), "pcie_replays": np.zeros(n), "xid_last": np.zeros(n)}))
        store.observe_frame(Frame("link", np.full(links, T0 + t), np.arange(links),
                                  {"tx_data": np.full(links, 1e9 * t), "pfc_pause_duration": np.zeros(links)}))
    assert registry.get_sample_value("foreshock_gpus_reporting", {"cluster": topo.cluster}) == n
    snap = store.snapshot()
    fresh = snap.heard["link"] >= snap.clock - 120.0
    assert fresh.all()
    # while a row of NaN with its XID alone is still none (the lost GPU above)
    store.observe_frame(Frame("gpu", np.full(n, T0 + 900.0), np.arange(n),
                              {"ecc_dbe": np.full(n, np.nan), "xid_last": np.full(n, 79.0)}))
    wall[0] = T0 + 900.0
    assert registry.get_sample_value("foreshock_gpus_reporting", {"cluster": topo.cluster}) == 0
