"""A recording one of whose kinds is stamped in another unit (review r110, R4): rack.parquet in
milliseconds, the rest in seconds, replayed silently: the guard holds each kind to its own stream's
present, so a whole kind in ms is its own consistent stream. The incident engine's clock jumped
53,000 years (every incident "resolved" at 1.7e12), the summary counted 471,752,109 hours of
telemetry, the findings changed, and nothing was counted or logged. ``Recording.open`` now
compares the kinds' stamps (Parquet statistics) with each other and with recording.json's start
and end, and refuses a recording whose kinds lie ten years or more apart, naming the file and the
unit its stamps look like."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingError, RecordingWriter
from foreshock.topology import Topology

T0 = 1_700_000_000.0
TICKS = 60
KINDS = ("gpu", "node", "rack")
UNITS = {1e3: "milliseconds", 1e6: "microseconds", 1e9: "nanoseconds"}


def topology() -> Topology:
    return Topology.from_gpu_hosts([("n1", 2), ("n2", 2)])


def write(path, scale: dict[str, float] | None = None, shift: dict[str, float] | None = None,
          stray_ms: str | None = None, t0: float = T0) -> None:
    """``TICKS`` ticks of every kind of ``KINDS``; a kind's stamps times ``scale[kind]`` plus
    ``shift[kind]``; ``stray_ms``: that kind's row of one tick in milliseconds."""
    topo = topology()
    scale, shift = scale or {}, shift or {}
    with RecordingWriter(path, topo, {"interval": 1.0}) as w:
        for k in range(TICKS):
            for kind in KINDS:
                n = topo.size(kind)
                ts = np.full(n, t0 + k) * scale.get(kind, 1.0) + shift.get(kind, 0.0)
                if kind == stray_ms and k == TICKS // 2:
                    ts[0] *= 1000.0
                w.write(Frame(kind, ts, np.arange(n), {}))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), factor=st.sampled_from(sorted(UNITS)))
def test_a_kind_in_another_unit_is_refused_naming_the_file_and_the_unit(tmp_path_factory, kind, factor) -> None:
    """On HEAD the recording opened, and its replay ran on."""
    path = tmp_path_factory.mktemp("rec")
    write(path, scale={kind: factor})
    with pytest.raises(RecordingError) as caught:
        Recording.open(path)
    message = str(caught.value)
    assert f"{kind}.parquet is stamped" in message and f"in {UNITS[factor]}, not seconds" in message
    assert f"about {factor:,.0f} times the stamps of" in message
    assert not any(f"{other}.parquet is stamped" in message for other in KINDS if other != kind)


def test_a_kind_stamped_by_a_clock_not_set_is_refused(tmp_path) -> None:
    write(tmp_path / "rec", shift={"rack": -T0})  # every rack row from epoch zero on
    # (recording.json's start and end are the stream's, gpu's and node's: StreamSpan)
    with pytest.raises(RecordingError, match=r"rack\.parquet is stamped 0 \.\. 59, 54 years before gpu, node and "
                                             r"recording\.json's start and end "
                                             r"\(1,700,000,000 \.\. 1,700,000,059, 2023-11-14 22:13:20 \.\. 22:14:19 UTC\): by "
                                             r"a clock not set"):
        Recording.open(tmp_path / "rec")


def test_a_file_in_milliseconds_against_its_recording_json_is_refused(tmp_path) -> None:
    """One kind only: recording.json's start and end (a file copied in from elsewhere) tell."""
    topo = topology()
    with RecordingWriter(tmp_path / "rec", topo, {"interval": 1.0}) as w:
        for k in range(TICKS):
            w.write(Frame("gpu", np.full(4, T0 + k), np.arange(4), {}))
    table = pq.read_table(tmp_path / "rec" / "gpu.parquet")
    pq.write_table(table.set_column(0, "ts", pa.array(table.column("ts").to_numpy() * 1000.0)),
                   tmp_path / "rec" / "gpu.parquet")
    with pytest.raises(RecordingError, match=r"gpu\.parquet is stamped .* times the stamps of recording\.json's "
                                             r"start and end .*: in milliseconds"):
        Recording.open(tmp_path / "rec")


@pytest.mark.parametrize("case", ["stray-ms-row", "an-hour-apart", "near-epoch-zero", "a-year-apart"])
def test_recordings_whose_kinds_agree_open(tmp_path, case) -> None:
    """A few rows in ms among seconds are the guard's (counted as future stamps), kinds starting an
    hour or a year apart are one recording, and stamps near zero (tests, synthetic data) are seconds."""
    if case == "stray-ms-row":
        write(tmp_path / "rec", stray_ms="gpu")
    elif case == "an-hour-apart":
        write(tmp_path / "rec", shift={"rack": 3600.0})
    elif case == "a-year-apart":
        write(tmp_path / "rec", shift={"rack": 365 * 86400.0})
    else:
        write(tmp_path / "rec", t0=0.0, scale={"rack": 1000.0})
    assert set(Recording.open(tmp_path / "rec").kinds()) == set(KINDS)


def test_replay_says_which_file_is_broken(tmp_path) -> None:
    """The reviewer's case: rack.parquet rewritten in ms, recording.json left as it was."""
    write(tmp_path / "rec")
    table = pq.read_table(tmp_path / "rec" / "rack.parquet")
    pq.write_table(table.set_column(0, "ts", pa.array(table.column("ts").to_numpy() * 1000.0)),
                   tmp_path / "rec" / "rack.parquet")
    meta = json.loads((tmp_path / "rec" / "recording.json").read_text())
    assert meta["end"] < 1e10  # (start and end still in seconds)
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0"])
    assert result.exit_code != 0
    assert "a broken recording: rack.parquet is stamped" in result.output
    assert "in milliseconds, not seconds" in result.output
    assert "Traceback" not in result.output
