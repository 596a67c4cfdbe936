"""The ground floor: field table, topology, frames, recordings and their error messages."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.events import Event, EventError, read_events
from foreshock.fields import ENTITY_KINDS, field_names, fields_of, get_field, load_fields, source_index
from foreshock.frames import Frame, FrameError, frames_from_records
from foreshock.recording import Recording, RecordingError, RecordingWriter
from foreshock.topology import Topology, TopologyError


# ---- field table -----------------------------------------------------------------------------
def test_field_table_covers_every_kind_with_base_units() -> None:
    fields = load_fields()
    assert {f.kind for f in fields} == set(ENTITY_KINDS)
    allowed_units = {"celsius", "watts", "joules", "hertz", "ratio", "bitmask", "seconds", "code", "errors",
                     "replays", "rows", "bytes", "ticks", "packets", "events", "state", "bits_per_second",
                     "volts", "amperes", "dbm", "bits", "flag", "liters_per_second"}
    assert {f.unit for f in fields} <= allowed_units
    for f in fields:
        assert f.help, f.name
        if f.is_counter:
            assert f.unit not in ("celsius", "watts", "ratio", "dbm"), f"{f.name}: a counter of a gauge unit"


def test_field_table_names_required_fields_per_kind() -> None:
    gpu = set(field_names("gpu"))
    assert {"gpu_temp", "hbm_temp", "power", "power_limit", "energy", "sm_clock", "sm_clock_max", "util",
            "throttle_reasons", "power_throttle_time", "thermal_throttle_time", "xid_last", "ecc_dbe",
            "pcie_replays", "remapped_rows"} <= gpu
    link = set(field_names("link"))
    assert {"tx_data", "rx_data", "xmit_wait", "pfc_pause_duration", "ecn_marked", "cnp_sent", "symbol_error",
            "link_downed", "link_error_recovery", "rcv_errors", "xmit_discards", "link_state", "link_rate"} <= link
    optic = set(field_names("optic"))
    assert {"module_temp", "module_voltage", "tx_bias", "tx_power", "rx_power", "rx_bits",
            "rx_corrected_bits", "prefec_ber", "los"} <= optic
    assert {"inlet_temp", "coolant_temp", "coolant_flow"} <= set(field_names("rack"))
    assert "cnp_handled" in link and "psu_power" in set(field_names("node"))


def test_field_table_names_each_field_in_the_real_sources() -> None:
    """The issue's sources, one column each, with the names the importers look up (FACTS.md)."""
    assert source_index("dcgm")["DCGM_FI_DEV_MEMORY_TEMP"][0].name == "hbm_temp"
    assert source_index("nvidia_smi")["clocks_event_reasons.active"][0].name == "throttle_reasons"
    assert source_index("dmon")["mtemp"][0].name == "hbm_temp"
    assert source_index("sysfs")["port_xmit_wait"][0].name == "xmit_wait"
    assert source_index("dom")["Rcvr signal avg optical power"][0].name == "rx_power"


