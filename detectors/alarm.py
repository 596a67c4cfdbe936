"""The life of one prediction on one entity: start, refresh, withdraw — with hysteresis.

A detector scores (an ETA, a confidence); this state machine decides. It starts a prediction
after ``on_count`` consecutive firing samples, refreshes it at most every ``refresh_s`` of
telemetry time while it holds, and withdraws it once the clear condition has held for
``off_hold_s`` — so a prediction does not flap on noise around its threshold.

State is four float64 columns inside the detector's per-slot state array, at offset ``off`` (or
three: the compact block, ``K_*``, that the thermal and the power detector keep).
Kernels write emitted rows into an *emission buffer* ``out`` (see :data:`OUT_FIELDS`) that the
Python side turns into :class:`~foreshock.findings.Prediction` objects; a kernel never builds
Python objects.
"""

from __future__ import annotations

import numpy as np

from foreshock.findings import Finding, Prediction

from .gpu_inputs import frame_now, inline, kernel

A_ACTIVE, A_ON, A_EMIT_TS, A_OFF_TS = 0, 1, 2, 3
A_SIZE = 4

CODE_NONE, CODE_START, CODE_REFRESH, CODE_WITHDRAW = 0, 1, 2, 3

OUT_FIELDS = ("row", "which", "code", "eta", "confidence", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8",
              "v9")
"""Emission buffer columns: input row, which prediction of the detector, code, ETA (s),
confidence, then up to ten detector-specific values for the human-readable reason (:func:`emit`
writes six, NaN after them; a detector with more writes them into the row it emitted)."""
OUT_SIZE = len(OUT_FIELDS)
O_ROW, O_WHICH, O_CODE, O_ETA, O_CONF, O_V0 = 0, 1, 2, 3, 4, 5


# The compact block: three columns, for the detectors whose state is held to a budget per GPU (the
# thermal and the power detector: the GPU bank's 1 KiB). ``K_STATE`` holds ``A_ACTIVE`` and ``A_ON`` in
# one: while the alarm is not active, its count of consecutive firing samples (>= 0); while it is,
# minus its tag (1, or what its detector sets: :func:`set_compact_tag`). The count is not read while
# the alarm is active (withdrawing zeroes it), so nothing is lost: the same codes at the same rows
# (tests/test_state_budget_thermal.py steps both blocks side by side).
K_STATE, K_EMIT_TS, K_OFF_TS = 0, 1, 2
K_SIZE = 3


def new_compact_alarms(n: int, count: int) -> np.ndarray:
    """``count`` compact alarm blocks for ``n`` slots, as one array (count * K_SIZE columns)."""
    state = np.zeros((n, count * K_SIZE))
    for k in range(count):
        state[:, k * K_SIZE + K_EMIT_TS] = np.nan
        state[:, k * K_SIZE + K_OFF_TS] = np.nan
    return state


def compact_from_alarm_columns(old: np.ndarray, count: int) -> np.ndarray:
    """``count`` four-column blocks (a state saved before the compact block) as compact blocks: an
    active alarm's state is minus its ``A_ACTIVE`` (its tag), an inactive one's its ``A_ON``."""
    old = np.asarray(old, dtype=np.float64)
    new = np.empty((old.shape[0], count * K_SIZE))
    for k in range(count):
        active, on = old[:, k * A_SIZE + A_ACTIVE], old[:, k * A_SIZE + A_ON]
        new[:, k * K_SIZE + K_STATE] = np.where(active != 0.0, -active, on)
        new[:, k * K_SIZE + K_EMIT_TS] = old[:, k * A_SIZE + A_EMIT_TS]
        new[:, k * K_SIZE + K_OFF_TS] = old[:, k * A_SIZE + A_OFF_TS]
    return new


def alarms_as_layout1(s_alarm: np.ndarray, count: int) -> np.ndarray:
    """``count`` compact blocks as the four-column ones kept before them (:func:`compact_from_alarm_columns`
    undone): active with its tag, or the firing count. Exact but for an active alarm's ``A_ON``: its
    firing count, not read while it is active (withdrawing zeroes it), is not kept; 1 here."""
    s_alarm = np.asarray(s_alarm, dtype=np.float64)
    out = new_alarm_columns(len(s_alarm), count)
    for k in range(count):
        state = s_alarm[:, k * K_SIZE + K_STATE]
        out[:, k * A_SIZE + A_ACTIVE] = np.maximum(-state, 0.0)
        out[:, k * A_SIZE + A_ON] = np.where(state < 0.0, 1.0, state)
        out[:, k * A_SIZE + A_EMIT_TS] = s_alarm[:, k * K_SIZE + K_EMIT_TS]
        out[:, k * A_SIZE + A_OFF_TS] = s_alarm[:, k * K_SIZE + K_OFF_TS]
    return out


@inline
def compact_active(state: np.ndarray, i: int, off: int) -> bool:
    """Whether the compact alarm of slot ``i`` at ``off`` is active."""
    return state[i, off + K_STATE] < 0.0  # type: ignore[no-any-return]


