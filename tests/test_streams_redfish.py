"""The Redfish source against test BMCs: HTTP(S) servers on 127.0.0.1 that serve a Redfish tree
the way a BMC does (basic auth checked on every request, 401 otherwise)."""

from __future__ import annotations

import base64
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.streams.redfish import CduSource, RedfishSource, fan_share, parse_bmc_list
from foreshock.topology import Topology

from local_http import LocalHttpServer
from thermal_synth import small_topology

CERTS = Path(__file__).parent / "data" / "redfish"
USER, PASSWORD = "admin", "s3cret"


class TestBmc(LocalHttpServer):
    """A BMC on 127.0.0.1: ``tree`` maps a path to a JSON document, to raw bytes (sent as they
    are) or to an int (that HTTP status). Every request needs USER/PASSWORD by basic auth."""

    __test__ = False  # not a test class for pytest

    def __init__(self, tree: dict[str, Any], tls: bool = False) -> None:
        self.tree = tree
        self.requests: list[str] = []
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

        def respond(request: Any) -> tuple[int, bytes, str]:
            self.requests.append(request.path)
            if request.headers.get("Authorization") != expected:
                return 401, b'{"error": "unauthorized"}', "application/json"
            found = self.tree.get(request.path.rstrip("/") or "/")
            if found is None:
                return 404, b'{"error": "not found"}', "application/json"
            if isinstance(found, int):
                return found, b"{}", "application/json"
            return 200, found if isinstance(found, bytes) else json.dumps(found).encode(), "application/json"

        context = None
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(CERTS / "bmc-cert.pem", CERTS / "bmc-key.pem")
        super().__init__(respond, context)


def legacy_tree(fan_rpm: tuple[float, ...] = (7200.0, 6900.0, 7100.0), max_rpm: float | None = 12000.0,
                watts: float = 5210.0) -> dict[str, Any]:
    """A server's chassis with the legacy Thermal and Power resources, fans in RPM (one empty bay)."""
    fans: list[dict[str, Any]] = [
        {"@odata.id": f"/redfish/v1/Chassis/1U/Thermal#/Fans/{i}", "MemberId": str(i), "Name": f"Fan {i}",
         "Reading": rpm, "ReadingUnits": "RPM", "Status": {"State": "Enabled", "Health": "OK"},
         **({"MaxReadingRange": max_rpm, "MinReadingRange": 0} if max_rpm else {})}
        for i, rpm in enumerate(fan_rpm)]
    fans.append({"MemberId": "9", "Name": "Fan bay 9", "Reading": None, "ReadingUnits": "RPM",
                 "Status": {"State": "Absent"}})
    return {
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1U"}]},
        "/redfish/v1/Chassis/1U": {"Id": "1U", "Thermal": {"@odata.id": "/redfish/v1/Chassis/1U/Thermal"},
                                   "Power": {"@odata.id": "/redfish/v1/Chassis/1U/Power"}},
        "/redfish/v1/Chassis/1U/Thermal": {"Fans": fans, "Temperatures": []},
        "/redfish/v1/Chassis/1U/Power": {"PowerControl": [{"PowerConsumedWatts": watts}]},
    }


def with_gpu_baseboard(tree: dict[str, Any], percents: tuple[float, ...], watts: float) -> dict[str, Any]:
    """Add an HGX-style baseboard chassis with the newer ThermalSubsystem fans (percent) and
    EnvironmentMetrics power."""
    base = "/redfish/v1/Chassis/HGX_Baseboard_0"
    tree = dict(tree)
    tree["/redfish/v1/Chassis"] = {"Members": tree["/redfish/v1/Chassis"]["Members"] + [{"@odata.id": base}]}
    tree[base] = {"Id": "HGX_Baseboard_0", "ThermalSubsystem": {"@odata.id": f"{base}/ThermalSubsystem"},
                  "EnvironmentMetrics": {"@odata.id": f"{base}/EnvironmentMetrics"}}
    tree[f"{base}/ThermalSubsystem"] = {"Fans": {"@odata.id": f"{base}/ThermalSubsystem/Fans"}}
    tree[f"{base}/ThermalSubsystem/Fans"] = {
        "Members": [{"@odata.id": f"{base}/ThermalSubsystem/Fans/{i}"} for i in range(len(percents))]}
    for i, pct in enumerate(percents):
        tree[f"{base}/ThermalSubsystem/Fans/{i}"] = {"Id": str(i), "SpeedPercent": {"Reading": pct, "SpeedRPM": 99},
                                                     "Status": {"State": "Enabled", "Health": "OK"}}
    tree[f"{base}/EnvironmentMetrics"] = {"PowerWatts": {"Reading": watts}}
    return tree


