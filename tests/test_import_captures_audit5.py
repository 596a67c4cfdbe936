"""``foreshock import`` misreadings an audit confirmed (2026-12-05): two nvidia-smi captures in one
file (the first capture's sections lost, its dmon rows stamped with the other's date), CSV times
read as UTC where the capture states another zone, the recorded interval taken from every GPU's
stamps pooled (8 GPUs polled each second, 3 ms apart, recorded 0.003 s), several hosts' dcgm
scrapes of one round stamped ``--interval`` apart, and dmon sections placed back to back from
``collected_at`` instead of after the commands that ran before them.

And what the fixes of those got wrong (review, same day): a capture's ``collected_at:`` is UTC
(``Z``) whatever its host's zone (the capture tool runs ``date -u``) while nvidia-smi prints local
time, so the ``Z`` taken for the CSV's zone put a CEST host's rows and dmon runs two hours late;
and several hosts' dcgm pages grouped into one round by default merged one endpoint's successive
scrapes (a GPU-less page, an exporter restarted under a new Hostname, a load-balanced Service).

Expected times are written out from the captures' own text (their ``collected_at:`` and CSV
timestamp lines), never computed by the importer."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.frames import Frame
from foreshock.recording import Recording

H100 = Path("nvidia-smi") / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200 = Path("nvidia-smi") / "linux-x86_64__nvidia-h200__590.48.01.txt"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=timezone.utc).timestamp()


# the captures' collected_at: headers (line 9 of each file)
H100_COLLECTED = utc(2026, 7, 14, 8, 12, 38)
H200_COLLECTED = utc(2026, 7, 3, 22, 10, 45)


def run(*args: str) -> str:
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def imported(path: Path, out: Path, fmt: str, *extra: str) -> tuple[Recording, str]:
    output = run("--format", fmt, str(path), "--out", str(out), *extra)
    return Recording.open(out), output


# ---- two captures in one file --------------------------------------------------------------------
def both_captures(shared_data: Path, tmp_path: Path) -> Path:
    """The H100 capture then the H200 one, appended (``cat h100.txt h200.txt``): every section
    title repeats."""
    path = tmp_path / "both.txt"
    path.write_text((shared_data / H100).read_text() + (shared_data / H200).read_text())
    return path


def test_two_appended_captures_import_both_captures_query_gpu_rows(shared_data: Path, tmp_path: Path) -> None:
    """Keyed by title, the second capture's sections replaced the first's: 2 rows of 4, no problem told."""
    rec, output = imported(both_captures(shared_data, tmp_path), tmp_path / "rec", "nvidia-smi")
    assert "no input problems" in output
    frame = rec.read_kind("gpu")
    # each row's power.draw and timestamp, as the captures' CSV lines print them
    assert sorted(zip(frame.ts.tolist(), frame.columns["power"].tolist())) == [
        (utc(2026, 7, 3, 22, 10, 46, 109000), 77.71), (utc(2026, 7, 3, 22, 11, 9, 763000), 627.40),
        (utc(2026, 7, 14, 8, 12, 38, 696000), 69.85), (utc(2026, 7, 14, 8, 12, 53, 353000), 631.95)]


def test_two_appended_captures_place_each_captures_dmon_rows_at_its_own_time(shared_data: Path,
                                                                              tmp_path: Path) -> None:
    """Each capture has an idle and a load dmon section of 5 samples: 20 rows, each capture's in the
    minute after its own collected_at (the H200's were lost, then stamped with the H100's date)."""
    rec, _ = imported(both_captures(shared_data, tmp_path), tmp_path / "rec", "dmon")
    frame = rec.read_kind("gpu")
    assert len(frame) == 20
    power = frame.columns["power"]
    # the H100's dmon prints 69 W idle and 631-636 W under load; the H200's 77 W and 628-632 W
    h100 = np.isin(power, [69.0, 631.0, 633.0, 634.0, 636.0])
    h200 = np.isin(power, [77.0, 628.0, 629.0, 630.0, 632.0])
    assert h100.sum() == 10 and h200.sum() == 10
    assert ((frame.ts[h100] >= H100_COLLECTED) & (frame.ts[h100] < H100_COLLECTED + 60)).all()
    assert ((frame.ts[h200] >= H200_COLLECTED) & (frame.ts[h200] < H200_COLLECTED + 60)).all()


# ---- time zones ----------------------------------------------------------------------------------
def cest_capture(shared_data: Path, tmp_path: Path) -> Path:
    """The H100 capture as a host two hours east of UTC writes it: collected_at with its offset,
    nvidia-smi's timestamps in local time (08:12 UTC printed as 10:12)."""
    text = (shared_data / H100).read_text()
    text = text.replace("collected_at:   2026-07-14T08:12:38Z", "collected_at:   2026-07-14T10:12:38+02:00")
    text = re.sub(r"^2026/07/14 08:", "2026/07/14 10:", text, flags=re.MULTILINE)
    path = tmp_path / "cest.txt"
    path.write_text(text)
    return path


