"""ethtool -m (SFF-8636, CMIS, SFF-8472) -> optic samples, lanes and thresholds.

The fixtures under tests/data follow ethtool's print formats exactly (``\\t%-41s : ``,
``%.3f mA``, ``%.4f mW / %.2f dBm``, ``%.2f degrees C / %.2f degrees F``, ``%.4f V``,
SFF-8636's ``Rcvr signal avg optical power(Channel N)`` without a space, CMIS's with one).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.dom import DBM_FLOOR, DomSource, ModuleDom, dom_batch, parse_ethtool_m

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


def dbm(mw: float) -> float:
    return 10 * math.log10(mw)


def test_sff8636_qsfp28_four_lanes() -> None:
    health = PipelineHealth()
    dom = parse_ethtool_m(read("ethtool_m_qsfp28_sr4.txt"), health)
    assert dom.spec == "sff8636" and dom.identifier == "0x11 (QSFP28)"
    assert (dom.temperature, dom.voltage) == (41.25, 3.2904)
    assert dom.lanes.tolist() == [1, 2, 3, 4]
    assert dom.tx_bias == pytest.approx([7.512e-3, 7.760e-3, 7.104e-3, 8.240e-3], abs=1e-12)
    assert dom.tx_power_dbm.tolist() == [-0.50, -0.40, -1.30, -0.70]
    assert dom.rx_power_dbm.tolist() == [-1.40, -1.80, -9.90, -1.50]
    assert dom.rx_los.tolist() == [0.0, 0.0, 0.0, 0.0]
    values = dom.optic_values()
    assert values["module_temp"] == 41.25
    assert values["tx_bias"] == pytest.approx((7.512 + 7.760 + 7.104 + 8.240) / 4 * 1e-3, abs=1e-12)
    lanes_mw = [10 ** (x / 10) for x in (-0.50, -0.40, -1.30, -0.70)]
    assert values["tx_power"] == pytest.approx(dbm(sum(lanes_mw) / 4), abs=1e-9)
    assert values["rx_power"] == -9.90  # the weakest lane
    assert values["los"] == 0.0
    assert dom.thresholds["rx_power_low_alarm"] == pytest.approx(-16.20)
    assert dom.thresholds["tx_bias_high_alarm"] == pytest.approx(0.015)
    assert dom.thresholds["module_temp_high_warning"] == 70.0
    assert dom.thresholds["module_voltage_low_alarm"] == 2.97
    assert len(dom.thresholds) == 20
    assert dom.flags["Laser rx power low warning (Channel 3)"] is True
    assert sum(dom.flags.values()) == 1
    assert health.total_problems() == 0


def test_cmis_osfp_eight_lanes_with_a_dark_lane() -> None:
    dom = parse_ethtool_m(read("ethtool_m_osfp_cmis_8lane.txt"))
    assert dom.spec == "cmis"
    assert dom.lanes.tolist() == list(range(1, 9))
    assert dom.rx_power_dbm[5] == DBM_FLOOR  # 0.0000 mW / -inf dBm on lane 6
    assert dom.rx_los.tolist() == [0, 0, 0, 0, 0, 1, 0, 0]
    values = dom.optic_values()
    assert values["rx_power"] == DBM_FLOOR  # lane 6 still carries bias and TX light: in use, and dark
    assert values["los"] == 1.0
    assert values["tx_bias"] == pytest.approx(np.mean([62.114, 71.902, 61.870, 62.458, 63.004, 61.552,
                                                       62.890, 62.006]) * 1e-3, abs=1e-12)
    assert values["module_voltage"] == 3.2571
    assert dom.flags["Laser bias current high warning (Chan 2)"] is True
    assert dom.flags["Laser rx power low alarm (Channel 6)"] is True
    assert dom.thresholds["rx_power_low_alarm"] == -10.50


def test_unused_lanes_of_a_four_lane_module_are_left_out() -> None:
    dom = parse_ethtool_m(read("ethtool_m_qsfpdd_4of8.txt"))
    assert dom.lanes_in_use().tolist() == [True] * 4 + [False] * 4
    values = dom.optic_values()
    assert values["rx_power"] == 2.60  # weakest of lanes 1-4, not the unused lanes' -inf
    assert values["tx_bias"] == pytest.approx((83.806 + 81.878 + 72.900 + 110.100) / 4 * 1e-3, abs=1e-12)
    assert values["los"] == 0.0
    assert np.isfinite(list(values.values())).all()


def test_sff8472_single_lane_sfp() -> None:
    values = parse_ethtool_m(read("ethtool_m_sfp_8472.txt")).optic_values()
    assert values == {"module_temp": 33.5, "module_voltage": 3.312, "tx_bias": pytest.approx(6.986e-3, abs=1e-12),
                      "tx_power": pytest.approx(-3.30, abs=1e-9), "rx_power": -4.00,
                      "rx_power_alarm_low": -21.02, "tx_bias_alarm_high": pytest.approx(13e-3)}


def test_zero_thresholds_of_a_module_without_a_thresholds_page_are_not_sent_as_levels() -> None:
    """A module that does not implement its alarm thresholds prints them as 0.000 mA and
    0.0000 mW / -inf dBm. They stay in ``thresholds`` (what the module said) but are not levels:
    sent in the row, a 0 mA high bias alarm had the optics detector read every bias as past it."""
    import re

    text = re.sub(r"(threshold\s*: )[0-9.]+ mA", r"\g<1>0.000 mA", read("ethtool_m_sfp_8472.txt"))
    text = re.sub(r"(threshold\s*: )[0-9.]+ mW / [-0-9.]+ dBm", r"\g<1>0.0000 mW / -inf dBm", text)
    dom = parse_ethtool_m(text)
    assert dom.thresholds["tx_bias_high_alarm"] == 0.0 and dom.thresholds["rx_power_low_alarm"] == DBM_FLOOR
    values = dom.optic_values()
    assert "tx_bias_alarm_high" not in values and "rx_power_alarm_low" not in values
    assert values["tx_bias"] == pytest.approx(6.986e-3) and values["rx_power"] == -4.00


def test_a_module_measuring_rx_power_as_oma_still_has_rx_power() -> None:
    """ethtool prints "Receiver signal OMA (Channel N)" (SFP: "Receiver signal OMA") for a module
    whose RX monitor measures OMA. Before, such a module had no RX power at all, silently: no RX
    trend, no weakest lane, no loss of signal by power."""
    qsfp = parse_ethtool_m(read("ethtool_m_qsfp28_sr4.txt").replace("Rcvr signal avg optical power",
                                                                      "Receiver signal OMA"))
    assert qsfp.rx_power_dbm.tolist() == [-1.40, -1.80, -9.90, -1.50] and qsfp.rx_power_type == "oma"
    assert qsfp.optic_values()["rx_power"] == -9.90
    sfp = parse_ethtool_m(read("ethtool_m_sfp_8472.txt").replace("Receiver signal average optical power",
                                                                  "Receiver signal OMA"))
    assert sfp.optic_values()["rx_power"] == -4.00
    assert parse_ethtool_m(read("ethtool_m_sfp_8472.txt")).rx_power_type == "average"


def test_bad_values_are_counted_and_a_module_without_dom_is_reported() -> None:
    text = read("ethtool_m_qsfp28_sr4.txt").replace("7.760 mA", "n/a mA").replace(
        ": None\n", ": [ Maybe ]\n", 1)
    health = PipelineHealth()
    batch, modules = dom_batch({"l0#a": text, "dac#a": "\tIdentifier                                : 0x11 (QSFP28)\n"},
                               ts=5.0, health=health)
    assert batch.entity_names() == ["l0#a"]
    assert math.isnan(modules["l0#a"].tx_bias[1])
    assert health.problems[("dom", "non-numeric value")] == 1
    assert health.problems[("dom", "unreadable loss-of-signal flags")] == 1
    assert health.problems[("dom", "module without diagnostics")] == 1


def test_dom_batch_rows_are_the_optic_values() -> None:
    batch, _ = dom_batch({"a#a": read("ethtool_m_qsfp28_sr4.txt"), "b#b": read("ethtool_m_osfp_cmis_8lane.txt")}, 7.0)
    assert batch.entity_names() == ["a#a", "b#b"]
    assert batch.columns["rx_power"].tolist() == [-9.90, DBM_FLOOR]
    assert batch.columns["los"].tolist() == [0.0, 1.0]
    # each module's own alarm levels travel in its row (the optics detector judges it by them)
    assert batch.columns["rx_power_alarm_low"].tolist() == [-16.20, -10.50]
    assert batch.columns["tx_bias_alarm_high"][0] == pytest.approx(0.015)


def test_a_copper_cable_counts_once_not_at_every_poll(tmp_path: Path) -> None:
    """A passive copper cable (DAC, common inside a rack) has no diagnostics, today and at every
    poll: counted at the first, so the agent's problem rate falls to zero; the optical module
    beside it is read every time."""
    stub = tmp_path / "ethtool"
    stub.write_text(f"""#!/bin/sh
