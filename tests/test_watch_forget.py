"""``foreshock watch`` over a dcgm-exporter whose hosts go away for good (a node pool recycled under
new hostnames, autoscaling): a host none of whose GPUs has been served for ``--forget-after``
seconds (on a monotonic clock: a wall clock stepped forward is no silence) is dropped from the
derived topology, its state with it, the other hosts' state following them by name to their
renumbered slots; a node down for a shorter repair keeps its place and state; ``--forget-after 0``
and a given topology never forget."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams import dcgm
from foreshock.streams.dcgm import UNLISTED_POLLS, DcgmScrapeSource, shrunk_topology
from foreshock.streams.polling import PollingSource
from foreshock.topology import Topology

from test_watch_churn import _Exporter, _free_port, _pages
from thermal_synth import Fault, World, small_topology

HOUR = 3600.0


def _gpu_page(hosts: list[str], ts: float) -> str:
    return "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",Hostname="{h}",UUID="GPU-{h}-{g}"}} 41 {int(ts * 1000)}\n'
                   for h in hosts for g in range(2))


class _Clocked(DcgmScrapeSource):
    """Serves the page of each poll; the clocks are the poll's time (``at``), not the test's: the
    monotonic one silence is measured on, and the wall clock, ``wall_step`` ahead of it."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("http://exporter:9400/metrics", interval=0.02, **kw)
        self.takes_in_new_gpus = True
        self.page = ""
        self.now = 0.0
        self.wall_step = 0.0  # how far the wall clock has been stepped
        self.clock = lambda: self.now + self.wall_step
        self.silence_clock = lambda: self.now

    def scrape(self) -> str | None:
        return self.page

    def at(self, ts: float, hosts: list[str]) -> list[Frame]:
        self.now, self.page = ts, _gpu_page(hosts, ts + self.wall_step)
        return self.poll()


def test_a_host_silent_past_forget_after_is_dropped_and_the_others_move_down_by_name(caplog):
    """b stops being served at t=100; at forget_after (24 h by default) past that it is still
    listed, one poll later it is gone: c's GPUs move down to b's slots, the source forgets what it
    kept of b's GPUs, and one line names b and how long it was silent."""
    src = _Clocked(health=PipelineHealth())
    assert src.forget_after_s == 24 * HOUR
    src.at(0, ["a", "b", "c"])
    src.at(100, ["a", "b", "c"])
    assert sorted(src._last_ts) == sorted(src.topology.gpus) and "b/gpu0" in src._boards.uuids
    listed = src.topology
    for t in np.arange(1000, 24 * HOUR + 100, 1800.0):
        src.at(float(t), ["a", "c"])
    src.at(24 * HOUR + 100, ["a", "c"])  # silent exactly forget_after: kept
    assert src.topology is listed
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        frames = src.at(24 * HOUR + 130, ["a", "c"])
    assert src.topology.gpus == ["a/gpu0", "a/gpu1", "c/gpu0", "c/gpu1"]
    assert src.topology.nodes == ["a", "c"]
    assert [f.slot.tolist() for f in frames] == [[0, 1, 2, 3]]  # c's rows in the slots b had
    assert sorted(src._last_ts) == sorted(src.topology.gpus)
    assert sorted(src._boards.uuids) == sorted(src.topology.gpus)
    told = [r.getMessage() for r in caplog.records if "forgot" in r.getMessage()]
    assert told == ["dcgm: forgot 1 host none of whose GPUs was served for over 24.0 h: b (24.0 h); 2 GPUs and "
                    "their state dropped from the derived topology (a host served again is taken in as a new one)"]


