"""The ``ethtool`` sources stamp each interface's rows with the time it was read.

``ethtool -S`` and ``ethtool -m`` run one interface after another, each up to its timeout. Until
2026-12-05 a poll read the clock once, before the first: one slow interface left every interface
read after it with a stamp from before its read, so a counter's rate (its increase over the stamps'
difference) came out ~1.9x too high at that poll and ~0.5x too low at the next, on healthy
interfaces too, and the link detectors raised warnings for discards at 60/s ("> 100/s").

The commands here are a fake ``run_command``: each run takes its interface's time on the test's
clock and prints counters as of the moment it returns, growing at known constant rates; no real
process and no real sleep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams import polling
from foreshock.streams.dom import DomSource
from foreshock.streams.ethtool_stats import EthtoolStatsSource

DATA = Path(__file__).parent / "data"
T0 = 1.7e9  # the first poll's start (a wall-clock time, as a live source stamps)
POLL_S = 10.0  # the ethtool source's default interval
FAST_S = 0.05  # an ordinary ethtool run
SLOW_S = 6.0  # one run held up (a lock, a firmware command), under the command's 10-s timeout
BYTES_PER_S = 1e9  # the fake NIC's true transmit rate
DISCARDS_PER_S = 60.0  # the repro's true discard rate: under the 100/s warning, read over it before
TEMP_PER_S = 0.1  # the fake module's true warming (°C/s)


class FakeEthtool:
    """Stands in for :func:`foreshock.streams.polling.run_command`. A run of ``iface`` takes
    ``slow[(poll, iface)]`` seconds of the test's clock (``FAST_S`` if not listed) and prints what
    ``text(iface, t)`` gives for the time ``t`` it returns at, which it notes in ``returned``."""

    def __init__(self, text: Callable[[str, float], str], slow: dict[tuple[int, str], float]) -> None:
        self.text = text
        self.slow = slow
        self.now = T0
        self.poll = 0
        self.returned: dict[tuple[int, str], float] = {}

    def clock(self) -> float:
        return self.now

    def run(self, argv: list[str], health: PipelineHealth, stage: str, timeout: float = 10.0) -> tuple[str, str]:
        iface = argv[-1]
        self.now += self.slow.get((self.poll, iface), FAST_S)
        self.returned[(self.poll, iface)] = self.now
        return self.text(iface, self.now), ""


def polled(source: polling.EthtoolSource, fake: FakeEthtool, polls: int,
           monkeypatch: pytest.MonkeyPatch) -> list[list[Frame]]:
    """Each poll's frames, poll k started at ``T0 + k * POLL_S`` (called directly: no real waits)."""
    monkeypatch.setattr(polling, "run_command", fake.run)
    source.clock = fake.clock
    out = []
    for k in range(polls):
        fake.poll, fake.now = k, T0 + k * POLL_S
        out.append(source.poll())
    return out


def row(frame: Frame, source: polling.EthtoolSource, kind: str, entity: str) -> tuple[float, dict[str, float]]:
    """``entity``'s one row of ``frame``: its stamp and values."""
    assert source.topology is not None
    at = np.flatnonzero(frame.slot == source.topology.slot(kind, entity))
    assert len(at) == 1, f"{entity}: {len(at)} rows"
    return float(frame.ts[at[0]]), {name: float(col[at[0]]) for name, col in frame.columns.items()}


def counters(iface: str, t: float) -> str:
    """``ethtool -S`` of a NIC whose counters grow at exactly the true rates since ``T0``."""
    return (f"NIC statistics:\n     tx_bytes_phy: {round(BYTES_PER_S * (t - T0))}\n"
            f"     tx_discards_phy: {round(DISCARDS_PER_S * (t - T0))}\n")


def test_interfaces_read_after_a_slow_one_keep_their_own_read_times_and_true_rates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """eth0's run at the second poll takes 6 s: eth1 and eth2 are read 6 s after that poll began,
    and their counters are as of then. Stamped with the poll's start, their rates over the interval
    before were 16 s of counting over 10 s of stamps (1.6x, discards at 96/s), and 0.4x after."""
    fake = FakeEthtool(counters, slow={(1, "eth0"): SLOW_S})
    health = PipelineHealth()
    source = EthtoolStatsSource(["eth0", "eth1", "eth2"], host="h", health=health)
    frames = polled(source, fake, 3, monkeypatch)
    # one link frame and one optic frame a poll, each interface in it once
    assert [[f.kind for f in poll] for poll in frames] == [["link", "optic"]] * 3
    assert [len(poll[0]) for poll in frames] == [3, 3, 3]
    for iface in ("eth0", "eth1", "eth2"):
        stamps, discards, sent = [], [], []
        for k, poll in enumerate(frames):
            ts, values = row(poll[0], source, "link", f"h/{iface}")
            # its own read's time, as the fake returned it: the later ones 6 s into the slow poll
            assert ts == fake.returned[(k, iface)], (k, iface)
            stamps.append(ts)
            discards.append(values["xmit_discards"])
            sent.append(values["tx_data"])
        dt = np.diff(stamps)
        # the rates the detectors take: the true ones at every interval, the slow one's and after (to
        # float rounding of stamps near 1.7e9 s, ~1e-8; the old ones were off by 60 % and more)
        assert np.diff(discards) / dt == pytest.approx([DISCARDS_PER_S] * 2, rel=1e-6), iface
        assert np.diff(sent) / dt == pytest.approx([BYTES_PER_S] * 2, rel=1e-6), iface
    # the later interfaces' second rows lie the slow run later than the poll's start
    assert fake.returned[(1, "eth2")] - (T0 + POLL_S) == pytest.approx(SLOW_S + 2 * FAST_S)
    assert health.total_problems() == 0


def module(iface: str, t: float) -> str:
    """``ethtool -m`` of a QSFP28 module warming at exactly ``TEMP_PER_S`` from 40 °C at ``T0``."""
    temp = 40.0 + TEMP_PER_S * (t - T0)
    text = (DATA / "ethtool_m_qsfp28_sr4.txt").read_text()
    line = "\tModule temperature                        : 41.25 degrees C / 106.25 degrees F"
    assert line in text  # the capture's line, replaced by the warming one
    return text.replace(line, f"\tModule temperature                        : {temp:.6f} degrees C / "
                              f"{temp * 9 / 5 + 32:.6f} degrees F")


def test_modules_read_after_a_slow_one_keep_their_own_read_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ethtool -m`` alike: eth0's slow run at the second poll left eth1's DOM row stamped 6 s before
    its reading, its temperature's trend 1.6x then 0.4x its true one; now it is its read time."""
    fake = FakeEthtool(module, slow={(1, "eth0"): SLOW_S})
    health = PipelineHealth()
    source = DomSource(["eth0", "eth1"], host="h", health=health)
    frames = polled(source, fake, 3, monkeypatch)
    assert [len(poll) for poll in frames] == [1, 1, 1]  # one optic frame a poll
    for iface in ("eth0", "eth1"):
        stamps, temps = [], []
        for k, poll in enumerate(frames):
            ts, values = row(poll[0], source, "optic", f"h/{iface}#a")
            assert ts == fake.returned[(k, iface)], (k, iface)
            stamps.append(ts)
            temps.append(values["module_temp"])
        assert np.diff(temps) / np.diff(stamps) == pytest.approx([TEMP_PER_S] * 2, rel=1e-4), iface
    assert health.total_problems() == 0