def test_source_names_carry_unit_conversion() -> None:
    dcgm = source_index("dcgm")
    energy, scale = dcgm["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.name == "energy" and scale == pytest.approx(1e-3)  # mJ -> J
    # both the legacy and the DCGM 4.6 names map to the same field
    assert dcgm["DCGM_FI_DEV_GPU_TEMP"][0] is dcgm["DCGM_FI_DEV_GPU_TEMP_CELSIUS"][0]
    assert dcgm["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"][0].name == "throttle_reasons"
    assert source_index("sysfs")["port_xmit_data"] == (get_field("tx_data"), 4.0)  # 4-byte words
    assert source_index("dmon")["pclk"][1] == pytest.approx(1e6)  # MHz -> Hz
    with pytest.raises(ValueError, match="unknown source"):
        source_index("snmp")


def test_fields_of_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown entity kind 'switch'"):
        fields_of("switch")


# ---- topology --------------------------------------------------------------------------------
def test_topology_slots_and_relations(small_topology: Topology) -> None:
    t = small_topology
    assert t.size("gpu") == 32 and t.size("node") == 4 and t.size("link") == 40 and t.size("optic") == 80
    g = t.slot("gpu", "node3/gpu5")
    assert g == 3 * 8 + 5
    assert t.nodes[t.gpu_node[g]] == "node3"
    assert t.racks[t.gpu_rack[g]] == "rack1"
    assert t.loops[t.rack_loop[t.gpu_rack[g]]] == "cdu1"
    assert t.jobs[t.gpu_job[g]] == "job1"
    link = t.slot("link", "node3/gpu5~leaf5")
    assert t.link_gpu[link] == g and t.switches[t.link_leaf[link]] == "leaf5"
    assert t.link_leaf[t.slot("link", "leaf5~spine0")] == -1
    assert t.name("optic", 2 * link + 1) == "node3/gpu5~leaf5#b"
    assert t.labels("gpu", g) == {"cluster": "test", "rack": "rack1", "node": "node3", "gpu": "5"}
    assert list(t.slots("gpu", ["node0/gpu0", "nope"])) == [0, -1]


def test_topology_yaml_round_trip(small_topology: Topology, tmp_path) -> None:
    small_topology.dump(tmp_path / "t.yaml")
    again = Topology.load(tmp_path / "t.yaml")
    assert again.gpus == small_topology.gpus and again.links == small_topology.links
    np.testing.assert_array_equal(again.gpu_job, small_topology.gpu_job)
    np.testing.assert_array_equal(again.link_b_switch, small_topology.link_b_switch)


@pytest.mark.parametrize("doc, message", [
    ("- just a list", "expected a mapping"),
    ("rows: []\nracks: [{name: r0, row: nowhere}]\nnodes: []", "rack 'r0' refers to unknown row 'nowhere'"),
    ("rows: [{name: a}]\nracks: [{name: r, row: a}]\nnodes: [{name: n, rack: r, gpus: -2}]", "invalid 'gpus'"),
    ("rows: [{name: a}]\nracks: [{name: r, row: a}]\nnodes: [{name: n, rack: r}, {name: n, rack: r}]", "duplicate"),
    ("rows: [{name: a}]\nracks: [{name: r, row: a}]\nnodes: []\nlinks: [{name: l, a: x, b: y}]", "unknown switch 'y'"),
    ("rows: [{name: a}\n", "not valid YAML"),
    # an empty name was accepted: an empty label on every series, GPUs named "/gpu0"
    ("rows: [{name: a}]\nracks: [{name: r, row: a}]\nnodes: [{name: '', rack: r}]", r"nodes\[0\] has an empty name ''"),
    ("rows: [{name: a}]\nracks: [{name: ' ', row: a}]\nnodes: []", r"racks\[0\] has an empty name ' '"),
    # `jobs:` with nothing after it (YAML null) read as "missing 'jobs'"
    ("rows: [{name: a}]\nracks: [{name: r, row: a}]\nnodes: []\njobs:\n", "'jobs' is empty \\(null\\).*or no 'jobs' at all"),
    ("rows:\nracks: []\nnodes: []", "'rows' is empty \\(null\\): expected a list of mappings"),
])
def test_topology_errors_name_the_problem(tmp_path, doc: str, message: str) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(doc)
    with pytest.raises(TopologyError, match=message) as err:
        Topology.load(path)
    assert str(path) in str(err.value)


# ---- frames ----------------------------------------------------------------------------------
def test_frame_fills_missing_fields_with_nan_and_round_trips_arrow_ipc() -> None:
    f = Frame("gpu", [1.0, 2.0], [3, 4], {"gpu_temp": [50.0, np.nan], "power": [600, 610]})
    assert np.isnan(f.columns["hbm_temp"]).all()
    g = Frame.from_ipc(f.to_ipc())
    assert g.kind == "gpu"
    np.testing.assert_array_equal(g.slot, [3, 4])
    np.testing.assert_array_equal(g.columns["power"], [600.0, 610.0])
    assert np.isnan(g.columns["gpu_temp"][1])
    assert g.matrix().shape == (2, len(field_names("gpu")))


@pytest.mark.parametrize("build, message", [
    (lambda: Frame("gpu", [1.0], [1, 2], {}), "ts has 1 rows, slot has 2"),
    (lambda: Frame("gpu", [1.0], [1], {"rx_power": [1.0]}), "unknown fields"),
    (lambda: Frame("gpu", [1.0], [1], {"power": [1.0, 2.0]}), "column power has 2 rows"),
])
def test_frame_rejects_malformed_input(build, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        build()


def test_from_ipc_rejects_garbage_and_wrong_schema() -> None:
    with pytest.raises(FrameError, match="not an Arrow IPC stream"):
        Frame.from_ipc(b"\x00garbage bytes")
    batch = pa.RecordBatch.from_pydict({"ts": [1.0], "slot": [0], "power": ["hot"]},
                                       ).replace_schema_metadata({b"foreshock.kind": b"gpu"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    with pytest.raises(FrameError, match="'power' is string"):
        Frame.from_ipc(sink.getvalue().to_pybytes())


def test_frames_from_records_rejects_each_bad_record_with_a_reason(small_topology: Topology) -> None:
    records = [
        {"kind": "gpu", "entity": "node0/gpu1", "ts": 10, "gpu_temp": 61},
        {"kind": "gpu", "entity": "node9/gpu1", "ts": 10, "gpu_temp": 61},
        {"kind": "gpu", "entity": "node0/gpu1", "ts": "later"},
        {"kind": "gpu", "entity": "node0/gpu1", "ts": 11, "gpu_temp": "hot"},
        {"kind": "toaster", "entity": "x", "ts": 1},
        {"kind": "gpu", "entity": "node0/gpu1", "ts": 12, "colour": 3},
        ["not", "a", "dict"],
    ]
    frames, rejected = frames_from_records(records, small_topology.slots_resolver())
    assert len(frames["gpu"]) == 1 and frames["gpu"].columns["gpu_temp"][0] == 61
    reasons = [r for _, r in rejected]
    assert reasons == ["unknown gpu entity 'node9/gpu1'", "missing or non-numeric 'ts'", "non-numeric field value",
                       "unknown entity kind 'toaster'", "unknown fields ['colour']", "record is not an object"]


# ---- recordings ------------------------------------------------------------------------------
def _write_small_recording(path, topology: Topology) -> None:
    with RecordingWriter(path, topology, {"interval": 1.0, "source": "test"}, rows_per_group=64) as w:
        for t in range(10):
            w.write(Frame("gpu", np.full(32, 100.0 + t), np.arange(32), {"gpu_temp": np.full(32, 40.0 + t)}))
            w.write(Frame("rack", np.full(2, 100.0 + t), np.arange(2), {"inlet_temp": [24.0, 25.0]}))
        w.add_events([Event(105.0, "fault_onset", "rack", "rack1", "f1", "cooling_loss")])


def test_recording_round_trip_interleaves_kinds_by_time(tmp_path, small_topology: Topology) -> None:
    _write_small_recording(tmp_path / "rec", small_topology)
    rec = Recording.open(tmp_path / "rec")
    assert rec.kinds() == ["gpu", "rack"] and rec.meta["rows"] == {"gpu": 320, "rack": 20}
    assert rec.meta["start"] == 100.0 and rec.meta["end"] == 109.0
    gpu = rec.read_kind("gpu")
    assert len(gpu) == 320 and gpu.columns["gpu_temp"][-1] == 49.0
    frames = list(rec.iter_frames(batch_rows=64))
    # one window per tick, kinds in the live order inside it, and nothing read from the future
    assert [(f.kind, float(f.ts.min()), float(f.ts.max())) for f in frames[:4]] == [
        ("gpu", 100.0, 100.0), ("rack", 100.0, 100.0), ("gpu", 101.0, 101.0), ("rack", 101.0, 101.0)]
    assert sum(len(f) for f in frames) == 340
    wide = list(rec.iter_frames(window_s=4.0, batch_rows=7))
    windows = [set(((f.ts - 100.0) // 4.0).astype(int)) for f in wide]
    assert all(len(w) == 1 for w in windows), "a frame spans two windows"
    order = [w.pop() for w in windows]
    assert order == sorted(order), "a later window came before an earlier one"
    assert sum(len(f) for f in wide) == 340
    assert rec.events()[0].fault_type == "cooling_loss"


def test_a_new_recording_replaces_every_part_of_an_old_one_in_its_folder(tmp_path, small_topology: Topology) -> None:
    """Writing a GPU-only recording where one with racks was: the old rack rows (slots of another
    topology) must not replay with the new one, nor its ground truth."""
    _write_small_recording(tmp_path / "rec", small_topology)
    other = Topology.from_gpu_hosts([("solo", 0)])
    with RecordingWriter(tmp_path / "rec", other, {"interval": 1.0}) as w:
        w.write(Frame("gpu", [500.0], [0], {"gpu_temp": [30.0]}))
    rec = Recording.open(tmp_path / "rec")
    assert rec.kinds() == ["gpu"] and rec.topology.gpus == ["solo/gpu0"]
    assert sum(len(f) for f in rec.iter_frames()) == 1 and rec.events() == []
    assert rec.meta["rows"] == {"gpu": 1}


def test_truncated_parquet_is_rejected_naming_the_file(tmp_path, small_topology: Topology) -> None:
    _write_small_recording(tmp_path / "rec", small_topology)
    gpu = tmp_path / "rec" / "gpu.parquet"
    gpu.write_bytes(gpu.read_bytes()[: gpu.stat().st_size // 2])
    with pytest.raises(RecordingError, match="gpu.parquet: unreadable Parquet"):
        Recording.open(tmp_path / "rec")


@pytest.mark.parametrize("odd", [math.inf, 1.7e18, -math.inf, math.nan])
def test_a_row_stamped_infinite_or_in_nanoseconds_is_delivered_and_the_replay_ends(tmp_path, small_topology,
                                                                                  odd: float) -> None:
    """One row stamped +inf, or in nanoseconds among seconds (adding a window leaves the stamp
    unchanged), ended every window's prefix: the replay spun at full CPU for good, yielding nothing.
    Such a row now rides along with its neighbours, for the guard to count."""
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}) as w:
        for t in range(10):
            ts = np.full(32, 100.0 + t)
            if t in (3, 9):
                ts[5] = odd
            w.write(Frame("gpu", ts, np.arange(32), {"gpu_temp": np.full(32, 40.0)}))
    frames = list(Recording.open(tmp_path / "rec").iter_frames(batch_rows=64))
    assert sum(len(f) for f in frames) == 320
    finite = np.concatenate([f.ts[np.isfinite(f.ts) & (f.ts < 1e9)] for f in frames])
    assert (np.diff(finite) >= 0).all()  # the rest still comes in time order


def test_a_part_missing_or_cut_short_is_refused_naming_it(tmp_path, small_topology: Topology) -> None:
    """A copy interrupted before the rack part: replayed without it the run looked whole (exit 0,
    no warning, the progress bar stopping short)."""
    _write_small_recording(tmp_path / "rec", small_topology)
    rack = tmp_path / "rec" / "rack.parquet"
    kept = rack.read_bytes()
    rack.unlink()
    with pytest.raises(RecordingError, match=r"rack.parquet: missing \(recording.json lists 20 rows\)"):
        Recording.open(tmp_path / "rec")
    rack.write_bytes(kept)
    pq.write_table(pq.read_table(rack).slice(0, 7), rack)
    with pytest.raises(RecordingError, match="rack.parquet: 7 rows, recording.json lists 20"):
        Recording.open(tmp_path / "rec")


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _gpu_tick(t: int) -> Frame:
    return Frame("gpu", np.full(32, 100.0 + t), np.arange(32), {"gpu_temp": np.full(32, 40.0 + t)})


def test_a_recorder_killed_mid_recording_keeps_every_part_it_had_closed(tmp_path, small_topology: Topology,
                                                                       caplog) -> None:
    """A live recorder writes in parts closed every ``segment_s``. Killed outright (SIGKILL, the
    OOM killer), a single open Parquet file had no footer and no recording.json existed: the
    whole recording was lost. Now only the part being written is."""
    clock = _FakeClock()
    w = RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}, rows_per_group=64, segment_s=10.0,
                        clock=clock)
    for t in range(25):  # parts close after ticks 10 and 20 (written at clock 10 and 20)
        clock.now = float(t)
        w.write(_gpu_tick(t))
        if t == 12:
            w.write(Frame("rack", [112.0, 112.0], [0, 1], {"inlet_temp": [24.0, 25.0]}))
    # the process dies here: no close(); ticks 21-24 sit in a .partial file or in memory
    assert (tmp_path / "rec" / "gpu.00002.parquet.partial").exists() or w._pending_rows["gpu"]
    with caplog.at_level("WARNING", logger="foreshock.recording"):
        rec = Recording.open(tmp_path / "rec")
    assert rec.interrupted and rec.meta["parts"] == {"gpu": 2, "rack": 1}
    assert rec.part_files("gpu") == [tmp_path / "rec" / "gpu.parquet", tmp_path / "rec" / "gpu.00001.parquet"]
    gpu = rec.read_kind("gpu")
    assert len(gpu) == 21 * 32 and rec.meta["rows"] == {"gpu": 21 * 32, "rack": 2}
    assert np.array_equal(np.unique(gpu.ts), 100.0 + np.arange(21)) and rec.meta["end"] == 120.0
    assert sum(len(f) for f in rec.iter_frames()) == 21 * 32 + 2
    assert "stopped without closing it" in caplog.text and "ends at 1970-01-01 00:02:00 UTC" in caplog.text
    assert "what it was writing is lost (gpu.00002.parquet.partial)" in caplog.text
    # closed properly, the same writer gives every row, in time order, marked complete
    w.close()
    rec = Recording.open(tmp_path / "rec")
    assert not rec.interrupted and rec.meta["format"] == 2 and rec.meta["parts"]["gpu"] == 3
    ts = np.concatenate([f.ts for f in rec.iter_frames() if f.kind == "gpu"])
    assert len(ts) == 25 * 32 and (np.diff(ts) >= 0).all()
    assert not list((tmp_path / "rec").glob("*.partial"))


def test_a_recorder_killed_before_its_first_part_leaves_an_empty_recording(tmp_path, small_topology) -> None:
    clock = _FakeClock()
    w = RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}, rows_per_group=1, segment_s=600.0,
                        clock=clock)
    w.write(_gpu_tick(0))  # flushed into gpu.parquet.partial, which has no footer yet
    rec = Recording.open(tmp_path / "rec")
    assert rec.interrupted and rec.kinds() == [] and list(rec.iter_frames()) == []


def test_a_part_listed_but_missing_is_refused_naming_it(tmp_path, small_topology: Topology) -> None:
    clock = _FakeClock()
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}, segment_s=1.0, clock=clock) as w:
        for t in range(3):
            clock.now = float(t)
            w.write(_gpu_tick(t))
    (tmp_path / "rec" / "gpu.00001.parquet").unlink()
    with pytest.raises(RecordingError, match=r"gpu.00001.parquet: missing \(recording.json lists 2 parts of gpu\)"):
        Recording.open(tmp_path / "rec")


def test_a_recording_written_whole_stays_format_1(tmp_path, small_topology: Topology) -> None:
    """The simulator and import write one file per kind: an older foreshock still reads those."""
    _write_small_recording(tmp_path / "rec", small_topology)
    meta = json.loads((tmp_path / "rec" / "recording.json").read_text())
    assert meta["format"] == 1 and "parts" not in meta and "complete" not in meta


def test_recording_missing_topology_and_unknown_columns(tmp_path, small_topology: Topology) -> None:
    _write_small_recording(tmp_path / "rec", small_topology)
    pq.write_table(pa.table({"ts": [1.0], "slot": [0], "warp_drive": [1.0]}), tmp_path / "rec" / "link.parquet")
    with pytest.raises(RecordingError, match=r"link.parquet: unknown fields \['warp_drive'\]"):
        Recording.open(tmp_path / "rec")
    (tmp_path / "rec" / "topology.yaml").unlink()
    with pytest.raises(RecordingError, match="topology.yaml: missing"):
        Recording.open(tmp_path / "rec")


def test_events_file_errors_name_the_line(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"time": 1, "type": "xid", "entity_kind": "gpu", "entity": "a"}) + "\n{oops\n")
    with pytest.raises(EventError, match=r"events.jsonl:2: not valid JSON"):
        read_events(path)
    path.write_text(json.dumps({"time": 1, "type": "xid"}) + "\n")
    with pytest.raises(EventError, match=r":1: missing \['entity_kind', 'entity'\]"):
        read_events(path)