@pytest.fixture
def bmcs():
    started: list[TestBmc] = []

    def start(tree: dict[str, Any], tls: bool = False) -> TestBmc:
        started.append(TestBmc(tree, tls))
        return started[-1]

    yield start
    for bmc in started:
        bmc.close()


def source(nodes: dict[str, str], **kwargs: Any) -> RedfishSource:
    kwargs.setdefault("user", USER)
    kwargs.setdefault("password", PASSWORD)
    return RedfishSource(nodes, interval=0.02, **kwargs)


def test_a_nodes_slowest_fan_and_largest_chassis_draw_make_its_row(bmcs):
    """Two chassis: the server's (RPM fans over their range, 5210 W) and the GPU baseboard's
    (fans in percent, 4100 W). The slowest of all fans counts; the empty bay does not."""
    bmc = bmcs(with_gpu_baseboard(legacy_tree((7200.0, 6900.0, 7100.0)), (64.0, 58.5), 4100.0))
    src = source({"node7": bmc.url})
    batch = src.read()
    assert batch.entity_names() == ["node7"]
    assert batch.columns["fan_speed"][0] == pytest.approx(6900.0 / 12000.0)  # 0.575 < 0.585
    assert batch.columns["psu_power"][0] == 5210.0
    assert src.health.total_problems() == 0

    bmc.tree["/redfish/v1/Chassis/HGX_Baseboard_0/ThermalSubsystem/Fans/1"]["SpeedPercent"]["Reading"] = 0.0
    assert src.read().columns["fan_speed"][0] == 0.0
    # Discovery ran once: the second poll read only the readings.
    assert bmc.requests.count("/redfish/v1/Chassis") == 1


def test_fan_readings_without_a_scale_are_counted_not_guessed():
    ok = {"Status": {"State": "Enabled", "Health": "OK"}}
    assert fan_share({**ok, "Reading": 45, "ReadingUnits": "Percent"}) == (0.45, "")
    assert fan_share({**ok, "Reading": 3000, "ReadingUnits": "RPM"}, fan_max_rpm=12000.0) == (0.25, "")
    assert fan_share({**ok, "Reading": 3000, "ReadingUnits": "RPM", "MaxReadingRange": 6000},
                     fan_max_rpm=12000.0) == (0.5, "")
    share, problem = fan_share({**ok, "Reading": 3000, "ReadingUnits": "RPM"})
    assert share is None and "full-speed reference" in problem
    assert fan_share({**ok, "Reading": 0, "ReadingUnits": "RPM"}) == (0.0, "")  # stopped: 0 on any scale
    assert fan_share({**ok, "Reading": "fast", "ReadingUnits": "RPM"}) == (None, "fan reading is not a number")
    assert fan_share({"Reading": None, "Status": {"State": "Enabled", "Health": "Critical"}}) == (0.0, "")
    assert fan_share({"Reading": None, "Status": {"State": "Enabled", "Health": "OK"}}) == (None, "fan without a reading")
    assert fan_share({"Reading": None, "Status": {"State": "Absent"}}) == (None, "")


def test_rpm_fans_without_a_range_use_the_configured_full_speed(bmcs, monkeypatch):
    bmc = bmcs(legacy_tree((7200.0, 900.0), max_rpm=None))
    unscaled = source({"node1": bmc.url})
    for _ in range(3):
        batch = unscaled.read()
        assert "fan_speed" not in batch.columns and batch.columns["psu_power"][0] == 5210.0
    # the BMC's configuration, the same at every poll: counted once for the node, not per fan per
    # poll (a Dell iDRAC's fans, MaxReadingRange null: ~17,000 a day a node; review r58)
    assert unscaled.health.problems == {("redfish", "fan RPM without a full-speed reference "
                                                    "(set FORESHOCK_BMC_FAN_MAX_RPM)"): 1}
    assert source({"node1": bmc.url}, fan_max_rpm=9000.0).read().columns["fan_speed"][0] == pytest.approx(0.1)
    monkeypatch.setenv("FORESHOCK_BMC_FAN_MAX_RPM", "9000")
    assert source({"node1": bmc.url}).read().columns["fan_speed"][0] == pytest.approx(0.1)
    monkeypatch.setenv("FORESHOCK_BMC_FAN_MAX_RPM", "fast")
    with pytest.raises(ValueError, match="full speed in RPM"):
        source({"node1": bmc.url})


