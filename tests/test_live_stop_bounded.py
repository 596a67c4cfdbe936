"""``record`` and ``watch`` end as asked within a bounded time, whatever their sources are stuck in
(audit 2026-12-05): an NVML call that never returned held ``record`` past ``--duration`` and its
first SIGTERM, and a second signal killed it with every row read unwritten; a BMC that never
answered was missing from ``watch``'s summary, and its read held the exit for its request's 10 s.

``record`` runs in a subprocess with a stand-in pynvml on PYTHONPATH whose power call blocks in C
(as a hung driver call does: no Python signal handler runs in that thread), each under a timeout
so that a command that never ends fails the test instead of hanging the suite."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from foreshock.cli import record, watch
from foreshock.health import PipelineHealth
from foreshock.streams.redfish import TOO_SLOW, RedfishSource

FAKE_PYNVML = textwrap.dedent('''
    """One GPU; nvmlDeviceGetPowerUsage blocks in C from its HANG_AT-th call (0: never)."""
    import ctypes, os
    NVML_ERROR_NOT_SUPPORTED = 3
    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value
    HANG_AT = int(os.environ.get("FAKE_NVML_HANG_AT", "0"))
    _calls = [0]
    def nvmlInit(): pass
    def nvmlDeviceGetCount(): return 1
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetUUID(h): return "GPU-11111111-2222-3333-4444-555555555555"
    def nvmlDeviceGetPowerUsage(h):
        _calls[0] += 1
        if HANG_AT and _calls[0] >= HANG_AT:
            open(os.environ["FAKE_NVML_HANGING"], "w").close()
            ctypes.CDLL(None).sleep(3600)  # a driver call that does not return
        return 300000
    def __getattr__(name):
        if name.startswith("nvml"):  # every other call: not supported by this GPU
            def unsupported(*a):
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return unsupported
        if name.startswith("NVML_") and not name.startswith("NVML_ERROR_"):
            return 0
        raise AttributeError(name)
''')

# the commands' deadlines lowered, so that the tests take seconds (10 s and 2 s in service)
LOWERED = ("import os, foreshock.streams.nvml as nvml, foreshock.cli.record as record; "
           "nvml.DEADLINE_S = float(os.environ['FAKE_NVML_DEADLINE_S']); record.WIND_DOWN_S = 1.0; "
           "from foreshock.cli.main import cli; cli()")
ENDS_WITHIN_S = 10.0  # start-up (imports) and the run, with room


def foreshock(tmp_path: Path, args: list[str], hang_at: int = 0, deadline_s: float = 0.5) -> subprocess.Popen[str]:
    (tmp_path / "fake").mkdir(exist_ok=True)
    (tmp_path / "fake" / "pynvml.py").write_text(FAKE_PYNVML)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "fake"),
                                                                       os.environ.get("PYTHONPATH")])),
           "FAKE_NVML_HANG_AT": str(hang_at), "FAKE_NVML_HANGING": str(tmp_path / "hanging"),
           "FAKE_NVML_DEADLINE_S": str(deadline_s)}
    return subprocess.Popen([sys.executable, "-c", LOWERED, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def ended(child: subprocess.Popen[str], within: float) -> tuple[str, str]:
    try:
        return child.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"still running {within:g} s after it should have ended")


def summary(out: str, name: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [s["name"] for s in lines] == [name], out
    return lines[0]


@pytest.mark.parametrize("stopped_by", ["--duration", "SIGTERM"])
def test_record_stops_as_asked_while_an_nvml_call_hangs_and_keeps_the_rows_read(tmp_path: Path,
                                                                                  stopped_by: str) -> None:
    out_dir = tmp_path / "rec"
    duration = ["--duration", "3"] if stopped_by == "--duration" else []
    child = foreshock(tmp_path, ["record", "--source", "nvml", "--interval", "0.2", "--out", str(out_dir),
                                 *duration], hang_at=4)
    if stopped_by == "SIGTERM":
        deadline = time.monotonic() + ENDS_WITHIN_S
        while not (tmp_path / "hanging").exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert (tmp_path / "hanging").exists()
        time.sleep(1.0)  # past the hung call's deadline: a poll or more skip the GPU
        child.send_signal(signal.SIGTERM)
    out, err = ended(child, ENDS_WITHIN_S)
    assert child.returncode == 0, err
    # the 3 polls before the hang, written and listed: killed by a second signal, none was
    recorded = summary(out, "record")
    assert recorded["rows"]["gpu"] >= 3 and recorded["interrupted"] == (stopped_by == "SIGTERM")
    listed = json.loads((out_dir / "recording.json").read_text())
    assert listed["rows"]["gpu"] == recorded["rows"]["gpu"] and listed["parts"] == {"gpu": 1}
    assert "NVML call hung" in err  # counted in the problems table


def test_record_leaves_a_source_still_polling_past_the_wind_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that does not end when stopped (a call that never returns, in any source) is waited
    for WIND_DOWN_S, then left: the frames end, and the recording is marked incomplete."""
    monkeypatch.setattr(record, "WIND_DOWN_S", 0.3)
    hang = threading.Event()

    def stuck_source() -> Any:
        yield "frame"
        hang.wait(30)  # the poll in hand never ends

    stopping, left = threading.Event(), []
    taken: list[Any] = []

    def consume() -> None:
        for item in record._frames_or_quiet(stuck_source(), lambda: 60.0, stopping, left):
            taken.append(item)
            stopping.set()

    consumer = threading.Thread(target=consume, daemon=True)
    began = time.monotonic()
    consumer.start()
    consumer.join(5)
    hang.set()
    assert not consumer.is_alive() and time.monotonic() - began < 2.0
    assert taken == ["frame"] and len(left) == 1