def test_csv_times_are_read_in_the_zone_the_captures_collected_at_states(shared_data: Path, tmp_path: Path) -> None:
    """Read as UTC, the rows landed two hours after the capture (and after its dmon rows)."""
    rec, _ = imported(cest_capture(shared_data, tmp_path), tmp_path / "rec", "nvidia-smi")
    assert rec.read_kind("gpu").ts.tolist() == [utc(2026, 7, 14, 8, 12, 38, 696000),
                                                utc(2026, 7, 14, 8, 12, 53, 353000)]


def utc_header_capture(shared_data: Path, tmp_path: Path, name: str, offset: timedelta) -> Path:
    """The H100 capture as the capture tool writes it on a host ``offset`` from UTC: collected_at
    by ``date -u`` (``Z``, unchanged), nvidia-smi's CSV timestamps in the host's local time."""
    def local(m: re.Match[str]) -> str:
        at = datetime.strptime(m.group(0), "%Y/%m/%d %H:%M:%S") + offset
        return at.strftime("%Y/%m/%d %H:%M:%S")

    text = (shared_data / H100).read_text()
    assert "collected_at:   2026-07-14T08:12:38Z" in text
    path = tmp_path / f"{name}.txt"
    path.write_text(re.sub(r"^2026/07/14 \d\d:\d\d:\d\d", local, text, flags=re.MULTILINE))
    return path


def test_a_utc_collected_at_does_not_set_the_zone_of_the_csv_rows(shared_data: Path, tmp_path: Path) -> None:
    """The capture tool writes collected_at in UTC on every host: taken for the CSV's zone, a CEST
    host's rows landed two hours late. The host's offset is the gap from collected_at to the first
    CSV timestamp (seconds after it), to a quarter hour; --tz still decides where given; a gap no
    zone explains (minutes off a quarter hour, a quarter hour no zone uses, past 14 h) leaves the
    rows in collected_at's UTC."""
    # the H100's rows, as its capture (a UTC host) prints them: 08:12:38.696 idle, 08:12:53.353 load
    rows = [utc(2026, 7, 14, 8, 12, 38, 696000), utc(2026, 7, 14, 8, 12, 53, 353000)]
    for name, hours, minutes in (("cest", 2, 0), ("edt", -4, 0), ("ist", 5, 30), ("npt", 5, 45)):
        offset = timedelta(hours=hours, minutes=minutes)
        path = utc_header_capture(shared_data, tmp_path, name, offset)
        rec, _ = imported(path, tmp_path / name, "nvidia-smi")
        assert rec.read_kind("gpu").ts.tolist() == rows, name
        told, _ = imported(path, tmp_path / f"{name}_told", "nvidia-smi", "--tz", "UTC")  # as printed, read as UTC
        assert told.read_kind("gpu").ts.tolist() == [t + offset.total_seconds() for t in rows], name
    # and a quarter hour no zone uses: a UTC host whose first row came 15 or 30 minutes after its
    # header had its rows moved that much early, read as from a "+00:15" host (review, same day)
    for name, offset in (("edited", timedelta(hours=3, minutes=10)), ("far", timedelta(hours=15)),
                         ("late15", timedelta(minutes=15)), ("late30", timedelta(minutes=30)),
                         ("late2h15", timedelta(hours=2, minutes=15))):
        rec, _ = imported(utc_header_capture(shared_data, tmp_path, name, offset), tmp_path / name, "nvidia-smi")
        assert rec.read_kind("gpu").ts.tolist() == [t + offset.total_seconds() for t in rows], name


