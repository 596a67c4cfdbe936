"""The baselines' shared feature stream, ``feature_kernel`` (detectors/baselines.py), against a plain-Python
reference on hypothesis frames (tests/test_baselines.py holds it on one seeded series only): several
GPUs interleaved, stamps repeated or going back (the row's features NaN, its GPU's state untouched),
gaps at and just over ``F_SLOPE_GAP_S`` and spans at and under ``F_SLOPE_MIN_S``, sensors dark (NaN),
power readings and energy counters NaN, infinite, negative, at and over the 1e5 W bound, counters that
go back, limits missing, 0 or infinite, clocks with no or a 0 maximum, throttle reasons that are not a
bitmask, own temperature limits inside, at and outside ``OWN_LIMIT_MIN_C``..``OWN_LIMIT_MAX_C``.

The slopes are :func:`test_baselines.reference_slope` (written from ``_track``'s docstring) over each
GPU's rows kept. The inlet a GPU sees is ``gpu_inputs.gpu_inlet``'s (its own contract, not restated here):
the reference replays it (as plain Python: the module's kernels' own bodies, nothing compiled for the
test) on copies of the rack and node states, row by row, with the power the row's features report, so
that the kernel must pass it the sample's own power after its bounds and energy rules. Temperatures are
finite or NaN: the input guard sets infinities to NaN before any detector
(``guard._scan_columns``). The kernel is read as a module attribute at call time, so that a mutated
copy patched in is what runs."""

from __future__ import annotations

import math
import types

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import baselines as bl
from foreshock.detectors import gpu_inputs as gi
from foreshock.health import PipelineHealth
from test_baselines import reference_slope
from thermal_synth import small_topology

pytestmark = pytest.mark.kernel

NAN, INF = math.nan, math.inf
TOPO = small_topology(nodes=2, gpus=2, racks=2)
N_GPU = 4
HOPPER_CORE_C, HOPPER_HBM_C, DEFAULT_LIMIT_W = 87.0, 95.0, 700.0
OWN_MIN_C, OWN_MAX_C, SLOWDOWN_LESS_C = 40.0, 130.0, 2.0
THERMAL_BITS, POWER_CAP_BIT = 0x08 | 0x20 | 0x40, 0x04  # HW slowdown, SW thermal, HW thermal; SW power cap

STEPS = st.sampled_from([0.0, 0.5, 1.0, 5.0, 10.0, 10.0, 29.5, 30.0, 300.0, 600.0, 601.0, -10.0])
TEMPS = st.one_of(st.sampled_from([NAN, NAN, 45.0, 60.0]), st.floats(20.0, 100.0))
POWERS = st.sampled_from([NAN, INF, -INF, -1.0, 0.0, 350.0, 650.5, 99_999.5, 1e5])
ENERGY = st.sampled_from(["nan", "inf", "same", "600W", "1e5W", "back", "10W"])
LIMITS = st.sampled_from([NAN, 0.0, -5.0, 700.0, 500.0, INF])
CLOCKS = st.sampled_from([NAN, 1.5e9, INF])
CLOCK_MAX = st.sampled_from([NAN, 0.0, -1.0, 2e9, INF])
REASONS = st.sampled_from([NAN, -1.0, 0.0, 4.0, 8.0, 32.0, 68.0, 1.5, 2.0 ** 40 - 1, 2.0 ** 40, INF])
OWN_LIMITS = st.sampled_from([NAN, 0.0, -2.0, 40.0, 40.5, 83.0, 85.0, 129.9, 130.0])


def as_python(module: types.ModuleType) -> dict:
    """``module``'s globals with each of its Numba kernels replaced by its Python body (calling each other)."""
    space = dict(vars(module))
    for name, value in vars(module).items():
        if isinstance(value, numba.core.dispatcher.Dispatcher):
            f = value.py_func
            space[name] = types.FunctionType(f.__code__, space, name, f.__defaults__, f.__closure__)
    return space


GI = as_python(gi)


def naive_features(rows, gpu_inlet_replay):
    """``rows``: obs rows (lists, in ``X_*`` order). Per row: NaN features where its stamp is not after
    its GPU's last row kept (skipped, counted); else the features, the GPU's last row and energy kept."""
    last_ts, last_energy = [NAN] * N_GPU, [NAN] * N_GPU
    kept: dict[int, list[tuple[int, float, float, float, float, float]]] = {g: [] for g in range(N_GPU)}
    out = [[NAN] * len(bl.FEATURES) for _ in rows]
    skipped = 0
    for k, r in enumerate(rows):
        ts, g = r[bl.X_TS], int(r[bl.X_SLOT])
        dt = ts - last_ts[g]
        if not math.isnan(last_ts[g]) and dt <= 0.0:
            skipped += 1
            continue
        temp, hbm, power, energy = r[bl.X_TEMP], r[bl.X_HBM], r[bl.X_POWER], r[bl.X_ENERGY]
        if not math.isnan(power) and not 0.0 <= power < 1e5:  # a reading out of bounds is none
            power = NAN
        if not math.isnan(last_ts[g]) and dt <= 600.0 and not math.isnan(energy) and not math.isnan(last_energy[g]):
            mean = (energy - last_energy[g]) / dt  # the counter's mean power since the last row, in bounds
            if 0.0 <= mean < 1e5:
                power = mean
        limit = r[bl.X_LIMIT] if r[bl.X_LIMIT] > 0.0 else DEFAULT_LIMIT_W
        max_op, slowdown, hbm_max_op = r[bl.X_MAX_OP], r[bl.X_SLOWDOWN], r[bl.X_HBM_MAX_OP]
        if OWN_MIN_C < max_op < OWN_MAX_C:
            core_limit = max_op
        elif OWN_MIN_C < slowdown < OWN_MAX_C:
            core_limit = slowdown - SLOWDOWN_LESS_C
        else:
            core_limit = HOPPER_CORE_C
        hbm_limit = hbm_max_op if OWN_MIN_C < hbm_max_op < OWN_MAX_C else HOPPER_HBM_C
        inlet = gpu_inlet_replay(ts, g, temp, power)
        last_ts[g], last_energy[g] = ts, energy
        kept[g].append((k, ts, temp, hbm, power, inlet))
        reasons = r[bl.X_REASONS]
        bits = int(reasons) if 0.0 <= reasons < 2.0 ** 40 else 0  # (NaN: no bits)
        clock, clock_max = r[bl.X_CLOCK], r[bl.X_CLOCK_MAX]
        out[k] = [temp, hbm, power, power / limit, clock / clock_max if clock_max > 0.0 else NAN, r[bl.X_UTIL],
                  NAN, NAN, NAN, core_limit - temp, hbm_limit - hbm, temp - inlet, inlet, NAN,
                  1.0 if bits & THERMAL_BITS else 0.0, 1.0 if bits & POWER_CAP_BIT else 0.0]
    for series in kept.values():
        ts = [x[1] for x in series]
        for col, j in ((6, 2), (7, 3), (8, 4), (13, 5)):
            for (k, *_), slope in zip(series, reference_slope(ts, [x[j] for x in series])):
                out[k][col] = slope
    return out, skipped


