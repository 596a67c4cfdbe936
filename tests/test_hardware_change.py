"""Workers restarted on changed hardware keep what each entity learnt (core/remap.py).

A rack added, a node retired, the topology file reordered: slots move, names stay. Detection
checkpoints carry their hardware's layout, and a partition loaded under another file moves each
entity's state to its new slot.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.registry import DETECTORS
from foreshock.fields import field_names
from foreshock.findings import Finding, finding_to_dict
from foreshock.frames import Frame
from foreshock.remap import HARDWARE_KINDS, Remap
from foreshock.streams.kafka_codec import PartitionMap, encode_bundle
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.streams.sources import ReplaySource
from foreshock.topology import Topology

BATCH_ROWS = 4096


def topology(racks: list[tuple[str, list[str]]], rails: int = 2) -> Topology:
    """Racks of (name, nodes) in one row, nodes of ``rails`` GPUs, a leaf per rail."""
    nodes = [(node, rack) for rack, names in racks for node in names]
    return Topology.from_dict({
        "cluster": "t", "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": rack, "row": "row0"} for rack, _ in racks],
        "nodes": [{"name": node, "rack": rack, "gpus": rails} for node, rack in nodes],
        "switches": [{"name": f"leaf{r}", "tier": "leaf", "rail": r} for r in range(rails)],
        "links": [{"name": f"{node}/gpu{r}~leaf{r}", "a": f"{node}/gpu{r}", "b": f"leaf{r}"}
                  for node, _ in nodes for r in range(rails)],
    })


def test_remap_moves_rows_by_name_and_starts_new_entities_fresh():
    old = topology([("rackA", ["n0", "n1"]), ("rackB", ["n2"])])
    new = topology([("rackC", ["n9"]), ("rackB", ["n2"]), ("rackA", ["n1"])])  # n0 retired, n9 added
    remap = Remap(old, new)
    saved = np.arange(old.size("node") * 2, dtype=float).reshape(-1, 2)  # row i: 2i, 2i+1
    fresh = np.full((new.size("node"), 2), -1.0)
    moved = remap.rows("node", saved, fresh)
    assert moved.tolist() == [[-1, -1], [4, 5], [2, 3]]  # n9 fresh; n2, n1 from their old rows
    assert remap.kept("node") == 2 and remap.kept("rack") == 2 and remap.kept("gpu") == 4
    assert remap.slots("link", np.array([-1, 0, 2, 4])).tolist() == \
        [-1, -1, new.slot("link", "n1/gpu0~leaf0"), new.slot("link", "n2/gpu0~leaf0")]
    assert remap.rows("optic", np.arange(old.size("optic")), np.zeros(new.size("optic"), dtype=np.int64))[
        new.slot("optic", "n2/gpu1~leaf1#b")] == old.slot("optic", "n2/gpu1~leaf1#b")
    reported = np.zeros((3, old.size("gpu")), dtype=bool)
    reported[1, old.slot("gpu", "n2/gpu1")] = True
    along = remap.rows("gpu", reported, np.zeros((3, new.size("gpu")), dtype=bool), axis=1)
    assert np.argwhere(along).tolist() == [[1, new.slot("gpu", "n2/gpu1")]]
    with pytest.raises(ValueError, match="does not fit"):
        remap.rows("node", saved[:, :1], fresh)
    kept = Remap(old, new, keep={"node": np.array([False, True, False])})
    assert kept.rows("node", saved, fresh).tolist() == [[-1, -1], [4, 5], [-1, -1]]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_kept_entity_keeps_its_own_rows_whatever_the_change(data: st.DataObject):
    names = [f"n{i}" for i in range(8)]
    old_nodes = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=8, unique=True))
    new_nodes = data.draw(st.lists(st.sampled_from(names + ["x0", "x1"]), min_size=1, max_size=10, unique=True))
    old = topology([("r0", old_nodes)])
    new = topology([("r0", new_nodes)])
    remap = Remap(old, new)
    for kind in HARDWARE_KINDS:
        saved = np.arange(old.size(kind), dtype=np.int64) + 100
        moved = remap.rows(kind, saved, np.full(new.size(kind), -1, dtype=np.int64))
        for slot, name in enumerate(new.names(kind)):
            expected = old.slot(kind, name) + 100 if name in old.names(kind) else -1
            assert moved[slot] == expected


def grown(base: Topology, kind: str) -> Topology:
    """``base`` with more entities of ``kind`` (and of the kinds that hang off them) only."""
    data = base.to_dict()
    if kind == "rack":
        data["racks"].append({"name": "rackZ", "row": data["rows"][0]["name"]})
    elif kind == "node":
        data["nodes"].append({"name": "nodeZ", "rack": data["racks"][0]["name"], "gpus": 0})
    elif kind == "gpu":
        data["nodes"][-1]["gpus"] += 1
    elif kind == "link":
        switches = [s["name"] for s in data["switches"]]
        data["links"].append({"name": "extra", "a": switches[0], "b": switches[-1]})
    return Topology.from_dict(data)


def shapes(state: Any, path: str = "") -> dict[str, tuple[int, ...]]:
    if isinstance(state, dict):
        return {k: v for key, sub in state.items() for k, v in shapes(sub, f"{path}/{key}" if path else key).items()}
    return {path: state.shape} if isinstance(state, np.ndarray) else {}


@pytest.mark.parametrize("name", sorted(set(DETECTORS) - {"sklearn"}))
def test_each_detector_names_the_entity_kind_of_every_array_that_grows_with_the_hardware(
        name: str, small_topology: Topology):
    """``Detector.slot_kinds`` is what moves state onto changed hardware: an array that grows with
    a kind must be declared with that kind (its first axis), and only then. Grown one kind at a
    time (links grow optics too, two per link)."""
    detector = DetectorBank.from_names(small_topology, [name], processors=()).detectors[0]
    before = shapes(detector.state_dict())
    declared = dict(detector.slot_kinds)
    assert set(declared) <= set(before), f"declared arrays {sorted(set(declared) - set(before))} are not state"
    for kind in ("rack", "node", "gpu", "link"):
        bigger = grown(small_topology, kind)
        after = shapes(DetectorBank.from_names(bigger, [name], processors=()).detectors[0].state_dict())
        for array, shape in before.items():
            if array in declared:
                owner = declared[array]
                assert shape[0] == small_topology.size(owner) and after[array][0] == bigger.size(owner), array
                assert after[array][1:] == shape[1:], array
            elif name == "congestion" and array == "s_congested_per_group":
                continue  # per leaf and node, recounted from the alarms (CongestionDetector.remap_state)
            else:
                assert after[array] == shape, f"{name}.{array} grows with {kind}s but names no kind"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 GPUs (2 racks), 10 simulated minutes of the mixed scenario."""
    from foreshock.simulator import ClusterSimulator

    out = tmp_path_factory.mktemp("hardware") / "rec"
    ClusterSimulator(gpus=64, scenario="mixed", seed=3, duration=600).record(out)
    return out


