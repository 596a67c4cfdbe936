"""A GPU that vanishes from a dcgm-exporter page (served before, absent now) is counted as an input
problem of the dcgm stage once each time it goes, named in the log, and said to be back when it is:
it had been neither logged nor counted, its last values lingering, while nvidia-smi and NVML count a
lost GPU (``GPU lost or requires reset``)."""

from __future__ import annotations

import logging
from typing import Any

from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import GPU_DISAPPEARED, STAGE, DcgmScrapeSource


def _page(gpus: list[int], ts: float) -> str:
    return "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",Hostname="n1",UUID="GPU-{g}"}} 41 {int(ts * 1000)}\n'
                   for g in gpus)


class _Served(DcgmScrapeSource):
    def __init__(self, **kw: Any) -> None:
        super().__init__("http://exporter:9400/metrics", interval=0.02, **kw)
        self.page: str | None = ""
        self.now = 0.0
        self.clock = lambda: self.now

    def scrape(self) -> str | None:
        return self.page

    def at(self, ts: float, gpus: list[int] | None) -> None:
        self.now = ts
        self.page = None if gpus is None else _page(gpus, ts)
        self.poll()


def _disappeared(health: PipelineHealth) -> int:
    return health.problems.get((STAGE, GPU_DISAPPEARED), 0)


def test_a_gpu_gone_from_the_page_is_counted_once_per_disappearance_and_logged(caplog) -> None:
    health = PipelineHealth()
    src = _Served(health=health)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        src.at(0, [0, 1, 2, 3])
        src.at(2, [0, 1, 2, 3])
        assert _disappeared(health) == 0
        src.at(4, [0, 1, 2])  # gpu3 goes
        assert _disappeared(health) == 1
        for t in range(6, 30, 2):  # and stays away: nothing more
            src.at(t, [0, 1, 2])
        src.at(30, None)  # the exporter down: says nothing of any GPU
        src.at(32, [0, 1, 2])
        assert _disappeared(health) == 1
        gone_lines = [r.getMessage() for r in caplog.records if "n1/gpu3" in r.getMessage()]
        assert len(gone_lines) == 1 and "absent" in gone_lines[0], gone_lines
        src.at(34, [0, 1, 2, 3])  # back: logged, not counted
        src.at(36, [0, 1, 2, 3])
        assert _disappeared(health) == 1
        back = [r.getMessage() for r in caplog.records if "served again" in r.getMessage()]
        assert len(back) == 1 and "n1/gpu3" in back[0]
        src.at(38, [0, 2, 3])  # another disappearance (another GPU): counted and named too
    assert _disappeared(health) == 2
    assert sum("n1/gpu1" in r.getMessage() for r in caplog.records) == 1
    assert health.problems.get((STAGE, "scrape failed"), 0) == 0  # (scrape returned None: the test's stand-in)


def test_the_first_page_after_an_outage_judges_no_gpu_gone() -> None:
    """A federation back from a restart serves its targets as it scrapes them again: a GPU absent
    from the first page after polls that read none is judged at the next page, counted if still absent."""
    health = PipelineHealth()
    src = _Served(health=health)
    src.at(0, [0, 1, 2, 3])
    src.at(2, None)  # the exporter (or the federation) down
    src.at(4, [0, 1])  # back, serving part of its targets
    assert _disappeared(health) == 0
    src.at(6, [0, 1, 2])  # gpu2 re-scraped; gpu3 still absent: counted now
    assert _disappeared(health) == 1
    src.at(8, [0, 1, 2])
    assert _disappeared(health) == 1
