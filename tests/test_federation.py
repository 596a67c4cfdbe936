"""``foreshock watch`` reading every GPU a real Prometheus server scrapes, through its
``/federate`` endpoint: no agent of foreshock's on the nodes. Debian's Prometheus scrapes the
real dcgm-exporter page served on 127.0.0.1; foreshock polls the federation twice as often as
Prometheus scrapes, so half its polls see samples it has already read."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from click.testing import CliRunner

from conftest_prom import wait_until
from foreshock.cli.main import cli

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


def test_watch_reads_the_gpus_a_prometheus_server_scrapes_through_its_federation(start_prometheus, dcgm_exporter):
    prom = start_prometheus(scrape={"dcgm": [dcgm_exporter.removeprefix("http://")]}, interval="1s")
    wait_until(lambda: len(prom.query("DCGM_FI_DEV_GPU_TEMP or DCGM_FI_DEV_SLOWDOWN_TEMP")) == 2, timeout=30,
               what="Prometheus scraping the exporter")
    url = f"{prom.url}/federate?" + urllib.parse.urlencode({"match[]": '{__name__=~"DCGM_.*"}'})
    result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", url, "--interval", "0.5",
                                      "--polls", "10", "--port", "0"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    # both GPUs of the page, named by their Hostname labels, one row per Prometheus scrape
    assert "2 GPUs, 2 nodes" in result.output
    # At most one row per GPU per poll (the source keeps only rows newer than the GPU's last):
    # 2 * 10. How many of the 10 polls see a fresh scrape depends on timing (a slow first frame,
    # slots skipped on a loaded machine: ~12 measured where 2 * 5 was expected); the polls that see
    # no new scrape must add nothing, which the guard's duplicate_timestamp would tell (next line)
    assert 2 * 3 <= summary["samples"] <= 2 * 10 and summary["telemetry_seconds"] >= 2.0
    assert "duplicate_timestamp" not in result.output and summary["findings"].get("prediction", 0) == 0
