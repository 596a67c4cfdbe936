"""Every text parser survives arbitrary input: bad input is counted, never raised."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.health import PipelineHealth
from foreshock.streams.dom import parse_ethtool_m
from foreshock.streams.ethtool_stats import parse_ethtool_stats, stats_batches
from foreshock.streams.nvidia_smi import capture_sections, parse_dmon, parse_query_gpu

DATA = Path(__file__).parent / "data"

# Characters the real formats are made of, so the fuzzer reaches deep into each parser.
ALPHABET = st.sampled_from(list("0123456789 .,:#[]()/-_\t\nxXWMHzCmAdBVabcdefgilnoprstuyNOTSupportedChanel"))
TEXT = st.text(alphabet=ALPHABET, max_size=400)

PARSERS: dict[str, Callable[[str, PipelineHealth], object]] = {
    "query-gpu": lambda text, h: parse_query_gpu(text, health=h),
    "query-gpu-noheader": lambda text, h: parse_query_gpu(text, health=h, columns=["timestamp", "index", "power.draw"]),
    "dmon": lambda text, h: parse_dmon(text, health=h),
    "ethtool -m": lambda text, h: parse_ethtool_m(text, h).optic_values(),
    "ethtool -S": lambda text, h: stats_batches({"l": text}, 0.0, h),
    "capture sections": lambda text, h: capture_sections(text),
}


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_parsers_never_raise(name: str, text: str) -> None:
    PARSERS[name](text, PipelineHealth())


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0, max_value=4000), junk=st.text(alphabet=ALPHABET, max_size=20))
def test_truncated_and_spliced_real_outputs(cut: int, junk: str) -> None:
    for name in ("ethtool_m_qsfp28_sr4.txt", "ethtool_m_osfp_cmis_8lane.txt"):
        text = (DATA / name).read_text()
        parse_ethtool_m(text[:cut] + junk + text[cut:], PipelineHealth())
    stats = (DATA / "ethtool_S_mlx5_t0.txt").read_text()
    parse_ethtool_stats(stats[: cut % len(stats)] + junk, PipelineHealth())
