"""The benchmark suite's plumbing (bench/run_all.py), without running a benchmark: every bench
script has a headline row and a stored result, run_all keeps only the JSON lines that name a
benchmark, and README's performance table is exactly what run_all generates from
bench/results.json (regenerate it with ``python bench/run_all.py --readme-only``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench_modules import load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_all() -> ModuleType:
    return load_bench("run_all")


def stored_results() -> list[dict]:  # type: ignore[type-arg]
    return json.loads((ROOT / "bench" / "results.json").read_text())["results"]  # type: ignore[no-any-return]


def test_every_bench_script_has_a_headline_and_a_stored_result(run_all: ModuleType) -> None:
    names = set(run_all.HEADLINES)
    for script in sorted((ROOT / "bench").glob("bench_*.py")):
        text = script.read_text()
        emitted = [n for n in names if f'"{n}"' in text]
        assert len(emitted) == 1, f"{script.name} names benchmarks {emitted}; give its JSON name a HEADLINES row"
    stored = [r["name"] for r in stored_results()]
    assert sorted(stored) == sorted(names), "bench/results.json should hold one entry per benchmark"


def test_readme_performance_table_is_generated_from_results_json(run_all: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(run_all.START):readme.index(run_all.END)]
    stored = json.loads((ROOT / "bench" / "results.json").read_text())
    # run_all writes the table with the run's date: an entry measured on another date says so
    assert run_all.table_markdown(stored["results"], stored["meta"]["date"]) in block, \
        "README's table differs from bench/results.json: run `python bench/run_all.py --readme-only`"


def test_run_collects_only_json_lines_with_a_name(run_all: ModuleType, tmp_path: Path) -> None:
    script = tmp_path / "fake_bench.py"
    script.write_text("import json\n"
                      "print('figures: 12 obs/s')\n"
                      "print(json.dumps({'no_name': 1}))\n"
                      "print('{not json')\n"
                      "print(json.dumps({'name': 'fake', 'obs_per_s': 12, 'obs_per_s_min': 11}))\n")
    assert run_all.run([sys.executable, str(script)], timeout=60) == [
        {"name": "fake", "obs_per_s": 12, "obs_per_s_min": 11}]
    table = run_all.table_markdown([{"name": "nab", "standard": 75.35, "reward_low_FP": 66.92, "reward_low_FN": 81.81,
                                     "thresholds": {}}])
    assert table.splitlines()[-1] == "| `nab` | standard **75.3**, low FP **66.9**, low FN **81.8** |"


def test_make_bench_runs_kafka_where_the_machine_allows(run_all: ModuleType, monkeypatch) -> None:
    """``auto``: with Java installed and the bench broker's port free; never with the port taken
    (``make test``'s broker uses the same fixed ports) or without Java."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            free = spare.getsockname()[1]  # bound, not listening: a connection is refused
            monkeypatch.setattr(run_all.shutil, "which", lambda name: "/usr/bin/java")
            assert run_all.kafka_wanted("auto", free)
            assert not run_all.kafka_wanted("auto", taken)
            monkeypatch.setattr(run_all.shutil, "which", lambda name: None)
            assert not run_all.kafka_wanted("auto", free)
            assert run_all.kafka_wanted("yes", taken) and not run_all.kafka_wanted("no", free)