@pytest.mark.parametrize("meta, message", [
    ({"format": "v2"}, "'format' must be an integer, not 'v2'"),
    ({"format": 99}, "format 99 is newer"),
    ({"interval": "fast"}, "'interval' must be a positive number of seconds"),
    ({"interval": 0}, "'interval' must be a positive number of seconds"),
    ({"start": "soon"}, "'start' must be a time in seconds"),
    ({"rows": {"gpu": "many"}}, "'rows' must map entity kinds to row counts"),
    ([1, 2], "expected a JSON object"),
])
def test_recording_metadata_of_the_wrong_type_is_rejected_naming_the_key(tmp_path, small_topology: Topology,
                                                                        meta, message: str) -> None:
    _write_small_recording(tmp_path / "rec", small_topology)
    meta_path = tmp_path / "rec" / "recording.json"
    if isinstance(meta, dict):
        meta = {**json.loads(meta_path.read_text()), **meta}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(RecordingError, match=message) as err:
        Recording.open(tmp_path / "rec")
    assert "recording.json" in str(err.value)


@pytest.mark.parametrize("name, error", [("recording.json", RecordingError), ("topology.yaml", RecordingError),
                                         ("events.jsonl", EventError)])
def test_binary_garbage_in_a_text_part_is_a_clear_error_naming_the_file(tmp_path, small_topology: Topology,
                                                                       name: str, error: type) -> None:
    _write_small_recording(tmp_path / "rec", small_topology)
    (tmp_path / "rec" / name).write_bytes(b"\xff\xfe\x00\x01 not text")
    with pytest.raises(error, match=f"{name}: not UTF-8 text"):
        rec = Recording.open(tmp_path / "rec")
        read_events(rec.path / "events.jsonl")