[ "$1" = -m ] || exit 3
case "$2" in
  eth2) cat {DATA}/ethtool_m_qsfp28_sr4.txt ;;
  *) printf '\\tIdentifier                                : 0x11 (QSFP28)\\n' ;;
esac
""")
    stub.chmod(0o755)
    health = PipelineHealth()
    source = DomSource(["eth2", "eth3"], interval=0.02, executable=str(stub), host="h", health=health, max_polls=3)
    frames = list(source)
    assert [len(f) for f in frames] == [1, 1, 1]
    assert health.problems[("dom", "module without diagnostics")] == 1


def test_dom_source_runs_ethtool(tmp_path: Path) -> None:
    stub = tmp_path / "ethtool"
    stub.write_text(f"#!/bin/sh\n[ \"$1\" = -m ] || exit 3\ncat {DATA}/ethtool_m_qsfp28_sr4.txt\n")
    stub.chmod(0o755)
    health = PipelineHealth()
    source = DomSource(["eth2"], interval=0.02, executable=str(stub), host="h", health=health, max_polls=1)
    frames = list(source)
    assert source.topology is not None and source.topology.links == ["h/eth2"]
    assert frames[0].slot.tolist() == [source.topology.slot("optic", "h/eth2#a")]
    assert frames[0].columns["rx_power"].tolist() == [-9.90]
    assert source.modules["h/eth2#a"].thresholds["module_temp_high_alarm"] == 75.0
    assert health.total_problems() == 0


@pytest.mark.parametrize("rx_low, bias_high", [(-40.0, 0.0), (-39.99, 1e-6), (-8.9, 0.013), (math.inf, math.inf),
                                               (-math.inf, -math.inf), (math.nan, math.nan), (-45.0, -1e-3)])
def test_the_row_carries_a_level_exactly_when_the_optics_detector_would_take_it(rx_low, bias_high) -> None:
    """One test of "is this a level the module set" for the DOM row and the detector (it was written
    three times: a threshold of +inf went out in the row and the detector's setter refused it)."""
    from foreshock.detectors.optics import OpticsDetector
    from foreshock.topology import Topology

    dom = ModuleDom(temperature=40.0, thresholds={"rx_power_low_alarm": rx_low, "tx_bias_high_alarm": bias_high})
    values = dom.optic_values()
    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
                               "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}]})
    for key, field in (("rx_power_low_alarm", "rx_power_alarm_low"), ("tx_bias_high_alarm", "tx_bias_alarm_high")):
        taken = OpticsDetector(topo).set_module_thresholds({topo.names("optic")[0]: {key: dom.thresholds[key]}})
        assert (field in values) == (taken == 1), (key, dom.thresholds[key])


def test_a_value_is_read_in_the_unit_printed_after_it() -> None:
    """Only ``X mW / Y dBm`` was converted: any other line had its first number taken in the field's
    base unit, so ``0.5000 mW`` read as +0.5 dBm, a dark lane's ``0.0000 mW`` as a healthy 0 dBm, and
    ``3290.4 mV`` as 3290 V."""
    text = read("ethtool_m_qsfp28_sr4.txt")
    text = text.replace("0.7244 mW / -1.40 dBm", "0.5000 mW").replace("0.1023 mW / -9.90 dBm", "0.0000 mW")
    text = text.replace("3.2904 V", "3290.4 mV").replace("7.512 mA", "7512 uA")
    text = re.sub(r"(Laser rx power low alarm threshold\s*: ).*", r"\g<1>0.0240 mW", text)
    health = PipelineHealth()
    dom = parse_ethtool_m(text, health)
    assert dom.rx_power_dbm[0] == pytest.approx(-3.0103, abs=1e-4)  # 10 log10(0.5)
    assert dom.rx_power_dbm[2] == DBM_FLOOR  # no light
    assert dom.voltage == pytest.approx(3.2904)
    assert dom.tx_bias[0] == pytest.approx(7.512e-3)
    assert dom.thresholds["rx_power_low_alarm"] == pytest.approx(-16.198, abs=1e-3)  # 10 log10(0.024)
    assert dom.optic_values()["rx_power"] == DBM_FLOOR  # the dark lane is the weakest
    assert health.total_problems() == 0


def test_a_value_in_a_unit_its_field_is_not_in_is_counted_not_used() -> None:
    text = read("ethtool_m_qsfp28_sr4.txt").replace("3.2904 V", "3.2904 kV").replace("7.760 mA", "7.760")
    text = text.replace("0.6607 mW / -1.80 dBm", "0.6607 MW")
    health = PipelineHealth()
    dom = parse_ethtool_m(text, health)
    assert math.isnan(dom.voltage) and math.isnan(dom.tx_bias[1]) and math.isnan(dom.rx_power_dbm[1])
    assert health.problems[("dom", "unexpected unit")] == 3


def test_a_comma_list_of_lanes_keeps_every_lane() -> None:
    """mlxlink-style lines print every lane in one value; only lane 1 was kept, so the weakest
    lane (3, at -9.90 dBm) vanished."""
    health = PipelineHealth()
    dom = parse_ethtool_m("\tIdentifier : 0x11 (QSFP28)\n"
                          "\tModule temperature : 41.25 degrees C / 106.25 degrees F\n"
                          "\tLaser tx bias current : 7.5, 7.6, 7.1, 8.2 mA\n"
                          "\tRcvr signal avg optical power : -1.40, -1.80, -9.90, -1.50 dBm\n", health)
    assert dom.lanes.tolist() == [1, 2, 3, 4]
    assert dom.tx_bias == pytest.approx([7.5e-3, 7.6e-3, 7.1e-3, 8.2e-3])
    assert dom.rx_power_dbm.tolist() == [-1.40, -1.80, -9.90, -1.50]
    assert dom.optic_values()["rx_power"] == -9.90
    assert health.total_problems() == 0
    # a list where one value belongs (a module value, a (Channel N) line) is counted, not used
    health = PipelineHealth()
    dom = parse_ethtool_m("\tModule voltage : 3.29, 3.30 V\n\tLaser tx bias current (Channel 2) : 7.5, 7.6 mA\n", health)
    assert math.isnan(dom.voltage) and len(dom.lanes) == 0
    assert health.problems[("dom", "lane list where one value belongs")] == 2


def test_a_lane_cut_short_is_counted() -> None:
    """ethtool -m output cut after lane 2's RX: lanes 3 and 4 have bias and TX but no RX, which the
    fold skipped, so the weakest lane (3, at -9.90 dBm) vanished with nothing counted."""
    full = read("ethtool_m_qsfp28_sr4.txt")
    health = PipelineHealth()
    dom = parse_ethtool_m(full[: full.index("Rcvr signal avg optical power(Channel 3)")], health)
    assert dom.lanes.tolist() == [1, 2, 3, 4]
    assert health.problems[("dom", "lane values missing")] == 2
