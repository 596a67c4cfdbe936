"""``--via``: simulated frames through a real format and its importer (streams/via_format.py).

Expected resolutions and lost fields are written out here from the formats' documentation
(dcgm-exporter prints integer °C, MHz, percent, mJ and µs; nvidia-smi's query has no name for
the slowdown threshold, energy, XID or PCIe replays; sysfs counts data in 4-byte words and has
no PFC pause time), not read from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.fields import field_names
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.simulator import ClusterSimulator, formats
from foreshock.streams.via_format import VIA_KIND, ViaFormat, fields_not_carried

# Resolution of each carried field in base units (the grid the real format puts values on).
GPU_RESOLUTION = {
    "gpu_temp": 1.0, "hbm_temp": 1.0, "slowdown_temp": 1.0, "power": 1e-6, "power_limit": 1e-6, "energy": 1e-3,
    "sm_clock": 1e6, "sm_clock_max": 1e6, "util": 0.01, "throttle_reasons": 1.0, "power_throttle_time": 1e-6,
    "thermal_throttle_time": 1e-6, "xid_last": 1.0, "ecc_dbe": 1.0, "pcie_replays": 1.0, "remapped_rows": 1.0,
}
LINK_RESOLUTION = {name: 1.0 for name in field_names("link")} | {"tx_data": 4.0, "rx_data": 4.0}
LOST = {  # (board_id comes back from the UUID: a label, a string column, no name of the field table's)
    "dcgm": set(),
    "nvidia-smi": {"slowdown_temp", "energy", "xid_last", "pcie_replays", "max_op_temp", "hbm_max_op_temp"},
    "sysfs": {"pfc_pause_duration"},
}
EXACT = {"throttle_reasons", "xid_last", "link_state", "link_rate"}  # codes: never perturbed


def _sim(gpus: int = 16) -> ClusterSimulator:
    return ClusterSimulator(gpus=gpus, seed=1, params={"missing_prob": 0.0}, warmup_s=60)


def _off_grid(frame: Frame, resolution: dict[str, float], seed: int = 0) -> Frame:
    """The frame with every non-code value moved off its format's grid (so rounding must happen)."""
    rng = np.random.default_rng(seed)
    cols = {}
    for name, col in frame.columns.items():
        res = resolution.get(name)
        cols[name] = col if res is None or name in EXACT else col + rng.uniform(0.05, 0.95, len(col)) * res
    return Frame(frame.kind, frame.ts, frame.slot, cols)


def _host_links(sim: ClusterSimulator) -> np.ndarray:
    return np.flatnonzero(sim.topology.link_gpu >= 0)


@pytest.mark.parametrize("fmt", list(VIA_KIND))
def test_frames_come_back_on_the_formats_grid_for_the_same_entities(fmt: str) -> None:
    sim = _sim()
    tick = sim.step()
    kind = VIA_KIND[fmt]
    index = [f.kind for f in tick].index(kind)
    resolution = GPU_RESOLUTION if kind == "gpu" else LINK_RESOLUTION
    if fmt == "dcgm":  # DCGM's violation counters count nanoseconds (nvidia-smi's: microseconds)
        resolution = resolution | {"power_throttle_time": 1e-9, "thermal_throttle_time": 1e-9}
    original = _off_grid(tick[index], resolution)
    health = PipelineHealth()
    with ViaFormat(sim.topology, fmt, formats, health) as via:
        back = via.convert(original)
    assert health.total_problems() == 0, health.problems
    assert back.kind == kind
    np.testing.assert_array_equal(back.slot, original.slot)  # same GPUs / links, same order
    np.testing.assert_array_equal(back.ts, original.ts)
    assert set(fields_not_carried(fmt)) == LOST[fmt]
    rows = _host_links(sim) if fmt == "sysfs" else np.arange(len(back))
    compared = 0
    for name, res in resolution.items():
        got, want = back.columns[name][rows], original.columns[name][rows]
        if name in LOST[fmt]:
            assert np.isnan(got).all(), f"{name} has no {fmt} name but came back"
            continue
        if np.isnan(want).all():
            continue
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        ok = ~np.isnan(want)
        if name in EXACT:
            np.testing.assert_array_equal(got[ok], want[ok], err_msg=name)
        else:
            assert np.all(np.abs(got[ok] - want[ok]) <= 0.5 * res * (1 + 1e-9) + 1e-9 * np.abs(want[ok])), name
            steps = got[ok] / res
            np.testing.assert_allclose(steps, np.round(steps), rtol=1e-9, atol=1e-6, err_msg=f"{name} off the grid")
            assert not np.array_equal(got[ok], want[ok]), f"{name} came back unrounded: not through the format?"
        compared += 1
    assert compared >= (12 if kind == "gpu" else 14)
    if kind == "gpu":  # each GPU's board, from its UUID: the same number back (NaN in a failed read only)
        np.testing.assert_array_equal(back.columns["board_id"], original.columns["board_id"])
        assert np.isfinite(back.columns["board_id"]).all()
    if fmt == "sysfs":  # switch-to-switch links have no host sysfs: passed through untouched
        switch = np.flatnonzero(sim.topology.link_gpu[back.slot] < 0)
        assert len(switch) > 0
        for name in field_names("link"):
            np.testing.assert_array_equal(back.columns[name][switch], original.columns[name][switch])