def draw_rows(data) -> list[list[float]]:  # type: ignore[no-untyped-def]
    rows, t = [], 1000.0
    prev_ts, energy = [NAN] * N_GPU, [5e6] * N_GPU
    for _ in range(data.draw(st.integers(0, 40))):
        t += data.draw(STEPS)
        g = data.draw(st.integers(0, N_GPU - 1))
        span = t - prev_ts[g] if t > prev_ts[g] else 1.0
        how = data.draw(ENERGY)
        e = {"nan": NAN, "inf": INF, "same": energy[g], "600W": energy[g] + 600.0 * span,
             "1e5W": energy[g] + 1e5 * span, "back": energy[g] - 1e4, "10W": energy[g] + 10.0 * span}[how]
        if math.isfinite(e):
            energy[g] = e
        prev_ts[g] = t
        r = [NAN] * 14
        r[bl.X_TS], r[bl.X_SLOT], r[bl.X_ENERGY] = t, float(g), e
        r[bl.X_TEMP], r[bl.X_HBM], r[bl.X_POWER] = data.draw(TEMPS), data.draw(TEMPS), data.draw(POWERS)
        r[bl.X_LIMIT], r[bl.X_CLOCK], r[bl.X_CLOCK_MAX] = data.draw(LIMITS), data.draw(CLOCKS), data.draw(CLOCK_MAX)
        r[bl.X_UTIL], r[bl.X_REASONS] = data.draw(st.sampled_from([NAN, 0.0, 0.75])), data.draw(REASONS)
        r[bl.X_SLOWDOWN], r[bl.X_MAX_OP], r[bl.X_HBM_MAX_OP] = (data.draw(OWN_LIMITS), data.draw(OWN_LIMITS),
                                                                data.draw(OWN_LIMITS))
        rows.append(r)
    return rows


@pytest.fixture(scope="module", autouse=True)
def compiled_first() -> None:
    """The kernel compiled before hypothesis runs: compiled inside a hypothesis test (Numba's inlining
    copies its IR, millions of objects) took twice as long, 40 s against 20 s on a cold cache."""
    stream = bl.FeatureStream(TOPO, PipelineHealth(), "test")
    bl.feature_kernel(np.zeros((0, 14)), stream.parents, stream.s_feat, stream.s_rack, stream.s_node,
                      np.zeros((0, len(bl.FEATURES))))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), rack_inlets=st.lists(st.sampled_from([NAN, 25.0, 31.5]), min_size=2, max_size=2),
       split=st.integers(0, 40))
def test_feature_kernel_matches_the_naive_features(data, rack_inlets, split):
    stream = bl.FeatureStream(TOPO, PipelineHealth(), "test")
    racks = np.array([[1000.0, r, inlet, NAN, NAN] for r, inlet in enumerate(rack_inlets)])
    gi.update_rack_inlet(racks, stream.s_rack)
    ref_rack, ref_node = stream.s_rack.copy(), stream.s_node.copy()
    parents = stream.parents

    def replay(ts, g, temp, power):  # type: ignore[no-untyped-def]
        return GI["gpu_inlet"](ts, parents[g, 1], parents[g, 0], temp, power, ref_rack, ref_node,
                            facts.THERMAL_RESISTANCE_C_PER_W, 300.0)

    rows = draw_rows(data)
    obs = np.array(rows, dtype=np.float64).reshape(len(rows), 14)
    out = np.full((len(rows), len(bl.FEATURES)), -7.0)
    cut = min(split, len(rows))  # two frames: the state carried from one to the next
    skipped = sum(bl.feature_kernel(np.ascontiguousarray(obs[part]), parents, stream.s_feat, stream.s_rack,
                                    stream.s_node, out[part]) for part in (slice(0, cut), slice(cut, None)))
    want, want_skipped = naive_features(rows, replay)
    assert skipped == want_skipped
    for k in range(len(rows)):
        for j, name in enumerate(bl.FEATURES):
            assert out[k, j] == pytest.approx(want[k][j], rel=1e-9, abs=1e-9, nan_ok=True), (k, name)
    # the inlet's own state: as gpu_inlet leaves it (up to the kernels' fastmath rounding)
    np.testing.assert_allclose(stream.s_rack, ref_rack, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stream.s_node, ref_node, rtol=1e-12, atol=1e-12)