def test_a_host_down_for_a_repair_keeps_its_place_and_one_back_after_being_forgotten_is_a_new_one():
    src = _Clocked(health=PipelineHealth())
    src.forget_after_s = 2 * HOUR
    src.at(0, ["a", "b", "c"])
    listed = src.topology
    for t in np.arange(60, 1.9 * HOUR, 60.0):  # a down for 1.9 h: repaired, back
        src.at(float(t), ["b", "c"])
    assert [f.slot.tolist() for f in src.at(1.9 * HOUR + 60, ["a", "b", "c"])] == [[0, 1, 2, 3, 4, 5]]
    for t in np.arange(1.9 * HOUR + 120, 4 * HOUR, 60.0):  # still served: a's silence started again
        src.at(float(t), ["a", "b", "c"])
    assert src.topology is listed
    for t in np.arange(4 * HOUR, 6.1 * HOUR, 60.0):  # a gone for over 2 h
        src.at(float(t), ["b", "c"])
    assert src.topology.nodes == ["b", "c"]
    for k in range(UNLISTED_POLLS - 1):  # a back: unlisted, refused until served in UNLISTED_POLLS polls
        assert [f.slot.tolist() for f in src.at(6.2 * HOUR + k, ["a", "b", "c"])] == [[0, 1, 2, 3]]
    assert [f.slot.tolist() for f in src.at(6.3 * HOUR, ["a", "b", "c"])] == [[4, 5, 0, 1, 2, 3]]
    assert src.topology.nodes == ["b", "c", "a"]  # taken in as a new host, after those listed
    assert src.health.problems[("dcgm", "unknown gpu entity")] == 2 * (UNLISTED_POLLS - 1)


def test_forget_after_0_a_given_topology_and_a_source_that_does_not_follow_never_forget():
    never = _Clocked(health=PipelineHealth())
    never.forget_after_s = 0
    given_topology = Topology.from_gpu_hosts([(h, g) for h in "abc" for g in range(2)])
    given = _Clocked(health=PipelineHealth(), topology=given_topology)
    agent = _Clocked(health=PipelineHealth())
    agent.takes_in_new_gpus = False  # foreshock agent: its topology does not follow the hardware
    for src in (never, given, agent):
        src.at(0, ["a", "b", "c"])
        listed = src.topology
        for t in (HOUR, 30 * HOUR, 1000 * HOUR):
            src.at(t, ["a", "c"])
        assert src.topology is listed and src.topology.nodes == ["a", "b", "c"]
    assert given.topology is given_topology


def test_not_every_host_is_forgotten_when_none_listed_is_served():
    """The whole cluster replaced under new hostnames: the old hosts are dropped once the new ones
    are taken in, never before (a topology without a GPU would watch nothing)."""
    src = _Clocked(health=PipelineHealth())
    src.forget_after_s = HOUR
    src.at(0, ["a", "b"])
    for k in range(UNLISTED_POLLS - 1):
        src.at(2 * HOUR + k, ["x"])
        assert src.topology.nodes == ["a", "b"]
    src.at(3 * HOUR, ["x"])
    assert src.topology.nodes == ["x"]


def test_shrunk_topology_keeps_the_other_nodes_in_order():
    topology = Topology.from_gpu_hosts([("a", 0), ("b", 0), ("b", 1), ("c", 0), ("c", 1), ("c", 2), ("d", 0)])
    shrunk = shrunk_topology(topology, ["b", "d"])
    assert shrunk.nodes == ["a", "c"] and shrunk.gpus == ["a/gpu0", "c/gpu0", "c/gpu1", "c/gpu2"]
    assert shrunk.racks == topology.racks and shrunk.cluster == topology.cluster


def test_the_frames_of_a_bmc_polled_beside_follow_their_node_across_a_shrink(monkeypatch):
    """A BMC polled beside the dcgm source numbers its node frames by the first topology: once the
    pipeline has moved onto one without node b, c's row is c's (slot 1 now, not 2) and b's is left out."""
    from foreshock.cli import watch

    first = Topology.from_gpu_hosts([(h, 0) for h in "abc"])
    shrunk = shrunk_topology(first, ["b"])

    class Primary(PollingSource):
        reads = ("gpu",)

    primary = Primary(1.0)
    primary._topology = first
    follower = watch._TopologyFollower(primary, first)
    gpu_before = Frame("gpu", np.zeros(3), np.arange(3), {})
    gpu_after = Frame("gpu", np.zeros(2), np.arange(2), {})
    marked = follower.mark(iter([gpu_before, gpu_after]))
    merged: list[Frame] = [next(marked)]
    primary._topology = shrunk
    merged += list(marked)
    assert len(merged) == 3 and not len(merged[1])  # the marker before the first frame of the shrunk one

    def bmc(ts: float) -> Frame:
        return Frame("node", np.full(3, ts), np.arange(3), {"fan_speed": np.array([10.0, 20.0, 30.0])})

    moved: list[Topology] = []
    monkeypatch.setattr(watch, "move_run", lambda run, topology, stage: moved.append(topology))
    out = list(follower.follow([merged[0], bmc(1), merged[1], merged[2], bmc(2)], run=None))
    assert moved == [shrunk]
    assert [(f.kind, f.slot.tolist()) for f in out] == [("gpu", [0, 1, 2]), ("node", [0, 1, 2]), ("gpu", [0, 1]),
                                                          ("node", [0, 1])]
    assert out[1].columns["fan_speed"].tolist() == [10.0, 20.0, 30.0]
    assert out[3].columns["fan_speed"].tolist() == [10.0, 30.0]