@pytest.fixture
def silent_bmc() -> Any:
    """A BMC that takes connections (the kernel does) and never answers, on a port these tests may use."""
    bmc = socket.socket()
    for port in range(19761, 19800):
        try:
            bmc.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    bmc.listen(8)
    yield f"http://127.0.0.1:{port}"
    bmc.close()


@pytest.mark.parametrize("hurried", [False, True])
def test_a_bmc_that_never_answers_is_counted_before_watch_gives_up_on_it(monkeypatch: pytest.MonkeyPatch,
                                                                         hurried: bool) -> None:
    """``watch`` stops its BMC source, then waits for its poll in hand, up to the poll's own limit,
    before its summary: a read that never ends is counted as too slow then (at its poll's deadline,
    or at once after a second signal), not after the summary was printed without it."""
    never = threading.Event()
    monkeypatch.setattr(RedfishSource, "read_one", lambda self, node: never.wait(30))  # (not cut at the deadline)
    health = PipelineHealth()
    src = RedfishSource({"n1": "http://127.0.0.1:19861"}, interval=0.5, timeout=0.3, health=health)
    threading.Thread(target=lambda: list(src), daemon=True).start()
    try:
        time.sleep(0.2)  # the first poll is waiting for the BMC
        src.hurry() if hurried else src.stop()
        began = time.monotonic()
        watch._wind_down([src])
        assert health.problems.get(("redfish", TOO_SLOW)) == 1
        assert time.monotonic() - began < (0.3 if hurried else record.stop_within(src))
    finally:
        never.set()


def test_a_second_sigterm_cuts_the_wait_for_a_hung_poll_short(tmp_path: Path) -> None:
    """The first SIGTERM waits for the poll in hand up to its own limit (NVML's deadline, 30 s here:
    a slow poll's rows are kept); a second one leaves it after WIND_DOWN_S, the rows read before
    the hang written and the summary printed (the second signal had killed record outright)."""
    out_dir = tmp_path / "rec"
    child = foreshock(tmp_path, ["record", "--source", "nvml", "--interval", "0.2", "--out", str(out_dir)],
                      hang_at=4, deadline_s=30.0)
    deadline = time.monotonic() + ENDS_WITHIN_S
    while not (tmp_path / "hanging").exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    assert (tmp_path / "hanging").exists()
    child.send_signal(signal.SIGTERM)
    time.sleep(2.0)  # past WIND_DOWN_S (1 s here), within the poll's 30 s
    assert child.poll() is None  # still waiting for the poll in hand
    child.send_signal(signal.SIGTERM)
    out, err = ended(child, 5.0)
    assert child.returncode == 0, err
    recorded = summary(out, "record")
    assert recorded["rows"]["gpu"] >= 3 and recorded["interrupted"] is True
    listed = json.loads((out_dir / "recording.json").read_text())
    assert listed["rows"]["gpu"] == recorded["rows"]["gpu"] and listed["complete"] is False


def test_a_bmc_read_in_flight_does_not_hold_the_exit(silent_bmc: str) -> None:
    """The BMC reads' threads do not keep the process alive past its end: a watch whose BMC never
    answered exited 7 s after its summary, when the request timed out."""
    script = textwrap.dedent(f"""
        import threading, time
        from foreshock.streams.redfish import RedfishSource
        src = RedfishSource({{"n1": "{silent_bmc}"}}, interval=1.0, timeout=8.0)
        threading.Thread(target=lambda: list(src), daemon=True).start()
        time.sleep(0.5)
        src.stop()
    """)
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], timeout=20, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 6.0  # the request's 8 s not waited for (imports take a second or two)