def test_events_with_a_nan_time_are_rejected(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"time": NaN, "type": "xid", "entity_kind": "gpu", "entity": "a"}\n')
    with pytest.raises(EventError, match=r"events.jsonl:1: bad value \(time nan is not a finite"):
        read_events(path)


@pytest.mark.parametrize("slots", [pa.array([0.0, 0.5]), pa.array([0, 2**32 + 1], pa.int64())])
def test_slots_that_are_not_int32_values_are_unknown_entities_not_cast(slots) -> None:
    """0.5 and 2**32+1 would become slots 0 and 1 in an int32 cast: rows moved to other GPUs. They
    are rows of no entity (-1, as a null slot), counted by the guard; the batch's other rows go on
    (tests/test_slot_values_not_int32.py)."""
    table = pa.table({"ts": [1.0, 2.0], "slot": slots, "gpu_temp": [50.0, 60.0]})
    assert Frame.from_arrow(table, kind="gpu").slot.tolist() == [0, -1]
    ok = Frame.from_arrow(pa.table({"ts": [1.0], "slot": pa.array([7.0]), "gpu_temp": [50.0]}), kind="gpu")
    assert ok.slot.tolist() == [7] and ok.slot.dtype == np.int32


@pytest.mark.parametrize("slots", [
    np.array([2**32 + 1]), np.array([-0.7]), np.array([0.9]), np.array([np.nan]), np.array([np.inf]),
    [2**31], np.array([None], dtype=object), np.array(["a"]),
])
def test_frame_refuses_slots_that_are_not_int32_values_as_from_arrow_does(slots) -> None:
    """A plain cast wrapped 2**32+1 to 1 and truncated -0.7 and 0.9 to 0: a bad row on a real GPU."""
    with pytest.raises(FrameError, match="gpu frame: slot values that are not 32-bit integers"):
        Frame("gpu", [1.0] * len(slots), slots, {})


