"""What the benchmarks count and compare: each port observation counted once (bench_fabric), the
bare pynvml loop making NvmlSource's calls (bench_poll), a failed benchmark's figures never passed
off as the new run's (run_all), the default bank's GPU detectors asked of the registry
(bench_gpu_bank). Without running a benchmark."""

from __future__ import annotations

import collections
import json
import sys
import types
from pathlib import Path
from typing import Any, Callable

import pytest
from bench_modules import load_bench

from foreshock.detectors.registry import DEFAULT_BANK
from foreshock.health import PipelineHealth
from foreshock.streams.nvml import NvmlSource


# ---- bench_fabric --------------------------------------------------------------------------------
class _Reader:
    def update(self, frame: Any) -> list[Any]:
        return []


def test_fabric_rate_counts_each_row_once_however_many_detectors_read_it(monkeypatch) -> None:
    fabric = load_bench("bench_fabric")
    ticks = iter([10.0, 11.0])  # one second of "CPU time" between the start and the end
    monkeypatch.setattr(fabric, "CLOCK", lambda: next(ticks))
    links = [[0] * 7 for _ in range(3)]  # three ticks of 7 link rows
    optics = [[0] * 5 for _ in range(3)]  # and of 5 optic rows
    # congestion and link_errors both read the link frames: their rows are still 3 * 7
    rate = fabric.rate_of([(_Reader, links), (_Reader, links), (_Reader, optics)])
    assert rate == 3 * 7 + 3 * 5


# ---- bench_poll ----------------------------------------------------------------------------------
def _counting(nv: types.ModuleType) -> tuple[types.ModuleType, list[tuple[str, tuple[Any, ...]]]]:
    """``nv`` with its device calls logged (the test's own, not the bench's)."""
    log: list[tuple[str, tuple[Any, ...]]] = []
    proxy = types.ModuleType("counted")
    proxy.__dict__.update({k: v for k, v in vars(nv).items() if not k.startswith("__")})
    for name, fn in vars(nv).items():
        if name.startswith("nvmlDevice") and callable(fn):
            def call(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name) -> Any:
                log.append((_name, tuple(tuple(a) if isinstance(a, list) else a for a in args[1:])))
                return _fn(*args)
            setattr(proxy, name, call)
    return proxy, log


def test_bare_loop_makes_the_calls_nvml_source_makes_each_poll() -> None:
    poll = load_bench("bench_poll")
    nv, log = _counting(poll.stand_in_nvml(2))
    source = NvmlSource(interval=1.0, health=PipelineHealth(), nvml=nv)
    bare = poll.bare_nvml_poll(nv, [h for h in source.handles if h is not None])
    counts = {}
    for label, fn in (("source", source.read), ("bare", bare)):
        fn()
        fn()  # the bench's two warm-up polls: the slow fields read once
        del log[:]
        for _ in range(20):
            fn()
        counts[label] = collections.Counter(log)
    assert counts["bare"] == counts["source"]
    assert ("nvmlDeviceGetMaxClockInfo", (1,)) not in counts["bare"]  # read once a minute, not per poll
    assert counts["bare"][("nvmlDeviceGetFieldValues", ((74,),))] == 2 * 20  # the power violation counter


def test_bench_poll_checks_the_calls_over_slow_field_readings() -> None:
    poll = load_bench("bench_poll")
    # 130 polls 1 s apart: the thresholds and the max clock read three times, at the same polls
    assert poll.calls_differ(poll.stand_in_nvml(2), polls=130) == []


def test_bench_poll_check_sees_a_loop_that_drifts(monkeypatch) -> None:
    poll = load_bench("bench_poll")
    mirror = poll.bare_nvml_poll

    def drifted(nv: types.ModuleType, handles: list[Any], clock: Callable[[], float]) -> Callable[[], Any]:
        inner = mirror(nv, handles, clock)

        def poll_() -> Any:
            for h in handles:
                nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)  # every poll: what the old loop did
            return inner()
        return poll_

    monkeypatch.setattr(poll, "bare_nvml_poll", drifted)
    differ = poll.calls_differ(poll.stand_in_nvml(1), polls=3)
    assert len(differ) == 3 and all("only the bare loop ['nvmlDeviceGetMaxClockInfo(1,)']" in d for d in differ)


# ---- run_all -------------------------------------------------------------------------------------
OLD_DATE = "2000-01-01"


