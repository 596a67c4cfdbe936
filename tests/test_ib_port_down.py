"""An InfiniBand port that vanishes from sysfs (an HCA reset, a driver reload, a NIC off the bus)
reaches ``link_errors`` as a down, counted once; ``foreshock watch`` follows a port found after
its start.

For a port its topology lists and sysfs no longer has, the sysfs source gives a row holding
only ``link_state`` DOWN (``streams/infiniband.py``). ``link_errors`` read ``link_state`` leaving
ACTIVE only on links without ``link_downed``, and an IB port has that counter: the down counted
for nothing, and the port came back with its counters cleared (a reset, not an increase), so no
detector ever saw it go down. Counted from the state as well, a down the counter also counts
must not be counted twice (two downs read as four: "flapping")."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock import facts
from foreshock.cli.main import cli
from foreshock.detectors.link_errors import LinkErrorsDetector
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import UNLISTED_POLLS
from foreshock.streams.infiniband import DISAPPEARED, STAGE, InfinibandSource
from foreshock.topology import Topology

from test_fabric_sources_review import make_port  # an ACTIVE port in the kernel's sysfs layout

HOST = "n0"
GONE = f"{HOST}/mlx5_1/1"  # the port whose HCA falls off the bus
POLL_S = 60.0


def run_outages(root: Path, outages: list[tuple[int, int, int]], polls: int,
                health: PipelineHealth | None = None) -> list[Anomaly]:
    """Poll a derived two-port topology once a minute through ``link_errors``; mlx5_1's HCA is gone
    for each ``(first poll, polls gone, link_downed when back)``. Its findings on that port."""
    make_port(root, "mlx5_0", "1", 0)
    make_port(root, "mlx5_1", "1", 3)
    clock = iter(np.arange(polls) * POLL_S)
    source = InfinibandSource(root, host=HOST, health=health or PipelineHealth())
    source.clock = lambda: float(next(clock))
    assert source.topology is not None
    det = LinkErrorsDetector(source.topology)
    found: list[Anomaly] = []
    for poll in range(polls):
        for first, gone, downed in outages:
            if poll == first:
                shutil.rmtree(root / "mlx5_1")
            if poll == first + gone:
                make_port(root, "mlx5_1", "1", downed)
        for frame in source.poll():
            found += [f for f in det.update(frame) if isinstance(f, Anomaly)]
    slot = source.topology.slot("link", GONE)
    assert not [f for f in found if f.slot != slot]  # mlx5_0 stayed up: nothing said of it
    return found


def fields(found: list[Anomaly]) -> list[str]:
    return [f.field for f in found]


@pytest.mark.parametrize("gone", [1, 3])
def test_a_port_gone_from_sysfs_and_back_with_its_counters_cleared_is_one_down(tmp_path: Path, gone: int) -> None:
    """Gone for one poll or for three, back with ``link_downed`` cleared, three times an hour apart:
    each time one fatal ``link_state`` finding (the state it went to, DOWN), and one down counted:
    the third makes the link flapping (gpud: 3 in 12 h), the second does not. Before, nothing."""
    health = PipelineHealth()
    found = run_outages(tmp_path / "ib", [(5, gone, 0), (65, gone, 0), (125, gone, 0)], 140, health)
    assert fields(found) == ["link_state", "link_state", "link_state", "link_flaps"]
    assert all(f.reason.startswith("fatal:") for f in found)
    assert all(f"port state {facts.IB_PORT_STATE_DOWN} (not ACTIVE)" in f.reason for f in found[:3])
    # said at the poll after it went: back there (its counter read no increase), or still gone (a
    # counter file unreadable once is no port gone; the counter's next reading has that down)
    assert [f.ts for f in found] == [6 * POLL_S, 66 * POLL_S, 126 * POLL_S, 126 * POLL_S]
    assert f"3 times in {facts.FLAP_WINDOW_S / 3600:g} h" in found[-1].reason
    assert health.problems[(STAGE, DISAPPEARED)] == 3


def test_a_down_the_counter_also_counts_when_the_port_is_back_is_counted_once(tmp_path: Path) -> None:
    """Back with ``link_downed`` risen by one (the down the state already told): that increase is
    the same down, neither reported again as ``link_downed`` nor counted again. Two outages are two
    downs, not four (not flapping); the third is the third."""
    two = run_outages(tmp_path / "two", [(5, 3, 4), (65, 3, 5)], 120)
    assert fields(two) == ["link_state", "link_state"]
    three = run_outages(tmp_path / "three", [(5, 3, 4), (65, 3, 5), (125, 3, 6)], 140)
    assert fields(three) == ["link_state", "link_state", "link_state", "link_flaps"]


def one_link() -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
        "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}]})


def feed(det: LinkErrorsDetector, state: list[float], downed: list[float], first: int = 0) -> list[Anomaly]:
    found: list[Anomaly] = []
    for k, (s, d) in enumerate(zip(state, downed)):
        frame = Frame("link", np.array([(first + k) * POLL_S]), np.array([0]),
                      {"link_state": np.array([s]), "link_downed": np.array([d])})
        found += [f for f in det.update(frame) if isinstance(f, Anomaly)]
    return found


# up, then two polls gone (DOWN, no counter reading), then back up
STATES = [4.0, 4.0, 1.0, 1.0, 4.0, 4.0]
DOWNED_UNTIL_BACK = [3.0, 3.0, np.nan, np.nan]


@pytest.mark.parametrize("back,want", [
    # cleared when back (a reset): what it counts from there are downs of their own, 3 in minutes
    ([1.0, 2.0], ["link_state", "link_downed", "link_downed", "link_flaps"]),
    # not cleared, no increase: it did not see that down, and its next increase is another one
    ([3.0, 4.0], ["link_state", "link_downed"]),
])
def test_a_counter_that_did_not_see_the_down_counts_its_later_downs(back: list[float], want: list[str]) -> None:
    """The down counted from the state waits for the counter's next reading only: a clear, or no
    increase, ends the wait, and every down the counter counts after it is counted."""
    found = feed(LinkErrorsDetector(one_link()), STATES, [*DOWNED_UNTIL_BACK, *back])
    assert fields(found) == want
    assert all(f.score == 1.0 for f in found if f.field == "link_downed")  # one down each, none taken away


def test_a_down_held_or_counted_goes_through_a_checkpoint_and_an_older_one_loads() -> None:
    """Saved while the down is held (one poll gone), and while the counted down awaits the counter:
    the restored detector says what the one kept running says. A checkpoint from before
    ``s_state_down`` loads as nothing held."""
    for cut in (3, 4):
        downed = [*DOWNED_UNTIL_BACK, 4.0, 5.0]  # back with the down counted, then one more
        a = LinkErrorsDetector(one_link())
        feed(a, STATES[:cut], downed[:cut])
        b = LinkErrorsDetector(one_link())
        b.load_state_dict(a.state_dict())
        rest = feed(a, STATES[cut:], downed[cut:], cut)
        assert rest == feed(b, STATES[cut:], downed[cut:], cut) and rest
    old = {k: v for k, v in a.state_dict().items() if k != "s_state_down"}
    c = LinkErrorsDetector(one_link())
    c.load_state_dict(old)
    assert np.isnan(c.s_state_down).all()
    # the rest goes on: the two downs it held and this one make three
    assert fields(feed(c, [4.0], [6.0], 10)) == ["link_downed", "link_flaps"]


def test_watch_takes_in_a_port_found_after_its_start(tmp_path: Path, monkeypatch: Any, caplog: Any) -> None:
    """``foreshock watch --source infiniband``: mlx5_1's driver loads after the start. Its port is
    taken into the derived topology after UNLISTED_POLLS polls (logged with the links it now holds,
    not "0 GPUs") and watched: a down on it is found and named. Before, its rows were unknown link
    entities for as long as the watch ran."""
    from foreshock.cli import watch

    root = tmp_path / "ib"
    make_port(root, "mlx5_0", "1", 0)
    appears, downs, polls = 2, 8, 12
    start = time.time() - polls * POLL_S  # its readings stamped in the past, a poll a minute
    opened = watch.open_live_source

    def scripted(*args: Any, **kwargs: Any) -> Any:
        polled, topology_of = opened(*args, **kwargs)
        read = polled.poll

        def poll() -> list[Frame]:
            if polled.polls == appears:
                make_port(root, "mlx5_1", "1", 0)
            if polled.polls == downs:
                (root / "mlx5_1" / "ports" / "1" / "counters" / "link_downed").write_text("1\n")
            return read()  # type: ignore[no-any-return]

        polled.poll = poll  # type: ignore[method-assign]
        polled.clock = lambda: start + polled.polls * POLL_S
        return polled, topology_of

    monkeypatch.setattr(watch, "open_live_source", scripted)
    findings = tmp_path / "findings.jsonl"
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        result = CliRunner().invoke(cli, ["watch", "--source", "infiniband", "--root", str(root), "--node", HOST,
                                          "--interval", "0.02", "--polls", str(polls), "--port", "0",
                                          "--findings", str(findings)])
    assert result.exit_code == 0, result.output
    changes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("topology changed")]
    assert len(changes) == 1
    assert changes[0].startswith(f"topology changed: +1 link ({HOST}/mlx5_1/1); now 2 links, 4 optics on 1 node;")
    found = [json.loads(line) for line in findings.read_text().splitlines()]
    assert [(f["entity"], f["field"], f["ts"]) for f in found if f.get("field") == "link_downed"] == [
        (GONE, "link_downed", start + downs * POLL_S)]
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["input_problems"] == UNLISTED_POLLS - 1  # its rows before it was taken in
