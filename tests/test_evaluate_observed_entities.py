"""False alarms per 1000 entity-hours count the entities the recording observed: a topology that
lists GPUs (a spare node, nodes down during a scrape) or links that never reported does not
dilute the rate. Until 2026-12-03 the hours were the recording's span times every entity of the
kind in the topology."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.detectors import evaluation as ev
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter
from foreshock.topology import Topology

T0 = 1_700_000_000.0
INTERVAL = 300.0
TICKS = 97  # eight hours: a link-down claim (6 h horizon, censored at the end) made early is judged
SPARE_NODE = "node3"  # listed in the topology, never reports


def topology() -> Topology:
    """Four nodes of 8 GPUs, each GPU's rail link to its leaf (as tests/conftest.py's small_topology)."""
    nodes = [f"node{i}" for i in range(4)]
    return Topology.from_dict({
        "cluster": "test",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": "rack0", "row": "row0"}],
        "nodes": [{"name": n, "rack": "rack0", "gpus": 8} for n in nodes],
        "switches": [{"name": f"leaf{r}", "tier": "leaf", "rail": r} for r in range(8)],
        "links": [{"name": f"{n}/gpu{r}~leaf{r}", "a": f"{n}/gpu{r}", "b": f"leaf{r}"}
                  for n in nodes for r in range(8)],
        "jobs": [{"name": "job0", "nodes": nodes}],
    })


def write(path: Path, topo: Topology, gpus: list[int], links: list[int]) -> None:
    """Rows every INTERVAL for the given GPU and link slots only; no events file."""
    g, lk = np.array(gpus, dtype=np.int64), np.array(links, dtype=np.int64)
    with RecordingWriter(path, topo, {"interval": INTERVAL}) as w:
        for k in range(TICKS):
            t = T0 + INTERVAL * k
            w.write(Frame("gpu", np.full(len(g), t), g,
                          {"gpu_temp": np.full(len(g), 50.0), "power": np.full(len(g), 300.0)}))
            if len(lk):
                w.write(Frame("link", np.full(len(lk), t), lk, {"link_state": np.ones(len(lk))}))


def false_alarm(t: float, kind: str, slot: int, event: str) -> list[Prediction]:
    """Raised at ``t`` and withdrawn 10 s later: one statement, false where nothing happens."""
    return [Prediction(t, kind, slot, event, 60.0, 0.9, "threshold", "", True),
            Prediction(t + 10.0, kind, slot, event, 60.0, 0.9, "threshold", "", False)]


reporting_gpus = st.sets(st.integers(0, 23), min_size=1, max_size=24).map(sorted)  # node0..node2's slots


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=reporting_gpus, links=st.sets(st.integers(0, 23), max_size=24).map(sorted),
       gpu_false=st.integers(1, 5), link_false=st.integers(0, 3), data=st.data())
def test_false_alarm_rate_counts_only_the_entities_observed(gpus, links, gpu_false, link_false, data):
    topo = topology()
    assert {topo.slot("gpu", f"{SPARE_NODE}/gpu{i}") for i in range(8)}.isdisjoint(gpus)
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp) / "rec", topo, gpus, links)
        rec = Recording.open(Path(tmp) / "rec")
        # GPUs through the input guard (the threshold set reads them); links, which no detector of
        # the set reads, from the recording
        result = ev.run_recording(rec, ["threshold"], log_scores=False)
        findings: list[Prediction] = []
        alarmed_gpus = data.draw(st.lists(st.sampled_from(gpus), min_size=gpu_false, max_size=gpu_false))
        for i, slot in enumerate(alarmed_gpus):  # one false power-cap statement each (no events: nothing happens)
            findings += false_alarm(T0 + 3600.0 + 1000.0 * i, "gpu", slot, "power_cap")
        alarmed_links = data.draw(st.lists(st.sampled_from(links), min_size=link_false, max_size=link_false)) \
            if links else []
        for i, slot in enumerate(alarmed_links):  # early enough that its 6 h horizon ends inside the recording
            findings += false_alarm(T0 + 600.0 + 60.0 * i, "link", slot, "link_down")
        result.findings = {"threshold": findings}
        report = ev.score(result, ["power_cap", "link_down"])
    hours = (TICKS - 1) * INTERVAL / 3600.0  # the span written
    assert report["meta"]["simulated_hours"] == pytest.approx(hours, abs=1e-3)
    power_cap = report["detectors"]["threshold"]["power_cap"]
    assert power_cap["precision"] == 0.0  # every statement made was false
    assert power_cap["false_alarms_per_1000_gpu_hours"] == pytest.approx(
        len(alarmed_gpus) / (len(gpus) * hours) * 1000.0, abs=6e-5)
    link_down = report["detectors"]["threshold"]["link_down"]
    if links:
        assert link_down["false_alarms_per_1000_gpu_hours"] == pytest.approx(
            len(alarmed_links) / (len(links) * hours) * 1000.0, abs=6e-5)
    else:  # no link observed: no link-hours to state a rate over
        assert link_down["false_alarms_per_1000_gpu_hours"] is None
    assert report["meta"]["entities_observed"] == {"gpu": len(gpus), "link": len(links)}
    assert report["meta"]["gpus"] == topo.size("gpu")  # the topology's count is still reported beside it


def test_rows_the_guard_sets_aside_observe_no_entity(tmp_path):
    """A GPU whose only rows the input guard refuses (stamped by a clock not set, in 1970) was not observed."""
    topo = topology()
    reporting = [0, 1, 2, 3]
    never_accepted = 4
    with RecordingWriter(tmp_path / "rec", topo, {"interval": INTERVAL}) as w:
        for k in range(TICKS):
            slots = np.array(reporting + ([never_accepted] if k == 0 else []), dtype=np.int64)
            ts = np.full(len(slots), T0 + INTERVAL * k)
            ts[len(reporting):] = 0.0
            w.write(Frame("gpu", ts, slots, {"gpu_temp": np.full(len(slots), 50.0)}))
    result = ev.run_recording(Recording.open(tmp_path / "rec"), ["threshold"], log_scores=False)
    assert sum(result.health.problems.values()) == 1  # the 1970 row, counted
    assert result.observed["gpu"] == len(reporting)
    assert result.observed["link"] == 0


def test_a_kind_no_detector_reads_counts_the_entities_with_a_row(tmp_path: Path) -> None:
    """Where no set reads a scored kind (links under ``--telemetry gpu,job``), its observed
    entities come from the recording's slot column: those with a row, not the topology's."""
    topo = topology()
    write(tmp_path / "rec", topo, gpus=[0, 1], links=[3, 17, 17 + 1])
    rec = Recording.open(tmp_path / "rec")
    assert np.flatnonzero(rec.reported_slots("link")).tolist() == [3, 17, 18]
    assert not rec.reported_slots("optic").any()  # a kind the recording lacks: none observed
    result = ev.run_recording(rec, ["threshold"], telemetry=("gpu", "job"))
    assert result.observed["link"] == 3 and result.observed["gpu"] == 2


def test_a_link_is_observed_through_its_optics(tmp_path: Path) -> None:
    """A DOM capture (or the Alibaba series) has optic rows and no link row; the optics detector
    predicts its links going down from them, so those links are observed: their false claims keep a
    rate (with no link counted, it had become None, the claims unrated)."""
    topo = topology()
    optics = np.array([2 * 5, 2 * 5 + 1, 2 * 9 + 1], dtype=np.int64)  # both ends of link 5, one of link 9
    with RecordingWriter(tmp_path / "rec", topo, {"interval": INTERVAL}) as w:
        for k in range(TICKS):
            w.write(Frame("optic", np.full(len(optics), T0 + INTERVAL * k), optics,
                          {"module_temp": np.full(len(optics), 45.0)}))
    rec = Recording.open(tmp_path / "rec")
    for telemetry in (None, ("gpu", "job")):  # the optics fed to the bank, or read from the recording
        result = ev.run_recording(rec, ["threshold"], telemetry=telemetry)
        assert result.observed["link"] == 2 and result.observed["gpu"] == 0