@pytest.mark.parametrize("content", [None, b"not a certificate"], ids=["missing", "no-certificate"])
def test_a_ca_file_that_cannot_be_used_is_a_value_error_naming_it(monkeypatch, tmp_path: Path,
                                                                  content: bytes | None) -> None:
    """The commands make a ValueError from a source's settings a usage error; a CA file named in
    FORESHOCK_BMC_CA_FILE that is missing, or holds no certificate, was a FileNotFoundError or an
    SSLError traceback (review h28)."""
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_bytes(content)
    monkeypatch.setenv("FORESHOCK_BMC_CA_FILE", str(ca))
    with pytest.raises(ValueError, match="FORESHOCK_BMC_CA_FILE .*ca.pem"):
        RedfishSource({"node1": "https://127.0.0.1:1"}, topology=small_topology(nodes=2))


def test_a_failing_bmc_is_counted_and_the_others_are_still_read(bmcs):
    """Wrong credentials, a server error, a body that is not JSON and a closed port each cost
    that node its row in the poll, are counted by reason, and never stop the poll."""
    good = bmcs(legacy_tree())
    broken = legacy_tree()
    broken["/redfish/v1/Chassis/1U/Thermal"] = 500
    server_error = bmcs(broken)
    garbage = legacy_tree()
    garbage["/redfish/v1/Chassis/1U/Power"] = b"<html>BMC busy</html>"
    not_json = bmcs(garbage)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    nodes = {"good": good.url, "error": server_error.url, "html": not_json.url, "gone": closed}
    src = source(nodes, timeout=2.0)
    batch = src.read()
    assert batch.entity_names() == ["good"]
    refused = source({"good": good.url}, password="wrong")
    assert len(refused.read()) == 0
    assert refused.health.problems[("redfish", "BMC refused the credentials")] == 1
    problems = src.health.problems
    assert problems[("redfish", "BMC answered HTTP 500")] == 1
    assert problems[("redfish", "BMC answer is not JSON")] == 1
    assert problems[("redfish", "BMC unreachable")] == 1

    # The BMC comes back: the node is discovered again and read.
    server_error.tree["/redfish/v1/Chassis/1U/Thermal"] = legacy_tree()["/redfish/v1/Chassis/1U/Thermal"]
    assert sorted(src.read().entity_names()) == ["error", "good"]
    assert server_error.requests.count("/redfish/v1/Chassis") == 2


def test_https_bmcs_are_verified_against_the_given_ca(bmcs):
    bmc = bmcs(legacy_tree(), tls=True)
    trusted = source({"node1": bmc.url}, ca_file=str(CERTS / "bmc-cert.pem"))
    assert trusted.read().entity_names() == ["node1"]
    untrusted = source({"node1": bmc.url})  # the system store does not know a self-signed BMC
    assert len(untrusted.read()) == 0
    assert untrusted.health.problems[("redfish", "BMC unreachable")] == 1
    assert source({"node1": bmc.url}, insecure=True).read().entity_names() == ["node1"]