def with_new_rows_of_racks(base: Topology) -> Topology:
    """``base`` with a new row of two racks, one node each, on a loop of its own: the new nodes,
    GPUs and links are listed *first*, so every existing one has another slot. The racks are
    listed last, so every existing rack keeps its partition."""
    data = base.to_dict()
    data["rows"].append({"name": "rowN", "cooling_loop": "cduN"})
    data["racks"] += [{"name": "rackN0", "row": "rowN"}, {"name": "rackN1", "row": "rowN"}]
    new_nodes = [{"name": "nodeN0", "rack": "rackN0", "gpus": 8}, {"name": "nodeN1", "rack": "rackN1", "gpus": 8}]
    data["nodes"] = new_nodes + data["nodes"]
    leaves = {link["a"].split("/")[1]: link["b"] for link in data["links"] if link["a"].startswith("node0/")}
    new_links = [{"name": f"{n['name']}/{gpu}~{leaf}", "a": f"{n['name']}/{gpu}", "b": leaf}
                 for n in new_nodes for gpu, leaf in sorted(leaves.items())]
    data["links"] = new_links + data["links"]
    return Topology.from_dict(data)


def on(topo: Topology, frame: Frame, source: Topology) -> Frame:
    """``frame`` of ``source``'s entities, numbered by ``topo``."""
    slots = topo.slots(frame.kind, [source.name(frame.kind, int(s)) for s in frame.slot])
    return Frame(frame.kind, frame.ts, slots, frame.columns)


def named(finding: Finding, topo: Topology) -> str:
    data = finding_to_dict(finding)
    data["slot"] = topo.name(data["entity_kind"], data["slot"])
    return json.dumps(data, sort_keys=True, default=float)