def test_frame_takes_whole_number_slots_of_any_type_and_int32_slots_as_they_are() -> None:
    for slots in ([3, -1], np.array([3, -1], np.int64), np.array([3.0, -1.0]), []):
        frame = Frame("gpu", [1.0] * len(slots), slots, {})
        assert frame.slot.dtype == np.int32 and frame.slot.tolist() == list(slots)
    slots32 = np.array([5, 6], np.int32)
    assert np.shares_memory(Frame("gpu", [1.0, 2.0], slots32, {}).slot, slots32)  # the hot path: no copy


# ---- the input guard's column scan against the per-column reference it replaced -------------
def _reference_guard_columns(columns: dict[str, np.ndarray], slots: np.ndarray,
                             valid: dict[str, tuple[float, float]], whole: set[str]
                             ) -> tuple[dict[str, np.ndarray], int, int, dict[str, int], dict[str, int]]:
    """Infinities become NaN (the rows holding one counted), then the rows with a NaN gap are counted,
    a gap being a NaN (not an infinity: counted once, as that) where an earlier row of the same slot
    held a value inside the field's range (and a whole number, for the fields in ``whole``); then
    finite values outside each field's valid range become NaN, counted per field (not as gaps), and so
    do values in range that are not whole numbers in a field in ``whole``. Gaps and infinities are
    counted per row (a sample), values per field and value."""
    out = {name: col.copy() for name, col in columns.items()}
    outside: dict[str, int] = {}
    fractional: dict[str, int] = {}
    inf_rows: set[int] = set()
    gap_rows: set[int] = set()
    was_inf = {}
    for name, col in out.items():
        inf = np.isinf(col)
        inf_rows.update(np.flatnonzero(inf).tolist())
        was_inf[name] = inf
        col[inf] = np.nan
    for name, col in out.items():
        lo, hi = valid[name]
        for i, v in enumerate(col):
            earlier = col[:i][slots[:i] == slots[i]]
            usable = (earlier >= lo) & (earlier <= hi) & ((earlier == np.floor(earlier)) | (name not in whole))
            if np.isnan(v) and not was_inf[name][i] and np.any(usable):  # (an infinity is no gap)
                gap_rows.add(i)
    infs, gaps = len(inf_rows), len(gap_rows)
    for name, col in out.items():
        lo, hi = valid[name]
        bad = np.isfinite(col) & ((col < lo) | (col > hi))
        if bad.any():
            outside[name] = int(bad.sum())
        col[bad] = np.nan
        if name in whole:
            broken = np.isfinite(col) & (col != np.floor(col))
            if broken.any():
                fractional[name] = int(broken.sum())
            col[broken] = np.nan
    return out, infs, gaps, outside, fractional


