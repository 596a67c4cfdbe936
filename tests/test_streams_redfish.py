"""The Redfish source against test BMCs: HTTP(S) servers on 127.0.0.1 that serve a Redfish tree
the way a BMC does (basic auth checked on every request, 401 otherwise)."""

from __future__ import annotations

import base64
import json
import math
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams.redfish import (CDU_METER_LOST, CDU_NOTHING_READ, CDU_UNMETERED, SENSOR_RANGE_ONLY, TOO_SLOW, CduSource,
                                       RedfishError, RedfishSource, clients, fan_share, parse_bmc_list)
from foreshock.topology import Topology

from local_http import LocalHttpServer
from thermal_synth import small_topology

CERTS = Path(__file__).parent / "data" / "redfish"
USER, PASSWORD = "admin", "s3cret"


class TestBmc(LocalHttpServer):
    """A BMC on 127.0.0.1: ``tree`` maps a path to a JSON document, to raw bytes (sent as they
    are) or to an int (that HTTP status). Every request needs USER/PASSWORD by basic auth.
    ``delay_s`` maps a path to how long its answer waits."""

    __test__ = False  # not a test class for pytest

    def __init__(self, tree: dict[str, Any], tls: bool = False) -> None:
        self.tree = tree
        self.requests: list[str] = []
        self.delay_s: dict[str, float] = {}
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

        def respond(request: Any) -> tuple[int, bytes, str]:
            self.requests.append(request.path)
            time.sleep(self.delay_s.get(request.path, 0.0))
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
    assert fan_share({**ok, "Reading": 3000, "ReadingUnits": "RPM", "MaxReadingRange": 6000}) == (0.5, "")
    # the configured full speed is one figure for the fleet: for fans the BMC gives no range, or
    # OpenBMC's default one; a BMC's own range is kept (taken over it, a 6000-RPM fan at 25 % read
    # 0.094 with the figure set for 16000-RPM fans: "stopped")
    assert fan_share({**ok, "Reading": 3000, "ReadingUnits": "RPM", "MaxReadingRange": 6000},
                     fan_max_rpm=12000.0) == (0.5, "")
    assert fan_share({**ok, "Reading": 3000, "ReadingUnits": "RPM", "MaxReadingRange": 25000},
                     fan_max_rpm=12000.0) == (0.25, "")
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
    """Wrong credentials and a closed port cost that node its row in the poll; a server error
    and a body that is not JSON cost only the resource's own readings (the Thermal's fans, the
    Power's draw). Each is counted by reason, and none stops the poll."""
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
    assert batch.entity_names() == ["good", "error", "html"]
    assert batch.columns["fan_speed"].tolist()[::2] == pytest.approx([6900 / 12000] * 2)
    assert math.isnan(batch.columns["fan_speed"][1]) and batch.columns["psu_power"].tolist()[:2] == [5210.0] * 2
    assert math.isnan(batch.columns["psu_power"][2])
    refused = source({"good": good.url}, password="wrong")
    assert len(refused.read()) == 0
    assert refused.health.problems[("redfish", "BMC refused the credentials")] == 1
    problems = src.health.problems
    assert problems[("redfish", "BMC answered HTTP 500")] == 1
    assert problems[("redfish", "BMC answer is not JSON")] == 1
    assert problems[("redfish", "BMC unreachable")] == 1

    # The resource comes back: read again where it was found, the node not discovered again.
    server_error.tree["/redfish/v1/Chassis/1U/Thermal"] = legacy_tree()["/redfish/v1/Chassis/1U/Thermal"]
    assert src.read().columns["fan_speed"][1] == pytest.approx(6900 / 12000)
    assert server_error.requests.count("/redfish/v1/Chassis") == 1


HGX_BASEBOARD = "/redfish/v1/Chassis/HGX_Baseboard_0"


def hgx_node_tree() -> dict:
    """A server chassis with three fans (7200, 6900 and 7100 RPM) and an HGX baseboard chassis."""
    return with_gpu_baseboard(legacy_tree((7200.0, 6900.0, 7100.0)), (64.0, 30.0), 4100.0)


