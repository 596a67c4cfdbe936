"""Link-down prediction and rerouted-congestion detection on simulator recordings, several seeds.

For each seed: ``foreshock simulate --scenario optic-degradation --random-faults --seed S``
(skipped when the recording exists), then the evaluation harness (the same code as
``foreshock evaluate``) with the ``link_down`` event kind and the ``congestion`` section. One
recording holds one scripted optic failure plus whatever the random faults add, so the figures
are given per seed and pooled over all seeds: recall (hits / episodes), the median and p10 lead
over every predicted episode (each seed's ``leads_s`` from the harness, pooled: its rule, not
a looser one of the bench's), precision (true / all judged claims), and congestion found within
two samples with the failed link named.

    .venv/bin/python bench/eval_fabric.py --seeds 101,102,103,104,105,106 --dir /tmp/fabric-eval
    .venv/bin/python bench/eval_fabric.py --seeds 108 --interval 30 --detectors fabric --dir /tmp/fabric-eval/i30

Prints a line per seed and the pooled figures, then a JSON line with ``"name": "fabric_evaluation"``. The seeds must be ones
the detectors were not tuned on (development used seeds 3 and 11).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from foreshock.detectors import evaluation
from foreshock.detectors.evaluation_fabric import score_congestion
from foreshock.recording import Recording

ROOT = Path(__file__).resolve().parents[1]
FORESHOCK = str(Path(sys.executable).parent / "foreshock")

evaluation.DETECTOR_SETS.setdefault("fabric", ("congestion", "link_errors", "optics"))


def simulate(out: Path, seed: int, args: argparse.Namespace) -> None:
    if (out / "recording.json").exists():
        return
    cmd = [FORESHOCK, "simulate", "--scenario", args.scenario, "--random-faults", "--seed", str(seed),
           "--out", str(out), "--no-progress", "--interval", str(args.interval), "--counter-bits",
           str(args.counter_bits)]
    if args.gpus:
        cmd += ["--gpus", str(args.gpus)]
    if args.duration:
        cmd += ["--duration", str(args.duration)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def claims(m: dict, hours: float) -> tuple[int, int]:  # type: ignore[type-arg]
    """(true, false) claims behind one recording's figures. The harness reports precision and the
    false-alarm rate, not the counts: false claims = rate x entity-hours / 1000 (exact); true
    claims = precision x false / (1 - precision) when there are false ones, else the number of
    predicted episodes (each consumed one true claim), so the pooled precision is exact whenever
    a recording has a false claim and otherwise 1.0 either way."""
    fp = round((m["false_alarms_per_1000_gpu_hours"] or 0.0) * hours / 1000.0)
    if m["precision"] is None:
        return 0, fp
    if fp == 0:
        return round((m["recall"] or 0.0) * m["episodes"]), 0
    return round(m["precision"] * fp / (1.0 - m["precision"])), fp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="101,102,103,104,105,106")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/fabric-eval"))
    ap.add_argument("--scenario", default="optic-degradation")
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--counter-bits", type=int, default=64, choices=(32, 64))
    ap.add_argument("--detectors", default="foreshock", help="detector set (foreshock = the default bank)")
    args = ap.parse_args()
    kind = evaluation.EVENT_KINDS["link_down"]
    rows: list[tuple[int, dict[str, Any], dict[str, Any], list[str]]] = []
    leads: list[float] = []
    totals = {"episodes": 0, "hits": 0, "true": 0, "false": 0, "rerouted": 0, "found": 0, "named": 0,
              "congestion_false_alarms": 0}
    t0 = time.perf_counter()
    for seed in (int(s) for s in args.seeds.split(",")):
        path = args.dir / f"{args.scenario}-{seed}"
        simulate(path, seed, args)
        rec = Recording.open(path)
        result = evaluation.run_recording(rec, [args.detectors])
        findings = result.findings[args.detectors]
        links = result.entities_observed("link")  # (the rate's denominator, as the report's)
        m = evaluation.score_kind(findings, result.events, kind, rec, result.start, result.end, entities=links)
        # the harness's own leads, by its rule (an alarm predicts only the first episode after it
        # was raised; one raised during an episode, or a warm-up episode, is not scored), so the
        # pooled lead is the per-seed figures' and not a looser count of its own
        leads.extend(m.get("leads_s") or ())
        tp, fp = claims(m, result.duration_s / 3600.0 * links)
        cong = score_congestion(result)["detectors"][args.detectors]
        totals["episodes"] += m["episodes"]
        totals["hits"] += round((m["recall"] or 0.0) * m["episodes"])
        totals["true"] += tp
        totals["false"] += fp
        totals["rerouted"] += cong["rerouted_episodes"]
        totals["found"] += cong["found"]
        totals["named"] += cong["cause_named"]
        totals["congestion_false_alarms"] += cong["false_alarms"]
        faults = [f"{f['type']}" for f in rec.meta.get("faults", [])]
        rows.append((seed, m, cong, faults))
        print(f"seed {seed}: faults {faults}; link_down episodes {m['episodes']}, recall {m['recall']}, "
              f"precision {m['precision']}, lead median {m['lead_median_s']} s; rerouted congestion "
              f"{cong['found']}/{cong['rerouted_episodes']} found within 2 samples, cause named "
              f"{cong['cause_named']}, missed {cong['missed']}", flush=True)
    lead = np.asarray(leads)
    pooled = {
        "seeds": args.seeds, "scenario": args.scenario, "detectors": args.detectors,
        "link_down_episodes": totals["episodes"],
        "link_down_recall": round(totals["hits"] / totals["episodes"], 4) if totals["episodes"] else None,
        "link_down_precision": (round(totals["true"] / (totals["true"] + totals["false"]), 4)
                                if totals["true"] + totals["false"] else None),
        "link_down_false_claims": totals["false"],
        "link_down_lead_median_s": round(float(np.median(lead)), 1) if len(lead) else None,
        "link_down_lead_p10_s": round(float(np.percentile(lead, 10)), 1) if len(lead) else None,
        "congestion_rerouted_episodes": totals["rerouted"],
        "congestion_found_within_2_samples": totals["found"],
        "congestion_cause_named": totals["named"],
        "congestion_false_alarms": totals["congestion_false_alarms"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(f"pooled over {len(rows)} seeds: link_down recall {pooled['link_down_recall']} "
          f"({totals['hits']}/{totals['episodes']}), precision {pooled['link_down_precision']} "
          f"({totals['false']} false claims), lead median "
          f"{(pooled['link_down_lead_median_s'] or math.nan) / 60:.0f} min, p10 "
          f"{(pooled['link_down_lead_p10_s'] or math.nan) / 60:.0f} min; rerouted congestion "
          f"{totals['found']}/{totals['rerouted']} found within 2 samples, cause named {totals['named']}")
    print(json.dumps({"name": "fabric_evaluation", **pooled}))


if __name__ == "__main__":
    main()