class Feeder:
    """Frames into a two-partition detection stage as the agents would send them."""

    def __init__(self, stage: DetectionStage, offsets: Counter[int] | None = None) -> None:
        self.stage = stage
        self.pmap = PartitionMap(stage.topology, 2)
        self.offsets = offsets if offsets is not None else Counter[int]()

    def feed(self, frames: list[Frame], first_seq: int) -> list[str]:
        out = []
        for seq, frame in enumerate(frames, first_seq):
            messages = self.pmap.messages(frame)
            for index, (part, piece) in enumerate(messages):
                if not self.stage.owns(part):
                    self.stage.load(part, None)
                value, headers = encode_bundle("a", 0.0, [(seq, index, len(messages), piece)],
                                               topology=self.stage.topology)
                result = self.stage.process(part, self.offsets[part], value, headers)
                assert not result.dead_letters, result.dead_letters
                self.offsets[part] += 1
                out.extend(named(f, self.stage.topology) for f in result.findings)
        return out


def bank(hardware: Topology) -> DetectorBank:
    return DetectorBank.from_names(hardware)


def findings_of_a_stage_that_never_stopped(topo: Topology, frames: list[Frame]) -> list[str]:
    """The second half's findings of a two-partition stage that read both halves of ``frames``."""
    half = len(frames) // 2
    straight = Feeder(DetectionStage(topo, bank, 2))
    straight.feed(frames[:half], 1)
    expected = straight.feed(frames[half:], half + 1)
    assert len(expected) > 20
    return expected


@pytest.mark.slow
def test_a_worker_restarted_on_changed_hardware_finds_the_same_as_one_that_never_stopped(recording: Path):
    """Half the recording on its own topology, checkpoints; the other half on a topology with a new
    row of racks whose nodes, GPUs and links come first (every slot moved). The findings of the
    second half are those of a stage that read the whole recording on the old topology. Before,
    the checkpoints were refused (`checkpoint_unusable`) and each partition started fresh: a
    fresh stage's findings differ, which this test checks too, so it shows the state mattered."""
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    old = source.topology
    frames = list(source)
    half = len(frames) // 2
    new = with_new_rows_of_racks(old)
    assert all(new.slot("gpu", g) != old.slot("gpu", g) for g in old.gpus)

    expected = findings_of_a_stage_that_never_stopped(old, frames)

    first = Feeder(DetectionStage(old, bank, 2))
    first.feed(frames[:half], 1)
    blobs = {p: first.stage.checkpoint(p)[1] for p in range(2)}
    restarted = DetectionStage(new, bank, 2)
    for p in range(2):
        assert restarted.load(p, blobs[p]) == first.offsets[p] - 1
    assert not restarted.health.problems
    got = Feeder(restarted, Counter(first.offsets)).feed([on(new, f, old) for f in frames[half:]], half + 1)
    assert Counter(got) == Counter(expected)

    fresh = Feeder(DetectionStage(new, bank, 2), Counter(first.offsets))
    assert Counter(fresh.feed([on(new, f, old) for f in frames[half:]], half + 1)) != Counter(expected)


