"""The summary's line of input problems: the largest reasons by name, the others counted together, so
that the numbers listed add up to the total printed before them (the four largest alone did not)."""

from __future__ import annotations

import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from foreshock.exporters.console import PROBLEM_REASONS_SHOWN, FindingTally, render_summary
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=20))
def test_the_listed_problem_counts_add_up_to_the_total(counts: list[int]) -> None:
    health = PipelineHealth()
    for i, count in enumerate(counts):
        health.problem(f"stage{i % 3}", f"reason, number {i}", count)  # (a comma inside a reason too)
    out = io.StringIO()
    render_summary(FindingTally(TOPO), health, console=Console(file=out, width=10_000))
    line = next(line for line in out.getvalue().splitlines() if line.startswith("input problems counted:"))
    total, listed = re.fullmatch(r"input problems counted: ([\d,]+) \((.*)\)", line).groups()  # type: ignore[union-attr]
    assert int(total.replace(",", "")) == sum(counts)
    items = re.findall(r"(?:^|, )(stage\d/reason, number (\d+)|and (\d+) other reasons) ([\d,]+)(?=, |$)", listed)
    assert ", ".join(f"{name} {n}" for name, _, _, n in items) == listed  # every item read
    named = [int(i) for _, i, _, _ in items if i]
    assert sum(int(n.replace(",", "")) for *_, n in items) == sum(counts)
    # the largest by name, the rest counted: as many as there are; one left over is named itself
    assert sorted(counts[i] for i in named) == sorted(counts)[::-1][:len(named)][::-1]
    assert len(named) == (len(counts) if len(counts) <= PROBLEM_REASONS_SHOWN + 1 else PROBLEM_REASONS_SHOWN)
    others = [int(k) for _, _, k, _ in items if k]
    assert others == ([len(counts) - len(named)] if len(named) < len(counts) else [])
