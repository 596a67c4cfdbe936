"""Per-link FEC limits and detector parameters on the command line.

A soft-decision DWDM transponder corrects pre-FEC BERs ~100x above a 400G KP4 link's 2.4e-4, so
one global limit calls every DWDM channel failing. The topology carries each link's own limit
(``fec_limit_ber``), the optics detector uses it, the Alibaba importer sets it per transport
plane, and ``replay``/``demo`` take ``--param DETECTOR.NAME=VALUE`` for the rest (an hourly
series needs hour-long buckets).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.optics import OpticsDetector
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.streams.alibaba import FEC_LIMIT_BY_PLANE, read_alibaba
from foreshock.topology import Topology, TopologyError

CSV = Path("optics") / "alibaba_prefec_ber.csv"


def two_links(fec: object | None) -> dict:
    link = {"name": "dwdm", "a": "t1", "b": "t2"}
    if fec is not None:
        link["fec_limit_ber"] = fec
    return {"rows": [], "racks": [], "nodes": [],
            "switches": [{"name": "t1", "tier": "transport"}, {"name": "t2", "tier": "transport"}],
            "links": [{"name": "kp4", "a": "t1", "b": "t2"}, link]}


def test_the_topology_keeps_each_links_fec_limit_through_yaml(tmp_path: Path) -> None:
    topo = Topology.from_dict(two_links(3.7e-2))
    assert np.isnan(topo.link_fec_limit[0]) and topo.link_fec_limit[1] == 3.7e-2
    topo.dump(tmp_path / "t.yaml")
    again = Topology.load(tmp_path / "t.yaml")
    assert np.isnan(again.link_fec_limit[0]) and again.link_fec_limit[1] == 3.7e-2


@pytest.mark.parametrize("bad", [0.0, 0.7, -1e-3, "high", True])
def test_a_bad_fec_limit_is_rejected_naming_the_link(bad: object) -> None:
    with pytest.raises(TopologyError, match=r"links\[1\] \(dwdm\).*fec_limit_ber"):
        Topology.from_dict(two_links(bad))


def test_the_optics_detector_judges_each_link_against_its_own_limit() -> None:
    """Both links run at BER 5e-3 and worsen: past KP4's 2.4e-4 (link down now) but far under
    the DWDM link's own 3.7e-2."""
    topo = Topology.from_dict(two_links(3.7e-2))
    det = OpticsDetector(topo)
    found = []
    for k, t in enumerate(np.arange(0.0, 4 * 3600.0, 30.0)):
        ber = 5e-3 * (1 + k / 2000)
        found += det.update(Frame("optic", [t, t], [1, 3], {"prefec_ber": [ber, ber]}))  # end b of each link
    predicted = {f.slot for f in found if isinstance(f, Prediction) and f.active and f.event == "link_down"}
    assert predicted == {0}
    assert det.fec_limit[3] == 3.7e-2 and det.fec_limit[1] == pytest.approx(2.4e-4)


def test_the_alibaba_importer_gives_each_channel_its_planes_limit(shared_data: Path) -> None:
    topo = read_alibaba(shared_data / CSV).topology
    for name, fec in zip(topo.links, topo.link_fec_limit):
        assert fec == FEC_LIMIT_BY_PLANE[name.split("/")[0]]


def test_replay_of_the_imported_alibaba_series_takes_detector_params(shared_data: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    rec = tmp_path / "rec"
    res = runner.invoke(cli, ["import", "--format", "alibaba", str(shared_data / CSV), "--out", str(rec)])
    assert res.exit_code == 0, res.output
    hourly = ["--param", "optics.bucket_s=3600", "--param", "optics.window=168", "--param", "optics.min_points=72",
              "--param", "optics.horizon_s=604800", "--param", "optics.min_slope_db_per_day=0.02",
              "--param", "optics.step_min_db=0.5"]
    res = runner.invoke(cli, ["replay", str(rec), "--port", "0", "--detectors", "optics",
                              "--findings", str(tmp_path / "f.jsonl"), *hourly])
    assert res.exit_code == 0, res.output
    findings = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    # the hourly buckets see the day-7.6 step on six ot1 channel ends and four slow ot2 trends
    # (docs: README "Fabric and optics"); with each plane's own limit no link is called failing
    steps = {f["slot"] for f in findings if "jumped" in f["reason"]}
    trends = {f["slot"] for f in findings if "worsening" in f["reason"]}
    assert len(steps) == 6 and len(trends) == 4
    assert not any(f.get("event") == "link_down" for f in findings)


@pytest.mark.parametrize("args, message", [
    (["--param", "optics.bogus=1"], "unknown parameters ['bogus']"),
    (["--param", "optics"], "expected DETECTOR.NAME=VALUE"),
    (["--param", "thermal.horizon_s=60", "--detectors", "optics"], "not in the bank: thermal"),
])
def test_a_bad_param_is_a_usage_error(args: list[str], message: str, tmp_path: Path) -> None:
    topo = Topology.from_dict(two_links(None))
    rec = tmp_path / "rec"
    rec.mkdir()
    topo.dump(rec / "topology.yaml")
    res = CliRunner().invoke(cli, ["replay", str(rec), "--port", "0", *args])
    assert res.exit_code == 2 and message in res.output, res.output
