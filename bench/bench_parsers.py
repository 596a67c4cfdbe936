"""Parse throughput of the real-source importers (text -> columnar samples), one core.

dcgm-exporter text: a synthetic 200-node x 8-GPU scrape with the default counters and real
labels; nvidia-smi --query-gpu: the real H200 load CSV row (258 columns) repeated; dmon: the
real H200 load section repeated; Alibaba: the real pre-FEC BER CSV; ethtool -m: the CMIS
8-lane fixture. Figures are medians of 3 runs after a warm-up.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, repeat, timed  # noqa: E402

from foreshock.health import PipelineHealth  # noqa: E402
from foreshock.streams.alibaba import read_alibaba  # noqa: E402
from foreshock.streams.dcgm import parse_dcgm_text  # noqa: E402
from foreshock.streams.dom import parse_ethtool_m  # noqa: E402
from foreshock.streams.nvidia_smi import capture_sections, parse_dmon, parse_query_gpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE",
           "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
           "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
           "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"]


def main() -> None:
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()  # --help, no options
    rng = random.Random(0)
    lines = [f'{m}{{gpu="{g}",UUID="GPU-{n:04d}-{g}",pci_bus_id="00000000:{g:02x}:00.0",device="nvidia{g}",'
             f'modelName="NVIDIA H100 80GB HBM3",Hostname="node{n:04d}",container="",namespace="",pod=""}} '
             f'{rng.random() * 100:.6f}' for n in range(200) for g in range(8) for m in METRICS]
    scrape = "\n".join(lines)
    h200 = capture_sections((DATA / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt").read_text())
    header, row = h200["load :: query-gpu"].splitlines()[:2]
    csv_rows = 500
    csv_text = header + "\n" + "\n".join([row] * csv_rows)
    dmon_lines = h200["load :: dmon"].splitlines()
    dmon_text = "\n".join(dmon_lines[:2] + dmon_lines[2:] * 5_000)
    dom_text = (ROOT / "tests" / "data" / "ethtool_m_osfp_cmis_8lane.txt").read_text()
    ber_csv = DATA / "optics" / "alibaba_prefec_ber.csv"

    health = PipelineHealth()
    dcgm = repeat(lambda: len(lines) / timed(lambda: parse_dcgm_text(scrape, 0.0, health)), runs=3)
    query = repeat(lambda: csv_rows / timed(lambda: parse_query_gpu(csv_text, health=health)), runs=3)
    dmon = repeat(lambda: 25_000 / timed(lambda: parse_dmon(dmon_text, health=health)), runs=3)
    alibaba = repeat(lambda: 29_275 / timed(lambda: read_alibaba(ber_csv, health=health)), runs=3)
    dom = repeat(lambda: 100 / timed(lambda: [parse_ethtool_m(dom_text, health) for _ in range(100)]), runs=3)
    print(f"dcgm-exporter text   {dcgm['median']:>12,.0f} lines/s   ({dcgm['median'] / len(METRICS):,.0f} GPUs/s)")
    print(f"nvidia-smi CSV       {query['median']:>12,.0f} rows/s  (258 columns)")
    print(f"nvidia-smi dmon      {dmon['median']:>12,.0f} rows/s")
    print(f"Alibaba BER CSV      {alibaba['median']:>12,.0f} rows/s")
    print(f"ethtool -m (8 lanes) {dom['median']:>12,.0f} modules/s")
    figures: dict[str, float] = {}
    for key, stats in (("dcgm_lines_per_s", dcgm), ("query_gpu_rows_per_s", query), ("dmon_rows_per_s", dmon),
                       ("alibaba_rows_per_s", alibaba), ("ethtool_m_modules_per_s", dom)):
        figures |= {key: round(stats["median"]), f"{key}_min": round(stats["min"]), f"{key}_max": round(stats["max"])}
    emit("parsers", **figures, runs=3)


if __name__ == "__main__":
    main()
