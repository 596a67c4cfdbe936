"""``foreshock import --format dcgm`` of a file holding several scrapes appended one after another
(``while sleep 30; do curl -s host:9400/metrics >> gpus.prom; done``): each scrape is its own
samples, stamped ``--interval`` apart. Until 2026-12-05 the parser folded the whole file into one
row per GPU: the scrapes' differing readings averaged into one sample ("conflicting duplicate
series"), the time series lost."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.recording import Recording
from foreshock.streams.dcgm import split_pages

DCGM_FILE = Path("dcgm") / "dcgm-exporter-tesla-t4.prom"
START = datetime(2026, 7, 1, tzinfo=timezone.utc).timestamp()


def with_temp(page: str, temp: int) -> str:
    """The page with every GPU's die temperature reading ``temp``."""
    return re.sub(r"^(DCGM_FI_DEV_GPU_TEMP\{.*\}) \d+$", rf"\g<1> {temp}", page, flags=re.M)


def import_file(path: Path, out: Path, *extra: str) -> str:
    result = CliRunner().invoke(command, ["--format", "dcgm", str(path), "--out", str(out),
                                          "--time", "2026-07-01T00:00:00Z", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_split_pages_finds_each_appended_scrape(shared_data: Path) -> None:
    page = (shared_data / DCGM_FILE).read_text()
    pages = [with_temp(page, t) for t in (25, 26, 27)]
    assert split_pages("".join(pages)) == pages


def test_one_page_and_a_page_without_help_lines_are_one_page(shared_data: Path) -> None:
    page = (shared_data / DCGM_FILE).read_text()
    assert split_pages(page) == [page]
    bare = "\n".join(line for line in page.splitlines() if not line.startswith("#")) + "\n"
    assert split_pages(bare + bare) == [bare + bare]  # nothing marks a new scrape: duplicates, counted as such
    assert split_pages("") == [""]


def test_a_series_repeated_within_one_page_stays_one_page(shared_data: Path) -> None:
    page = (shared_data / DCGM_FILE).read_text()
    temp_line = next(line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    doubled = page + temp_line.replace(" 25", " 40") + "\n"
    assert split_pages(doubled) == [doubled]


def test_three_scrapes_import_as_three_samples_per_gpu(shared_data: Path, tmp_path: Path) -> None:
    page = (shared_data / DCGM_FILE).read_text()
    path = tmp_path / "three.prom"
    path.write_text("".join(with_temp(page, t) for t in (25, 26, 27)))
    output = import_file(path, tmp_path / "rec", "--interval", "30")
    assert "conflicting duplicate series" not in output
    assert "3 scrapes in the file, stamped 30 s apart" in output
    rec = Recording.open(tmp_path / "rec")
    frame = rec.read_kind("gpu")
    for gpu in ("424773df46e0/gpu0", "551bdf382151/gpu0"):
        rows = np.flatnonzero(frame.slot == rec.topology.slot("gpu", gpu))
        order = rows[np.argsort(frame.ts[rows], kind="stable")]
        assert frame.ts[order].tolist() == [START, START + 30.0, START + 60.0]
        if gpu == "424773df46e0/gpu0":  # (the capture's other GPU serves no die temperature)
            assert frame.columns["gpu_temp"][order].tolist() == [25.0, 26.0, 27.0]


def test_a_metric_foreshock_does_not_read_is_counted_in_one_scrape_not_in_each(shared_data: Path,
                                                                                tmp_path: Path) -> None:
    """As the live source counts it (once per exporter): a page's unmapped metrics are a fact about
    the exporter's configuration, the same in every scrape of the file."""
    page = (shared_data / DCGM_FILE).read_text()
    (tmp_path / "one.prom").write_text(page)
    (tmp_path / "three.prom").write_text(page * 3)
    counted = [re.search(r"unmapped metric ignored\s*│\s*(\d+)", import_file(tmp_path / f"{name}.prom",
                                                                               tmp_path / name))
               for name in ("one", "three")]
    assert counted[0] is not None and counted[1] is not None
    assert counted[0].group(1) == counted[1].group(1)