def read_server_chassis_only(src: RedfishSource, polls: int) -> None:
    """Each poll's row holds the server chassis's slowest fan and its draw: nothing of the baseboard."""
    for _ in range(polls):
        batch = src.read()
        assert batch.columns["fan_speed"].tolist() == [pytest.approx(6900.0 / 12000.0)]
        assert batch.columns["psu_power"].tolist() == [5210.0]


def test_one_resources_http_error_costs_only_its_readings_and_keeps_the_discovery(bmcs):
    """An HGX baseboard chassis whose EnvironmentMetrics answers 503 (its HMC busy) and one of
    whose fans answers 500: the node's row keeps its other fans and the server chassis's draw,
    at every poll, and the node is not discovered again (it had no row at all, and was
    discovered again, at every poll)."""
    base, tree = HGX_BASEBOARD, hgx_node_tree()
    tree[f"{base}/EnvironmentMetrics"] = 503
    tree[f"{base}/ThermalSubsystem/Fans/1"] = 500
    bmc = bmcs(tree)
    src = source({"node7": bmc.url})
    read_server_chassis_only(src, polls=2)
    assert src.health.problems == {("redfish", "BMC answered HTTP 503"): 2, ("redfish", "BMC answered HTTP 500"): 2}
    assert bmc.requests.count("/redfish/v1/Chassis") == 1


def test_a_chassis_that_cannot_be_discovered_costs_only_its_own_readings_and_is_tried_again(bmcs):
    """A chassis the collection lists but that answers 404 (a stale member, or one not up yet)
    cost the node its row at every poll. Now the other chassis are read, the collection is read
    again once (it may list the chassis under a new id), and, listed again, the chassis is looked
    for at each poll, counted once, and read once it answers."""
    base, tree = HGX_BASEBOARD, hgx_node_tree()
    baseboard = tree.pop(base)
    bmc = bmcs(tree)
    src = source({"node7": bmc.url})
    read_server_chassis_only(src, polls=4)
    assert src.health.problems == {("redfish", "BMC answered HTTP 404"): 1,
                                   ("redfish", "BMC lists a resource that answers 404"): 1}
    assert bmc.requests.count(base) == 4
    bmc.tree[base] = baseboard
    assert src.read().columns["fan_speed"].tolist() == [pytest.approx(0.30)]
    assert bmc.requests.count("/redfish/v1/Chassis") == 2
    assert bmc.requests.count("/redfish/v1/Chassis/1U") == 2


def test_a_chassis_back_under_a_new_id_is_found_by_reading_the_collection_again(bmcs):
    """The HMC restarts and its chassis comes back as HGX_Baseboard_1: the 404 of the old id has
    the collection read again, and the baseboard's stopped fan is read at the next poll (it was
    looked for under the old id for good, the stopped fan never seen)."""
    tree = hgx_node_tree()
    old = {path: tree.pop(path) for path in [path for path in tree if path.startswith(HGX_BASEBOARD)]}
    bmc = bmcs(tree)
    src = source({"node7": bmc.url})
    read_server_chassis_only(src, polls=1)
    moved = json.loads(json.dumps(old).replace("HGX_Baseboard_0", "HGX_Baseboard_1"))
    moved["/redfish/v1/Chassis/HGX_Baseboard_1/ThermalSubsystem/Fans/1"]["SpeedPercent"]["Reading"] = 0.0
    bmc.tree.update(moved)
    bmc.tree["/redfish/v1/Chassis"] = {"Members": [{"@odata.id": "/redfish/v1/Chassis/1U"},
                                                   {"@odata.id": "/redfish/v1/Chassis/HGX_Baseboard_1"}]}
    for _ in range(2):
        assert src.read().columns["fan_speed"].tolist() == [0.0]
    assert bmc.requests.count("/redfish/v1/Chassis") == 2
    assert src.health.problems == {("redfish", "BMC answered HTTP 404"): 1}