def test_a_fan_stopping_on_a_bmc_flags_its_node_in_the_cooling_detector(bmcs):
    """End to end: four nodes' BMCs polled as node frames of the cluster's topology; node2's
    fan stops, and the cooling detector flags node2 at that poll, not before."""
    from foreshock.detectors.cooling import CoolingDetector

    topo = small_topology(nodes=4, gpus=8, racks=2)
    servers = {f"node{i}": bmcs(legacy_tree()) for i in range(4)}
    src = RedfishSource({node: b.url for node, b in servers.items()}, interval=0.02, topology=topo,
                        user=USER, password=PASSWORD, max_polls=4)
    det = CoolingDetector(topo)
    flagged: list[tuple[int, int]] = []
    for poll, frame in enumerate(src):
        assert isinstance(frame, Frame) and frame.kind == "node"
        assert sorted(frame.slot.tolist()) == [0, 1, 2, 3]
        flagged += [(poll, f.slot) for f in det.update(frame) if f.field == "fan_speed"]
        if poll == 1:
            servers["node2"].tree["/redfish/v1/Chassis/1U/Thermal"]["Fans"][1]["Reading"] = 0
    assert flagged == [(2, 2)]
    assert np.isfinite(det.s_fan_flag[2])


def test_bmc_lists_name_each_node_once():
    assert parse_bmc_list("node7=https://10.0.0.7, node8=https://10.0.0.8:8443") == {
        "node7": "https://10.0.0.7", "node8": "https://10.0.0.8:8443"}
    assert parse_bmc_list("https://bmc7.mgmt", host="node7") == {"node7": "https://bmc7.mgmt"}
    assert parse_bmc_list("https://bmc7.mgmt") == {"bmc7.mgmt": "https://bmc7.mgmt"}
    for bad in ("", "node7=10.0.0.7", "node7=https://a,node7=https://b"):
        with pytest.raises(ValueError):
            parse_bmc_list(bad)


def test_the_record_command_writes_a_bmcs_readings(bmcs, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from foreshock.cli.main import cli
    from foreshock.recording import Recording

    bmc = bmcs(legacy_tree((7200.0, 3000.0)))
    monkeypatch.setenv("FORESHOCK_BMC_USER", USER)
    monkeypatch.setenv("FORESHOCK_BMC_PASSWORD", PASSWORD)
    out = tmp_path / "rec"
    result = CliRunner().invoke(cli, ["record", "--source", "redfish", "--url", f"node7={bmc.url}",
                                       "--polls", "2", "--interval", "0.05", "--out", str(out)])
    assert result.exit_code == 0, result.output
    frames = [f for f in Recording.open(str(out)).iter_frames() if f.kind == "node"]
    speeds = np.concatenate([f.columns["fan_speed"] for f in frames])
    assert speeds.tolist() == [0.25, 0.25]


def test_record_names_nodes_by_the_clusters_topology_file(bmcs, tmp_path, monkeypatch):
    """With --topology, node3's BMC reading lands in node3's slot of the cluster's topology (and
    the recording carries that topology); a BMC for a node the file lacks is counted."""
    import click
    from click.testing import CliRunner

    from foreshock.cli.agent import open_source
    from foreshock.cli.main import cli
    from foreshock.recording import Recording

    topo = small_topology(nodes=4, gpus=8, racks=2)
    topo.dump(tmp_path / "cluster.yaml")
    bmc = bmcs(legacy_tree((7200.0, 3000.0)))
    monkeypatch.setenv("FORESHOCK_BMC_USER", USER)
    monkeypatch.setenv("FORESHOCK_BMC_PASSWORD", PASSWORD)
    out = tmp_path / "rec"
    result = CliRunner().invoke(cli, ["record", "--source", "redfish", "--url", f"node3={bmc.url},node9={bmc.url}",
                                      "--topology", str(tmp_path / "cluster.yaml"), "--polls", "1",
                                      "--interval", "0.05", "--out", str(out)])
    assert result.exit_code == 0, result.output
    recording = Recording.open(str(out))
    assert recording.topology.fingerprint() == topo.fingerprint()
    (frame,) = [f for f in recording.iter_frames() if f.kind == "node"]
    assert frame.slot.tolist() == [topo.nodes.index("node3")] and frame.columns["fan_speed"].tolist() == [0.25]
    assert "unknown node entity" in result.output

    with pytest.raises(click.UsageError, match="brings its own"):
        open_source("replay", str(out), None, None, None, None, None, None, None, None, False, 8, "", 0, None,
                    str(tmp_path / "cluster.yaml"))


# ---- CDUs ------------------------------------------------------------------------------------
CDU = "/redfish/v1/ThermalEquipment/CDUs/1"


def cdu_tree(connectors: list[dict[str, Any]], cdus: int = 1) -> dict[str, Any]:
    """A CDU's Redfish service: the CDU collection, the CoolingUnit and its secondary connectors."""
    tree: dict[str, Any] = {
        "/redfish/v1/ThermalEquipment/CDUs": {
            "Members": [{"@odata.id": f"/redfish/v1/ThermalEquipment/CDUs/{i + 1}"} for i in range(cdus)]},
        CDU: {"Id": "1", "EquipmentType": "CDU",
              "SecondaryCoolantConnectors": {"@odata.id": f"{CDU}/SecondaryCoolantConnectors"}},
        f"{CDU}/SecondaryCoolantConnectors": {
            "Members": [{"@odata.id": f"{CDU}/SecondaryCoolantConnectors/{i}"} for i in range(len(connectors))]},
    }
    for i, connector in enumerate(connectors):
        tree[f"{CDU}/SecondaryCoolantConnectors/{i}"] = connector
    return tree


def connector(supply_c: Any, flow_lpm: Any) -> dict[str, Any]:
    return {"CoolantConnectorType": "Pair", "SupplyTemperatureCelsius": {"Reading": supply_c},
            "ReturnTemperatureCelsius": {"Reading": 41.0}, "FlowLitersPerMinute": {"Reading": flow_lpm}}


def two_loop_topology() -> Topology:
    return Topology.from_dict({
        "cluster": "cdu-test",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}, {"name": "row1", "cooling_loop": "cdu1"}],
        "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row0"}, {"name": "rack2", "row": "row1"}],
        "nodes": [{"name": f"node{i}", "rack": f"rack{i}", "gpus": 8} for i in range(3)],
    })