def test_dmon_of_a_host_east_of_utc_is_placed_in_its_capture_not_hours_later(shared_data: Path,
                                                                               tmp_path: Path) -> None:
    """dmon prints no dates and is placed after the CSV rows printed before it: those read in the
    ``Z`` of collected_at put a CEST host's dmon runs at 10:12 UTC, two hours after its capture."""
    rec, _ = imported(utc_header_capture(shared_data, tmp_path, "cest", timedelta(hours=2)), tmp_path / "rec",
                      "dmon")
    frame = rec.read_kind("gpu")
    assert len(frame) == 10
    assert ((frame.ts >= H100_COLLECTED) & (frame.ts < H100_COLLECTED + 60)).all()
    idle = frame.ts[frame.columns["power"] < 100]  # 69 W idle
    # after the idle retired-pages query, printed 08:12:38.898 by the (UTC) capture
    assert idle.min() >= utc(2026, 7, 14, 8, 12, 38, 898000)


def test_each_appended_capture_has_its_own_hosts_zone(shared_data: Path, tmp_path: Path) -> None:
    """A CEST host's capture then a UTC host's (both collected_at in ``Z``): each capture's offset
    is its own, not the first's for the file."""
    path = tmp_path / "both.txt"
    path.write_text(utc_header_capture(shared_data, tmp_path, "cest", timedelta(hours=2)).read_text()
                    + (shared_data / H200).read_text())
    rec, _ = imported(path, tmp_path / "rec", "nvidia-smi")
    frame = rec.read_kind("gpu")
    assert sorted(zip(frame.ts.tolist(), frame.columns["power"].tolist())) == [
        (utc(2026, 7, 3, 22, 10, 46, 109000), 77.71), (utc(2026, 7, 3, 22, 11, 9, 763000), 627.40),
        (utc(2026, 7, 14, 8, 12, 38, 696000), 69.85), (utc(2026, 7, 14, 8, 12, 53, 353000), 631.95)]


BARE_CSV = ("timestamp, index, temperature.gpu, power.draw [W]\n"
            "2026/07/14 10:00:00.000, 0, 40, 100.00 W\n"
            "2026/07/14 10:00:01.000, 0, 41, 101.00 W\n")


def test_tz_sets_the_zone_of_a_bare_csv_log(tmp_path: Path) -> None:
    """A bare CSV log states no zone: UTC unless --tz says otherwise (an offset or a zone name)."""
    path = tmp_path / "log.csv"
    path.write_text(BARE_CSV)
    as_utc, _ = imported(path, tmp_path / "utc", "nvidia-smi")
    assert as_utc.read_kind("gpu").ts.tolist() == [utc(2026, 7, 14, 10, 0, 0), utc(2026, 7, 14, 10, 0, 1)]
    for zone in ("+02:00", "Europe/Berlin"):  # Berlin is at +02:00 (summer time) in July
        rec, _ = imported(path, tmp_path / zone.replace("/", "_"), "nvidia-smi", "--tz", zone)
        assert rec.read_kind("gpu").ts.tolist() == [utc(2026, 7, 14, 8, 0, 0), utc(2026, 7, 14, 8, 0, 1)]


def test_tz_sets_the_zone_of_dmon_dates_and_a_bad_zone_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dmon.txt"
    path.write_text("# Date       Time        gpu    pwr\n# YYYYMMDD   HH:MM:SS    Idx      W\n"
                    " 20260714   10:00:00      0    100\n 20260714   10:00:01      0    101\n")
    rec, _ = imported(path, tmp_path / "rec", "dmon", "--tz", "+02:00")
    assert rec.read_kind("gpu").ts.tolist() == [utc(2026, 7, 14, 8, 0, 0), utc(2026, 7, 14, 8, 0, 1)]
    for bad in ("Mars/Olympus", "Europe", "+25:00"):  # no such zone, a folder of zones, no such offset
        result = CliRunner().invoke(command, ["--format", "dmon", str(path), "--out", str(tmp_path / "bad"),
                                              "--tz", bad])
        assert result.exit_code == 2 and "not a time zone" in result.output, result.output