@pytest.mark.slow
def test_a_checkpoint_written_before_columns_were_appended_is_read_on(recording: Path):
    """A new version that appends state columns (``Detector.upgrade_state``, ``add_columns``) meets
    the checkpoints of the old one. A worker keeps each partition as a delta from a fresh bank's
    state, and that initial state now has the wider arrays: the delta could not be applied to a
    non-uniform one, the checkpoint was refused (`checkpoint_unusable`) and every partition started
    fresh at each such upgrade. The old initial state is the first columns of the new one as the
    previous layout kept it (``Detector.previous_layout_state``: columns were removed since)."""
    from foreshock.detectors import power as pw
    from test_state_budget_thermal import L1_F_BITS_TS, L1_G_USRC, L1_S_OVER_DEFAULT
    from foreshock.streams.kafka_worker import apply_delta, decode_checkpoint, encode_checkpoint, state_delta, \
        uniform_fills

    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    topo = source.topology
    frames = list(source)
    half = len(frames) // 2

    expected = findings_of_a_stage_that_never_stopped(topo, frames)

    # what the version before these columns would have written: every array of theirs narrower
    # (in layout 1, as the code before 2026-12-06 kept them: each detector's previous_layout_state —
    # the thermal fit's, thermal's and power's alarms and rows, cooling's idle history, the
    # straggler's S_TAKEN, xid's reset counts)
    older = {("thermal", "s_forecast"): L1_F_BITS_TS, ("power", "s_gpu"): L1_S_OVER_DEFAULT,
             **{(name, "s_model"): L1_G_USRC for name in ("thermal", "power", "cooling")}}

    # ... and as 9845867 wrote them: no rack inlets kept by the straggler, and the input guard's
    # fields reported before max_op_temp and hbm_max_op_temp were appended to fields.csv (until
    # 2026-12-01 that guard state was refused: every partition started fresh)
    gpu_fields_before = field_names("gpu").index("max_op_temp")

    def narrower(state: dict[str, Any]) -> dict[str, Any]:
        layout1 = first.stage.parts[0].pipeline.bank.previous_layout_state(state["bank"])
        detectors = {name: dict(sub) for name, sub in layout1["detectors"].items()}
        assert detectors["cooling"]["s_idle"].shape[1] == 9 and "s_dbe_resets" in detectors["xid"]
        for (name, key), width in older.items():
            detectors[name][key] = np.ascontiguousarray(detectors[name][key][:, :width])
        del detectors["straggler"]["s_rack"]
        reported = np.ascontiguousarray(state["guard"]["gpu:reported"][:gpu_fields_before])
        guard = {**state["guard"], "gpu:reported": reported}
        return {**state, "guard": guard, "bank": {**state["bank"], "detectors": detectors}}

    first = Feeder(DetectionStage(topo, bank, 2))
    first.feed(frames[:half], 1)
    restarted = DetectionStage(topo, bank, 2)
    old_initial = narrower(first.stage._initial)
    fills = uniform_fills(old_initial)["bank"]["detectors"]
    assert [fills[name][key] for name, key in older] == [None] * len(older), \
        "an array here is uniform: its delta carries a fill that rebuilds it at any shape"
    for p in range(2):
        saved = decode_checkpoint(first.stage.checkpoint(p)[1], "detect", first.stage.signature)
        state = narrower(apply_delta(first.stage._initial, saved.state))
        blob = encode_checkpoint(saved.offset, state_delta(old_initial, state, uniform_fills(old_initial)),
                                 "detect", first.stage.signature, topo, layout=True)
        assert restarted.load(p, blob) == first.offsets[p] - 1
    assert not restarted.health.problems
    got = Feeder(restarted, Counter(first.offsets)).feed(frames[half:], half + 1)
    # what the older version did not keep is not known after the restart: when each GPU's power cap
    # last bound (S_CAP_TS, one of the columns cut), which holds a cap forecast back for cap_hold_s
    # after it; the power detector's findings of that first minute may differ, nothing else
    held_until = min(float(f.ts.min()) for f in frames[half:] if len(f)) + pw.PARAMS["cap_hold_s"]

    def settled(findings: list[str]) -> Counter[str]:
        return Counter(f for f in findings
                       if not (json.loads(f)["detector"] == "power" and json.loads(f)["ts"] < held_until))

    assert settled(got) == settled(expected)
    assert len(got) - len(expected) in range(-5, 6)


def test_entities_that_moved_to_another_partition_start_fresh_there(recording: Path):
    """Partitions follow racks (rack index modulo partitions). An empty rack listed between the
    two moves rack1 from partition 1 to partition 0: partition 0 keeps what it knew of rack0 and
    starts rack1 fresh (partition 1 had read it); partition 1 keeps nothing of rack1 — its frames
    go to partition 0 now, and partition 1 must not export it as its own (the guard's last
    timestamps say which entities a partition has seen)."""
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    old = source.topology
    first = Feeder(DetectionStage(old, bank, 2))
    first.feed(list(source)[:40], 1)
    data = old.to_dict()
    data["racks"].insert(1, {"name": "rackZ", "row": data["racks"][0]["row"]})
    new = Topology.from_dict(data)
    assert PartitionMap(new, 2).by_kind["rack"].tolist() == [0, 1, 0]
    stage = DetectionStage(new, bank, 2)
    for p in range(2):
        stage.load(p, first.stage.checkpoint(p)[1])
    rack0 = np.isin(new.gpu_rack, [new.slot("rack", "rack0")])

    def thermal_model(s: DetectionStage, p: int) -> np.ndarray:
        return next(d for d in s.parts[p].pipeline.bank.detectors if d.name == "thermal").s_model  # type: ignore[attr-defined, no-any-return]

    seen = {p: np.isfinite(stage.parts[p].pipeline.guard.s_last_ts["gpu"]) for p in range(2)}
    assert seen[0].tolist() == rack0.tolist() and not seen[1].any()
    saved = thermal_model(first.stage, 0)
    moved = thermal_model(stage, 0)
    for gpu in np.flatnonzero(rack0):
        assert np.array_equal(moved[gpu], saved[old.slot("gpu", new.gpus[gpu])], equal_nan=True)
    untouched = DetectionStage(new, bank, 2)
    untouched.load(0, None)
    assert np.array_equal(moved[~rack0], thermal_model(untouched, 0)[~rack0], equal_nan=True)
    assert not np.array_equal(moved[rack0], thermal_model(untouched, 0)[rack0], equal_nan=True)