def test_a_cdus_secondary_loop_becomes_the_inlet_and_flow_of_the_racks_it_feeds(bmcs):
    """cdu0 has two secondary connectors (600 L/min at 32.0 °C, 300 at 32.6: the supply is their
    flow-weighted mean) and feeds two racks; cdu1's service is given by its base URL only."""
    topo = two_loop_topology()
    cdu0 = bmcs(cdu_tree([connector(32.0, 600.0), connector(32.6, 300.0)]))
    cdu1 = bmcs(cdu_tree([connector(30.5, 240.0)]))
    src = CduSource({"cdu0": cdu0.url + CDU, "cdu1": cdu1.url}, topo, user=USER, password=PASSWORD)
    (frame,) = src.poll()
    assert frame.kind == "rack" and frame.slot.tolist() == [0, 1, 2]
    supply0 = (32.0 * 600 + 32.6 * 300) / 900
    assert frame.columns["inlet_temp"].tolist() == pytest.approx([supply0, supply0, 30.5])
    assert frame.columns["coolant_temp"].tolist() == frame.columns["inlet_temp"].tolist()
    assert frame.columns["coolant_flow"].tolist() == pytest.approx([900 / 60 / 2, 900 / 60 / 2, 240 / 60])
    assert src.health.total_problems() == 0


def test_cdu_readings_that_are_not_numbers_and_unknown_cdus_are_counted(bmcs):
    topo = two_loop_topology()
    cdu0 = bmcs(cdu_tree([connector(33.0, "Out of range")]))
    two = bmcs(cdu_tree([connector(30.0, 100.0)], cdus=2))  # a base URL can't say which CDU
    src = CduSource({"cdu0": cdu0.url, "cdu1": two.url}, topo, user=USER, password=PASSWORD)
    (frame,) = src.poll()
    assert frame.slot.tolist() == [0, 1] and np.isnan(frame.columns["coolant_flow"]).all()
    assert frame.columns["inlet_temp"].tolist() == [33.0, 33.0]
    assert src.health.problems[("redfish", "CDU FlowLitersPerMinute is not a number")] == 1
    assert src.health.problems[("redfish", "CDU not identified")] == 1
    with pytest.raises(ValueError, match="not in the topology"):
        CduSource({"cdu9": cdu0.url}, topo)