# ---- the recorded interval -----------------------------------------------------------------------
def interval_of(tmp_path: Path, name: str, text: str) -> float:
    path = tmp_path / f"{name}.csv"
    path.write_text(text)
    run("--format", "nvidia-smi", str(path), "--out", str(tmp_path / name))
    return float(json.loads((tmp_path / name / "recording.json").read_text())["interval"])


def test_interval_is_each_gpus_own_polling_period_not_the_gap_between_gpus_rows(tmp_path: Path) -> None:
    """8 GPUs polled every second, nvidia-smi printing them 3 ms apart: 1 s, not 0.003 s (replay cut
    each poll into 8 windows and logged time jumps)."""
    rows = "".join(f"2026/07/14 08:00:{poll:02d}.{3 * gpu:03d}, {gpu}, 40, 100.00 W\n"
                   for poll in range(4) for gpu in range(8))
    assert interval_of(tmp_path, "eight", "timestamp, index, temperature.gpu, power.draw [W]\n" + rows) == 1.0


def test_interval_of_two_hosts_polled_half_a_second_apart_is_their_period(tmp_path: Path) -> None:
    rows = "".join(f"2026/07/14 08:00:{poll:02d}.{500 * k:03d}, {host}, 0, 40, 100.00 W\n"
                   for poll in range(4) for k, host in enumerate(("nodeA", "nodeB")))
    assert interval_of(tmp_path, "two", "timestamp, hostname, index, temperature.gpu, power.draw [W]\n" + rows) == 1.0


# ---- dcgm scrapes of several hosts ---------------------------------------------------------------
def dcgm_page(host: str, temp: int) -> str:
    return (f"# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-{host}",Hostname="{host}"}} {temp}\n')


def test_several_hosts_pages_of_one_round_share_its_time(tmp_path: Path) -> None:
    """``for h in n1 n2; do curl $h:9400/metrics; done >> gpus.prom`` every 30 s: n1 and n2 at +0,
    then both at +30 (n2's pages were put at +30 and +90, n1's second at +60)."""
    path = tmp_path / "multi.prom"
    path.write_text(dcgm_page("n1", 40) + dcgm_page("n2", 50) + dcgm_page("n1", 41) + dcgm_page("n2", 51))
    # a file that cannot say it is such a loop: --round-of-hosts says so (see the default below)
    rec, _ = imported(path, tmp_path / "rec", "dcgm", "--interval", "30", "--time", "2026-07-01T00:00:00Z",
                      "--round-of-hosts")
    frame = rec.read_kind("gpu")
    start = utc(2026, 7, 1)
    placed = sorted(zip(frame.columns["gpu_temp"].tolist(), frame.ts.tolist()))
    assert placed == [(40.0, start), (41.0, start + 30), (50.0, start), (51.0, start + 30)]
    assert rec.meta["interval"] == 30.0


def dcgm_frame(tmp_path: Path, name: str, pages: list[str], *extra: str) -> Frame:
    """The rows of a file of ``pages`` appended, scraped every 30 s from 2026-07-01T00:00:00Z."""
    path = tmp_path / f"{name}.prom"
    path.write_text("".join(pages))
    rec, _ = imported(path, tmp_path / name, "dcgm", "--interval", "30", "--time", "2026-07-01T00:00:00Z", *extra)
    return rec.read_kind("gpu")


def dcgm_stamps(tmp_path: Path, name: str, pages: list[str], *extra: str) -> list[tuple[float, float]]:
    """(gpu_temp, seconds after the first scrape) of each row of a file of ``pages`` appended."""
    frame = dcgm_frame(tmp_path, name, pages, *extra)
    return sorted((temp, ts - utc(2026, 7, 1)) for temp, ts in zip(frame.columns["gpu_temp"].tolist(),
                                                                   frame.ts.tolist()))


def dcgm_times(tmp_path: Path, name: str, pages: list[str], *extra: str) -> list[float]:
    """Seconds after the first scrape of each row of a file of ``pages`` appended, in order."""
    return sorted(ts - utc(2026, 7, 1) for ts in dcgm_frame(tmp_path, name, pages, *extra).ts.tolist())