_VALUES = st.sampled_from([0.0, 1.5, -3.0, 42.0, 79.5, 9000.0, 2.0 ** 41, -90.0, float("nan"), float("inf"),
                           float("-inf")])


@pytest.mark.kernel
@settings(max_examples=80, deadline=None)
@given(st.integers(0, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.lists(_VALUES, min_size=n, max_size=n), min_size=1, max_size=13),
    st.booleans())))
def test_guard_column_scan_matches_the_per_column_reference(case) -> None:
    from foreshock.guard import InputGuard
    from foreshock.health import PipelineHealth

    n, cols, constant = case
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(4)])
    names = field_names("gpu")[:len(cols)]
    columns = {name: (np.full(n, 7.0) if constant and i == 0 else np.array(col, dtype=float))
               for i, (name, col) in enumerate(zip(names, cols))}
    frame = Frame("gpu", np.arange(n, dtype=float), np.arange(n) % 4, {k: v.copy() for k, v in columns.items()})
    # columns the frame does not report are NaN in every row: never counted as gaps
    absent = {name: np.full(n, np.nan) for name in field_names("gpu") if name not in columns}
    # the valid ranges written out here, not read from the code under test
    valid = {name: (-math.inf, math.inf) for name in field_names("gpu")}
    valid.update({"gpu_temp": (-60.0, 200.0), "hbm_temp": (-60.0, 200.0), "slowdown_temp": (-60.0, 200.0),
                  "power": (0.0, 5000.0), "power_limit": (0.0, 5000.0), "sm_clock": (0.0, 1e11),
                  "sm_clock_max": (0.0, 1e11), "util": (0.0, 1.2), "throttle_reasons": (0.0, 2.0 ** 40 - 1),
                  "xid_last": (0.0, 1023.0)})
    expect, infs, gaps, outside, fractional = _reference_guard_columns({**columns, **absent}, frame.slot.copy(),
                                                                       valid, {"throttle_reasons", "xid_last"})
    health = PipelineHealth()
    out = InputGuard(topology, health).check(frame)
    assert len(out) == n  # every slot's timestamps rise: the guard keeps every row
    for name in field_names("gpu"):
        np.testing.assert_array_equal(out.columns[name], expect[name])
        np.testing.assert_array_equal(frame.columns[name], expect[name])  # in place, as before
    assert health.problems[("guard", "inf_values")] == infs
    assert health.problems[("guard", "missing_values")] == gaps
    assert {reason.removeprefix("out_of_range: "): n for (_, reason), n in health.problems.items()
            if reason.startswith("out_of_range")} == outside
    assert {reason.removeprefix("not_whole: "): n for (_, reason), n in health.problems.items()
            if reason.startswith("not_whole")} == fractional