# ---- the whole watch ---------------------------------------------------------------------------

GONE_POLL = 150  # node0 is no longer served from this scrape on (1500 s of telemetry in)
FORGET_AFTER = 1200.0  # 120 polls of 10 s


def _watch(pages: list[str], page_ts: list[float], findings: Path, forget_after: float,
           monkeypatch: Any) -> tuple[Any, str]:
    """``foreshock watch --source dcgm --forget-after`` over ``pages``, its wall clock the time of
    the page it is about to read (10 s a page, not the test's); the result and /metrics as read
    when the last page was requested."""
    port = _free_port()
    exporter = _Exporter(pages, f"http://127.0.0.1:{port}/metrics", scrape_at=len(pages))

    class Clocked(DcgmScrapeSource):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.clock = self.silence_clock = lambda: page_ts[min(exporter.served, len(page_ts) - 1)]

    monkeypatch.setattr(dcgm, "DcgmScrapeSource", Clocked)
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", exporter.url, "--interval", "0.02",
                                          "--polls", str(len(pages) + 1), "--port", str(port), "--top-k", "32",
                                          "--forget-after", f"{forget_after:g}", "--findings", str(findings)])
    finally:
        exporter.close()
    assert result.exit_code == 0, result.output
    return result, exporter.metrics


def _world() -> tuple[Topology, list[Frame], list[str], list[float]]:
    world_topology = small_topology(nodes=3, gpus=8, racks=1)
    faults = [Fault("tim_degradation", 16 + 5, 600, 1.2, "node2")]
    frames, _ = World(world_topology, faults=faults, seed=1).run(4500.0)
    pages = _pages(world_topology, frames, lambda i: [0, 1, 2] if i < GONE_POLL else [1, 2])
    page_ts = [float(f.ts[0]) for f in frames if f.kind == "gpu"]
    return world_topology, frames, pages, page_ts


def _gpu_series(metrics: str) -> list[str]:
    return [line.split('node="')[1].split('"')[0] for line in metrics.splitlines()
            if line.startswith("foreshock_gpu_temperature_celsius{")]


@pytest.mark.slow
def test_watch_forgets_a_host_gone_for_long_and_the_others_keep_their_state_by_name(tmp_path: Path, caplog,
                                                                                  monkeypatch):
    """node0 goes away for good 1500 s in; with --forget-after 1200 the watch drops it 1200 s later:
    counted and logged, its series gone from /metrics, and every detector's and the input guard's
    state of node2's GPUs (now in node1's slots, node1's in node0's) is what it was before, by name.
    node2/gpu5, whose interface degrades, is still predicted to throttle, named as it is."""
    from foreshock.cli import watch

    _, _, pages, page_ts = _world()
    states: list[tuple[Topology, dict[str, Any], np.ndarray]] = []
    move_run = watch.move_run

    def watched_move(run: Any, topology: Topology, stage: str) -> str:
        def state() -> tuple[Topology, dict[str, Any], np.ndarray]:
            return run.pipeline.topology, run.pipeline.bank.state_dict(), run.pipeline.guard.s_last_ts["gpu"].copy()

        states.append(state())
        line = move_run(run, topology, stage)
        states.append(state())
        return line

    monkeypatch.setattr(watch, "move_run", watched_move)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        result, metrics = _watch(pages, page_ts, tmp_path / "forgot.jsonl", FORGET_AFTER, monkeypatch)

    forgot = [r.getMessage() for r in caplog.records if "forgot" in r.getMessage()]
    assert len(forgot) == 1 and forgot[0].startswith("dcgm: forgot 1 host none of whose GPUs was served for over "
                                                     "20 min: node0 (20 min); 8 GPUs")
    assert 'foreshock_topology_changes_total{cluster="default",stage="dcgm"} 1.0' in metrics
    assert sorted(set(_gpu_series(metrics))) == ["node1", "node2"] and len(_gpu_series(metrics)) == 16
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["input_problems"] == 8  # node0's 8 GPUs, counted once each as they left the page

    (before, saved, guard_before), (after, moved, guard_after) = states
    assert before.nodes == ["node0", "node1", "node2"] and after.nodes == ["node1", "node2"]
    compared = 0
    for gpu in ("node1/gpu3", "node2/gpu5"):
        old, new = before.slot("gpu", gpu), after.slot("gpu", gpu)
        assert old != new  # renumbered
        assert guard_after[new] == guard_before[old] > 0
        for detector in ("robust_zscore", "thermal", "power", "cooling"):
            for key, value in saved["detectors"][detector].items():
                if isinstance(value, np.ndarray) and value.ndim and len(value) == before.size("gpu"):
                    np.testing.assert_array_equal(moved["detectors"][detector][key][new], value[old],
                                                  err_msg=f"{detector} {key} {gpu}")
                    compared += 1
    assert compared >= 8
    thermal_model = saved["detectors"]["thermal"]["s_model"]
    assert np.isfinite(thermal_model[before.slot("gpu", "node2/gpu5")]).any()  # it had learnt something

    named = [json.loads(line) for line in (tmp_path / "forgot.jsonl").read_text().splitlines()]
    throttles = [f for f in named if f["type"] == "prediction" and f.get("event") == "thermal_throttle"]
    assert throttles and {f["entity"] for f in throttles} == {"node2/gpu5"}
    assert max(f["ts"] for f in throttles) > page_ts[GONE_POLL] + FORGET_AFTER  # some after the shrink


