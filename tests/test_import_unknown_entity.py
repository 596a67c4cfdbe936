"""``foreshock import --format jsonl``: records of entities the topology does not hold are counted under
one reason per kind, ``unknown <kind> entity``, logged once with the first names: a reason quoting
each name made one warning and one row of the problems table per name (296 for 300 hosts)."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.cli.import_cmd import UNKNOWN_NAMED, command
from foreshock.topology import Topology


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _problem_rows(printed: str) -> list[str]:
    """The printed problems table's jsonl rows, each 'reason | count'."""
    return sorted(" | ".join(cell.strip() for cell in line.split("│")[2:4])
                  for line in printed.splitlines() if "│ jsonl" in line)


@settings(max_examples=15, deadline=None)
@given(unknown_hosts=st.integers(1, 40), records_each=st.integers(1, 3), unknown_nodes=st.integers(0, 8),
       given_topology=st.booleans())
def test_unknown_entities_are_one_reason_per_kind(unknown_hosts: int, records_each: int, unknown_nodes: int,
                                                   given_topology: bool) -> None:
    known = [{"kind": "gpu", "entity": "known/gpu0", "ts": 1767225600 + t, "gpu_temp": 40} for t in range(2)]
    gpus = [{"kind": "gpu", "entity": f"node{n}/gpu0", "ts": 1767225600 + t, "gpu_temp": 40}
            for t in range(records_each) for n in range(unknown_hosts)]
    nodes = [{"kind": "node", "entity": f"ghost{n}", "ts": 1767225600, "fan_speed": 9000} for n in range(unknown_nodes)]
    gpu_names = [f"node{n}/gpu0" for n in range(unknown_hosts)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "in.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in known + gpus + nodes))
        args = ["--format", "jsonl", str(path), "--out", str(Path(folder) / "rec")]
        if given_topology:  # only the known host: the others' GPUs are unknown too
            Topology.from_gpu_hosts([("known", 0)]).dump(Path(folder) / "topology.yaml")
            args += ["--topology", str(Path(folder) / "topology.yaml")]
        else:  # derived from every GPU name: only the node records are of entities it lacks
            gpus, gpu_names = [], []
        warnings = _Warnings()
        logging.getLogger("foreshock").addHandler(warnings)
        try:
            result = CliRunner().invoke(command, args, catch_exceptions=False)
        finally:
            logging.getLogger("foreshock").removeHandler(warnings)
    assert result.exit_code == 0, result.output
    expected = ([f"unknown gpu entity | {len(gpus)}"] if gpus else []) + \
        ([f"unknown node entity | {len(nodes)}"] if nodes else [])
    assert _problem_rows(result.output) == sorted(expected)
    for kind, names in (("gpu", gpu_names), ("node", [f"ghost{n}" for n in range(unknown_nodes)])):
        said = [line for line in warnings.lines if line.startswith(f"jsonl: unknown {kind} entity")]
        assert len(said) == (1 if names else 0)
        if names:  # the first names, in the order they came, and how many more
            assert f"{len(names)} not in the topology: " + ", ".join(repr(n) for n in names[:UNKNOWN_NAMED]) in said[0]
            rest = len(names) - UNKNOWN_NAMED
            assert (f" and {rest} more" in said[0]) == (rest > 0)
