"""Fourth audit of the incident engine's predicted spread (2026-12-05): the spread names only
entities that show nothing yet (not a GPU throttling or a link down under another live incident,
not a link failing itself, not the siblings of a link whose predicted failure was withdrawn),
telemetry rows of a slot outside the topology are left out and counted (they crashed the detector
bank or wrote another entity's row), and a PDU's reason counts the nodes it holds.

Topology (tests/test_incidents.py): two loops of two racks of two nodes of 4 GPUs, one leaf per
rail (link(n, r) is node n's rail r), job0 on node0-3 and job1 on node4-7."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.incident_external import ExternalEvent
from foreshock.detectors.incidents import IncidentEngine
from foreshock.fields import field_names
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth

from test_incidents import TOPO, gpu, link, thermal

N_GPUS = len(TOPO.gpus)


def gpu_frame(t: float) -> Frame:
    """Every GPU at 60 °C except node0's, held at 86 °C (its fans failed), limits from the capture."""
    temp = np.full(N_GPUS, 60.0)
    temp[[gpu(0, i) for i in range(4)]] = 86.0
    return Frame("gpu", np.full(N_GPUS, t), np.arange(N_GPUS, dtype=np.int32),
                 {"gpu_temp": temp, "max_op_temp": np.full(N_GPUS, 87.0), "slowdown_temp": np.full(N_GPUS, 89.0),
                  "power": np.full(N_GPUS, 500.0), "power_limit": np.full(N_GPUS, 700.0)})


def link_down(t: float, lk: int) -> Anomaly:
    return Anomaly(t, "link", lk, "link_downed", 1.0, "link_errors", f"fatal: link down on {TOPO.links[lk]}")


def predicted_of(engine: IncidentEngine, now: float, root: str) -> list[str]:
    """The predicted spread of the live incident rooted at ``root``, as the engine tells it now."""
    (inc,) = [i for i in engine.incidents(now) if i.root_entity == root]
    return [name for name, _ in inc.predicted_members]


def test_a_loop_losing_capacity_does_not_name_gpus_throttling_under_another_incident() -> None:
    # node0's fans fail and its 4 GPUs throttle (an incident of its own, observed effects); later
    # cdu0 loses capacity (GPUs on node1-3 predicted to throttle). Those 4 GPUs are already hit:
    # the loop's spread topped its list with them (hottest, least margin), ahead of GPUs still calm
    eng = IncidentEngine(TOPO)
    node0 = {f"node0/gpu{i}" for i in range(4)}
    for t in range(0, 1500, 10):
        eng.observe_frame(gpu_frame(float(t)))
        fs: list[Anomaly | Prediction] = [Anomaly(float(t), "node", 0, "fan_speed", 0.9, "cooling", "fan stalled")]
        fs += [Anomaly(float(t), "gpu", gpu(0, i), "thermal_throttle_time", 1.0, "throttle_bits", "thermal")
               for i in range(4)]
        if t >= 900:
            fs += [thermal(float(t), g) for g in (gpu(1, 0), gpu(2, 0), gpu(3, 1))]
        eng.observe(fs, float(t))
    spread = predicted_of(eng, 1490.0, "cdu0")
    assert not node0 & set(spread), spread
    # still a spread: the calm GPUs of node1 (not members, nobody's) remain exposed to the loop
    assert "node1/gpu1" in spread, spread


def test_a_link_down_does_not_name_a_sibling_down_under_its_own_incident() -> None:
    # node5 rail 1 goes down and stays down; rail 2 fails on its own 800 s later (its own
    # incident). Rail 2 takes none of rail 1's traffic: it carries none itself
    eng = IncidentEngine(TOPO)
    a, b = link(5, 1), link(5, 2)
    for t in range(0, 1500, 10):
        fs = [link_down(float(t), a)] if t % 100 == 0 else []
        if t >= 800 and t % 100 == 0:
            fs.append(link_down(float(t), b))
        eng.observe(fs, float(t))
    assert predicted_of(eng, 1490.0, TOPO.links[a]) == [TOPO.links[link(5, 0)], TOPO.links[link(5, 3)]]
    assert predicted_of(eng, 1490.0, TOPO.links[b]) == [TOPO.links[link(5, 0)], TOPO.links[link(5, 3)]]


