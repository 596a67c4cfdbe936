"""The input guard's two kernels together, ``_guard_kernel`` (row rules) then ``_scan_columns`` (values), on
hypothesis frames, against the references the suite already holds: ``reference_guard``
(tests/test_kernels_pipeline.py, hypothesis-driven there on stamps alone) and ``_reference_guard_columns``
(tests/test_core.py, hypothesis-driven there on frames whose every row is kept). Here the rows carry both:
stamps NaN, infinite, repeated, within 10 ms of the last kept one (and just outside), going back, before
the stream's anchor by more than ``MAX_BEHIND_S``, in unknown slots; and values NaN, infinite, out of
range, fractional where a field is a whole number. Over several frames (the last stamps and the fields
each GPU reported carried from one to the next), only the kept rows' values are scanned: a refused
row's value is no gap, no range violation, and does not make a later NaN of its GPU a gap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foreshock.fields import field_names
from foreshock.frames import Frame
from foreshock.guard import MAX_BEHIND_S, MIN_SPACING_S, SPACING_ROUNDING_S, InputGuard
from foreshock.health import PipelineHealth
from test_core import _reference_guard_columns
from test_kernels_pipeline import TOPO, reference_guard

pytestmark = pytest.mark.kernel

NAN, INF = math.nan, math.inf
ANCHOR = 1.7e9
FIELDS = ("gpu_temp", "power", "throttle_reasons")
# the valid ranges written out here, not read from the code under test (as tests/test_core.py has them)
VALID = {"gpu_temp": (-60.0, 200.0), "power": (0.0, 5000.0), "throttle_reasons": (0.0, 2.0 ** 40 - 1)}
WHOLE = {"throttle_reasons"}

STEP = st.sampled_from([0.0, 0.0, 0.001, 0.0099, 0.01, 0.0101, 1.0, 1.0, 5.0, -0.003, -1.0, NAN, INF, -INF,
                        -MAX_BEHIND_S - 10.0])
VALUE = st.sampled_from([NAN, NAN, INF, -INF, 0.0, 4.0, 42.0, 42.5, -61.0, 200.0, 5000.0, 5001.0, 2.0 ** 40,
                         -0.5])
ROW = st.tuples(STEP, st.integers(-1, 9), st.tuples(VALUE, VALUE, VALUE))


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(st.lists(ROW, max_size=25), min_size=1, max_size=3))
@example(frames=[[(1.0, 0, (42.0, 300.0, 4.0))], [(0.0, 0, (300.0, NAN, 4.5)), (1.0, 0, (NAN, NAN, NAN))]]).via(
    "a refused duplicate's out-of-range values are not counted; the next row's NaNs are gaps")
def test_guard_row_rules_then_column_scan_match_the_references(frames):
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    guard.stream_anchor = ANCHOR
    t = ANCHOR
    all_ts, all_slots, all_values, got = [], [], [], {name: [] for name in field_names("gpu")}
    for rows in frames:
        ts = []
        for step, _, _ in rows:
            if math.isfinite(step) and step > -MAX_BEHIND_S:
                t += step
                ts.append(t)
            else:  # a stamp of its own: NaN, infinite, or years before the anchor
                ts.append(ANCHOR + step if math.isfinite(step) else step)
        slots = [s for _, s, _ in rows]
        values = np.array([v for _, _, v in rows], dtype=np.float64).reshape(len(rows), len(FIELDS))
        all_ts += ts
        all_slots += slots
        all_values.append(values)
        out = guard.check(Frame("gpu", np.array(ts, dtype=np.float64), np.array(slots, dtype=np.int32),
                                {name: values[:, j].copy() for j, name in enumerate(FIELDS)}))
        for name in got:
            got[name].extend(out.columns[name].tolist() if name in out.columns else [NAN] * len(out))

    keep, reasons = reference_guard(np.array(all_ts), np.array(all_slots), TOPO.size("gpu"), np.full(8, -INF),
                                    earliest=ANCHOR - MAX_BEHIND_S, min_spacing=MIN_SPACING_S - SPACING_ROUNDING_S)
    values = np.concatenate(all_values)[keep]
    kept_slots = np.array(all_slots, dtype=np.int32)[keep]
    columns = {name: values[:, j].copy() for j, name in enumerate(FIELDS)}
    absent = {name: np.full(len(values), NAN) for name in field_names("gpu") if name not in columns}
    valid = {name: VALID.get(name, (-INF, INF)) for name in field_names("gpu")}
    expect, infs, gaps, outside, fractional = _reference_guard_columns({**columns, **absent}, kept_slots, valid,
                                                                       WHOLE)
    for name in FIELDS:
        np.testing.assert_array_equal(got[name], expect[name], err_msg=name)
    problems = {reason: n for (stage, reason), n in health.problems.items() if stage == "guard" and n}
    want = {reason: reasons.count(reason) for reason in set(reasons)}
    want.update({f"out_of_range: {name}": n for name, n in outside.items() if n})
    want.update({f"not_whole: {name}": n for name, n in fractional.items() if n})
    if infs:
        want["inf_values"] = infs
    if gaps:
        want["missing_values"] = gaps
    assert problems == want
