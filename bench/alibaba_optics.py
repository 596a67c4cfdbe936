"""The optics detector on the real Alibaba pre-FEC BER series, end to end, with a picture.

Reads ``../shared/data/optics/alibaba_prefec_ber.csv`` (hourly pre-FEC BER of 50 DWDM channel
ends over two transponder planes, ``ot1`` and ``ot2``) through foreshock's importer, runs the
optics detector over both planes (each link carries its plane's FEC limit in the imported
topology), and reports which channel ends it
flags and why:

- **step**: the BER jumped and stayed (six ``ot1`` channel ends improved 40-70x on day 7.6: a
  network change, not a fault — the detector reports it and does not read it as a trend);
- **worsening**: a significant Theil-Sen decline of the Q factor that reaches the FEC limit
  within ``trend_horizon_s`` (90 days) and ``max_extrapolation`` windows;
- **link_down predicted**: reaches it within ``horizon_s`` (7 days) — none in this series.

FEC limits are the BER at each transponder's measured OSNR limit, from the dataset's own
``data/ber-marign.json`` (alibaba/alibaba-cloud-transport-system): ``ot1`` 3.7e-2, ``ot2``
5.4e-2. Trend windows are 7 days of hourly buckets (the series is 14 days long, ``ot2`` 7).

Writes a small PNG (``--out``, default ``docs/img/alibaba_optics.png``): every channel end's
final margin to its FEC limit against its trend, coloured by flag, and the series of four
flagged ends with their steps and warnings. Prints a table, then a JSON line with
``"name": "alibaba_optics"``.

    .venv/bin/python bench/alibaba_optics.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from foreshock.detectors.optics import DAY_S, F_CONF, F_LEVEL, F_SLOPE, SIG_Q, OpticsDetector
from foreshock.findings import Anomaly, Finding, Prediction
from foreshock.health import PipelineHealth
from foreshock.streams.alibaba import read_alibaba

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "optics" / "alibaba_prefec_ber.csv"


PARAMS = {
    "bucket_s": 3600.0,  # the series is hourly
    "window": 168.0,  # seven days of buckets
    "min_points": 72.0,  # three days before a trend is trusted (diurnal swings)
    "horizon_s": 7 * 86400.0,
    "min_slope_db_per_day": 0.02,
    "step_min_db": 0.5,
}

COLOURS = {"link_down predicted": "tab:red", "worsening": "tab:orange", "step": "tab:blue", "steady": "0.6"}


def classify(findings: list[Finding]) -> str:
    if any(isinstance(f, Prediction) and f.active for f in findings):
        return "link_down predicted"
    if any(isinstance(f, Anomaly) and "worsening" in f.reason for f in findings):
        return "worsening"
    if any(isinstance(f, Anomaly) and "jumped" in f.reason for f in findings):
        return "step"
    return "steady"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "alibaba_optics.png")
    args = ap.parse_args()
    t_start = time.perf_counter()
    health = PipelineHealth()
    imp = read_alibaba(args.data, health=health)
    topo = imp.topology
    frame = imp.batch.to_frame(topo, health)
    names = topo.names("optic")
    t0 = float(frame.ts.min())
    per_end: dict[int, list[Finding]] = {}
    summary: dict[int, dict[str, float]] = {}
    # one detector for both planes: each link carries its plane's FEC limit in the topology
    det = OpticsDetector(topo, health=health, **PARAMS)
    for f in det.update(frame):
        optic = f.slot if f.entity_kind == "optic" else -1
        if isinstance(f, Prediction):  # a link prediction names its optic end in the reason
            optic = next((o for o in (2 * f.slot, 2 * f.slot + 1) if f.reason.startswith(names[o])), 2 * f.slot)
        per_end.setdefault(optic, []).append(f)
    for o in np.unique(frame.slot):
        fit = det.s_fit[o, SIG_Q]
        summary[int(o)] = {"margin_db": float(fit[F_LEVEL] - det.q_limit[o]), "trend_db_per_day": float(fit[F_SLOPE] * DAY_S),
                           "confidence": float(fit[F_CONF]), "fec_limit": float(det.fec_limit[o])}
    flags = {o: classify(per_end.get(o, [])) for o in summary}
    wall = time.perf_counter() - t_start

    # ---- table -------------------------------------------------------------------------------
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Alibaba pre-FEC BER: {len(summary)} channel ends, {len(frame):,} hourly samples")
    for col in ("channel end", "flag", "margin dB", "trend dB/day", "why (first finding)"):
        table.add_column(col)
    for o in sorted(summary, key=lambda o: (list(COLOURS).index(flags[o]), names[o])):
        if flags[o] == "steady":
            continue
        s = summary[o]
        first = per_end[o][0]
        table.add_row(names[o], flags[o], f"{s['margin_db']:.1f}", f"{s['trend_db_per_day']:+.3f}",
                      f"day {(first.ts - t0) / DAY_S:.1f}: {first.reason.split(': ', 1)[-1]}")
    Console(width=160).print(table)

    _plot(args.out, frame, names, summary, flags, per_end, t0)
    counts = {k: sum(1 for v in flags.values() if v == k) for k in COLOURS}
    print(f"{len(frame):,} samples in {wall:.1f} s; {sum(health.problems.values())} input problems counted; "
          f"figure: {args.out}")
    print(json.dumps({"name": "alibaba_optics", "channel_ends": len(summary), "samples": len(frame),
                      **{k.replace(" ", "_"): v for k, v in counts.items()},
                      "findings": sum(len(v) for v in per_end.values()), "wall_s": round(wall, 2),
                      "figure": str(args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out)}))


def _plot(out: Path, frame, names, summary, flags, per_end, t0: float) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(11, 5.6))
    grid = fig.add_gridspec(2, 3, width_ratios=[1.25, 1, 1], wspace=0.32, hspace=0.45)
    ax = fig.add_subplot(grid[:, 0])
    for flag, colour in COLOURS.items():
        pts = [(s["trend_db_per_day"], s["margin_db"]) for o, s in summary.items() if flags[o] == flag]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=22, color=colour, label=f"{flag} ({len(pts)})", zorder=3)
    for o, s in summary.items():
        if flags[o] == "worsening":
            ax.annotate(names[o], (s["trend_db_per_day"], s["margin_db"]), fontsize=6.5, xytext=(3, 2),
                        textcoords="offset points")
    ax.axvline(0, color="0.8", lw=0.8)
    ax.set_xlabel("Q trend at the end, dB/day (Theil-Sen, 7-day window)")
    ax.set_ylabel("margin above the FEC limit, dB (Q)")
    ax.set_title("Every channel end: margin vs trend", fontsize=10)
    ax.legend(fontsize=7.5, loc="upper right")
    # four flagged ends, worst first: worsening, then steps
    chosen = sorted((o for o in summary if flags[o] in ("link_down predicted", "worsening")),
                    key=lambda o: summary[o]["trend_db_per_day"])[:3]
    chosen += [o for o in summary if flags[o] == "step"][: 4 - len(chosen)]
    for k, o in enumerate(chosen[:4]):
        sub = fig.add_subplot(grid[k // 2, 1 + k % 2])
        m = frame.slot == o
        days = (frame.ts[m] - t0) / DAY_S
        sub.semilogy(days, frame.columns["prefec_ber"][m], lw=0.7, color="0.3")
        sub.axhline(summary[o]["fec_limit"], color="tab:red", ls="--", lw=0.8)
        for f in per_end.get(o, []):
            d = (f.ts - t0) / DAY_S
            if "jumped" in f.reason:
                sub.axvline(d, color="tab:blue", lw=1.0, alpha=0.8)
            elif "worsening" in f.reason:
                sub.axvline(d, color="tab:orange", lw=1.0, ls=":")
        sub.set_title(f"{names[o]}: {flags[o]}", fontsize=8.5, color=COLOURS[flags[o]])
        sub.tick_params(labelsize=7)
        sub.set_xlabel("day", fontsize=7.5)
        if k % 2 == 0:
            sub.set_ylabel("pre-FEC BER", fontsize=7.5)
    fig.suptitle("foreshock optics detector on the real Alibaba pre-FEC BER series "
                 "(red dashed: FEC limit; blue: step; dotted: trend warning)", fontsize=9.5)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
