"""Fit a real GPU's thermal step response (a recording made by ``step_response.sh``).

For the core and the HBM sensor, fits ``T(t) = T0 + R * P_tau(t)`` — ``P_tau`` the GPU's power
(from the energy counter) through a first-order lag of time constant ``tau`` — by least squares
over a grid of ``tau``, on every phase except the memory-bound ``copy`` phase; then reports how
far the copy phase sits from that model (a total-power model cannot know where the power goes).
Writes ``OUT/step_fit.json`` and ``OUT/h200_step.png``::

    python deploy/device/analyse_step.py tests/data/h200_step/run1_500ms tests/data/h200_step/run2_100ms --out docs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from scipy.signal import lfilter  # noqa: E402

SENSORS = {"gpu_temp": "core", "hbm_temp": "HBM"}
TAUS = np.geomspace(0.1, 600.0, 120)


def load(run: Path) -> tuple[dict[str, np.ndarray], list[dict]]:
    table = pq.read_table(run / "gpu.parquet")
    cols = {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}
    phases = [json.loads(line) for line in (run / "phases.jsonl").read_text().splitlines() if line.strip()]
    return cols, phases


def mean_power(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Interval-mean power from the energy counter (the power reading is a short average)."""
    dt = np.diff(cols["ts"])
    return np.r_[cols["power"][0], np.diff(cols["energy"]) / dt]


def lag(power: np.ndarray, dt: float, tau: float) -> np.ndarray:
    a = np.exp(-dt / tau)
    return lfilter([1 - a], [1, -a], power, zi=[a * power[0]])[0]


def fit(ts: np.ndarray, temp: np.ndarray, power: np.ndarray, train: np.ndarray) -> dict[str, float]:
    dt = float(np.median(np.diff(ts)))
    best: dict[str, float] = {}
    for tau in TAUS:
        x = np.c_[np.ones_like(power), lag(power, dt, tau)]
        coef, *_ = np.linalg.lstsq(x[train], temp[train], rcond=None)
        rms = float(np.sqrt(np.mean((x[train] @ coef - temp[train]) ** 2)))
        if not best or rms < best["rms_c"]:
            best = {"tau_s": float(tau), "r_c_per_w": float(coef[1]), "t0_c": float(coef[0]), "rms_c": rms}
    return best


def analyse(run: Path) -> tuple[dict, dict[str, np.ndarray]]:
    cols, phases = load(run)
    ts = cols["ts"]
    power = mean_power(cols)
    spans = [(a["phase"], a["time"], b["time"]) for a, b in zip(phases, phases[1:])]
    copy = np.zeros(ts.size, bool)
    for name, start, end in spans:
        if name == "copy":
            copy |= (ts >= start) & (ts < end + 20)  # and the tail it leaves
    result: dict = {"run": run.name, "interval_s": float(np.median(np.diff(ts))), "gpu": phases[0]["gpu"],
                    "phases": [{"phase": n, "seconds": round(e - s, 1),
                                "median_power_w": round(float(np.median(cols["power"][(ts >= s + 5) & (ts < e)])), 1),
                                "core_c": float(np.median(cols["gpu_temp"][(ts >= e - 5) & (ts < e)])),
                                "hbm_c": float(np.median(cols["hbm_temp"][(ts >= e - 5) & (ts < e)]))}
                               for n, s, e in spans]}
    model = {}
    for sensor, label in SENSORS.items():
        f = fit(ts, cols[sensor], power, ~copy)
        pred = f["t0_c"] + f["r_c_per_w"] * lag(power, float(np.median(np.diff(ts))), f["tau_s"])
        f["copy_phase_bias_c"] = float(np.mean(cols[sensor][copy] - pred[copy]))
        result[label] = {k: round(v, 4) for k, v in f.items()}
        model[sensor] = pred
    return result, {"t": ts - phases[0]["time"], "power": power, **{k: cols[k] for k in SENSORS},
                    **{k + "_fit": v for k, v in model.items()}, "spans": spans, "t0": phases[0]["time"]}


def plot(series: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(len(series), 1, figsize=(11, 3.6 * len(series)), squeeze=False)
    colours = {"idle": "white", "matmul": "#fde0dd", "copy": "#deebf7"}
    for ax, s in zip(axes[:, 0], series):
        for name, start, end in s["spans"]:
            ax.axvspan(start - s["t0"], end - s["t0"], color=colours.get(name, "white"), lw=0)
            ax.text((start + end) / 2 - s["t0"], 1.0, name, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=8)
        for sensor, colour in (("gpu_temp", "tab:red"), ("hbm_temp", "tab:blue")):
            ax.plot(s["t"], s[sensor], color=colour, lw=1.2, label=f"{SENSORS[sensor]} measured")
            ax.plot(s["t"], s[sensor + "_fit"], color=colour, lw=0.8, ls="--", label=f"{SENSORS[sensor]} fit")
        ax.set_ylabel("°C")
        ax.set_xlabel("seconds from the start of the schedule")
        twin = ax.twinx()
        twin.plot(s["t"], s["power"], color="grey", lw=0.6, label="power")
        twin.set_ylabel("W")
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.suptitle("Real H200 step response (foreshock NVML source); dashed: first-order fit, copy phase held out")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results, series = [], []
    for run in args.runs:
        r, s = analyse(run)
        results.append(r)
        series.append(s)
        print(json.dumps(r))
    (args.out / "step_fit.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(series, args.out / "h200_step.png")


if __name__ == "__main__":
    main()
