"""The incident engine's link utilisation from 32-bit ``tx_data`` counters (``port_xmit_data``, 4-byte
words: it wraps at 2**34 bytes, every 0.3 s at 400 Gb/s). Until 2026-12-06 ``Telemetry.observe`` read
every fall as a problem and every rise as a utilisation: a healthy ``simulate --counter-bits 32``
recording had 30 % of its link rows counted (``ForeshockInputProblems`` for good) and the rest read as a
few percent on busy links. The counter is now read by ``CounterRates`` as the congestion and optics
detectors read theirs: a wrap is no problem, an interval whose wraps cannot be told gives no rate."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.incident_impact import LINK_TX, LINK_UTIL, Telemetry
from foreshock.frames import Frame

FAST = 400e9  # bits/s
TX_MODULUS = 2.0**34  # a 32-bit port_xmit_data, in bytes
SLOW = 1e9  # a 1G port's 32-bit counter at 5-s polls: its wraps can be told (5 s carry < 2**33 bytes)


def link_frame(t: float, tx_bytes: float, rate: float) -> Frame:
    return Frame("link", np.array([t]), np.array([0]), {"tx_data": np.array([tx_bytes]),
                                                         "link_rate": np.array([rate])})


def feed(tel: Telemetry, start: float, share: float, rate: float, polls: int, t0: float = 0.0,
         interval: float = 5.0, modulus: float = TX_MODULUS) -> tuple[int, list[float]]:
    """A counter wrapping at ``modulus`` (32 bits: ``TX_MODULUS``) of a link carrying ``share`` of ``rate``
    from ``start`` bytes: the problems counted, the utilisations read."""
    problems, utils = 0, []
    for i in range(polls):
        total = start + rate / 8.0 * share * interval * i
        problems += tel.observe(link_frame(t0 + interval * i, total % modulus, rate))
        utils.append(float(tel.s_link_tel[0, LINK_UTIL]))
    return problems, utils


def test_a_busy_32_bit_counter_is_no_problem_and_its_utilisation_unknown_not_wrong() -> None:
    tel = Telemetry(1, 1, 1)
    problems, utils = feed(tel, 1e9, 0.6, FAST, 40)
    assert problems == 0  # it had been ~30 % of the rows
    assert all(np.isnan(u) for u in utils[1:])  # 250 GB in 5 s mod 17 GB: any number of wraps


def test_a_32_bit_counter_whose_wraps_can_be_told_reads_right_through_them() -> None:
    tel = Telemetry(1, 1, 1)
    per_poll = SLOW / 8.0 * 0.5 * 5.0
    problems, utils = feed(tel, TX_MODULUS - 6 * per_poll, 0.5, SLOW, 12)
    assert problems == 0
    assert utils[1:] == pytest.approx([0.5] * 11)  # the wrap at the 7th poll included


def test_a_64_bit_counter_reads_as_before_and_its_reset_is_counted_once() -> None:
    tel = Telemetry(1, 1, 1)
    problems, utils = feed(tel, 8.6e15, 0.25, FAST, 6, modulus=2.0**64)
    assert problems == 0 and utils[1:] == pytest.approx([0.25] * 5)
    # cleared (perfquery -x -R) from 8.6e15 bytes: a reset, counted once it stands, not a wrap
    after = [tel.observe(link_frame(30.0 + 5.0 * i, 1e6 + FAST / 8.0 * 0.25 * 5.0 * i, FAST)) for i in range(4)]
    assert sum(after) == 1
    assert tel.s_link_tel[0, LINK_UTIL] == pytest.approx(0.25)


def test_the_counter_state_goes_through_a_checkpoint_and_an_old_one_loads() -> None:
    tel = Telemetry(1, 1, 1)
    per_poll = SLOW / 8.0 * 0.5 * 5.0
    feed(tel, TX_MODULUS - 3.5 * per_poll, 0.5, SLOW, 3)
    state = tel.state_dict()
    back = Telemetry(1, 1, 1)
    back.load_state_dict(state)
    # the wrap right after the restore fits the pace the checkpoint kept: a wrap, not a reset
    assert back.observe(link_frame(15.0, (TX_MODULUS - 0.5 * per_poll) % TX_MODULUS, SLOW)) == 0
    assert back.observe(link_frame(20.0, 0.5 * per_poll, SLOW)) == 0
    assert back.s_link_tel[0, LINK_UTIL] == pytest.approx(0.5)
    old = {k: v for k, v in state.items() if k != "s_link_counter"}  # saved before it was kept
    again = Telemetry(1, 1, 1)
    again.load_state_dict(old)
    assert again.s_link_tel[0, LINK_TX] == state["s_link_tel"][0, LINK_TX]
    assert again.observe(link_frame(15.0, state["s_link_tel"][0, LINK_TX] + per_poll, SLOW)) == 0
    assert again.s_link_tel[0, LINK_UTIL] == pytest.approx(0.5)


def test_a_healthy_32_bit_recording_replays_without_input_problems(tmp_path) -> None:
    rec = tmp_path / "c32"
    runner = CliRunner()
    made = runner.invoke(cli, ["simulate", "--gpus", "16", "--duration", "300", "--interval", "5",
                               "--counter-bits", "32", "--out", str(rec), "--no-progress"])
    assert made.exit_code == 0, made.output
    result = runner.invoke(cli, ["replay", str(rec), "--port", "0"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert "tx_data" not in result.output, result.output
    assert last["input_problems"] < 0.01 * last["samples"], result.output