def test_a_resource_that_always_answers_404_has_its_node_discovered_again_once_not_at_every_poll(bmcs):
    """A chassis links an EnvironmentMetrics that answers 404 for good (its firmware lists a
    sensor it does not have): the node is discovered again once; listed again and answering 404
    again, the link is left out, counted once. The node was discovered again at every poll (its
    whole tree read again each time, and on a slow BMC a row only every third poll)."""
    tree = with_gpu_baseboard(legacy_tree(), (64.0,), 4100.0)
    del tree[f"{HGX_BASEBOARD}/EnvironmentMetrics"]
    bmc = bmcs(tree)
    src = source({"node7": bmc.url})
    for _ in range(5):
        batch = src.read()
        assert batch.columns["fan_speed"].tolist() == [pytest.approx(0.575)]
        assert batch.columns["psu_power"].tolist() == [5210.0]
    assert bmc.requests.count("/redfish/v1/Chassis") == 2
    assert bmc.requests.count(f"{HGX_BASEBOARD}/EnvironmentMetrics") == 2
    assert src.health.problems == {("redfish", "BMC answered HTTP 404"): 1,
                                   ("redfish", "BMC lists a resource that answers 404"): 1}


def test_a_403_on_one_resource_costs_only_its_readings_one_on_the_collection_the_node(bmcs):
    """403 is the account not allowed that resource (a ReadOnly account and a baseboard's
    sensor), not the credentials refused (401): the node keeps its row and its discovery, the
    403 counted once. It had no row, and was discovered again, at every poll."""
    tree = with_gpu_baseboard(legacy_tree(), (64.0,), 4100.0)
    tree[f"{HGX_BASEBOARD}/EnvironmentMetrics"] = 403
    bmc = bmcs(tree)
    src = source({"node7": bmc.url})
    for _ in range(3):
        assert src.read().columns["fan_speed"].tolist() == [pytest.approx(0.575)]
    assert bmc.requests.count("/redfish/v1/Chassis") == 1
    assert src.health.problems == {("redfish", "BMC answered HTTP 403"): 1}
    bmc.tree["/redfish/v1/Chassis"] = 403  # the account cannot read the BMC at all
    src = source({"node7": bmc.url})
    assert not len(src.read()) and src.health.problems == {("redfish", "BMC answered HTTP 403"): 1}


def test_a_node_that_gives_no_reading_is_counted_at_each_poll_without_its_row(bmcs):
    """OpenBMC fans with no full speed (counted once) and no power resource, and a BMC whose
    Chassis collection lists nothing: neither has a row at any poll, which was counted at the
    first poll only, or never."""
    tree = legacy_tree((2400.0, 2500.0), max_rpm=25000.0)
    del tree["/redfish/v1/Chassis/1U/Power"], tree["/redfish/v1/Chassis/1U"]["Power"]
    src = source({"openbmc": bmcs(tree).url, "empty": bmcs({"/redfish/v1/Chassis": {"Members": []}}).url})
    for _ in range(3):
        assert not len(src.read())
    assert src.health.problems == {("redfish", SENSOR_RANGE_ONLY): 1,
                                   ("redfish", "BMC gave neither fan speed nor power"): 6}


def test_a_connect_or_tls_handshake_cut_short_is_too_slow_not_unreachable():
    """A BMC that accepts the connection but does not finish the TLS handshake by the deadline
    (a busy one): counted as too slow, which keeps the node's discovery. It was "unreachable",
    and the node discovered again."""
    with socket.socket() as listening:  # accepted by the kernel's backlog, never answered
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        client = clients({"node7": f"https://127.0.0.1:{listening.getsockname()[1]}"}, USER, PASSWORD, 0.3,
                         None, True)["node7"]
        with pytest.raises(RedfishError) as raised:
            client.get("/redfish/v1/Chassis")
    assert raised.value.reason == TOO_SLOW and not raised.value.outdates_discovery


def test_a_planned_resource_gone_or_the_credentials_refused_mean_discovering_the_node_again(bmcs):
    """A 404 for a resource found at discovery (the BMC's tree changed) costs that resource's
    readings and the node is discovered again at the next poll; refused credentials, even on one
    resource, cost the whole node its row."""
    bmc = bmcs(legacy_tree())
    src = source({"node7": bmc.url})
    assert src.read().entity_names() == ["node7"]
    thermal = bmc.tree.pop("/redfish/v1/Chassis/1U/Thermal")
    batch = src.read()
    assert "fan_speed" not in batch.columns and batch.columns["psu_power"].tolist() == [5210.0]
    bmc.tree["/redfish/v1/Chassis/1U/Thermal"] = thermal
    assert src.read().columns["fan_speed"].tolist() == [pytest.approx(6900.0 / 12000.0)]
    assert bmc.requests.count("/redfish/v1/Chassis") == 2

    bmc.tree["/redfish/v1/Chassis/1U/Power"] = 401
    assert not len(src.read()) and not len(src.read())
    assert bmc.requests.count("/redfish/v1/Chassis") == 3  # the first refusal dropped the discovery
    assert src.health.problems == {("redfish", "BMC answered HTTP 404"): 1,
                                   ("redfish", "BMC refused the credentials"): 2}