@pytest.mark.slow
def test_watch_with_forget_after_0_keeps_a_host_gone_for_long(tmp_path: Path, monkeypatch):
    _, _, pages, page_ts = _world()
    _, metrics = _watch(pages, page_ts, tmp_path / "kept.jsonl", 0, monkeypatch)
    assert not any(line.startswith("foreshock_topology_changes_total{") and not line.endswith(" 0.0")
                   for line in metrics.splitlines())
    assert sorted(set(_gpu_series(metrics))) == ["node0", "node1", "node2"]


@pytest.mark.slow
def test_an_incident_open_on_a_forgotten_host_is_resolved_when_the_host_is_dropped(tmp_path: Path, monkeypatch):
    """node0's two degrading GPUs open an incident rooted at node0; the node then goes silent and is
    forgotten 600 s later. The move drops the incident with the hardware it was about, and nothing
    resolved it: /metrics kept it open and the findings file's last word on it was "stable", for good
    (review h19). It is resolved at the move now; without forgetting it resolves by itself, later."""
    topo = small_topology(nodes=3, gpus=8, racks=1)
    faults = [Fault("tim_degradation", 5, 300, 8.0, "f"), Fault("tim_degradation", 3, 300, 8.0, "g")]
    frames, _ = World(topo, faults=faults, seed=3).run(6000.0)
    pages = _pages(topo, frames, lambda i: [0, 1, 2] if i < GONE_POLL else [1, 2])
    page_ts = [float(f.ts[0]) for f in frames if f.kind == "gpu"]
    findings = tmp_path / "findings.jsonl"
    _, metrics = _watch(pages, page_ts, findings, 600, monkeypatch)
    last: dict[str, dict[str, Any]] = {}
    for line in findings.read_text().splitlines():
        f = json.loads(line)
        if f["type"] == "incident":
            last[f["incident_id"]] = f
    on_node0 = [f for f in last.values() if f["root_entity"] == "node0"]
    assert on_node0 and all(f["state"] == "resolved" and "left the topology" in f["reason"] for f in on_node0)
    assert 'foreshock_incidents_open{cluster="default",root_kind="node"} 1.0' not in metrics
    assert not [line for line in metrics.splitlines()
                if line.startswith("foreshock_incident_members{") and 'root_entity="node0"' in line]


def test_an_exporter_outage_is_no_hosts_silence():
    """The federation is down for 3 h (forget_after 2 h); its first page back serves a and b only,
    as a Prometheus /federate does while it scrapes its targets again. c, silent only because
    nothing was served, was forgotten at once, refused as unknown and taken in again as a new host,
    its state lost (review h19). The outage does not count as any host's silence now."""
    src = _Clocked(health=PipelineHealth())
    src.forget_after_s = 2 * HOUR
    for t in range(0, 600, 10):
        src.at(float(t), ["a", "b", "c"])
    page = src.scrape
    src.scrape = lambda: None  # type: ignore[method-assign]
    for t in range(600, int(3 * HOUR + 600), 60):
        src.now = float(t)
        src.poll()
    src.scrape = page  # type: ignore[method-assign]
    back = 3 * HOUR + 600
    src.at(back, ["a", "b"])
    assert src.topology.nodes == ["a", "b", "c"]
    src.at(back + 10, ["a", "b", "c"])
    assert src.topology.nodes == ["a", "b", "c"] and not src.health.problems
    src.at(back + 2 * HOUR + 20, ["a", "b"])  # c silent for 2 h since the outage ended: forgotten
    assert src.topology.nodes == ["a", "b"]