@inline
def compact_tag(state: np.ndarray, i: int, off: int) -> float:
    """The tag of the compact alarm of slot ``i`` at ``off`` (``A_ACTIVE``'s value: 0 when not
    active, else 1 or what :func:`set_compact_tag` set)."""
    return max(-state[i, off + K_STATE], 0.0)  # type: ignore[no-any-return]


@inline
def set_compact_tag(state: np.ndarray, i: int, off: int, tag: float) -> None:
    """Tag the active compact alarm of slot ``i`` at ``off`` with ``tag`` (>= 1), as a detector
    storing more than 1 in ``A_ACTIVE`` did."""
    state[i, off + K_STATE] = -tag


@inline
def compact_withdraw(state: np.ndarray, i: int, off: int, ts: float) -> int:
    """:func:`alarm_withdraw` of a compact block."""
    if not state[i, off + K_STATE] < 0.0:
        return CODE_NONE
    state[i, off + K_STATE] = 0.0
    state[i, off + K_OFF_TS] = np.nan
    state[i, off + K_EMIT_TS] = ts
    return CODE_WITHDRAW


@inline
def compact_step(state: np.ndarray, i: int, off: int, ts: float, firing: bool, clear: bool,
                 on_count: float, off_hold_s: float, refresh_s: float) -> int:
    """:func:`alarm_step` of a compact block (columns ``off..off+2``); the same emission codes."""
    count = state[i, off + K_STATE]
    if not count < 0.0:
        count = count + 1.0 if firing else 0.0
        if count >= on_count:
            state[i, off + K_STATE] = -1.0
            state[i, off + K_EMIT_TS] = ts
            state[i, off + K_OFF_TS] = np.nan
            return CODE_START
        state[i, off + K_STATE] = count
        return CODE_NONE
    if clear:
        since = state[i, off + K_OFF_TS]
        if since != since:
            state[i, off + K_OFF_TS] = ts
        elif ts - since >= off_hold_s:
            return compact_withdraw(state, i, off, ts)
        return CODE_NONE
    state[i, off + K_OFF_TS] = np.nan
    if firing and ts - state[i, off + K_EMIT_TS] >= refresh_s:
        state[i, off + K_EMIT_TS] = ts
        return CODE_REFRESH
    return CODE_NONE


def new_alarm_columns(n: int, count: int) -> np.ndarray:
    """``count`` alarm blocks for ``n`` slots, as one array (count * A_SIZE columns)."""
    state = np.zeros((n, count * A_SIZE))
    for k in range(count):
        state[:, k * A_SIZE + A_EMIT_TS] = np.nan
        state[:, k * A_SIZE + A_OFF_TS] = np.nan
    return state


@inline
def alarm_withdraw(state: np.ndarray, i: int, off: int, ts: float) -> int:
    """Withdraw the alarm of slot ``i`` now, without the clear hold (what it watched is gone);
    return the emission code: ``CODE_WITHDRAW``, or ``CODE_NONE`` if it was not active."""
    if state[i, off + A_ACTIVE] == 0.0:
        return CODE_NONE
    state[i, off + A_ACTIVE] = 0.0
    state[i, off + A_ON] = 0.0
    state[i, off + A_OFF_TS] = np.nan
    state[i, off + A_EMIT_TS] = ts
    return CODE_WITHDRAW