def test_a_read_cut_short_for_time_keeps_what_was_discovered(bmcs):
    """Discovering and reading each fit in one poll, not both together: the read cut short keeps
    the node's discovery, so the next poll only reads. It was discovered again at every poll,
    cut short again, and the node never had a row."""
    bmc = bmcs(legacy_tree())
    bmc.delay_s = {path: 0.35 for path in bmc.tree}  # 4 requests, 1.4 s, where a poll waits 1.25 s
    src = source({"node7": bmc.url}, timeout=1.0)
    rows = [len(src.read()) for _ in range(3)]
    src.stop()
    assert rows == [0, 1, 1]
    assert src.health.problems == {("redfish", TOO_SLOW): 1}
    assert bmc.requests.count("/redfish/v1/Chassis") == 1


@pytest.mark.parametrize("watts, reason", [
    ("N/A", "power reading is not a number"), (b"NaN", "power reading is not a number"),
    (-1.0, "power reading out of range"), (None, "no power reading")], ids=["text", "nan", "negative", "null"])
def test_a_chassis_draw_that_cannot_be_used_is_counted(bmcs, watts: Any, reason: str):
    """The chassis's ``PowerConsumedWatts`` was dropped uncounted: psu_power just disappeared."""
    tree = legacy_tree()
    if isinstance(watts, bytes):
        tree["/redfish/v1/Chassis/1U/Power"] = b'{"PowerControl": [{"PowerConsumedWatts": NaN}]}'
    else:
        tree["/redfish/v1/Chassis/1U/Power"]["PowerControl"][0]["PowerConsumedWatts"] = watts
    src = source({"node7": bmcs(tree).url})
    for _ in range(2):  # the node's only draw: a poll without psu_power, counted at each
        batch = src.read()
        assert "psu_power" not in batch.columns and batch.columns["fan_speed"].tolist() == [pytest.approx(0.575)]
    assert src.health.problems == {("redfish", reason): 2}


def test_a_baseboards_power_without_a_reading_is_counted_once_the_servers_draw_kept(bmcs):
    """A null reading beside the node's draw (the server chassis's, which holds the baseboard's)
    costs the node nothing: counted once, not at every poll."""
    tree = with_gpu_baseboard(legacy_tree(), (64.0,), 4100.0)
    tree["/redfish/v1/Chassis/HGX_Baseboard_0/EnvironmentMetrics"] = {"PowerWatts": {"Reading": None}}
    src = source({"node7": bmcs(tree).url})
    for _ in range(3):
        assert src.read().columns["psu_power"].tolist() == [5210.0]
    assert src.health.problems == {("redfish", "no power reading"): 1}


@pytest.mark.parametrize("beside_a_draw", [True, False], ids=["beside-a-draw", "alone"])
def test_a_power_entry_without_a_reading_is_the_bmcs_configuration_counted_once(bmcs, beside_a_draw: bool):
    """A PowerControl entry with no PowerConsumedWatts at all (a limit-only entry, a subsystem's)
    was counted as "no power reading" at every poll, the node's draw read fine or not there."""
    tree = legacy_tree()
    limit_only = {"MemberId": "1", "Name": "CPU Sub-system Power", "PowerLimit": {"LimitInWatts": None}}
    controls = tree["/redfish/v1/Chassis/1U/Power"]["PowerControl"]
    tree["/redfish/v1/Chassis/1U/Power"]["PowerControl"] = controls + [limit_only] if beside_a_draw else [limit_only]
    src = source({"node7": bmcs(tree).url})
    for _ in range(3):
        assert src.read().columns.get("psu_power", np.array([math.nan])).tolist() == \
            ([5210.0] if beside_a_draw else [pytest.approx(math.nan, nan_ok=True)])
    assert src.health.problems == {("redfish", "no power reading"): 1}


