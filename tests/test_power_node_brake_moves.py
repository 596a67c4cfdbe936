"""The power detector's per-node count of braking GPUs follows the GPUs' state when it is restarted
(a board swapped in its slot, ``DetectorBank.restart_gpus``) or rearranged (boards renumbered at a
reboot, ``DetectorBank.move_gpus``).

The count is kept as each GPU's brake flag changes. A braking GPU whose state started afresh, or
whose board left its node at a reboot, never let its brake go, and its node kept counting it: the
next single GPU of the node to brake was reported as "node-wide power brake: 2 of 4 GPUs braking
together — power supply or PDU fault"."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import power as pw
from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.remap import Remap

from thermal_synth import small_topology

GPUS = 4
BRAKE = float(facts.THROTTLE_HW_POWER_BRAKE)


def bank() -> DetectorBank:
    return DetectorBank.from_names(small_topology(nodes=2, gpus=GPUS, racks=1), ["power"], processors=())


def fresh_state() -> dict:
    return bank().state_dict()["detectors"]


def power(b: DetectorBank) -> pw.PowerDetector:
    det = b.detectors[0]
    assert isinstance(det, pw.PowerDetector)
    return det


def tick(b: DetectorBank, t: float, braking: list[int]) -> list[Finding]:
    """One poll of every GPU of both nodes at ``t``: loaded, the GPUs ``braking`` with the power
    brake bit set."""
    n = 2 * GPUS
    bits = np.zeros(n)
    bits[braking] = BRAKE
    return b.update(Frame("gpu", np.full(n, t), np.arange(n), {
        "gpu_temp": np.full(n, 55.0), "power": np.full(n, 600.0), "power_limit": np.full(n, 700.0),
        "throttle_reasons": bits}))


def run(b: DetectorBank, start: float, ticks: int, braking: list[int]) -> list[Finding]:
    found: list[Finding] = []
    for k in range(ticks):
        found += tick(b, start + 10.0 * k, braking)
    return found


def node_brakes(found: list[Finding]) -> list[str]:
    return [f.reason for f in found if isinstance(f, Anomaly) and f.entity_kind == "node"]


def gpu_brakes(found: list[Finding]) -> list[int]:
    return [f.slot for f in found if isinstance(f, Anomaly) and f.entity_kind == "gpu"]


def test_a_braking_gpus_state_restarted_is_no_longer_counted_on_its_node() -> None:
    b = bank()
    run(b, 0.0, 20, [])
    assert gpu_brakes(run(b, 200.0, 5, [3])) == [3]
    b.restart_gpus([3], fresh_state())  # node0/gpu3 replaced (RMA): the new board does not brake
    found = run(b, 250.0, 5, [1])  # node0/gpu1 brakes alone
    assert gpu_brakes(found) == [1] and node_brakes(found) == []
    assert power(b).s_node_brake[0, pw.N_COUNT] == 1.0
    # ... and two braking together are still the node's (the count is not merely emptied)
    found = run(b, 300.0, 5, [1, 2])
    assert node_brakes(found) == ["node-wide power brake: 2 of 4 GPUs braking together — power supply or "
                                  "PDU fault on node0"]


def test_a_braking_board_gone_at_a_reboot_is_no_longer_counted_on_its_node() -> None:
    b = bank()
    run(b, 0.0, 20, [])
    run(b, 200.0, 5, [2])
    # node0 reboots without gpu2: gpu3's board reads at index 2, index 3 is silent
    b.move_gpus(np.array([0, 1, 3, -1, 4, 5, 6, 7]), fresh_state())
    found = run(b, 250.0, 5, [0])  # node0/gpu0 brakes alone
    assert gpu_brakes(found) == [0] and node_brakes(found) == []
    np.testing.assert_array_equal(power(b).s_node_brake[:, pw.N_COUNT], [1.0, 0.0])


def test_a_braking_board_that_moved_is_still_counted_on_its_node() -> None:
    b = bank()
    run(b, 0.0, 20, [])
    run(b, 200.0, 5, [3])
    # node0 reboots without gpu2: gpu3's board, still braking, reads at index 2
    b.move_gpus(np.array([0, 1, 3, -1, 4, 5, 6, 7]), fresh_state())
    assert power(b).s_node_brake[0, pw.N_COUNT] == 1.0
    found = run(b, 250.0, 5, [2, 0])  # it brakes on, and node0/gpu0 joins it
    assert gpu_brakes(found) == [0] and len(node_brakes(found)) == 1


def test_a_node_event_ends_once_none_of_its_gpus_brake_after_a_restart() -> None:
    b = bank()
    run(b, 0.0, 20, [])
    assert len(node_brakes(run(b, 200.0, 5, [0, 1]))) == 1
    b.restart_gpus([0, 1], fresh_state())  # both boards replaced
    np.testing.assert_array_equal(power(b).s_node_brake[0, [pw.N_COUNT, pw.N_ACTIVE]], [0.0, 0.0])
    found = run(b, 250.0, 5, [2, 3])  # a new power event on the node: told again
    assert len(node_brakes(found)) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=2 * GPUS, max_size=2 * GPUS),
       st.lists(st.integers(-1, 2 * GPUS - 1), min_size=2 * GPUS, max_size=2 * GPUS),
       st.lists(st.booleans(), min_size=2, max_size=2))
def test_after_a_remap_each_node_counts_the_braking_gpus_it_holds(braking: list[bool], take_from: list[int],
                                                                   active: list[bool]) -> None:
    det = power(bank())
    topology = det.topology
    state = det.state_dict()
    s_gpu = state["s_gpu"]
    state["s_gpu"] = pw.with_flags(s_gpu, pw.loaded_samples_of(s_gpu), np.array(braking), pw.thermal_of(s_gpu))
    state["s_node_brake"][:, pw.N_COUNT] = 3.0  # whatever it was: counted again
    state["s_node_brake"][:, pw.N_ACTIVE] = np.array(active, dtype=float)
    moved = det.remap_state(state, Remap.rearranged(topology, np.array(take_from)))
    for node in range(2):
        held = [slot for slot in range(2 * GPUS) if slot // GPUS == node]
        count = sum(1 for slot in held if take_from[slot] >= 0 and braking[take_from[slot]])
        assert moved["s_node_brake"][node, pw.N_COUNT] == count
        assert moved["s_node_brake"][node, pw.N_ACTIVE] == (1.0 if active[node] and count > 0 else 0.0)
