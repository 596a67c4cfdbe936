"""Helpers every benchmark shares: repeat, summarise (median, min, max), print a JSON line."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable


def repeat(fn: Callable[[], float], runs: int = 5, warmup: int = 1) -> dict[str, float]:
    """Call ``fn`` (which returns a rate or a duration) ``runs`` times after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    return summary([fn() for _ in range(runs)])


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and count of ``values`` (rates or durations), as :func:`repeat` gives them."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def emit(name: str, **figures: Any) -> None:
    """Print the benchmark's JSON line; `bench/run_all.py` collects the lines with a "name"."""
    print(json.dumps({"name": name, **figures}, sort_keys=False), flush=True)