def test_openbmcs_default_sensor_range_is_not_taken_for_a_fans_full_speed(bmcs, monkeypatch):
    """OpenBMC gives a fan its tach sensor's default 25000 RPM range as MaxReadingRange: a healthy
    fan at 2400 RPM read 0.096 of full speed, "stopped" to the cooling detector (under 0.1).
    Without a configured full speed that reading is counted, once per node, saying why; with
    FORESHOCK_BMC_FAN_MAX_RPM it is put on that, where another BMC's own range is still its fans'."""
    monkeypatch.delenv("FORESHOCK_BMC_FAN_MAX_RPM", raising=False)
    openbmc = bmcs(legacy_tree((2400.0, 2500.0), max_rpm=25000.0))
    src = source({"node1": openbmc.url})
    for _ in range(3):
        batch = src.read()
        assert "fan_speed" not in batch.columns and batch.columns["psu_power"].tolist() == [5210.0]
    assert src.health.problems == {("redfish", SENSOR_RANGE_ONLY): 1}
    monkeypatch.setenv("FORESHOCK_BMC_FAN_MAX_RPM", "12000")
    assert source({"node1": openbmc.url}).read().columns["fan_speed"].tolist() == [pytest.approx(0.2)]
    ranged = bmcs(legacy_tree((2400.0,), max_rpm=6000.0))
    assert source({"node1": ranged.url}).read().columns["fan_speed"].tolist() == [pytest.approx(0.4)]


@pytest.mark.parametrize("only", ["FORESHOCK_BMC_PASSWORD", "FORESHOCK_BMC_USER"])
def test_one_credential_without_the_other_is_a_usage_error(monkeypatch, tmp_path, only: str):
    """A password without a user sent no credentials at all (and the BMC's 401 was then counted
    as the password refused)."""
    from click.testing import CliRunner

    from foreshock.cli.main import cli

    monkeypatch.delenv("FORESHOCK_BMC_USER", raising=False)
    monkeypatch.delenv("FORESHOCK_BMC_PASSWORD", raising=False)
    monkeypatch.setenv(only, "s3cret")
    with pytest.raises(ValueError, match=f"{only} is set but"):
        clients({"node7": "https://10.0.0.7"}, None, None, 5.0, None, None)
    result = CliRunner().invoke(cli, ["record", "--source", "redfish", "--url", "node7=https://127.0.0.1:1",
                                      "--polls", "1", "--out", str(tmp_path / "rec")])
    assert result.exit_code == 2 and f"{only} is set but" in result.output, result.output


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


@pytest.mark.parametrize("flow, reason", [
    (None, "CDU FlowLitersPerMinute: no reading"), ("missing", "CDU FlowLitersPerMinute: no reading"),
    ("Out of range", "CDU FlowLitersPerMinute is not a number"), (-5.0, "CDU FlowLitersPerMinute out of range")])
def test_a_cdus_flow_is_given_only_when_every_meter_gave_one(bmcs, flow: Any, reason: str):
    """Two connectors of 300 L/min, one meter then not giving a valid flow: the loop's flow was
    the other's alone (null: uncounted), half, a 50 % cooling loss to the thermal detector. Now
    it is NaN for the poll, counted; the supply temperature is still given."""
    cdu = bmcs(cdu_tree([connector(32.0, 300.0), connector(32.0, 300.0)]))
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), user=USER, password=PASSWORD)
    assert src.poll()[0].columns["coolant_flow"].tolist() == [5.0, 5.0]
    second = cdu.tree[f"{CDU}/SecondaryCoolantConnectors/1"]
    if flow == "missing":
        del second["FlowLitersPerMinute"]
    else:
        second["FlowLitersPerMinute"]["Reading"] = flow
    (frame,) = src.poll()
    assert frame.slot.tolist() == [0, 1] and frame.columns["inlet_temp"].tolist() == [32.0, 32.0]
    assert np.isnan(frame.columns["coolant_flow"]).all()
    assert src.health.problems == {("redfish", reason): 1}