def test_a_withdrawn_link_down_prediction_stops_naming_the_siblings() -> None:
    # an optic trending to failure predicts its link down, then the detector withdraws it (the
    # trend reversed): the siblings were named as taking its traffic until the incident resolved
    lk = link(2, 1)
    optic = TOPO.name("optic", 2 * lk)

    def pred(t: float, active: bool = True) -> Prediction:
        return Prediction(t, "link", lk, "link_down", 7200.0, 0.8, "optics",
                          f"{optic} RX power falling: {TOPO.links[lk]} predicted down" if active
                          else f"{TOPO.links[lk]} no longer trending to failure", active)

    stream = {0.0: [pred(0.0)], 60.0: [pred(60.0)], 300.0: [pred(300.0, active=False)]}
    eng = IncidentEngine(TOPO)
    siblings = {TOPO.links[link(2, r)] for r in (0, 2, 3)}
    for t in range(0, 1000, 10):
        eng.observe(stream.get(float(t), []), float(t))
        if t == 290:  # predicted down: its siblings take its traffic when it goes
            assert siblings <= {n for i in eng.incidents(float(t)) for n, _ in i.predicted_members}
    live = eng.incidents(990.0)
    assert live and all(i.state != "resolved" for i in live)  # (still open: the point of the test)
    assert not [n for i in live for n, _ in i.predicted_members]


def test_a_nic_alarm_names_its_own_links_as_next_to_fail_not_as_taking_the_traffic() -> None:
    # a NIC alarm on node3 (which link is not said): its own NIC links are named as what fails next,
    # each once, ETA unknown (docs/external-events.md) — not as the links that take one another's
    # traffic (the audit's reading of the old rule, which put them all among the failing links)
    eng = IncidentEngine(TOPO)
    eng.add_external([ExternalEvent("node3", 100.0, "nic_link_down", "critical")])
    out = [f for t in range(0, 400, 10) for f in eng.observe([], float(t)) if isinstance(f, Incident)]
    assert out and out[0].root_entity == "node3"
    own = {TOPO.links[link(3, r)] for r in range(4)}
    for f in out:
        named = [n for n, _ in f.predicted_members]
        assert sorted(named) == sorted(own) and all(eta == -1.0 for _, eta in f.predicted_members)


def test_a_pdu_reason_counts_the_nodes_it_holds() -> None:
    # the rack's PDU sags, node0's PSU degrades, one GPU each of node0 and node1 brakes: two
    # nodes (a node member's anc[1] is its rack, which counted the rack and its loop as nodes)
    eng = IncidentEngine(TOPO)
    out: list[Incident] = []
    for t in range(0, 200, 10):
        fs = [Anomaly(float(t), "rack", 0, "pdu_power", 0.9, "power", "PDU sagging"),
              Anomaly(float(t), "node", 0, "psu_power", 0.9, "power", "PSU degraded")]
        fs += [Anomaly(float(t), "gpu", g, "throttle_reasons", 128.0, "throttle_bits", "brake")
               for g in (gpu(0, 0), gpu(1, 0))]
        out += [f for f in eng.observe(fs, float(t)) if isinstance(f, Incident)]
    assert out[-1].root_kind == "pdu"
    assert "power events on 2 nodes of rack0" in out[-1].reason, out[-1].reason


@pytest.mark.parametrize("bad", [-1, 10_000])
@pytest.mark.parametrize("kind,cols,table", [
    ("link", {"tx_data": np.array([1e9, 2e9]), "link_rate": np.array([4e11, 4e11])}, "s_link_tel"),
    ("job", {"step_time": np.array([1.0, 5.0])}, "s_job_tel"),
])
def test_telemetry_rows_outside_the_topology_are_left_out_and_counted(
        kind: str, cols: dict[str, np.ndarray], table: str, bad: int) -> None:
    # the last entity's row must not take the bad row's reading (-1 indexed the table from its
    # end: a step time of 5 s landed on job1), 10,000 raised IndexError; the good row is still taken
    health = PipelineHealth()
    eng = IncidentEngine(TOPO, health)
    last = len(getattr(eng.tel, table)) - 1
    before = getattr(eng.tel, table)[last].copy()
    eng.observe_frame(Frame(kind, np.array([100.0, 100.0]), np.array([0, bad], np.int32), cols))
    np.testing.assert_array_equal(getattr(eng.tel, table)[last], before)
    assert np.isfinite(getattr(eng.tel, table)[0]).any()  # slot 0's row was taken
    assert sum(n for (stage, _), n in health.problems.items() if stage == eng.name) == 1


