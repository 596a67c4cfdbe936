"""The contract shared by foreshock's generic univariate online detectors.

A univariate detector watches ``n_series`` independent series at once. Its state is a few
numpy arrays indexed by series (attributes named ``s_*``); a private ``@njit`` kernel loops over
a batch of time steps and updates them. The contract, the same for every algorithm:

- ``update(x)`` — *prequential*: each row of ``x`` (shape ``(T, n_series)``, or ``(n_series,)``
  for one step) is scored against the state so far, then learned. Returns scores shaped like
  ``x``. Higher = more anomalous; scores are in the detector's natural unit (a z-score, a CUSUM
  statistic...), never thresholded: deciding is the job of a filter or of the combiner.
- ``score(x)`` — *pure*: scores every row against the current state and learns nothing, so
  calling it never changes a later ``update``.
- Missing samples (NaN), non-finite values (±inf) and finite values of magnitude beyond
  :data:`MAX_MAGNITUDE` (a corrupted double, a ``DBL_MAX`` sentinel) score NaN and do not touch
  the state; with a ``health`` object they are counted (``<name>``/``non_finite_input``).
- ``state_dict()`` / ``load_state_dict()`` — every ``s_*`` array; a detector restored from a
  state dict produces exactly the scores the original would have.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from foreshock.health import PipelineHealth

MAX_MAGNITUDE = 1e150
"""Largest input magnitude a detector learns. Beyond it a value is no reading but a corrupted
one, and its differences and squares (up to ~1e300) would overflow float64 near 1.7e308 and
leave the state inf or NaN for good: such a value is treated as non-finite."""


def unusable(x: np.ndarray) -> np.ndarray:
    """Mask of the values a detector skips: NaN, ±inf, or magnitude beyond :data:`MAX_MAGNITUDE`."""
    return ~(np.abs(x) <= MAX_MAGNITUDE)


def as_batch(x: Any, n_series: int, name: str) -> tuple[np.ndarray, bool]:
    """Validate one step ``(n_series,)`` or a batch ``(T, n_series)``; return a C-contiguous
    float64 ``(T, n_series)`` array and whether the input was a single step."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        if arr.shape[0] != n_series:
            raise ValueError(f"{name}: expected {n_series} values (one per series), got {arr.shape[0]}")
        return np.ascontiguousarray(arr.reshape(1, n_series)), True
    if arr.ndim != 2 or arr.shape[1] != n_series:
        raise ValueError(f"{name}: expected shape (T, {n_series}), got {arr.shape}")
    return np.ascontiguousarray(arr), False


def check_positive(name: str, **values: float) -> None:
    for key, v in values.items():
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name}: {key} must be a positive finite number, got {v!r}")


def check_rate(name: str, **values: float) -> None:
    """Smoothing rates live in (0, 1]."""
    for key, v in values.items():
        if not (np.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError(f"{name}: {key} must be in (0, 1], got {v!r}")


def check_count(name: str, **values: int) -> None:
    for key, v in values.items():
        if int(v) != v or v < 0:
            raise ValueError(f"{name}: {key} must be a non-negative integer, got {v!r}")


class UnivariateDetector:
    """Base class: subclasses set ``name``, create their ``s_*`` arrays and implement ``_run``.

    ``_run(x, out, learn)`` fills ``out`` with the scores of batch ``x``; it must leave the
    state untouched when ``learn`` is False.
    """

    name: ClassVar[str] = "univariate"

    def __init__(self, n_series: int, health: PipelineHealth | None = None) -> None:
        if int(n_series) != n_series or n_series < 1:
            raise ValueError(f"{self.name}: n_series must be a positive integer, got {n_series!r}")
        self.n_series = int(n_series)
        self.health = health

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        raise NotImplementedError

    def _apply(self, x: Any, learn: bool) -> np.ndarray:
        batch, single = as_batch(x, self.n_series, self.name)
        skip = unusable(batch)
        if skip.any():
            # the kernels skip non-finite values only: an oversized one goes in as NaN (on a
            # copy: ``batch`` may be the caller's array)
            batch = np.where(skip, np.nan, batch)
        if self.health is not None and batch.size:
            self.health.problem(self.name, "non_finite_input", int(np.count_nonzero(skip)))
        out = np.empty_like(batch)
        if batch.shape[0]:
            self._run(batch, out, learn)
        return out[0] if single else out

    def update(self, x: Any) -> np.ndarray:
        """Score each row against the state so far, then learn it (prequential)."""
        return self._apply(x, learn=True)

    def score(self, x: Any) -> np.ndarray:
        """Score each row against the current state; learn nothing."""
        return self._apply(x, learn=False)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in vars(self).items() if k.startswith("s_") and isinstance(v, np.ndarray)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own = self.state_dict()
        if set(own) != set(state):
            raise ValueError(f"{self.name}: state keys {sorted(state)} != expected {sorted(own)}")
        for key, ref in own.items():
            arr = np.asarray(state[key], dtype=ref.dtype)
            if arr.shape != ref.shape:
                raise ValueError(f"{self.name}: state {key!r} has shape {arr.shape}, expected {ref.shape}")
            setattr(self, key, np.ascontiguousarray(arr).copy())

    def state_nbytes(self) -> int:
        return sum(v.nbytes for v in self.state_dict().values())