@pytest.mark.parametrize(("fmt", "row_kept"), [("dcgm", False), ("nvidia-smi", True), ("sysfs", False)])
def test_a_missing_sample_is_what_the_real_source_shows(fmt: str, row_kept: bool) -> None:
    """dcgm-exporter and sysfs leave a sample they could not read out; nvidia-smi prints [N/A].
    The second tick also checks that sysfs reads a fresh tree (no port left over from tick 1)."""
    sim = _sim()
    kind = VIA_KIND[fmt]
    health = PipelineHealth()
    with ViaFormat(sim.topology, fmt, formats, health) as via:
        first = next(f for f in sim.step() if f.kind == kind)
        assert len(via.convert(first)) == len(first)
        frame = next(f for f in sim.step() if f.kind == kind)
        gone = int(_host_links(sim)[3]) if kind == "link" else 3
        cols = {name: col.copy() for name, col in frame.columns.items()}
        for col in cols.values():
            col[gone] = np.nan
        back = via.convert(Frame(kind, frame.ts, frame.slot, cols))
    assert health.total_problems() == 0, health.problems  # a left-over sysfs port would be an unknown link
    assert (gone in back.slot) == row_kept
    assert len(back) == len(frame) - (0 if row_kept else 1)
    if row_kept:
        assert all(np.isnan(back.columns[name][back.slot == gone]).all() for name in field_names(kind))


def test_other_kinds_pass_through_and_the_scratch_tree_is_removed(tmp_path: Path) -> None:
    sim = _sim()
    ticks = [sim.step() for _ in range(2)]
    via = ViaFormat(sim.topology, "sysfs", formats, scratch=tmp_path)
    out = list(via.frames(f for tick in ticks for f in tick))
    assert [f.kind for f in out] == [f.kind for tick in ticks for f in tick]
    for got, want in zip(out, (f for tick in ticks for f in tick)):
        if got.kind != "link":
            assert got is want
    assert list(tmp_path.iterdir()) == []  # the generator cleaned up after itself


class _BrokenRenderers:
    """The real writers, with the kinds of damage a real capture shows."""

    @staticmethod
    def dcgm_exposition(frame: Frame, topology: object) -> str:
        text = formats.dcgm_exposition(frame, topology)  # type: ignore[arg-type]
        return text + 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname=node0} 41\nDCGM_FI_DEV_POWER_USAGE{gpu="1",Hostname="nowhere"} 7\n'

    @staticmethod
    def nvidia_smi_csv(frame: Frame, topology: object, node: str) -> str:
        header, first, *rest = formats.nvidia_smi_csv(frame, topology, node).splitlines()  # type: ignore[arg-type]
        cells = first.split(", ")
        cells[2] = "hot"  # the first field column: a value that is not a number
        return "\n".join([header, ", ".join(cells), *rest]) + "\n"

    @staticmethod
    def infiniband_sysfs(frame: Frame, topology: object, node: str, root: str | Path) -> dict[str, str]:
        names = formats.infiniband_sysfs(frame, topology, node, root)  # type: ignore[arg-type]
        (Path(root) / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error").write_text("lots\n")
        return names


@pytest.mark.parametrize(("fmt", "stage", "reasons"), [
    ("dcgm", "dcgm", {"malformed labels", "unknown gpu entity"}),
    ("nvidia-smi", "nvidia-smi", {"non-numeric value"}),
    ("sysfs", "infiniband", {"non-numeric counter value"}),
])
def test_parse_problems_are_counted_under_the_importers_stage(fmt: str, stage: str, reasons: set[str]) -> None:
    sim = _sim()
    health = PipelineHealth()
    with ViaFormat(sim.topology, fmt, _BrokenRenderers(), health) as via:
        via.tick(sim.step())
    assert {reason for (s, reason) in health.problems if s == stage} == reasons


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown format"):
        ViaFormat(_sim().topology, "snmp", formats)


# ---- command line ----------------------------------------------------------------------------------
def _simulate(out: Path, *extra: str) -> dict[str, float]:
    # 60 ticks of 16 GPUs: at the default 5e-4 a sample or two is missing (seed 0 has some)
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "16", "--duration", "300", "--interval", "5", "--seed",
                                      "0", "--out", str(out), "--no-progress", *extra])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert set(last) == {"gpus", "simulated_seconds", "wall_seconds", "faults", "events"}
    return last  # type: ignore[no-any-return]