def test_a_connector_without_a_meter_is_left_out_of_the_flow_counted_once(bmcs):
    """A connector that has never given a flow (no FlowLitersPerMinute at all: unmetered, the
    return of a pair metered on its supply) made the loop's flow NaN for good, counted at every
    poll; the flow over the same meters at every poll is all the thermal detector needs. A
    one-connector CDU without a meter still gives its supply temperature."""
    unmetered = {"CoolantConnectorType": "Pair", "SupplyTemperatureCelsius": {"Reading": 32.0}}
    cdu0 = bmcs(cdu_tree([connector(32.0, 300.0), unmetered]))
    cdu1 = bmcs(cdu_tree([dict(unmetered)]))
    src = CduSource({"cdu0": cdu0.url + CDU, "cdu1": cdu1.url + CDU}, two_loop_topology(), user=USER,
                    password=PASSWORD)
    for _ in range(3):
        (frame,) = src.poll()
        assert frame.columns["coolant_flow"].tolist() == pytest.approx([2.5, 2.5, math.nan], nan_ok=True)
        assert frame.columns["inlet_temp"].tolist() == [32.0] * 3
    assert src.health.problems == {("redfish", CDU_UNMETERED): 2}


def test_a_cdus_supply_temperature_is_not_weighted_by_the_flows_of_some_connectors(bmcs):
    """30 °C at 600 L/min and 40 °C at 300: 33.3 °C weighted. With the first meter null the
    mean was weighted by the second's flow alone, 40 °C, a 6.7 °C step in the loop's inlet; now
    it is their plain mean for that poll."""
    cdu = bmcs(cdu_tree([connector(30.0, 600.0), connector(40.0, 300.0)]))
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), user=USER, password=PASSWORD)
    assert src.poll()[0].columns["inlet_temp"].tolist() == pytest.approx([100 / 3] * 2)
    cdu.tree[f"{CDU}/SecondaryCoolantConnectors/0"]["FlowLitersPerMinute"]["Reading"] = None
    (frame,) = src.poll()
    assert frame.columns["inlet_temp"].tolist() == [35.0, 35.0] and np.isnan(frame.columns["coolant_flow"]).all()


def test_a_cdu_connector_that_always_answers_404_has_the_cdu_looked_for_again_once(bmcs):
    """A connector the CDU lists but answers 404 for good: the CDU's connectors are found again
    once, then that one is left out, counted once. The CDU was looked for again, and its flow
    NaN, at every poll."""
    tree = cdu_tree([connector(32.0, 300.0), connector(32.0, 300.0)])
    del tree[f"{CDU}/SecondaryCoolantConnectors/1"]
    cdu = bmcs(tree)
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), user=USER, password=PASSWORD)
    flows = [src.poll()[0].columns["coolant_flow"].tolist()[0] for _ in range(5)]
    assert flows == pytest.approx([math.nan, 2.5, 2.5, 2.5, 2.5], nan_ok=True)
    assert cdu.requests.count(CDU) == 2
    assert src.health.problems == {("redfish", "BMC answered HTTP 404"): 1,
                                   ("redfish", "BMC lists a resource that answers 404"): 1}


def test_a_cdu_meter_that_gave_a_flow_and_is_then_dropped_leaves_the_loop_without_a_flow(bmcs):
    """A connector that gave a flow, then answers 404 for good: dropped after the CDU is looked for
    again once, the other meter's flow alone had been published, 2.5 L/s of 5: a loss of half the
    flow that is not there. Now the loop has no flow from then on, counted once."""
    tree = cdu_tree([connector(32.0, 300.0), connector(32.0, 300.0)])
    cdu = bmcs(tree)
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), user=USER, password=PASSWORD)
    flows = [src.poll()[0].columns["coolant_flow"].tolist()[0]]
    del cdu.tree[f"{CDU}/SecondaryCoolantConnectors/1"]
    flows += [src.poll()[0].columns["coolant_flow"].tolist()[0] for _ in range(4)]
    assert flows == pytest.approx([5.0, math.nan, math.nan, math.nan, math.nan], nan_ok=True)
    assert src.health.problems[("redfish", CDU_METER_LOST)] == 1