@pytest.fixture()
def bench_root(tmp_path: Path, monkeypatch) -> tuple[types.ModuleType, Path]:
    """run_all over a scratch root holding results of OLD_DATE for parsers and nab, and a README."""
    run_all = load_bench("run_all")
    (tmp_path / "bench").mkdir()
    old = [{"name": "parsers", "dcgm_lines_per_s": 111}, {"name": "nab", "standard": 1.0}]
    (tmp_path / "bench" / "results.json").write_text(json.dumps({"meta": {"date": OLD_DATE}, "results": old}))
    (tmp_path / "README.md").write_text(f"intro\n{run_all.START}\nold table\n{run_all.END}\n")
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    monkeypatch.setattr(run_all, "RESULTS", tmp_path / "bench" / "results.json")
    return run_all, tmp_path


def _main(run_all: types.ModuleType, monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["run_all.py", *argv])
    run_all.main()


def test_run_all_fails_and_marks_a_failed_benchmarks_figures_stale(bench_root, monkeypatch) -> None:
    run_all, root = bench_root
    (root / "bench" / "bench_parsers.py").write_text(
        'raise SystemExit("data file missing")  # would emit("parsers", ...)\n')
    with pytest.raises(SystemExit) as exit_:
        _main(run_all, monkeypatch, "--only", "bench_parsers", "--readme")
    assert exit_.value.code not in (0, None)
    saved = json.loads((root / "bench" / "results.json").read_text())
    parsers = next(r for r in saved["results"] if r["name"] == "parsers")
    assert saved["meta"]["date"] != OLD_DATE
    assert parsers["stale"] is True and parsers["measured"] == OLD_DATE
    row = next(line for line in (root / "README.md").read_text().splitlines() if line.startswith("| `parsers`"))
    assert "stale" in row and OLD_DATE in row


def test_run_all_keeps_each_entrys_own_measurement_date(bench_root, monkeypatch) -> None:
    run_all, root = bench_root
    (root / "bench" / "bench_nab.py").write_text(
        'import json\nprint(json.dumps({"name": "nab", "standard": 2.0}))\n')
    _main(run_all, monkeypatch, "--only", "bench_nab", "--readme")
    saved = json.loads((root / "bench" / "results.json").read_text())
    by_name = {r["name"]: r for r in saved["results"]}
    assert by_name["nab"]["standard"] == 2.0 and by_name["nab"]["measured"] == saved["meta"]["date"]
    assert by_name["parsers"]["measured"] == OLD_DATE and "stale" not in by_name["parsers"]  # not run: kept
    readme = (root / "README.md").read_text()
    assert f"(measured {OLD_DATE})" in next(line for line in readme.splitlines() if line.startswith("| `parsers`"))


def test_run_all_keeps_a_real_gpus_poll_cost_over_a_stand_ins(bench_root, monkeypatch) -> None:
    """The lent H200's poll cost stays when a machine without a GPU runs the benchmark on stand-ins;
    a run on real hardware replaces it."""
    run_all, root = bench_root
    results = root / "bench" / "results.json"
    real = {"name": "poll_cost", "on": "NVIDIA H200", "nvml_real": True, "nvml_ms_per_poll": 4.28,
            "measured": "2026-12-04"}
    results.write_text(json.dumps({"meta": {"date": OLD_DATE}, "results": [real]}))
    script = root / "bench" / "bench_poll.py"
    script.write_text('import json\nprint(json.dumps({"name": "poll_cost", "on": "stand-ins", "nvml_real": False, '
                      '"nvml_ms_per_poll": 0.26}))\n')
    _main(run_all, monkeypatch, "--only", "bench_poll", "--readme")
    assert json.loads(results.read_text())["results"] == [real]
    assert "(measured 2026-12-04)" in (root / "README.md").read_text()
    script.write_text(script.read_text().replace('"nvml_real": False', '"nvml_real": True'))
    _main(run_all, monkeypatch, "--only", "bench_poll", "--readme")
    (poll,) = json.loads(results.read_text())["results"]
    assert poll["nvml_ms_per_poll"] == 0.26 and poll["measured"] != "2026-12-04"


# ---- bench_gpu_bank ------------------------------------------------------------------------------
def test_gpu_bank_compares_with_every_default_detector_taking_gpu_frames() -> None:
    bank = load_bench("bench_gpu_bank")
    names = bank.default_gpu_detectors(bank.cluster(64))
    assert set(bank.GPU_BANK) < set(names) <= set(DEFAULT_BANK)
    assert {"robust_zscore", "throttle_bits", "xid"} <= set(names)
    assert not {"congestion", "link_errors", "optics"} & set(names)