def test_a_gpu_row_outside_the_topology_is_counted() -> None:
    health = PipelineHealth()
    eng = IncidentEngine(TOPO, health)
    eng.observe_frame(Frame("gpu", np.array([100.0, 100.0]), np.array([0, -1], np.int32),
                            {"gpu_temp": np.array([50.0, 70.0])}))
    assert eng.tel.s_gpu_tel[0, 1] == 50.0 and np.isnan(eng.tel.s_gpu_tel[-1, 1])
    assert sum(n for (stage, _), n in health.problems.items() if stage == eng.name) == 1


@pytest.mark.parametrize("kind", ["link", "job"])
def test_the_bank_survives_a_telemetry_row_outside_the_topology(kind: str) -> None:
    # a frame fed past the guard: the other detectors count such a row; the engine raised IndexError
    health = PipelineHealth()
    eng = IncidentEngine(TOPO, health)
    bank = DetectorBank.from_names(TOPO, None, processors=[eng])
    cols = {f: np.array([1.0, 1.0]) for f in field_names(kind)}
    bank.update(Frame(kind, np.array([100.0, 100.0]), np.array([0, 10_000], np.int32), cols))
    assert sum(n for (stage, _), n in health.problems.items() if stage == eng.name) == 1


def _fan_then_loop(hot: Callable[[int], bool], throttle_said: Callable[[int], bool]) -> list[str]:
    """node0's fans fail (its fan anomaly keeps that incident live throughout); its GPUs read
    86 °C while ``hot(t)`` (60 °C else) and say a throttle while ``throttle_said(t)``; from t=900
    cdu0 loses capacity. cdu0's spread at t=1490."""
    eng = IncidentEngine(TOPO)
    for t in range(0, 1500, 10):
        frame = gpu_frame(float(t))
        if not hot(t):
            frame.columns["gpu_temp"][[gpu(0, i) for i in range(4)]] = 60.0
        eng.observe_frame(frame)
        fs: list[Anomaly | Prediction] = [Anomaly(float(t), "node", 0, "fan_speed", 0.9, "cooling", "fan stalled")]
        if throttle_said(t):
            fs += [Anomaly(float(t), "gpu", gpu(0, i), "thermal_throttle_time", 1.0, "throttle_bits", "thermal")
                   for i in range(4)]
        if t >= 900:
            fs += [thermal(float(t), g) for g in (gpu(1, 0), gpu(2, 0), gpu(3, 1))]
        eng.observe(fs, float(t))
    return predicted_of(eng, 1490.0, "cdu0")


def test_NEW_a_gpu_that_throttled_once_long_ago_is_exposed_again() -> None:
    # node0's GPUs throttled for the first 200 s and have been calm at 60 °C for 1300 s since: no
    # current effect, on the node whose fans failed. Its one throttle had them left out of cdu0's
    # spread for as long as the fan incident lived (the effect ever shown counted, until 2026-12-05)
    spread = _fan_then_loop(lambda t: t < 200, lambda t: t < 200)
    assert {f"node0/gpu{i}" for i in range(4)} <= set(spread), spread


def test_NEW_a_steady_throttle_said_only_at_its_onset_stays_held() -> None:
    # a throttle said once, at its onset, and held since (86 °C under an 87 °C limit): still hit,
    # not exposed next, though its one finding is older than quiet_s
    spread = _fan_then_loop(lambda t: True, lambda t: t == 0)
    assert not {f"node0/gpu{i}" for i in range(4)} & set(spread), spread
    assert "node1/gpu1" in spread, spread


def test_NEW_a_held_throttle_said_again_stays_held_though_cooler() -> None:
    # a throttle the detectors say again (throttle_bits every 300 s while it holds) counts while
    # its last saying is within quiet_s, whatever the temperature telemetry last read
    spread = _fan_then_loop(lambda t: False, lambda t: t % 300 == 0)
    assert not {f"node0/gpu{i}" for i in range(4)} & set(spread), spread


def test_NEW_a_members_last_observed_effect_survives_a_checkpoint() -> None:
    eng = IncidentEngine(TOPO)
    eng.observe([Anomaly(100.0, "gpu", gpu(0, 0), "thermal_throttle_time", 1.0, "throttle_bits", "thermal")], 100.0)
    eng.observe([Anomaly(400.0, "gpu", gpu(0, 0), "gpu_temp", 3.0, "ewma_zscore", "z")], 400.0)
    again = IncidentEngine(TOPO)
    again.load_state_dict(eng.state_dict())
    (inc,) = [i for i in again._incidents.values()]
    (m,) = [m for m in inc.members.values() if m.slot == gpu(0, 0)]
    assert (m.shown_ts, m.last_ts) == (100.0, 400.0)