def test_simulate_via_dcgm_records_what_the_importer_delivers(tmp_path: Path) -> None:
    direct, via = tmp_path / "direct", tmp_path / "via"
    a, b = _simulate(direct), _simulate(via, "--via", "dcgm")
    assert a["events"] == b["events"]  # the physics does not see the format
    rec_a, rec_b = Recording.open(direct), Recording.open(via)
    assert rec_b.meta["via"] == "dcgm" and "via" not in rec_a.meta
    gpu_a, gpu_b = rec_a.read_kind("gpu"), rec_b.read_kind("gpu")
    # a GPU row the exporter could not read is missing, every other one is there
    key_a = {(t, s): i for i, (t, s) in enumerate(zip(gpu_a.ts, gpu_a.slot))}
    rows = np.array([key_a[(t, s)] for t, s in zip(gpu_b.ts, gpu_b.slot)])
    dropped = np.setdiff1d(np.arange(len(gpu_a)), rows)
    np.testing.assert_array_equal(dropped, np.flatnonzero(np.isnan(gpu_a.matrix()).all(axis=1)))
    for name, res in GPU_RESOLUTION.items():
        want, got = gpu_a.columns[name][rows], gpu_b.columns[name]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        ok = ~np.isnan(want)
        assert np.all(np.abs(got[ok] - want[ok]) <= 0.5 * res + 1e-9 * np.abs(want[ok])), name
    for kind in ("link", "optic", "node", "rack", "job"):  # untouched by --via dcgm
        np.testing.assert_array_equal(rec_a.read_kind(kind).matrix(), rec_b.read_kind(kind).matrix())


@pytest.mark.parametrize("fmt", ["nvidia-smi", "sysfs"])
def test_simulate_via_records_nan_for_the_fields_the_format_lacks(tmp_path: Path, fmt: str) -> None:
    _simulate(tmp_path / "rec", "--via", fmt)
    rec = Recording.open(tmp_path / "rec")
    assert rec.meta["via"] == fmt
    frame = rec.read_kind(VIA_KIND[fmt])
    rows = rec.topology.link_gpu[frame.slot] >= 0 if fmt == "sysfs" else np.ones(len(frame), dtype=bool)
    assert rows.any()
    for name in field_names(frame.kind):
        lost = np.isnan(frame.columns[name][rows]).all()
        assert lost == (name in LOST[fmt]), name
    if fmt == "sysfs":
        assert np.all(frame.columns["tx_data"][rows] % 4 == 0)


def test_demo_feeds_the_detectors_through_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    import foreshock.cli.demo as demo

    converted: list[str] = []

    class Spy(ViaFormat):
        def convert(self, frame: Frame) -> Frame:
            out = super().convert(frame)
            if frame.kind == self.kind:
                converted.append(self.format)
            return out

    monkeypatch.setattr(demo, "ViaFormat", Spy)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["demo", "--gpus", "16", "--duration", "60", "--interval", "10", "--port", "0",
              "--detectors", "throttle_bits", "--via", "nvidia-smi"])
    assert result.exit_code == 0, result.output
    assert converted == ["nvidia-smi"] * 6
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["name"] == "demo" and summary["samples"] > 0
