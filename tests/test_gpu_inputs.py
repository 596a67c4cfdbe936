"""Inputs shared by the per-GPU detectors (detectors/gpu_inputs.py): the throttle-reasons parser."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.gpu_inputs import REASON_BITS_LIMIT, reason_bits, reason_bits_column

VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(0, 2 ** 41).map(float),
                   st.sampled_from([0.0, 1.0, 0x24, -1.0, REASON_BITS_LIMIT - 1, REASON_BITS_LIMIT]))


@pytest.mark.kernel
@settings(deadline=None)  # the first call compiles the kernel
@given(st.lists(VALUES, max_size=40))
def test_the_column_parser_reads_every_value_as_the_kernels_do(values):
    """Harness code parses a frame's column at once; kernels parse a sample at a time: one rule."""
    got = reason_bits_column(np.array(values, dtype=float))
    assert got.dtype == np.int64
    assert list(got) == [reason_bits(v) for v in values]


def test_values_that_are_not_a_bitmask_read_as_missing():
    got = reason_bits_column(np.array([np.nan, -4.0, np.inf, 2.0 ** 40, 2.0 ** 40 - 1, 0x24]))
    assert list(got) == [-1, -1, -1, -1, 2 ** 40 - 1, 0x24]
