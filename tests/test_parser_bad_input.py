"""Bad input to the dcgm-exporter and nvidia-smi parsers (review h31): each bad line keeps the
pipeline running, costs its own row or cell only, and is counted once, under one reason."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.common import PipelineRun, build_pipeline
from foreshock.cli.import_cmd import command as import_command
from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.dcgm import MAX_AHEAD_S, DcgmScrapeSource, parse_dcgm_text
from foreshock.streams.nvidia_smi import parse_dmon, parse_query_gpu
from foreshock.streams.samples import MAX_GPU_INDEX, gpu_topology, parse_token

from local_http import ScrapeServer

T0 = 1_780_000_000.0
MS = 1_780_000_000_000  # T0 in milliseconds: a federated line's own stamp
CSV_HEAD = "timestamp, index, temperature.gpu, power.draw [W]\n"


def dcgm(metric: str, value: float, gpu: int | str = 0, stamp: int | str | None = None) -> str:
    return f'{metric}{{gpu="{gpu}",Hostname="n1"}} {value}' + (f" {stamp}" if stamp is not None else "") + "\n"


def temps(batch) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return dict(zip(batch.entity_names(), batch.column("gpu_temp").tolist()))


def federation(pages: list[str]) -> DcgmScrapeSource:
    """A source serving ``pages`` one per poll (a Prometheus federation's, with their own stamps)."""
    src = DcgmScrapeSource("http://prometheus:9090/federate", interval=0.02, health=PipelineHealth())
    served = iter(pages)
    src.scrape = lambda: next(served)  # type: ignore[method-assign]
    return src


# ---- 1: dcgm, the wall clock stepped back -------------------------------------------------------
def test_dcgm_rows_older_than_the_last_read_reach_the_guard_and_are_counted_once() -> None:
    """Left out as "not newer", the rows after a clock stepped back were lost uncounted until the
    clock caught up. A sample served again (a federation polled faster than Prometheus scrapes)
    is still left out silently."""
    def page(ms: int) -> str:
        return dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0, ms) + dcgm("DCGM_FI_DEV_GPU_TEMP", 51, 1, ms)

    src = federation([page(MS), page(MS + 30_000), page(MS + 30_000), page(MS - 3_600_000), page(MS - 3_570_000)])
    polls = [src.poll() for _ in range(5)]
    assert [sum(len(f) for f in frames) for frames in polls] == [2, 2, 0, 2, 2]
    assert src.health.total_problems() == 0  # the source counts nothing: the guard does
    assert src.topology is not None
    guard = InputGuard(src.topology, src.health)
    kept = [len(guard.check(f)) for frames in polls for f in frames]
    assert kept == [2, 2, 0, 0]
    assert dict(src.health.problems) == {("guard", "out_of_order"): 4}


# ---- 2: dcgm, a line stamped far ahead ----------------------------------------------------------
def test_dcgm_a_line_stamped_far_ahead_is_counted_and_its_gpu_keeps_its_row() -> None:
    health = PipelineHealth()
    text = (dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0, MS) + dcgm("DCGM_FI_DEV_POWER_USAGE", 300, 0, MS * 1000)  # µs
            + dcgm("DCGM_FI_DEV_GPU_TEMP", 51, 1, MS + 60_000))  # a minute ahead: a clock slightly off, read
    batch = parse_dcgm_text(text, T0, health)
    assert dict(health.problems) == {("dcgm", "future timestamp"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0, "n1/gpu1": 51.0}
    assert batch.ts.tolist() == [T0, T0 + 60.0]  # gpu0's row is not stamped by the refused line
    assert np.isnan(batch.column("power")).all()
    just = parse_dcgm_text(dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0, int((T0 + MAX_AHEAD_S) * 1000)), T0)
    assert len(just) == 1  # the limit itself is within it


def test_dcgm_one_line_stamped_far_ahead_does_not_hide_its_gpu_for_good() -> None:
    """The GPU's row took the line's stamp, the source remembered it, and every later row of that
    GPU was left out as not newer: nothing counted, nothing logged."""
    def page(ms: int, micro: bool = False) -> str:
        power = dcgm("DCGM_FI_DEV_POWER_USAGE", 300, 0, ms * 1000 if micro else ms)  # once in µs
        return dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0, ms) + power + dcgm("DCGM_FI_DEV_GPU_TEMP", 51, 1, ms)

    now = int(time.time() * 1000)
    src = federation([page(now - 30_000 * (6 - k), micro=k == 1) for k in range(6)])
    rows = {0: 0, 1: 0}
    for _ in range(6):
        for frame in src.poll():
            for slot in frame.slot.tolist():
                rows[slot] += 1
    assert rows == {0: 6, 1: 6}
    assert src.health.problems[("dcgm", "future timestamp")] == 1


