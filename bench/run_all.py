"""Run every benchmark under bench/, print one table and each benchmark's JSON line.

Each benchmark is a script that prints figures and, last, a JSON line with a "name" key.
`--readme` rewrites the performance table in README.md (between the bench markers) from the
results, so the README always shows measured figures and the command that made them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results.json"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"

# Headline figures per benchmark: (JSON key, label). Anything else still lands in results.json.
HEADLINES: dict[str, list[tuple[str, str]]] = {
    "detector_bank_vs_river": [("foreshock_obs_per_s", "GPU obs/s"), ("river_obs_per_s", "river HST obs/s"),
                               ("ratio", "ratio"), ("state_bytes_per_gpu", "state B/GPU"),
                               ("fastest_tick_obs_per_s", "fastest tick obs/s")],
    "simulator": [("gpus", "GPUs at 1 s"), ("speed_x_realtime", "x real time (CPU time)"),
                  ("wall_speed_x_realtime", "x real time (wall)"), ("peak_rss_mib", "peak RSS MiB")],
    "replay_end_to_end": [("gpus", "GPUs"), ("samples_per_s", "samples/s"), ("speedup_vs_real_time", "x real time")],
    "parsers": [("dcgm_lines_per_s", "dcgm lines/s"), ("dmon_rows_per_s", "dmon rows/s"),
                ("alibaba_rows_per_s", "Alibaba rows/s"), ("ethtool_m_modules_per_s", "ethtool -m modules/s")],
    "fabric_detectors": [("port_obs_per_s", "port obs/s")],
    "generic_detectors": [("foreshock_points_per_s", "points/s"), ("ratio", "ratio vs river"),
                          ("state_bytes_per_series", "state B/series"),
                          ("river_hst_bytes_per_series", "river HST B/series")],
    "nab": [("standard", "standard"), ("reward_low_FP", "low FP"), ("reward_low_FN", "low FN")],
    "incident_engine": [("gpus", "GPUs"), ("findings_per_s", "findings/s"), ("memory_growth_mib", "24 h heap growth MiB")],
    "poll_cost": [("on", "on"), ("nvml_gpus", "GPUs"), ("nvml_ms_per_poll", "NVML ms/poll"),
                  ("nvml_ratio", "vs bare pynvml"), ("smi_ms_per_poll", "nvidia-smi ms/poll")],
    "kafka_end_to_end": [("gpus", "GPUs"), ("workers", "workers"), ("samples_per_s", "samples/s"),
                         ("latency_p50_s", "p50 s"), ("latency_p99_s", "p99 s"),
                         ("samples_per_worker_cpu_s", "per worker CPU s")],
}


def run(cmd: list[str], timeout: float) -> list[dict]:  # type: ignore[type-arg]
    return run_checked(cmd, timeout)[0]


def run_checked(cmd: list[str], timeout: float) -> tuple[list[dict], bool]:  # type: ignore[type-arg]
    """The JSON lines with a "name" that ``cmd`` prints, and whether it ran through (exit 0 in time)."""
    print(f"$ {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout:.0f} s", flush=True)
        return [], False
    out = []
    for line in proc.stdout.splitlines():
        print("  " + line)
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "name" in obj:
                out.append(obj)
    if proc.returncode != 0:
        print(f"  exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] if proc.stderr else ''}", flush=True)
    return out, proc.returncode == 0


def names_of(script: Path) -> set[str]:
    """The benchmarks (``HEADLINES`` names) whose JSON line ``script`` prints."""
    text = script.read_text()
    return {name for name in HEADLINES if f'"{name}"' in text}


REAL_HARDWARE = {"poll_cost": "nvml_real"}
"""Benchmarks that measure real hardware where a machine has it, and stand-ins where not, with the
key that says which: a run on stand-ins does not replace figures a lent GPU gave (until 2026-12-05
`make bench` on a machine without one overwrote the H200's poll cost with a stand-in script's)."""


def merge(old: list[dict], old_date: str, fresh: list[dict], ran: set[str],  # type: ignore[type-arg]
          failed: set[str], date: str) -> list[dict]:  # type: ignore[type-arg]
    """The results to save: each with the date it was measured (``measured``).

    ``fresh``: this run's, measured ``date``. ``ran``: the benchmarks whose scripts ran, ``failed``
    those of scripts that failed. An old entry (measured ``old_date`` unless it says) of a benchmark
    not run is kept with its own date; of a failed one, kept with its own date and marked
    ``stale`` (with ``failed``: this run's date), never passed off as this run's; of one that ran
    and no longer prints that name, dropped; of one measured on real hardware where this run had
    only stand-ins (``REAL_HARDWARE``), kept with its own date. Old entries keep their order; new
    ones follow."""
    now = {r["name"]: {**r, "measured": date} for r in fresh}
    out: list[dict] = []  # type: ignore[type-arg]
    for r in old:
        name = r["name"]
        real = REAL_HARDWARE.get(name)
        if name in now and real and r.get(real) and not now[name].get(real):
            now.pop(name)
            out.append({**r, "measured": r.get("measured", old_date)})
        elif name in now:
            out.append(now.pop(name))
        elif name in failed:
            out.append({**r, "measured": r.get("measured", old_date), "stale": True, "failed": date})
        elif name not in ran:
            out.append({**r, "measured": r.get("measured", old_date)})
    return out + list(now.values())


def fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def dated(r: dict, date: str | None) -> str:  # type: ignore[type-arg]
    """What to say beside an entry not measured on ``date`` (the run's): its own date, and that it
    is stale where its benchmark failed since."""
    measured = r.get("measured")
    if r.get("stale"):
        return f" (stale: measured {measured}; failed {r.get('failed', 'since')})"
    if date is not None and measured is not None and measured != date:
        return f" (measured {measured})"
    return ""


def table_markdown(results: list[dict], date: str | None = None) -> str:  # type: ignore[type-arg]
    lines = ["| benchmark | figures |", "| --- | --- |"]
    for r in results:
        keys = HEADLINES.get(r["name"], [(k, k) for k in r if k != "name"][:4])
        figures = ", ".join(f"{label} **{fmt(r[k])}**" for k, label in keys if k in r)
        lines.append(f"| `{r['name']}` | {figures}{dated(r, date)} |")
    return "\n".join(lines)


def write_readme(meta: dict, results: list[dict]) -> None:  # type: ignore[type-arg]
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START in text and END in text:
        block = (f"{START}\nMeasured {meta['date']} on {meta['machine']} (Python {meta['python']}) with "
                 f"`make bench` (median of runs; min and max in `bench/results.json`; an entry measured "
                 f"on another date says so):\n\n"
                 f"{table_markdown(results, meta['date'])}\n{END}")
        readme.write_text(text[: text.index(START)] + block + text[text.index(END) + len(END):])


def kafka_wanted(choice: str, port: int = 19092) -> bool:
    """Whether this machine can run the Kafka benchmark now (``auto``) or was told to."""
    if choice != "auto":
        return choice == "yes"
    if shutil.which("java") is None:
        return False
    with socket.socket() as probe:  # the bench's broker takes fixed ports
        return probe.connect_ex(("127.0.0.1", port)) != 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--readme", action="store_true", help="Rewrite README.md's performance table.")
    ap.add_argument("--kafka", choices=("auto", "yes", "no"), default="auto",
                    help="Also run `make bench-kafka` (starts its own broker on 127.0.0.1:19092): auto = "
                         "when Java is installed and that port is free (not while `make test`'s broker runs).")
    ap.add_argument("--only", default="", help="Comma-separated script names to run (default: all).")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--readme-only", action="store_true",
                    help="Rewrite README.md's table from the last bench/results.json without running anything.")
    args = ap.parse_args()
    if args.readme_only:
        saved = json.loads(RESULTS.read_text())
        write_readme(saved["meta"], saved["results"])
        return
    scripts = sorted(p for p in (ROOT / "bench").glob("bench_*.py") if p.name != "bench_kafka.py")
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        scripts = [p for p in scripts if p.stem in wanted or p.name in wanted]
    results: list[dict] = []  # type: ignore[type-arg]
    ran: set[str] = set()
    failed: set[str] = set()  # the benchmarks of scripts that failed: no figures of theirs this run
    failed_runs: list[str] = []  # the scripts (and make targets) that failed, said at the end
    for script in scripts:
        names = names_of(script)
        out, ok = run_checked([sys.executable, str(script.relative_to(ROOT))], args.timeout)
        ran |= names
        if ok:
            results += out
        else:  # lines printed before it failed are no measurement to stand on
            failed |= names | {r["name"] for r in out}
            failed_runs.append(script.name)
    # with --only, Kafka runs only when asked for (--kafka yes)
    with_kafka = args.kafka == "yes" if args.only else kafka_wanted(args.kafka)
    if with_kafka:
        out, ok = run_checked(["make", "--no-print-directory", "bench-kafka"], args.timeout)
        ran.add("kafka_end_to_end")
        if ok:
            results += out
        else:
            failed |= {"kafka_end_to_end"} | {r["name"] for r in out}
            failed_runs.append("make bench-kafka")
    elif args.kafka == "auto" and not args.only:
        print("kafka_end_to_end skipped: no `java` on PATH or 127.0.0.1:19092 in use "
              "(its last figures stay in bench/results.json, with their own date)", flush=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version()}
    old, old_date = [], meta["date"]
    if RESULTS.exists():
        saved = json.loads(RESULTS.read_text())
        old, old_date = saved["results"], saved["meta"]["date"]
    if not args.only:  # every script ran: an old entry none printed is a benchmark gone (Kafka aside)
        ran |= {r["name"] for r in old} - (set() if with_kafka else {"kafka_end_to_end"})
    # a benchmark not run keeps its last figures and their date; a failed one's are marked stale
    saved_all = merge(old, old_date, results, ran, failed, meta["date"])
    table = Table(title="foreshock benchmarks (median of runs; see each JSON line for min/max)")
    table.add_column("benchmark")
    table.add_column("figures")
    for r in saved_all:
        keys = HEADLINES.get(r["name"], [(k, k) for k in r if k != "name"][:4])
        table.add_row(r["name"], ", ".join(f"{label} {fmt(r[k])}" for k, label in keys if k in r)
                      + dated(r, meta["date"]))
    Console().print(table)
    RESULTS.write_text(json.dumps({"meta": meta, "results": saved_all}, indent=2) + "\n")
    if args.readme:
        write_readme(meta, saved_all)
    # one JSON line per benchmark; the replay throughput (the first benchmark, the one a user
    # running `make bench | tail -1` has always got) stays the last line
    for r in sorted(results, key=lambda r: r["name"] == "replay_end_to_end"):
        print(json.dumps(r))
    if failed_runs:
        print(f"FAILED: {', '.join(failed_runs)}: no figures this run"
              + (f"; the last ones of {', '.join(sorted(failed))} are kept marked stale" if failed else ""),
              file=sys.stderr, flush=True)
        sys.exit(1)

if __name__ == "__main__":
    main()