def test_a_forget_after_shorter_than_the_polls_taking_a_host_in_is_refused():
    """Under UNLISTED_POLLS polls a host that missed one scrape was forgotten, then taken in again
    as a new one (review h19); NaN was read as never."""
    for value in ("5", "nan"):
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", "http://127.0.0.1:9/metrics",
                                          "--interval", "10", "--polls", "1", "--forget-after", value])
        assert result.exit_code == 2 and "--forget-after" in result.output, result.output
        assert "at least 3 polls (30 s)" in result.output


# ---- review h19's loose ends (h20) ---------------------------------------------------------------

def test_the_bmc_rows_of_a_forgotten_node_are_counted_under_their_source_not_dropped_silently(caplog):
    """After the move onto a topology without node b, b's BMC still answers: its rows are left out,
    and each is counted under the BMC source's stage, the reason logged once with b's name (they
    vanished uncounted: review h19)."""
    from foreshock.cli import watch

    first = Topology.from_gpu_hosts([(h, 0) for h in "abc"])
    shrunk = shrunk_topology(first, ["b"])

    class Primary(PollingSource):
        reads = ("gpu",)

    class Bmc(PollingSource):
        stage = "redfish"
        reads = ("node",)

    health = PipelineHealth()
    primary = Primary(1.0, health)
    primary._topology = first
    follower = watch._TopologyFollower(primary, first, [Bmc(1.0, health)])
    gpu = Frame("gpu", np.zeros(2), np.arange(2), {})
    marked = follower.mark(iter([gpu]))
    primary._topology = shrunk
    marker = next(marked)
    fans = Frame("node", np.ones(3), np.arange(3), {"fan_speed": np.array([10.0, 20.0, 30.0])})
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        out = list(follower.follow([marker, fans, fans], run=_real_run(first)))
    assert [f.columns["fan_speed"].tolist() for f in out] == [[10.0, 30.0], [10.0, 30.0]]
    assert health.problems == {("redfish", "node no longer in the topology"): 2}
    told = [r.getMessage() for r in caplog.records if "no longer in the topology" in r.getMessage()]
    assert len(told) == 1 and told[0].startswith("redfish: node no longer in the topology: b: rows left out")


def _real_run(topology: Topology) -> Any:
    """What ``watch.move_run`` reads of a run: a pipeline and the bank's factory; no server, no file."""
    from types import SimpleNamespace

    from foreshock.detectors.bank import DetectorBank
    from foreshock.streams.embedded import EmbeddedPipeline

    pipeline = EmbeddedPipeline(topology, DetectorBank.from_names(topology), health=PipelineHealth())
    return SimpleNamespace(pipeline=pipeline, make_bank=DetectorBank.from_names, tally=SimpleNamespace(topology=None),
                           jsonl=None, health=pipeline.health)


class _Scripted(_Clocked):
    """Polled through ``PollingSource.__iter__`` (which yields no empty frame), each poll reading
    the next (time, page) of ``script``."""

    def __init__(self, script: list[tuple[float, str]]) -> None:
        super().__init__(health=PipelineHealth(), max_polls=len(script))
        self.script = script

    def poll(self) -> list[Frame]:
        self.now, self.page = self.script[self.polls]
        return super().poll()