def test_pages_of_distinct_hosts_are_each_their_own_scrape_by_default(tmp_path: Path) -> None:
    """``while sleep 30; do curl gpus-svc:9400/metrics >> gpus.prom; done`` against a load-balanced
    Service answers from n1, n2, n2, n1, n2: five scrapes 30 s apart. Grouped into rounds of
    distinct hosts by default, they were put at 0, 0, 30, 30, 60 (two scrapes a round, the
    recording half as long as the capture)."""
    pages = [dcgm_page("n1", 40), dcgm_page("n2", 50), dcgm_page("n2", 51), dcgm_page("n1", 41), dcgm_page("n2", 52)]
    assert dcgm_stamps(tmp_path, "lb", pages) == [(40.0, 0.0), (41.0, 90.0), (50.0, 30.0), (51.0, 60.0),
                                                   (52.0, 120.0)]


def test_a_restarted_exporter_and_a_page_without_gpus_keep_one_scrape_each(shared_data: Path,
                                                                            tmp_path: Path) -> None:
    """The real T4 page names its hosts by container id (``Hostname="424773df46e0"``): an exporter
    container restarted between two scrapes of a loop comes back under another id, a "new host"
    that joined the round of the scrape before it (put at 30 s, not 60 s); a page the exporter
    served with no GPU (HELP and TYPE lines only) stayed in its round, and the scrape after it,
    the same GPUs, was put 30 s early."""
    page = (shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()
    restarted = page.replace('Hostname="424773df46e0"', 'Hostname="9f1c0e2b7a11"').replace(
        'Hostname="551bdf382151"', 'Hostname="0c7e5d2a9b33"')
    assert restarted != page
    gpu_less = "".join(line + "\n" for line in page.splitlines() if line.startswith("#"))
    # the page names two GPUs (gpu="0" of each container): a row each per scrape
    assert dcgm_times(tmp_path, "restart", [page, page, restarted]) == [0.0, 0.0, 30.0, 30.0, 60.0, 60.0]
    expected = [0.0, 0.0, 60.0, 60.0]  # the GPU-less scrape at 30 s, with no row
    assert dcgm_times(tmp_path, "empty", [page, gpu_less, page]) == expected
    # said to be a loop over several hosts, the GPU-less page is still a round of its own
    assert dcgm_times(tmp_path, "empty_rounds", [page, gpu_less, page], "--round-of-hosts") == expected


def test_round_of_hosts_starts_a_round_at_a_host_seen_in_it_or_a_page_without_gpus(tmp_path: Path) -> None:
    """A loop over n1 and n2 whose second round lists n2 first, then a round where n2's exporter was
    up without its GPU: rounds (n1, n2), (n2, n1), (no GPU), (n1, n2) at 0, 30, 60 and 90 s."""
    gpu_less = "".join(line + "\n" for line in dcgm_page("n2", 0).splitlines() if line.startswith("#"))
    pages = [dcgm_page("n1", 40), dcgm_page("n2", 50), dcgm_page("n2", 51), dcgm_page("n1", 41), gpu_less,
             dcgm_page("n1", 42), dcgm_page("n2", 52)]
    assert dcgm_stamps(tmp_path, "loop", pages, "--round-of-hosts") == [
        (40.0, 0.0), (41.0, 30.0), (42.0, 90.0), (50.0, 0.0), (51.0, 30.0), (52.0, 90.0)]


# ---- dmon placed after the commands before it ----------------------------------------------------
def test_dmon_sections_start_no_earlier_than_the_csv_rows_printed_before_them(shared_data: Path,
                                                                               tmp_path: Path) -> None:
    """The capture ran ``idle :: dmon`` after the idle CSV queries (last stamped 22:10:46.307) and
    ``load :: dmon`` after the load ones (22:11:09.950): placed back to back from collected_at, the
    idle run began before the commands that preceded it and the load run 19 s too early."""
    rec, _ = imported(shared_data / H200, tmp_path / "rec", "dmon")
    frame = rec.read_kind("gpu")
    power = frame.columns["power"]
    idle, load = frame.ts[power < 100], frame.ts[power > 600]  # 77 W idle, 628-632 W under load
    assert len(idle) == len(load) == 5
    assert idle.min() >= utc(2026, 7, 3, 22, 10, 46, 307000)
    assert load.min() >= utc(2026, 7, 3, 22, 11, 9, 950000)
    assert np.all(np.diff(np.sort(load)) == 1.0)  # still one sample a second (--interval)