def withdraw_silent(state: np.ndarray, count: int, last_ts: np.ndarray, now: float,
                    silent_s: float, compact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Withdraw now, without the clear hold, each active alarm of the ``count`` blocks in ``state``
    whose slot was last heard from (``last_ts``, by slot) more than ``silent_s`` before ``now``, as
    :func:`alarm_withdraw` does; return the (slots, blocks) withdrawn, slot by slot. A prediction
    steps only on its own slot's rows: one whose slot stopped reporting (an exporter hung, a GPU off
    the bus) was never withdrawn, and held for ever. One compiled pass over the slots per frame,
    a second only where there is something to withdraw: done with NumPy (a strided view of the
    active flags, ``any`` over the blocks) it took ~0.17 ms a frame at 16,384 GPUs, run by the
    thermal and the power detector each: a tenth of the GPU bank's time at 10-s polls. ``compact``:
    the blocks are compact ones (:data:`K_SIZE` columns)."""
    n = _silent_alarms(state, count, last_ts, now, silent_s, np.empty(0, np.int64), np.empty(0, np.int64), compact)
    slots, blocks = np.empty(n, np.int64), np.empty(n, np.int64)
    if n:
        _silent_alarms(state, count, last_ts, now, silent_s, slots, blocks, compact)
    return slots, blocks


@kernel
def _silent_alarms(state: np.ndarray, count: int, last_ts: np.ndarray, now: float, silent_s: float,
                   slots: np.ndarray, blocks: np.ndarray, compact: bool = False) -> int:
    """How many active alarms :func:`withdraw_silent` withdraws; where ``slots`` has room for them,
    withdraws them and writes their slot and block (a never-heard slot, NaN, is silent too)."""
    k = 0
    write = len(slots) > 0
    size = K_SIZE if compact else A_SIZE
    for i in range(state.shape[0]):
        for b in range(count):
            off = b * size
            active = state[i, off + K_STATE] < 0.0 if compact else state[i, off + A_ACTIVE] != 0.0
            if active and not now - last_ts[i] <= silent_s:
                if write:
                    if compact:
                        compact_withdraw(state, i, off, now)
                    else:
                        alarm_withdraw(state, i, off, now)
                    slots[k] = i
                    blocks[k] = b
                k += 1
    return k


def withdraw_silent_in_frame(state: np.ndarray, count: int, last_ts: np.ndarray, stamps: np.ndarray,
                             silent_s: float, compact: bool = False) -> tuple[float, np.ndarray, np.ndarray]:
    """:func:`withdraw_silent` as of a frame's time: ``now`` is what its ``stamps`` speak for
    (:func:`~.gpu_inputs.frame_now`: one row stamped far ahead does not silence the rest; missing
    stamps skipped). Returns ``(now, slots, blocks)``; a frame with no stamp withdraws nothing."""
    stamps = stamps[np.isfinite(stamps)]
    if not len(stamps):
        return float("nan"), np.empty(0, np.int64), np.empty(0, np.int64)
    now = frame_now(stamps, silent_s)
    slots, blocks = withdraw_silent(state, count, last_ts, now, silent_s, compact)
    return now, slots, blocks


def silent_gpu_withdrawals(detector: str, alarms: np.ndarray, block_events: tuple[tuple[str, ...], ...],
                           last_ts: np.ndarray, stamps: np.ndarray, silent_s: float,
                           compact: bool = False) -> list[Finding]:
    """:func:`withdraw_silent_in_frame` over a GPU detector's ``alarms`` (block ``k`` predicts the
    events ``block_events[k]``; ``compact``: compact blocks), and the withdrawals as predictions that
    say why."""
    now, slots, blocks = withdraw_silent_in_frame(alarms, len(block_events), last_ts, stamps, silent_s, compact)
    return [Prediction(now, "gpu", slot, event, -1.0, 0.0, detector, silent_reason(now - float(last_ts[slot])),
                       active=False)
            for slot, block in zip(slots.tolist(), blocks.tolist()) for event in block_events[block]]


def silent_reason(silent_for_s: float,
                  why: str = "its exporter hung, its host down, or the GPU fell off the bus") -> str:
    """The reason of a prediction withdrawn by :func:`withdraw_silent`; ``why``: what can have
    silenced the entity (a GPU's causes by default)."""
    return f"no report for {silent_for_s / 60:.0f} min: withdrawn as no longer reporting; not a recovery ({why})"


@inline
def alarm_step(state: np.ndarray, i: int, off: int, ts: float, firing: bool, clear: bool,
               on_count: float, off_hold_s: float, refresh_s: float) -> int:
    """Advance the alarm of slot ``i`` at columns ``off..off+3``; return the emission code."""
    if state[i, off + A_ACTIVE] == 0.0:
        if firing:
            state[i, off + A_ON] += 1.0
        else:
            state[i, off + A_ON] = 0.0
        if state[i, off + A_ON] >= on_count:
            state[i, off + A_ACTIVE] = 1.0
            state[i, off + A_EMIT_TS] = ts
            state[i, off + A_OFF_TS] = np.nan
            return CODE_START
        return CODE_NONE
    if clear:
        since = state[i, off + A_OFF_TS]
        if since != since:
            state[i, off + A_OFF_TS] = ts
        elif ts - since >= off_hold_s:
            return alarm_withdraw(state, i, off, ts)
        return CODE_NONE
    state[i, off + A_OFF_TS] = np.nan
    if firing and ts - state[i, off + A_EMIT_TS] >= refresh_s:
        state[i, off + A_EMIT_TS] = ts
        return CODE_REFRESH
    return CODE_NONE


@inline
def emit(out: np.ndarray, n_out: int, row: int, which: int, code: int, eta: float,
         conf: float, values: tuple[float, float, float, float, float, float]) -> int:
    """Append one emission; returns the new count."""
    out[n_out, O_ROW] = row
    out[n_out, O_WHICH] = which
    out[n_out, O_CODE] = code
    out[n_out, O_ETA] = eta
    out[n_out, O_CONF] = conf
    for k in range(6):
        out[n_out, O_V0 + k] = values[k]
    for k in range(6, OUT_SIZE - O_V0):
        out[n_out, O_V0 + k] = np.nan
    return n_out + 1


def prediction_spans(preds: list[Prediction], end: float) -> list[tuple[float, float]]:
    """(start, end) of each stretch during which an entity's prediction held, from its
    time-ordered start/refresh/withdraw findings; one still holding at ``end`` is closed there."""
    spans: list[tuple[float, float]] = []
    opened: float | None = None
    for p in preds:
        if p.active and opened is None:
            opened = p.ts
        elif not p.active and opened is not None:
            spans.append((opened, p.ts))
            opened = None
    if opened is not None:
        spans.append((opened, max(end, opened)))
    return spans