def test_topology_diff_says_what_a_restart_on_the_new_file_keeps(small_topology: Topology, tmp_path: Path):
    """A rack listed after the old ones keeps every entity's partition, fabric links included
    (they follow their switch: until 2026-12-01 they followed the rack count too, so adding one
    rack moved every leaf-to-spine link to another partition and it started fresh); a rack
    listed first moves the others."""
    from click.testing import CliRunner

    from foreshock.cli.main import cli

    def diff(data: dict[str, Any]) -> dict[str, Any]:
        old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
        small_topology.dump(old)
        Topology.from_dict(data).dump(new)
        res = CliRunner().invoke(cli, ["topology", "diff", str(old), str(new), "--partitions", "2"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output.strip().splitlines()[-1])  # type: ignore[no-any-return]

    data = small_topology.to_dict()
    data["racks"].append({"name": "rack9", "row": "row0"})
    data["nodes"].append({"name": "node9", "rack": "rack9", "gpus": 8})
    data["nodes"] = [n for n in data["nodes"] if n["name"] != "node3"]
    data["links"] = [link for link in data["links"] if not link["a"].startswith("node3/")]
    data["jobs"] = data["jobs"][:1]
    appended = diff(data)
    assert appended["same_hardware"] is False
    assert appended["rack"] == {"old": 2, "new": 3, "kept": 2, "moved_partition": 0, "added": 1, "removed": 0}
    assert appended["gpu"] == {"old": 32, "new": 32, "kept": 24, "moved_partition": 0, "added": 8, "removed": 8}
    assert appended["link"]["kept"] == 24 + 8 and appended["link"]["moved_partition"] == 0  # GPU links, fabric links
    data["racks"].insert(0, data["racks"].pop())
    first = diff(data)
    assert first["rack"]["kept"] == 0 and first["rack"]["moved_partition"] == 2
    assert first["link"]["kept"] == 8  # the fabric links alone
    same = diff(small_topology.to_dict())
    assert same["same_hardware"] is True and same["optic"]["kept"] == small_topology.size("optic")


def test_open_incidents_keep_their_members_and_roots_when_the_incident_stage_moves_hardware(recording: Path):
    """The incident stage's checkpoint carries its layout too: restarted on a file with a new row
    of racks listed first (every slot moved), the incident engine has the same incidents, each
    with the same members and root by name, and its indexes agree with them. Until 2026-12-01 the
    checkpoint was refused and every open incident started again. A processor that cannot move its
    state is still refused (tests/test_kafka_pipeline.py)."""
    from foreshock.findings import finding_to_json
    from foreshock.streams.embedded import EmbeddedPipeline
    from foreshock.streams.kafka_worker import IncidentStage

    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    old = source.topology
    pipeline = EmbeddedPipeline(old, DetectorBank.from_names(old))
    pipeline.run(source)
    (engine,) = pipeline.bank.processors
    before = [finding_to_json(i) for i in engine.incidents(include_resolved=True)]  # type: ignore[attr-defined]
    assert len(before) >= 2
    _, blob = IncidentStage([engine], topology=old).checkpoint()
    new = with_new_rows_of_racks(old)
    stage = IncidentStage(DetectorBank.from_names(new).processors, topology=new)
    stage.load(blob)
    assert not stage.health.problems
    (moved,) = stage.processors
    moved.check_invariants()  # type: ignore[attr-defined]
    assert [finding_to_json(i) for i in moved.incidents(include_resolved=True)] == before  # type: ignore[attr-defined]
    gpu = old.gpus[5]
    assert np.array_equal(moved.tel.s_gpu_tel[new.slot("gpu", gpu)],  # type: ignore[attr-defined]
                          engine.tel.s_gpu_tel[old.slot("gpu", gpu)], equal_nan=True)  # type: ignore[attr-defined]