def test_a_host_forgotten_and_served_again_between_two_frames_is_dropped_then_taken_in_as_a_new_one(caplog):
    """A federation polled faster than Prometheus scrapes serves a and c's last samples again: the
    poll that forgets b brings no new row, nor do the next two, which serve b (unlisted, refused),
    and the third takes b in. The pipeline moved once, from [a, b, c] to [a, c, b]: b kept its
    state by name though the source had logged it dropped, and the move's line said no GPU was
    added or dropped ("renumbered"). It moves through both topologies now, each logged and counted,
    and b starts afresh as a new host."""
    from foreshock.cli import watch

    script = [(0.0, _gpu_page(["a", "b", "c"], 0.0))]
    script += [(float(t), _gpu_page(["a", "c"], float(t))) for t in np.arange(60, HOUR + 1, 60.0)]
    stale = _gpu_page(["a", "c"], HOUR)  # their last samples, served again
    script += [(HOUR + 60, stale)]  # b silent for over forget_after: forgotten; no new row
    script += [(HOUR + 60 + k, _gpu_page(["b"], HOUR + 60 + k) + stale) for k in range(1, UNLISTED_POLLS + 1)]
    src = _Scripted(script)
    src.forget_after_s = HOUR
    frames = iter(src)
    first = next(frames)
    run = _real_run(src.topology)
    run.pipeline.process(first)
    follower = watch._TopologyFollower(src, src.topology)
    b_last_ts: list[float] = []
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        for frame in follower.follow(follower.mark(frames), run):
            if frame.slot.tolist() == [4, 5]:  # b's rows, the first frame under [a, c, b]
                b_last_ts = run.pipeline.guard.s_last_ts["gpu"][[4, 5]].tolist()
            run.pipeline.process(frame)
    assert src.topology.nodes == ["a", "c", "b"] and run.pipeline.topology.nodes == ["a", "c", "b"]
    moves = [r.getMessage().split(";")[0] for r in caplog.records if r.getMessage().startswith("topology changed")]
    assert moves == ["topology changed: -2 GPUs (b)", "topology changed: +2 GPUs (b)"]
    assert run.health.changes() == {"dcgm": 2}
    assert b_last_ts and not np.isfinite(b_last_ts).any()  # b's input guard state started afresh, not kept


def test_a_wall_clock_stepped_forward_is_no_hosts_silence():
    """b misses one scrape just as NTP steps the wall clock 2 h forward (forget_after 1 h): on the
    wall clock b had been silent for 2 h and was forgotten, its state lost; a and c, served in that
    poll, were not, so "never every host" did not catch it (review h19). Silence is measured on the
    monotonic clock; the rows are stamped with the (stepped) wall time as before."""
    src = _Clocked(health=PipelineHealth())
    src.forget_after_s = HOUR
    for t in range(0, 600, 10):
        src.at(float(t), ["a", "b", "c"])
    src.at(600.0, ["a", "c"])
    src.wall_step = 2 * HOUR
    frames = src.at(610.0, ["a", "c"])
    assert src.topology.nodes == ["a", "b", "c"]
    assert [f.ts.tolist() for f in frames] == [[610.0 + 2 * HOUR] * 4]
    assert [f.slot.tolist() for f in src.at(620.0, ["a", "b", "c"])] == [[0, 1, 2, 3, 4, 5]]
    src.at(620.0 + HOUR + 10, ["a", "c"])  # a real hour of b's silence still forgets it
    assert src.topology.nodes == ["a", "c"]


def test_an_incident_that_loses_members_in_a_move_is_told_again_without_them_at_the_move():
    """An incident of three degrading GPUs on node0 and node1, rooted at their rack. node0 is
    forgotten: the incident stays (its root is still listed) but listed node0's GPUs in /metrics and
    the findings file until its next update, which called it "growing" (review h19). At the move it
    is told again with node1/gpu3 alone, its own root now (a lone GPU makes no node or rack a root),
    still "stable"."""
    from foreshock.detectors.bank import DetectorBank
    from foreshock.streams.embedded import EmbeddedPipeline

    world_topology = small_topology(nodes=3, gpus=8, racks=1)
    faults = [Fault("tim_degradation", 3, 300, 8.0, "f"), Fault("tim_degradation", 5, 300, 8.0, "g"),
              Fault("tim_degradation", 8 + 3, 300, 8.0, "h")]
    frames, _ = World(world_topology, faults=faults, seed=3).run(1700.0)
    old = Topology.from_gpu_hosts([(f"node{n}", g) for n in range(3) for g in range(8)])
    told: list[Any] = []

    class Told:
        def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
            pass

        def observe_findings(self, findings: Any) -> None:
            told.extend(f for f in findings if f.type == "incident")

    pipeline = EmbeddedPipeline(old, DetectorBank.from_names(old), sinks=[Told()], health=PipelineHealth())
    for frame in frames:
        if frame.kind == "gpu":
            pipeline.process(frame)
    (before,) = pipeline.store.incidents()
    assert (before.state, before.root_entity) == ("stable", "unknown")
    assert sorted(before.members) == ["node0/gpu3", "node0/gpu5", "node1/gpu3"]
    told.clear()
    shrunk = shrunk_topology(old, ["node0"])
    pipeline.move_to(shrunk, DetectorBank.from_names(shrunk))
    (after,) = pipeline.store.incidents()
    assert after.incident_id == before.incident_id
    assert (after.state, after.root_entity, after.members) == ("stable", "node1/gpu3", ("node1/gpu3",))
    assert [(f.incident_id, f.members) for f in told] == [(before.incident_id, ("node1/gpu3",))]
    told.clear()
    last = max(float(f.ts.max()) for f in frames)
    for k in range(1, 7):  # the next minute: no update saying it grew
        slots = np.arange(shrunk.size("gpu"))
        pipeline.process(Frame("gpu", np.full(len(slots), last + 10 * k), slots,
                               {"gpu_temp": np.full(len(slots), 45.0)}))
    assert not [f for f in told if f.state == "growing"]