@pytest.mark.slow
def test_a_cooling_loss_read_from_the_cdus_is_predicted_minutes_ahead_not_one(bmcs):
    """The simulator's cooling-loss scenario (256 GPUs, 2 loops; one CDU loses flow over 15 min):
    its GPUs as recorded, its loops as their CDUs would report them over Redfish (supply
    temperature, flow), polled every 10 s of simulated time. Read that way the thermal detector
    warns of the throttles as far ahead as from the simulator's own rack frames; from GPU
    telemetry alone, minutes later."""
    from foreshock.detectors.thermal import ThermalDetector
    from foreshock.findings import Prediction
    from foreshock.simulator import ClusterSimulator

    sim = ClusterSimulator(gpus=256, scenario="cooling-loss", seed=1, interval=10.0, duration=3600)
    ticks = list(sim.iter_ticks(3600))
    topo = sim.topology
    onsets: dict[int, float] = {}
    for e in sim.events:
        if e.type == "thermal_throttle_start":
            onsets.setdefault(topo.gpus.index(e.entity), e.time)
    assert len(onsets) >= 64
    servers = {loop: bmcs(cdu_tree([connector(0.0, 0.0)])) for loop in topo.loops}
    cdus = CduSource({loop: s.url for loop, s in servers.items()}, topo, user=USER, password=PASSWORD)
    loop_of_rack = topo.rack_loop
    garbage = [0]

    def leads(mode: str) -> list[float]:
        det, first = ThermalDetector(topo), {}
        for tick in ticks:
            for frame in tick:
                if frame.kind == "rack" and mode != "gpu only":
                    if mode == "cdu":
                        now = float(frame.ts[0])
                        for i, loop in enumerate(topo.loops):
                            on = loop_of_rack[frame.slot] == i
                            reading = servers[loop].tree[f"{CDU}/SecondaryCoolantConnectors/0"]
                            supply = float(frame.columns["coolant_temp"][on].mean())
                            flow = float(frame.columns["coolant_flow"][on].sum() * 60)
                            reading["SupplyTemperatureCelsius"]["Reading"] = supply
                            reading["FlowLitersPerMinute"]["Reading"] = flow
                            garbage[0] += int(np.isnan(supply)) + int(np.isnan(flow))  # a lost sample, served as NaN
                        cdus.clock = lambda: now
                        (frame,) = cdus.poll()
                    found = det.update(frame)
                elif frame.kind == "gpu":
                    found = det.update(frame)
                else:
                    continue
                for p in found:
                    if isinstance(p, Prediction) and p.event == "thermal_throttle" and p.active:
                        first.setdefault(p.slot, p.ts)
        assert set(first) <= set(onsets), "a GPU that never throttled was predicted to"
        return [onsets[g] - first[g] for g in onsets if g in first and first[g] < onsets[g]]

    from_cdus, from_racks, alone = leads("cdu"), leads("rack frames"), leads("gpu only")
    assert len(from_cdus) == len(onsets)
    assert np.median(from_cdus) >= 300 and np.median(from_cdus) >= np.median(from_racks) - 30
    assert np.median(from_cdus) >= np.median(alone) + 120
    assert cdus.health.total_problems() == garbage[0] > 0  # each NaN the CDU served was counted


def test_record_reads_cdus_by_the_topologys_loops_and_needs_the_topology(bmcs, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from foreshock.cli.main import cli
    from foreshock.recording import Recording

    topo = two_loop_topology()
    topo.dump(tmp_path / "cluster.yaml")
    cdu = bmcs(cdu_tree([connector(31.0, 480.0)]))
    monkeypatch.setenv("FORESHOCK_BMC_USER", USER)
    monkeypatch.setenv("FORESHOCK_BMC_PASSWORD", PASSWORD)
    args = ["record", "--source", "cdu", "--url", f"cdu1={cdu.url}", "--polls", "2", "--interval", "0.05"]
    unplaced = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "none")])
    assert unplaced.exit_code == 2 and "needs --url LOOP=https://CDU" in unplaced.output
    result = CliRunner().invoke(cli, args + ["--topology", str(tmp_path / "cluster.yaml"), "--out", str(tmp_path / "rec")])
    assert result.exit_code == 0, result.output
    frames = [f for f in Recording.open(str(tmp_path / "rec")).iter_frames() if f.kind == "rack"]
    assert np.concatenate([f.slot for f in frames]).tolist() == [2, 2]  # rack2, the one cdu1 feeds
    assert np.concatenate([f.columns["coolant_flow"] for f in frames]).tolist() == [8.0, 8.0]  # 480 L/min
