"""``foreshock watch`` over a dcgm-exporter whose hosts change mid-run (a node replaced: new
hostnames): the derived topology takes the new node in, the learnt state of the others stays, and
the /metrics store moves onto the new topology on the same port."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.bank import DetectorBank
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.findings import Anomaly, Prediction, finding_from_dict
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.simulator.formats import dcgm_exposition
from foreshock.streams.dcgm import UNLISTED_POLLS, DcgmScrapeSource, grown_topology
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.topology import Topology

from local_http import LocalHttpServer
from test_watch import stamped
from thermal_synth import Fault, World, small_topology

CHANGE_POLL = 150  # node0 is replaced by node2 from this scrape on (1500 s of telemetry in)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pages(world_topology: Topology, frames: list[Frame], nodes_of_poll: Any) -> list[str]:
    """One dcgm-exporter page per gpu frame, serving the GPUs of ``nodes_of_poll(i)`` only."""
    pages = []
    for i, frame in enumerate(f for f in frames if f.kind == "gpu"):
        keep = np.isin(world_topology.gpu_node[frame.slot], nodes_of_poll(i))
        part = Frame("gpu", frame.ts[keep], frame.slot[keep], {k: v[keep] for k, v in frame.columns.items()})
        pages.append(stamped(dcgm_exposition(part, world_topology), float(frame.ts[0])))
    return pages


class _Exporter(LocalHttpServer):
    """Serves ``pages`` in order, then the last again; at the request numbered ``scrape_at`` it
    reads the watch's own /metrics first (the watch is waiting for that page, so everything
    before it has been processed)."""

    def __init__(self, pages: list[str], metrics_url: str, scrape_at: int) -> None:
        self.served = 0
        self.metrics = ""

        def respond(_request: Any) -> tuple[int, bytes, str]:
            if self.served == scrape_at:
                with urllib.request.urlopen(metrics_url, timeout=10) as response:
                    self.metrics = response.read().decode()
            body = pages[min(self.served, len(pages) - 1)].encode()
            self.served += 1
            return 200, body, "text/plain; version=0.0.4"

        super().__init__(respond)
        self.url += "/metrics"


def watch_pages(pages: list[str], findings: Path) -> tuple[Any, str]:
    """``foreshock watch --source dcgm`` over ``pages`` (served once each, then the last again),
    its findings written to ``findings``: the CLI result and /metrics as read when the last page
    was requested."""
    port = _free_port()
    exporter = _Exporter(pages, f"http://127.0.0.1:{port}/metrics", scrape_at=len(pages))
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", exporter.url, "--interval", "0.02",
                                          "--polls", str(len(pages) + 1), "--port", str(port), "--top-k", "32",
                                          "--findings", str(findings)])
    finally:
        exporter.close()
    assert result.exit_code == 0, result.output
    return result, exporter.metrics


def _watch(tmp_path: Path, pages: list[str], name: str) -> tuple[Any, dict[str, Any], list[Any], str]:
    findings = tmp_path / f"{name}.jsonl"
    result, metrics = watch_pages(pages, findings)
    summary = json.loads(result.output.strip().splitlines()[-1])
    found = [finding_from_dict(json.loads(line)) for line in findings.read_text().splitlines()]
    return result, summary, found, metrics


def _named(found: list[Any], topology: Topology) -> list[tuple[str, str, float, str]]:
    return [(topology.name(f.entity_kind, f.slot), f.type, f.ts, getattr(f, "event", getattr(f, "field", "")))
            for f in found if isinstance(f, (Prediction, Anomaly))]


@pytest.mark.slow
def test_watch_takes_in_a_replaced_node_and_keeps_what_it_learnt_of_the_others(tmp_path: Path, caplog):
    """node0 and node1 are served, then node0 is replaced by node2 (a new hostname). The thermal
    interface of node1/gpu2 degrades from 10 min in, that of node2/gpu5 too: after the change
    node2's GPUs are watched (exported, and its failing GPU is predicted to throttle), the unknown
    GPUs are counted in two polls only, and every finding of node1 is the one of a run without the
    change (its learnt state moved with it)."""
    world_topology = small_topology(nodes=3, gpus=8, racks=1)
    faults = [Fault("tim_degradation", 8 + 2, 600, 1.2, "node1"), Fault("tim_degradation", 16 + 5, 600, 1.2, "node2")]
    frames, events = World(world_topology, faults=faults, seed=1).run(4500.0)
    churned = _pages(world_topology, frames, lambda i: [0, 1] if i < CHANGE_POLL else [1, 2])
    steady = _pages(world_topology, frames, lambda i: [0, 1])

    with caplog.at_level(logging.WARNING, logger="foreshock"):
        result, summary, found, metrics = _watch(tmp_path, churned, "churned")
    _, steady_summary, steady_found, _ = _watch(tmp_path, steady, "steady")

    # the new node was taken in after UNLISTED_POLLS polls: its GPUs were refused in the polls before
    unknown = 8 * (UNLISTED_POLLS - 1)
    # and node0's 8 GPUs, gone from the page, are counted once each as they go (GPU disappeared from page)
    assert summary["input_problems"] == unknown + 8 and steady_summary["input_problems"] == 0
    assert summary["samples"] + unknown == steady_summary["samples"] == 16 * len(churned)  # refused at the source
    changes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("topology changed")]
    assert len(changes) == 1 and changes[0].startswith("topology changed: +8 GPUs (node2)")
    assert 'foreshock_topology_changes_total{cluster="default",stage="dcgm"} 1.0' in metrics
    assert f'foreshock_input_problems_total{{cluster="default",reason="unknown gpu entity",stage="dcgm"}} {unknown}.0' \
        in metrics
    # node2's GPUs are exported (the /metrics store moved onto the grown topology, on the same port)
    assert sum('node="node2"' in line for line in metrics.splitlines()
               if line.startswith("foreshock_gpu_temperature_celsius{")) == 8

    derived = Topology.from_gpu_hosts([(f"node{n}", g) for n in range(3) for g in range(8)])
    named = _named(found, derived)
    # the findings file names each finding's entity, under the topology it was found under
    lines = [json.loads(line) for line in (tmp_path / "churned.jsonl").read_text().splitlines()]
    assert [line["entity"] for line in lines if line["type"] != "incident"] == [entity for entity, *_ in named]
    onset = next(e.time for e in events if e.type == "thermal_throttle_start" and e.entity == "node2/gpu5")
    node2 = [ts for entity, kind, ts, event in named if entity == "node2/gpu5" and kind == "prediction"
             and event == "thermal_throttle"]
    assert node2 and min(node2) < onset
    assert "node2/gpu5" in result.output  # the summary names it (by the topology it was found under)
    assert not any(entity.startswith("node2/") and entity != "node2/gpu5" for entity, *_ in named)
    # node1's findings, before and after the change, are those of the run without it
    node1 = [f for f in named if f[0].startswith("node1/")]
    assert any(ts > frames[0].ts[0] + 10 * CHANGE_POLL for _, _, ts, _ in node1)  # some come after the change
    assert node1 == [f for f in _named(steady_found, derived) if f[0].startswith("node1/")]


def _gpu_page(hosts: list[str], ts: float) -> str:
    return "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",Hostname="{h}"}} 41 {int(ts * 1000)}\n'
                   for h in hosts for g in range(2))


class _Pages(DcgmScrapeSource):
    def __init__(self, pages: list[str], **kw: Any) -> None:
        super().__init__("http://exporter:9400/metrics", interval=0.02, **kw)
        self.pages = pages

    def scrape(self) -> str | None:
        return self.pages.pop(0)


def test_one_odd_scrape_does_not_change_the_topology_and_gpus_gone_are_forgotten():
    """A host served in one scrape (or two) is not taken in; one served in UNLISTED_POLLS in a row
    is, after the hosts listed, which keep their slots. Only GPUs the topology lists are
    remembered (``_last_ts``: it kept every name ever served)."""
    pages = [_gpu_page(["b", "a"], 1), _gpu_page(["a", "odd"], 2), _gpu_page(["a"], 3)]
    pages += [_gpu_page(["a", "new"], 4 + k) for k in range(UNLISTED_POLLS)]
    pages += [_gpu_page(["a", f"x{k}"], 9 + k) for k in range(5)]  # a new host at every scrape
    src = _Pages(pages, health=PipelineHealth())
    src.takes_in_new_gpus = True
    for _ in range(3):
        src.poll()
    assert src.topology.gpus == ["a/gpu0", "a/gpu1", "b/gpu0", "b/gpu1"]
    for _ in range(UNLISTED_POLLS - 1):
        src.poll()
    assert src.topology.size("gpu") == 4
    assert [f.slot.tolist() for f in src.poll()] == [[0, 1, 4, 5]]  # taken in: "new" follows "a" and "b"
    assert src.topology.gpus == ["a/gpu0", "a/gpu1", "b/gpu0", "b/gpu1", "new/gpu0", "new/gpu1"]
    for _ in range(5):
        src.poll()
    assert src.topology.size("gpu") == 6 and sorted(src._last_ts) == src.topology.gpus


def test_a_given_topology_stays_and_says_once_to_add_the_gpu(caplog):
    given = Topology.from_gpu_hosts([("a", 0), ("a", 1)])
    src = _Pages([_gpu_page(["a", "new"], ts) for ts in range(1, 6)], topology=given, health=PipelineHealth())
    src.takes_in_new_gpus = True
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        for _ in range(5):
            src.poll()
    assert src.topology is given and src.health.problems[("dcgm", "unknown gpu entity")] == 10
    told = [r.getMessage() for r in caplog.records if "not in the topology" in r.getMessage()]
    assert told == ["dcgm: 2 GPUs not in the topology, their samples counted as unknown gpu entities: new/gpu0, "
                    "new/gpu1; add them to the --topology file and restart"]
    assert sorted(src._last_ts) == ["a/gpu0", "a/gpu1"]


def test_the_store_moves_onto_a_grown_topology_by_name():
    """What the store knows of each GPU (latest values, when last seen, active findings, XID counts,
    estimates) follows it to its new slot; a new GPU starts unseen; one no longer listed is dropped."""
    old = Topology.from_gpu_hosts([("b", 0), ("b", 1), ("c", 0), ("c", 1)])
    new = Topology.from_gpu_hosts([("a", 0), ("a", 1), ("c", 0), ("c", 1)])  # b replaced by a, sorted first
    store = FindingStore(old)
    temps = np.array([50.0, 51.0, 60.0, 61.0])
    store.observe_frame(Frame("gpu", np.full(4, 100.0), np.arange(4), {"gpu_temp": temps, "xid_last": np.zeros(4)}))
    store.observe_frame(Frame("gpu", np.full(4, 110.0), np.arange(4),
                              {"gpu_temp": temps, "xid_last": np.array([0, 0, 0, 79.0])}))
    store.observe_findings([Prediction(110.0, "gpu", 3, "thermal_throttle", 600.0, 0.8, "thermal", "R rising"),
                            Prediction(110.0, "gpu", 0, "thermal_throttle", 600.0, 0.8, "thermal", "R rising"),
                            Anomaly(110.0, "gpu", 2, "gpu_temp", 7.0, "robust_zscore")])
    store.set_gauges({"thermal_resistance_celsius_per_watt": ("gpu", np.array([0.1, 0.2, 0.3, 0.4]), "R")})

    store.move_to(new, Remap(old, new))

    snap = store.snapshot()
    assert snap.topology is new
    np.testing.assert_array_equal(snap.latest["gpu"]["gpu_temp"], [np.nan, np.nan, 60.0, 61.0])
    np.testing.assert_array_equal(snap.seen["gpu"], [False, False, True, True])
    np.testing.assert_array_equal(snap.last_seen["gpu"], [-np.inf, -np.inf, 110.0, 110.0])
    assert [(p.slot, p.event) for p in snap.predictions] == [(3, "thermal_throttle")]  # c/gpu1's; b/gpu0's gone
    assert [(a.slot, a.field) for a in snap.anomalies] == [(2, "gpu_temp")]
    assert snap.xids == {(3, 79): 1}
    np.testing.assert_array_equal(snap.gauges["thermal_resistance_celsius_per_watt"][1], [np.nan, np.nan, 0.3, 0.4])
    # and the exporter labels them by the new topology; a new GPU's first XID is its own
    store.observe_frame(Frame("gpu", np.full(4, 120.0), np.arange(4),
                              {"gpu_temp": temps + 1, "xid_last": np.array([13.0, 0, 0, 79])}))
    registry = build_registry(store, top_k=8)
    assert registry.get_sample_value("foreshock_gpu_temperature_celsius",
                                     {"cluster": "imported", "rack": "unknown", "node": "a", "gpu": "0"}) == 51.0
    assert registry.get_sample_value("foreshock_xid_events_total", {"cluster": "imported", "rack": "unknown", "node": "c",
                                                                   "gpu": "1", "xid": "79", "severity": "critical"}) == 1.0
    assert store.snapshot().xids == {(3, 79): 1}


def test_a_moved_pipeline_gives_the_findings_and_estimates_of_one_that_never_moved():
    """EmbeddedPipeline.move_to: a bank moved onto a grown topology (a node appended) carries on
    exactly as a bank that had the grown topology from the start and never saw the new node."""
    world_topology = small_topology(nodes=2, gpus=8, racks=1)
    frames, _ = World(world_topology, faults=[Fault("tim_degradation", 5, 300, 2.0, "f")], seed=3).run(2400.0)
    gpu = [f for f in frames if f.kind == "gpu"]
    old = Topology.from_gpu_hosts([("node0", g) for g in range(8)] + [("node1", g) for g in range(8)])
    grown = grown_topology(old, [f"node9/gpu{g}" for g in range(8)])

    def pipeline(topology: Topology) -> EmbeddedPipeline:
        return EmbeddedPipeline(topology, DetectorBank.from_names(topology), health=PipelineHealth())

    moved, reference = pipeline(old), pipeline(grown)
    found: list[list[Any]] = [[], []]
    for i, frame in enumerate(gpu):
        if i == 100:
            assert moved.move_to(grown, DetectorBank.from_names(grown)) == []  # the incident engine moves too
        for k, p in enumerate((moved, reference)):
            found[k] += p.process(frame)
    assert found[0] and found[0] == found[1]
    for name, (kind, values, _) in reference.bank.gauges().items():
        np.testing.assert_allclose(moved.bank.gauges()[name][1], values, err_msg=name)
    np.testing.assert_array_equal(moved.guard.s_last_ts["gpu"], reference.guard.s_last_ts["gpu"])


def test_topology_changes_are_counted_in_health():
    health = PipelineHealth()
    health.topology_changed("dcgm")
    health.topology_changed("dcgm")
    store = FindingStore(Topology.from_gpu_hosts([("a", 0)]), health)
    assert build_registry(store).get_sample_value("foreshock_topology_changes_total",
                                                  {"cluster": "imported", "stage": "dcgm"}) == 2.0


def test_the_pipeline_moves_between_the_last_frame_of_the_old_topology_and_the_first_of_the_new(monkeypatch):
    """With a BMC polled beside it, the source runs in a thread of its own, ahead of the pipeline:
    when the pipeline takes its first frame, the source may have switched topology already. The
    move comes exactly before the first frame mapped on the new one, not when the pipeline
    notices the switch."""
    from foreshock.cli import watch
    from foreshock.streams.polling import PollingSource

    old = Topology.from_gpu_hosts([("a", 0)])
    new = grown_topology(old, ["b/gpu0"])

    def frame(ts: float) -> Frame:
        return Frame("gpu", np.array([ts]), np.array([0]), {})

    class Switching(PollingSource):
        def __init__(self) -> None:
            super().__init__(0.02, max_polls=3)
            self._topology = old

        def poll(self) -> list[Frame]:
            if self.polls == 1:
                self._topology = new
            return [frame(float(self.polls))]

    primary = Switching()
    seen = follow_a_source_running_ahead(primary, watch._TopologyFollower(primary, old), monkeypatch,
                                         lambda: primary.topology is new)
    assert seen == [0.0, new, 1.0, 2.0]


def follow_a_source_running_ahead(primary: Any, follower: Any, monkeypatch: Any,
                                  ahead: Callable[[], bool]) -> list[Any]:
    """``primary``'s frames through ``follower`` with another source polled beside it (``alongside``
    polls each in a thread of its own, so ``primary`` runs ahead of the pipeline): the timestamps of
    the frames taken, with the topology of each ``move_run`` between them. Asserts
    ``ahead()`` (the source had gone on) once the pipeline has its first frame."""
    import threading

    from foreshock.cli import watch
    from foreshock.streams.polling import PollingSource, alongside

    class Quiet(PollingSource):
        def poll(self) -> list[Frame]:
            return []

    done = threading.Event()

    def frames():  # type: ignore[no-untyped-def]
        yield from primary
        done.set()

    seen: list[Any] = []
    monkeypatch.setattr(watch, "move_run", lambda run, topology, stage: seen.append(topology))
    merged = follower.follow(alongside(follower.mark(frames()), [Quiet(0.02, max_polls=1)]), run=None)
    first = next(merged)
    assert done.wait(5) and ahead()  # the source has gone on before the pipeline's first frame
    seen.append(float(first.ts[0]))
    seen += [float(f.ts[0]) for f in merged]
    return seen
