"""order_stats' kernels against plain Python: the group buckets the cooling and straggler kernels
take their medians over (``median_of`` itself is checked in test_optics.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import order_stats


@pytest.mark.kernel
@settings(max_examples=200, deadline=None)
@given(groups=st.lists(st.integers(-2, 6), max_size=60), n_groups=st.integers(0, 6))
def test_bucket_by_group_lists_each_groups_members_in_index_order(groups: list[int], n_groups: int) -> None:
    start, members, largest = order_stats.bucket_by_group(np.array(groups, dtype=np.int64), n_groups)
    want = [[k for k, g in enumerate(groups) if g == group] for group in range(n_groups)]
    assert [list(members[start[g]:start[g + 1]]) for g in range(n_groups)] == want
    assert len(members) == sum(map(len, want))  # an element outside every group is in none
    assert largest == max(map(len, want), default=0)