def test_a_cdu_that_gives_no_reading_at_all_is_counted(bmcs):
    """Every excerpt null or missing: no row, and nothing was counted. Now each poll without the
    loop's row is counted, the connectors without a flow once."""
    cdu = bmcs(cdu_tree([connector(None, None), {"CoolantConnectorType": "Pair"}]))
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), user=USER, password=PASSWORD)
    assert src.poll() == [] and src.poll() == []
    assert src.health.problems == {("redfish", CDU_UNMETERED): 2, ("redfish", CDU_NOTHING_READ): 2}


def test_a_cdus_connectors_are_kept_through_one_connectors_error_and_found_again_once_gone(bmcs):
    """A connector answering 503 costs the loop its flow for the poll (counted), not its supply
    temperature, and the CDU is not looked for again; a connector answering 404 is gone: the
    CDU's connectors are found again at the next poll."""
    tree = cdu_tree([connector(32.0, 300.0), connector(32.6, 300.0)])
    tree[f"{CDU}/SecondaryCoolantConnectors/1"] = 503
    cdu = bmcs(tree)
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), user=USER, password=PASSWORD)
    for _ in range(2):
        (frame,) = src.poll()
        assert frame.columns["inlet_temp"].tolist() == [32.0, 32.0] and np.isnan(frame.columns["coolant_flow"]).all()
    assert cdu.requests.count(CDU) == 1
    cdu.tree[f"{CDU}/SecondaryCoolantConnectors/1"] = 404
    src.poll()
    del cdu.tree[f"{CDU}/SecondaryCoolantConnectors/1"]
    cdu.tree[f"{CDU}/SecondaryCoolantConnectors"] = {
        "Members": [{"@odata.id": f"{CDU}/SecondaryCoolantConnectors/0"}]}
    (frame,) = src.poll()
    assert frame.columns["coolant_flow"].tolist() == pytest.approx([300 / 60 / 2] * 2)
    assert cdu.requests.count(CDU) == 2
    assert src.health.problems == {("redfish", "BMC answered HTTP 503"): 2, ("redfish", "BMC answered HTTP 404"): 1}


def test_a_slow_cdu_read_keeps_its_connectors(bmcs):
    """Finding the CDU and reading it fit in one poll each, not together: the read cut short keeps
    the connectors found, so the next poll only reads them."""
    cdu = bmcs(cdu_tree([connector(32.0, 300.0), connector(32.0, 300.0)]))
    cdu.delay_s = {path: 0.35 for path in cdu.tree}  # 4 requests, 1.4 s, where a poll waits 1.25 s
    src = CduSource({"cdu0": cdu.url + CDU}, two_loop_topology(), interval=0.02, timeout=1.0, user=USER,
                    password=PASSWORD)
    frames = [len(src.poll()) for _ in range(3)]
    src.stop()
    assert frames == [0, 1, 1]
    assert src.health.problems == {("redfish", "BMC answer too slow"): 1}
    assert cdu.requests.count(CDU) == 1


def test_a_cdu_collection_url_with_a_trailing_slash_is_read_as_the_collection(bmcs):
    """It was taken for a CoolingUnit: "CDU without a secondary coolant loop"."""
    cdu = bmcs(cdu_tree([connector(30.5, 240.0)]))
    src = CduSource({"cdu1": cdu.url + "/redfish/v1/ThermalEquipment/CDUs/"}, two_loop_topology(), user=USER,
                    password=PASSWORD)
    (frame,) = src.poll()
    assert frame.columns["coolant_flow"].tolist() == [4.0] and src.health.total_problems() == 0


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
    garbage, rows_lost = [0], [0]

    def leads(mode: str) -> list[float]:
        det = ThermalDetector(topo)
        first: dict[int, float] = {}
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
                            rows_lost[0] += int(np.isnan(supply) and np.isnan(flow))  # the loop's row, then
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
    # each NaN the CDU served was counted, and each row left out for having neither reading
    assert cdus.health.total_problems() == garbage[0] + rows_lost[0] and garbage[0] > 0
    assert cdus.health.problems[("redfish", CDU_NOTHING_READ)] == rows_lost[0]


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