def test_watch_refuses_rows_stamped_far_ahead_of_this_hosts_clock(shared_data: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """watch's input guard holds rows to this host's clock, as the Kafka workers' does: a row an
    hour ahead (a BMC's clock, say) is refused and counted, not taken as its GPU's last time."""
    import foreshock.cli.watch as watch

    made: list[PipelineRun] = []

    def build_and_keep(*args, **kwargs) -> PipelineRun:  # type: ignore[no-untyped-def]
        made.append(build_pipeline(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(watch, "build_pipeline", build_and_keep)
    server = ScrapeServer([(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()])
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", server.url, "--interval", "0.02",
                                          "--polls", "2", "--port", "0", "--detectors", "robust_zscore"])
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    guard, health = made[0].pipeline.guard, made[0].health
    ahead = time.time() + 3600.0
    # the row on time a second on: stamped at once, it came milliseconds after the last poll's row of
    # its GPU (0.02-s polls) and was refused as a near duplicate now and then (seen 5.8 ms after)
    on_time = time.time() + 1.0
    frame = Frame("gpu", np.array([ahead, on_time]), np.array([0, 1]), {"gpu_temp": np.array([50.0, 51.0])})
    before = health.problems[("guard", "future_timestamp")]
    assert guard.check(frame).slot.tolist() == [1]
    assert health.problems[("guard", "future_timestamp")] == before + 1


# ---- 3: dcgm, numbers too long to read ----------------------------------------------------------
@pytest.mark.parametrize("digits", [20, 400, 5000])
def test_dcgm_a_timestamp_too_long_is_a_malformed_line(digits: int) -> None:
    """400 digits overflowed the float (/ 1000), 5000 passed int()'s limit: the scrape raised, and a
    live source lost every GPU of every poll of that page."""
    health = PipelineHealth()
    text = (dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0) + dcgm("DCGM_FI_DEV_GPU_TEMP", 51, 1)
            + dcgm("DCGM_FI_DEV_POWER_USAGE", 300, 1, "9" * digits))
    batch = parse_dcgm_text(text, T0, health)
    assert dict(health.problems) == {("dcgm", "malformed line"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0, "n1/gpu1": 51.0}


def test_dcgm_a_gpu_label_too_long_is_counted_and_the_import_goes_on(tmp_path: Path) -> None:
    health = PipelineHealth()
    text = dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0) + dcgm("DCGM_FI_DEV_GPU_TEMP", 51, "9" * 5000)
    assert temps(parse_dcgm_text(text, T0, health)) == {"n1/gpu0": 50.0}
    assert dict(health.problems) == {("dcgm", "bad GPU index"): 1}
    # foreshock import died with a traceback on either
    capture = tmp_path / "scrape.prom"
    capture.write_text(text + dcgm("DCGM_FI_DEV_POWER_USAGE", 300, 0, "9" * 5000))
    result = CliRunner().invoke(import_command, ["--format", "dcgm", str(capture), "--out", str(tmp_path / "rec"),
                                                 "--time", "2026-07-01T00:00:00Z"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "bad GPU index" in result.output and "malformed line" in result.output
    rec = Recording.open(tmp_path / "rec")
    assert rec.topology.gpus == ["n1/gpu0"] and rec.read_kind("gpu").columns["gpu_temp"].tolist() == [50.0]


# ---- 4: a hex cell too long for a float ---------------------------------------------------------
def test_a_hex_token_too_long_for_a_float_is_not_a_number_and_costs_its_cell_only() -> None:
    value, ok = parse_token("0x" + "F" * 300)
    assert np.isnan(value) and not ok
    assert parse_token("0x" + "F" * 255)[1]  # the longest that a float still holds
    health = PipelineHealth()
    csv = ("timestamp, index, temperature.gpu, clocks_event_reasons.active\n"
           "2026/07/03 22:11:09.763, 0, 50, 0x0000000000000001\n"
           f"2026/07/03 22:11:09.763, 1, 51, 0x{'F' * 300}\n")
    batch = parse_query_gpu(csv, host="n1", health=health)
    assert dict(health.problems) == {("nvidia-smi", "non-numeric value"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0, "n1/gpu1": 51.0}
    assert batch.column("throttle_reasons")[0] == 1.0 and np.isnan(batch.column("throttle_reasons")[1])


# ---- 5: a GPU index no node has -----------------------------------------------------------------
def test_a_huge_gpu_index_is_refused_by_every_parser_not_made_a_giant_topology() -> None:
    """gpu="1000000" made a derived topology of a million GPUs (4294967295: billions)."""
    health = PipelineHealth()
    text = "".join(dcgm("DCGM_FI_DEV_GPU_TEMP", 50 + i, gpu) for i, gpu in
                   enumerate([0, MAX_GPU_INDEX, MAX_GPU_INDEX + 1, 1_000_000, 4_294_967_295]))
    batch = parse_dcgm_text(text, T0, health)
    assert dict(health.problems) == {("dcgm", "bad GPU index"): 3}
    assert temps(batch) == {"n1/gpu0": 50.0, f"n1/gpu{MAX_GPU_INDEX}": 51.0}
    assert gpu_topology([batch]).size("gpu") == MAX_GPU_INDEX + 1

    health = PipelineHealth()
    csv = CSV_HEAD + "".join(f"2026/07/03 22:11:09.763, {gpu}, {50 + i}, 300 W\n" for i, gpu in
                             enumerate([0, MAX_GPU_INDEX + 1, 1_000_000, 4_294_967_295]))
    batch = parse_query_gpu(csv, host="n1", health=health)
    assert dict(health.problems) == {("nvidia-smi", "bad GPU index"): 3}
    assert temps(batch) == {"n1/gpu0": 50.0} and gpu_topology([batch]).size("gpu") == 1

    health = PipelineHealth()
    batch = parse_dmon(f"# gpu pwr gtemp\n# Idx W C\n 0 300 50\n {MAX_GPU_INDEX + 1} 300 51\n", "n1", health=health)
    assert dict(health.problems) == {("dmon", "bad GPU index"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0}


def test_a_live_dcgm_source_derives_its_topology_without_the_huge_index() -> None:
    src = federation([dcgm("DCGM_FI_DEV_GPU_TEMP", 50, 0) + dcgm("DCGM_FI_DEV_GPU_TEMP", 51, 1_000_000)])
    assert sum(len(f) for f in src.poll()) == 1
    assert src.topology is not None and src.topology.gpus == ["n1/gpu0"]
    assert dict(src.health.problems) == {("dcgm", "bad GPU index"): 1}


# ---- 6: nvidia-smi, a stray quote ---------------------------------------------------------------
def test_nvidia_smi_a_stray_quote_costs_its_own_row_only() -> None:
    """csv.reader took the quote for an open quoted cell and joined every following line into it."""
    rows = [f"2026/07/03 22:11:{s:02d}.000, {g}, {50 + g}, 300.00 W\n" for s in range(5) for g in range(2)]
    rows[1] = '2026/07/03 22:11:00.000, 1, "51, 300.00 W\n'
    health = PipelineHealth()
    batch = parse_query_gpu(CSV_HEAD + "".join(rows), host="n1", health=health)
    assert dict(health.problems) == {("nvidia-smi", "truncated row"): 1}
    assert batch.entity_names() == ["n1/gpu0"] + ["n1/gpu0", "n1/gpu1"] * 4
    assert batch.ts.tolist() == sorted(batch.ts.tolist()) and len(set(batch.ts.tolist())) == 5


def test_nvidia_smi_a_stray_quote_before_many_lines_does_not_raise() -> None:
    """Joined, the lines after the quote passed the csv module's field limit (128 KiB): it raised."""
    many = [f"2026/07/03 {22 + s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.000, 0, 50, 300.00 W\n"
            for s in range(4000)]
    health = PipelineHealth()
    batch = parse_query_gpu(CSV_HEAD + '2026/07/03 21:59:59.000, 0, "50, 300.00 W\n' + "".join(many),
                            host="n1", health=health)
    assert dict(health.problems) == {("nvidia-smi", "truncated row"): 1}
    assert len(batch) == len(many)


# ---- 7: dmon, a fractional GPU index ------------------------------------------------------------
def test_dmon_a_fractional_gpu_index_is_refused_like_query_gpus() -> None:
    """int() read 1.5 as GPU 1: its values landed on another GPU, uncounted."""
    health = PipelineHealth()
    batch = parse_dmon("# gpu pwr gtemp\n# Idx W C\n 0 300 50\n 1 310 51\n 1.5 999 99\n", "n1", health=health)
    assert dict(health.problems) == {("dmon", "bad GPU index"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0, "n1/gpu1": 51.0}
    assert batch.column("power").tolist() == [300.0, 310.0]


# ---- 8: a row left out is counted once ----------------------------------------------------------
def test_a_row_left_out_is_counted_once_not_again_for_each_of_its_cells() -> None:
    good = "2026/07/03 22:11:09.763, 0, 50, 300 W\n"
    health = PipelineHealth()
    batch = parse_query_gpu(CSV_HEAD + good + "\x00\x13garbage, ??, ##, $$\n", host="n1", health=health)
    assert dict(health.problems) == {("nvidia-smi", "bad timestamp"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0}

    health = PipelineHealth()
    batch = parse_query_gpu(CSV_HEAD + good + "2026/07/03 22:11:09.763, ??, ##, $$\n", host="n1", health=health)
    assert dict(health.problems) == {("nvidia-smi", "bad GPU index"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0}

    health = PipelineHealth()
    batch = parse_dmon("# gpu pwr gtemp\n# Idx W C\n 0 300 50\n ?? ## $$\n", "n1", health=health)
    assert dict(health.problems) == {("dmon", "bad GPU index"): 1}
    assert temps(batch) == {"n1/gpu0": 50.0}
