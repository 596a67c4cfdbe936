"""Live sources against answers a healthy device does not give (review r58): a BMC sending its
answer a byte at a time or without end, links and redirects to another host, impossible readings,
a CDU that never answers; a paced replay of a recording with a row stamped epoch zero; an external
event file with an event in milliseconds at the start, or that cannot be read; squeue output that
is not UTF-8; a BMC's node that dcgm serves only after the watch started."""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from click.testing import CliRunner

import foreshock.streams.redfish as redfish
from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.streams.external_feed import ExternalFeed, feed_before_frames
from foreshock.streams.polling import PollingSource, run_command
from foreshock.streams.redfish import CduSource, RedfishSource, fan_share, read_cdu
from foreshock.streams.sources import ReplaySource, paced
from foreshock.topology import Topology

from test_streams_redfish import PASSWORD, USER, TestBmc, cdu_tree, connector, legacy_tree, two_loop_topology

T0 = 1.7e9
Handler = Callable[[BaseHTTPRequestHandler], None]


class RawBmc:
    """A BMC on 127.0.0.1 whose answers are written by hand: ``routes`` maps a path to a JSON
    document, or to a function that writes the whole response (a drip, a redirect). ``seen``:
    (path, Authorization) of each request; ``stop`` ends a drip."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.seen.append((self.path, self.headers.get("Authorization")))
                route = routes.get(self.path.rstrip("/"))
                try:
                    if callable(route):
                        route(self)
                    else:
                        body = json.dumps(route).encode() if route is not None else b"{}"
                        self.send_response(200 if route is not None else 404)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                except OSError:  # the client gave up (a drip cut short)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def thermal_tree(fans: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
        "/redfish/v1/Chassis/1": {"Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal"},
                                  "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power"}},
        "/redfish/v1/Chassis/1/Thermal": {"Fans": fans},
        "/redfish/v1/Chassis/1/Power": {"PowerControl": [{"PowerConsumedWatts": 5000}]},
    }


FANS = [{"Reading": 50, "ReadingUnits": "Percent"}] * 3


def drip(body: bytes, every_s: float, stop: threading.Event, headers_too: bool = False) -> Handler:
    """A response sent a byte every ``every_s`` seconds (each well inside the client's timeout):
    the body, or from its headers on."""
    def write(handler: BaseHTTPRequestHandler) -> None:
        head = (f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "X-Slow: " + "a" * 100 + "\r\n\r\n").encode()
        if not headers_too:
            handler.wfile.write(head)
            handler.wfile.flush()
        for b in (head + body if headers_too else body):
            if stop.wait(every_s):
                return
            handler.wfile.write(bytes([b]))
            handler.wfile.flush()
    return write


@pytest.fixture
def servers():
    started: list[Any] = []

    def start(server: Any) -> Any:
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


# ---- R1: a request's time and size are bounded ------------------------------------------------
def test_a_bmc_sending_its_answer_a_byte_at_a_time_is_given_up_at_the_timeout(servers):
    """urllib's timeout bounds each socket operation: a BMC sending its Thermal answer a byte every
    0.1 s held the poll (and every node's row) for the whole answer (142 bytes: 14 s), each byte
    well inside the 1.5 s timeout."""
    good = servers(RawBmc(thermal_tree(FANS)))
    tree = thermal_tree(FANS)
    slow_server = RawBmc(tree)
    tree["/redfish/v1/Chassis/1/Thermal"] = drip(json.dumps({"Fans": FANS}).encode(), 0.1, slow_server.stop)
    slow = servers(slow_server)
    health = PipelineHealth()
    # (a timeout leaving the good BMC's four requests the poll's 1.9 s on a loaded machine)
    src = RedfishSource({"good": good.url, "slow": slow.url}, interval=0.05, timeout=1.5, health=health)
    began = time.monotonic()
    batch = src.read()
    took = time.monotonic() - began
    assert took < 3.5, took  # the 1.5 s timeout, not the 14 s drip
    assert batch.entity_names() == ["good"] and batch.columns["fan_speed"].tolist() == [0.5]
    assert health.problems == {("redfish", "BMC answer too slow"): 1}


@pytest.mark.parametrize("sized", [True, False], ids=["content-length", "until-closed"])
def test_an_answer_larger_than_the_cap_is_refused(servers, monkeypatch, sized: bool):
    monkeypatch.setattr(redfish, "MAX_ANSWER_BYTES", 4096, raising=False)
    big = json.dumps({"Fans": FANS, "Oem": {"padding": "x" * 20_000}}).encode()

    def write(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        if sized:
            handler.send_header("Content-Length", str(len(big)))
        handler.end_headers()
        handler.wfile.write(big)

    tree = thermal_tree(FANS)
    tree["/redfish/v1/Chassis/1/Thermal"] = write
    bmc = servers(RawBmc(tree))
    health = PipelineHealth()
    batch = RedfishSource({"node1": bmc.url}, interval=0.05, timeout=2.0, health=health).read()
    assert "fan_speed" not in batch.columns and batch.columns["psu_power"].tolist() == [5000.0]  # the Power's own
    assert health.problems == {("redfish", "BMC answer too large"): 1}


def test_a_poll_does_not_wait_for_a_bmc_past_its_time_nor_ask_it_again_meanwhile(servers):
    """A BMC sending even its headers a byte at a time, each byte inside the timeout: the poll
    takes the others' rows once its time is up and counts the slow one; its request was given up
    at its deadline (no thread left reading it), so the next poll asks it again."""
    tree = thermal_tree(FANS)
    slow_server = RawBmc(tree)
    tree["/redfish/v1/Chassis"] = drip(json.dumps(tree["/redfish/v1/Chassis"]).encode(), 0.05, slow_server.stop,
                                       headers_too=True)
    slow = servers(slow_server)
    good = servers(RawBmc(thermal_tree(FANS)))
    health = PipelineHealth()
    # (a timeout leaving the good BMC's four requests the poll's 1.9 s on a loaded machine)
    src = RedfishSource({"slow": slow.url, "good": good.url}, interval=0.05, timeout=1.5, health=health)
    began = time.monotonic()
    first = src.read()
    second = src.read()
    took = time.monotonic() - began
    src.stop()
    assert took < 6.0, took  # the 1.5 s timeout at each poll, where the drip (234 bytes) takes 11.7 s
    assert first.entity_names() == second.entity_names() == ["good"]
    assert health.problems == {("redfish", "BMC answer too slow"): 2}
    assert [path for path, _ in slow.seen] == ["/redfish/v1/Chassis"] * 2  # asked, and given up, at each poll


# ---- R3: the credentials stay with the BMC --------------------------------------------------
@pytest.mark.parametrize("link", ["absolute", "scheme-relative"])
def test_a_link_to_another_host_is_refused_not_followed_with_the_credentials(servers, link: str):
    other = servers(RawBmc(thermal_tree(FANS)))
    where = other.url if link == "absolute" else other.url.removeprefix("http:")
    bmc = servers(RawBmc({"/redfish/v1/Chassis": {"Members": [{"@odata.id": where + "/redfish/v1/Chassis/1"}]}}))
    health = PipelineHealth()
    assert not len(RedfishSource({"node1": bmc.url}, interval=0.05, user=USER, password=PASSWORD,
                                 health=health).read())
    assert other.seen == []
    assert health.problems == {("redfish", "BMC link off its own host refused"): 1,
                               ("redfish", "BMC gave neither fan speed nor power"): 1}  # its only chassis


def test_a_redirect_to_another_host_is_refused_one_within_the_bmc_followed(servers):
    """urllib's redirect handler copied the Authorization header onto a 302 to any host."""
    other = servers(RawBmc(thermal_tree(FANS)))

    def to(base: str) -> Handler:
        def write(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(302)
            handler.send_header("Location", base + handler.path + "/")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        return write

    away = servers(RawBmc({"/redfish/v1/Chassis": to(other.url)}))
    health = PipelineHealth()
    assert not len(RedfishSource({"node1": away.url}, interval=0.05, user=USER, password=PASSWORD,
                                 health=health).read())
    assert other.seen == []
    assert health.problems == {("redfish", "BMC redirect to another host refused"): 1}

    # the BMC's own redirect (a trailing slash added) is followed, with the credentials
    routes = thermal_tree(FANS)
    same = servers(RawBmc(routes))  # routes are read at each request: the handler below can name its URL
    chassis = json.dumps(routes["/redfish/v1/Chassis"]).encode()

    def chassis_or_slash(handler: BaseHTTPRequestHandler) -> None:
        if not handler.path.endswith("/"):
            to(same.url)(handler)
            return
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(chassis)))
        handler.end_headers()
        handler.wfile.write(chassis)

    routes["/redfish/v1/Chassis"] = chassis_or_slash
    health = PipelineHealth()
    batch = RedfishSource({"node1": same.url}, interval=0.05, user=USER, password=PASSWORD, health=health).read()
    assert batch.entity_names() == ["node1"] and health.total_problems() == 0
    assert ("/redfish/v1/Chassis/", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()) in same.seen


# ---- R5: CDUs in parallel, an unreachable one tried again ever less often ----------------------
class Silent:
    """Accepts connections and never answers (a CDU hung after its TCP stack); counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.accepted: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                self.accepted.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_cdus_are_read_in_parallel_and_one_not_found_is_not_asked_at_every_poll(servers):
    """Two CDUs that never answer cost a poll one timeout, not one each; the next poll does not
    ask them (each was asked at every poll, costing every loop the timeout)."""
    hung = [servers(Silent()), servers(Silent())]
    health = PipelineHealth()
    src = CduSource({"cdu0": hung[0].url, "cdu1": hung[1].url}, two_loop_topology(), interval=0.05, timeout=1.5,
                    health=health)
    began = time.monotonic()
    assert src.poll() == []
    first = time.monotonic() - began
    # the 1.5 s timeout, and at most the poll's 1.875 s and its 0.25 s wind-down (2.125 s) on a
    # loaded machine, where one after the other took at least 3 s
    assert first < 2.7, first
    # (both reads end, each counting its failure, at their timeout: one a loaded machine let run
    # past the poll is waited for here, so that the next poll's time is its own)
    deadline = time.monotonic() + 5
    while any(not read.done() for read in src._reads.pending.values()) and time.monotonic() < deadline:
        time.sleep(0.005)
    began = time.monotonic()
    assert src.poll() == []
    second = time.monotonic() - began
    assert second < 1.0, second  # nothing asked: asking them again waited the 1.5 s timeout
    assert [len(h.accepted) for h in hung] == [1, 1]
    assert sum(health.problems.values()) == 2  # each counted once: too slow, or unreachable
    src.stop()


def test_an_unreachable_cdu_is_tried_again_after_1_2_4_polls(servers, monkeypatch):
    health = PipelineHealth()
    good = servers(TestBmc(cdu_tree([connector(30.5, 240.0)])))
    src = CduSource({"cdu0": "http://127.0.0.1:1", "cdu1": good.url}, two_loop_topology(), interval=0.05,
                    user=USER, password=PASSWORD, health=health)
    asked: list[int] = []
    real = src.read_one
    monkeypatch.setattr(src, "read_one", lambda loop: (asked.append(src.polls) if loop == "cdu0" else None)
                        or real(loop))
    for _ in range(12):
        (frame,) = src.poll()  # the healthy loop's racks at every poll
        assert len(frame) and np.allclose(frame.columns["inlet_temp"], 30.5)
        src.polls += 1
    assert asked == [0, 2, 5, 10]
    assert health.problems == {("redfish", "BMC unreachable"): 4}


# ---- R8, R9: readings -------------------------------------------------------------------------
def test_readings_no_fan_or_pump_gives_are_counted_and_left_out(servers):
    ok = {"Status": {"State": "Enabled", "Health": "OK"}}
    for reading, units in ((-1, "Percent"), (100.5, "Percent"), (-300, "RPM")):
        assert fan_share({**ok, "Reading": reading, "ReadingUnits": units}, 12000.0) == \
            (None, "fan reading out of range")
    assert fan_share({**ok, "Reading": 100, "ReadingUnits": "Percent"}) == (1.0, "")
    bmc = servers(RawBmc(thermal_tree([{"Reading": 60, "ReadingUnits": "Percent"},
                                       {"Reading": -1, "ReadingUnits": "Percent"}])))
    health = PipelineHealth()
    batch = RedfishSource({"node1": bmc.url}, interval=0.05, health=health).read()
    assert batch.columns["fan_speed"].tolist() == [0.6]  # was -0.01: the broken sensor's
    assert health.problems == {("redfish", "fan reading out of range"): 1}

    tree = cdu_tree([connector(31.0, -120.0), connector(33.0, 60.0)])
    reading = read_cdu(tree.__getitem__, [p for p in tree if "SecondaryCoolantConnectors/" in p])
    assert reading.problems == ["CDU FlowLitersPerMinute out of range"]
    assert np.isnan(reading.flow_lps)  # not the other connector's 60 L/min: a loss of flow that is not there
    # not weighted by the one flow read (33.0): the plain mean of the two supplies
    assert reading.supply_c == pytest.approx(32.0)


def test_fans_in_rpm_without_a_full_speed_are_counted_once_per_node(servers, monkeypatch):
    monkeypatch.delenv("FORESHOCK_BMC_FAN_MAX_RPM", raising=False)
    fans = [{"Reading": 13000 + 100 * i, "ReadingUnits": "RPM", "MaxReadingRange": None,
             "Status": {"Health": "OK", "State": "Enabled"}} for i in range(6)]
    bmcs = {f"node{i}": servers(RawBmc(thermal_tree(fans))).url for i in range(2)}
    health = PipelineHealth()
    rows = sum(len(f) for f in RedfishSource(bmcs, interval=0.02, health=health, max_polls=4))
    assert rows == 8
    assert health.problems == {("redfish", "fan RPM without a full-speed reference (set FORESHOCK_BMC_FAN_MAX_RPM)"): 2}


# ---- R2: a BMC named for a node dcgm serves later --------------------------------------------
def test_a_bmc_node_taken_into_the_derived_topology_later_has_its_rows_read(monkeypatch, caplog):
    """watch --source dcgm --bmc node8=URL, node8 not served at the first poll: its BMC source was
    numbered by the first topology, so node8's rows were refused as unknown for good, even after
    the watch took node8 in."""
    from foreshock.cli import watch

    monkeypatch.setenv("FORESHOCK_BMC_USER", USER)
    monkeypatch.setenv("FORESHOCK_BMC_PASSWORD", PASSWORD)
    bmc = TestBmc(legacy_tree((7200.0, 6000.0, 7100.0)))
    try:
        first = Topology.from_gpu_hosts([("node7", 0)])
        grown = Topology.from_gpu_hosts([("node7", 0), ("node8", 0)])
        health = PipelineHealth()
        (source,) = watch._bmc_sources(None, {"node8": bmc.url}, 0.05, None, first, health, fixed=False)

        class Primary(PollingSource):
            reads = ("gpu",)

        primary = Primary(1.0, health)
        primary._topology = first
        follower = watch._TopologyFollower(primary, first, [source])
        moved: list[Topology] = []
        monkeypatch.setattr(watch, "move_run", lambda run, topology, stage: moved.append(topology))
        gpu = Frame("gpu", np.zeros(1), np.zeros(1, np.int32), {})
        before = source.poll()
        marked = follower.mark(iter([gpu, gpu]))
        merged = [next(marked)]
        primary._topology = grown  # dcgm took node8 in
        merged += list(marked)
        after = source.poll()
        out = list(follower.follow([merged[0], *before, *merged[1:], *after], run=None))
    finally:
        bmc.close()
    assert moved == [grown]
    nodes = [f for f in out if f.kind == "node"]
    assert [len(f) for f in nodes] == [0, 1]  # before: not in the topology yet; after: node8's
    assert nodes[1].slot.tolist() == [grown.nodes.index("node8")]
    assert nodes[1].columns["fan_speed"].tolist() == [pytest.approx(0.5)]
    assert health.problems == {("redfish", "unknown node entity"): 1}


# ---- R4: pacing a replay ----------------------------------------------------------------------
def test_a_paced_replay_of_a_recording_with_a_row_stamped_epoch_zero_runs(tmp_path: Path):
    """One row stamped 0 in the first window made the pacing start 0: the next frame was due
    1.7e9 / speed seconds later."""
    topology = Topology.from_gpu_hosts([("node0", 0), ("node0", 1)])
    with RecordingWriter(tmp_path / "rec", topology, meta={"interval": 1.0}) as w:
        w.write(Frame("gpu", np.array([0.0]), np.array([0]), {"gpu_temp": np.array([40.0])}))
        for i in range(5):
            w.write(Frame("gpu", np.full(2, T0 + i), np.arange(2), {"gpu_temp": np.array([41.0, 42.0])}))
    source = ReplaySource(str(tmp_path / "rec"), speed=100.0)
    got: list[tuple[int, float]] = []
    reader = threading.Thread(target=lambda: got.extend((len(f), time.monotonic()) for f in source), daemon=True)
    reader.start()
    reader.join(10.0)
    source.stop.set()
    assert sum(rows for rows, _ in got) == 11 and not reader.is_alive()
    assert 0.04 - 0.005 <= got[-1][1] - got[0][1] < 1.0  # still paced: 4 s of telemetry at 100x


def test_a_jump_in_telemetry_time_is_told_and_the_pacing_goes_on_from_there(caplog):
    """A first frame of strays only, then a frame stamped in milliseconds: neither is waited out
    (1.7e9 s, 1.7e12 s of telemetry), both are logged, and the frames around them are paced."""
    stamps = [0.0, T0, T0 + 1, T0 * 1000, T0 + 2, T0 + 3]
    frames = [Frame("gpu", np.array([t]), np.array([0]), {}) for t in stamps]
    released: list[float] = []
    stop = threading.Event()
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        reader = threading.Thread(target=lambda: released.extend(time.monotonic() - began
                                                                 for _ in paced(iter(frames), 10.0, stop)))
        reader.start()
        reader.join(5.0)
        stop.set()
        reader.join()
    assert len(released) == len(frames) and released[-1] < 1.0
    assert released[2] - released[1] >= 0.1 - 0.005  # 1 s at 10x
    assert released[5] - released[4] >= 0.1 - 0.005
    told = [r.getMessage() for r in caplog.records if "telemetry time jumps" in r.getMessage()]
    assert len(told) == 3  # onto T0, onto the milliseconds, back


def test_a_gap_in_a_recording_is_waited_out_as_recorded_and_told(caplog):
    """A recording's silence (an hour without data, here 30 s at 100x) is waited out: a replay
    feeds the detectors, and a Kafka worker's arrival clock, the gap as the live source gave it.
    It is logged, so an idle replay says why it waits."""
    stamps = [T0, T0 + 1, T0 + 31, T0 + 32]
    frames = [Frame("gpu", np.array([t]), np.array([0]), {}) for t in stamps]
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        released = [time.monotonic() - began for _ in paced(iter(frames), 100.0, threading.Event(), window=1.0)]
    assert released[2] - released[1] >= 0.3 - 0.005
    told = [r.getMessage() for r in caplog.records if "telemetry time jumps" in r.getMessage()]
    assert len(told) == 1 and "waiting it out" in told[0]


# ---- R6, R7: the external event file ----------------------------------------------------------
def test_an_event_in_milliseconds_already_in_the_file_is_refused_not_held(tmp_path: Path):
    from foreshock.detectors.incidents import IncidentEngine

    topology = Topology.from_gpu_hosts([("node0", 0), ("node1", 0)])
    path = tmp_path / "ext.jsonl"
    path.write_bytes(b'{"node":"node0","time":1700006460000,"type":"fan_failure","severity":"critical"}\n'
                     b'{"node":"node1","time":1700006402,"type":"fan_failure","severity":"critical"}\n')
    health = PipelineHealth()
    engine = IncidentEngine(topology, health)
    feed = ExternalFeed(path, health)
    for now in feed_before_frames([1700006401.0 + i for i in range(5)], feed, [engine]):
        engine.observe([], now)
    assert feed.events == 2 and len(engine._external) == 0
    assert health.problems == {("incidents", "external event dated too far ahead of telemetry: refused"): 1}


def test_a_file_that_cannot_be_read_is_counted_once_not_at_every_frame(tmp_path: Path):
    path = tmp_path / "ext"
    path.mkdir()  # stat sees it, open() refuses it (as a file another user's after a rotation)
    health = PipelineHealth()
    feed = ExternalFeed(path, health)
    assert list(feed_before_frames(range(200), feed, [])) == list(range(200))
    assert health.problems == {("external", "external event file cannot be read"): 1}
    path.rmdir()
    path.write_text('{"node":"node0","time":1.0,"type":"xid","severity":"critical"}\n')
    assert len(feed.poll()) == 1
    path.unlink()
    path.mkdir()  # unreadable again, another inode: counted again
    for _ in range(5):
        feed.poll()
    assert health.problems[("external", "external event file cannot be read")] == 2


# ---- R10: output that is not UTF-8 -----------------------------------------------------------
SQUEUE_LATIN1 = b'{"jobs":[{"job_id":7,"name":"r\xe9sum\xe9","nodes":"node[0-1]","job_state":["RUNNING"]}]}\n'


def test_command_output_that_is_not_utf8_is_read_with_replacement_characters(tmp_path: Path):
    script = tmp_path / "squeue"  # a job name submitted from a Latin-1 terminal
    script.write_bytes(b"#!/bin/sh\ncat " + str(tmp_path / "out.json").encode() + b"\n")
    (tmp_path / "out.json").write_bytes(SQUEUE_LATIN1)
    script.chmod(0o755)
    out, why = run_command([str(script)], PipelineHealth(), "slurm")
    assert why == "" and out is not None and "r\ufffdsum\ufffd" in out

    topology = tmp_path / "topo.yaml"
    Topology.from_gpu_hosts([("node0", 0), ("node1", 0)]).dump(topology)
    for args in (["--squeue", str(script)], ["--squeue-json", str(tmp_path / "out.json")]):
        result = CliRunner().invoke(cli, ["topology", "jobs", str(topology), *args, "-o", str(tmp_path / "new.yaml")])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output.strip().splitlines()[-1])["jobs"] == 1
        assert Topology.load(tmp_path / "new.yaml").jobs == ["7:r\ufffdsum\ufffd"]