@pytest.mark.slow
def test_watch_tells_an_incident_across_a_forgotten_host_and_a_kept_one_without_the_forgotten_gpus(
        tmp_path: Path, monkeypatch):
    """The whole watch: node0's and node1's degrading GPUs share an incident rooted at the derived
    topology's rack; node0 goes silent and is forgotten 600 s later. The findings file's next word
    on the incident came at its next update, calling it "growing" as it shrank (review h19); now
    the move tells it without node0's GPUs, and it never says it grew."""
    topo = small_topology(nodes=3, gpus=8, racks=1)
    faults = [Fault("tim_degradation", 3, 300, 8.0, "f"), Fault("tim_degradation", 5, 300, 8.0, "g"),
              Fault("tim_degradation", 8 + 3, 300, 8.0, "h")]
    frames, _ = World(topo, faults=faults, seed=3).run(3000.0)
    pages = _pages(topo, frames, lambda i: [0, 1, 2] if i < GONE_POLL else [1, 2])
    page_ts = [float(f.ts[0]) for f in frames if f.kind == "gpu"]
    findings = tmp_path / "findings.jsonl"
    _, metrics = _watch(pages, page_ts, findings, 600, monkeypatch)
    told = [f for f in map(json.loads, findings.read_text().splitlines()) if f["type"] == "incident"]
    across = [f for f in told if any(m.startswith("node0/") for m in f["members"])
              and any(m.startswith("node1/") for m in f["members"])]
    assert across, [(f["state"], f["members"]) for f in told]
    after = [f for f in told if f["incident_id"] == across[0]["incident_id"] and f["ts"] > page_ts[GONE_POLL]]
    assert after and after[0]["members"] == ["node1/gpu3"] and after[0]["state"] == "stable"
    assert not [f for f in after if f["state"] == "growing" or any(m.startswith("node0/") for m in f["members"])]
    assert 'root_entity="unknown"' not in "".join(line for line in metrics.splitlines()
                                                  if line.startswith("foreshock_incident_members{"))


def test_the_sentinels_counted_for_a_forgotten_host_are_forgotten_with_it():
    """A not-supported sentinel is counted once per (metric, GPU), remembered in ``counted_once``;
    the keys of a forgotten host's GPUs stayed, so a node pool recycled under new hostnames grew
    the set without end (2,400 keys per 100 hosts) while the topology stayed small."""
    blank = 9223372036854775794  # DCGM's int64 blank: the metric is not supported
    src = _Clocked(health=PipelineHealth())
    src.forget_after_s = HOUR
    sizes = []
    for k in range(12):  # "stable" stays, and a new host every two hours replaces the last one
        host = f"pool-{k}"
        for t in range(0, 2 * int(HOUR), 600):
            src.now = k * 2 * HOUR + t
            src.page = _gpu_page(["stable", host], src.now) + "".join(
                f'DCGM_FI_DEV_MEMORY_TEMP{{gpu="{g}",Hostname="{h}"}} {blank}\n' for h in ("stable", host)
                for g in range(2))
            src.poll()
            src.taken_topologies()
        sizes.append(len(src.counted_once))
    assert src.topology.nodes == ["stable", "pool-11"]
    assert max(sizes) <= 2 * 3 and sizes[-1] == sizes[1]  # (the stable host's, and at most two hosts' more)
    assert src.health.problems[("dcgm", "not-supported sentinel dropped")] == 2 * 13
