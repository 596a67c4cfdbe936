"""Online robust Mahalanobis distance for entities that report many fields at once (a node's
tens of metrics), with per-field attribution of every score.

Per entity: an exponentially weighted mean ``mu`` and covariance ``C`` of its field vector.
For a sample ``x`` with residual ``r = x - mu``::

    D^2 = r' C^-1 r                     (Cholesky solve; correlations shrunk by ``ridge``)
    contribution_i = r_i * (C^-1 r)_i   (sums to D^2: field i's share of the distance)

The score is ``D / sqrt(d)`` — about 1 for a typical sample whatever the number of fields —
so thresholds carry over between node types. A field that moves with its correlated
peers costs little; one that breaks the usual relation (power up, temperature flat) gets the
largest contribution, which is what an operator needs to see.

Robust learning: a sample with ``D^2`` beyond ``d + clip * sqrt(2 d)`` (``clip`` standard
deviations of a chi-square with d degrees of freedom) is down-weighted by ``bound / D^2``, so
an anomaly does not teach the model that it is normal. The first samples use running means
(rate ``max(alpha, 1/n)``). Missing fields (NaN or inf) are imputed at the mean: they
contribute 0 to the score, and learning treats them as a sample at the mean (their variance
decays by ``1 - alpha``), which keeps ``C`` positive semi-definite. A sample with no finite
field scores NaN and teaches nothing.

>>> import numpy as np
>>> rng = np.random.default_rng(5)
>>> base = rng.normal(size=(3000, 1))
>>> x = np.hstack([base + 0.1 * rng.normal(size=(3000, 1)) for _ in range(4)])[:, None, :]
>>> x[2500, 0, 2] += 1.5                    # field 2 breaks away from its three peers
>>> det = OnlineMahalanobis(n_entities=1, n_fields=4, alpha=0.01)
>>> res = det.update(x)
>>> bool(res.score[2500, 0] > 4 * np.median(res.score[1000:2500, 0])), int(np.argmax(res.contributions[2500, 0]))
(True, 2)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

ALPHA, RIDGE, CLIP, WARMUP, FLOOR = 0, 1, 2, 3, 4
"""Indices into the kernel's parameter vector; ``FLOOR + i`` is field i's variance floor."""


class MultivariateScores(NamedTuple):
    score: np.ndarray          # (T, entities): D / sqrt(fields), NaN with no finite field
    contributions: np.ndarray  # (T, entities, fields): r_i (C^-1 r)_i, summing to D^2


class RowScores(NamedTuple):
    """Scores of rows that each name their entity (:meth:`OnlineMahalanobis.update_rows`)."""

    score: np.ndarray          # (rows,): D / sqrt(fields), NaN with no finite field
    contributions: np.ndarray  # (rows, fields): r_i (C^-1 r)_i, summing to D^2
    residuals: np.ndarray      # (rows, fields): x_i - mean_i before learning (0 where missing)


@jit
def _cholesky_solve(a: np.ndarray, r: np.ndarray, low: np.ndarray, inv: np.ndarray, y: np.ndarray) -> None:
    """y = a^-1 r via a Cholesky factor ``low`` of the symmetric positive (after loading) ``a``.
    A pivot that is not positive is replaced by a tiny fraction of the diagonal, so an
    ill-conditioned covariance gives a large distance instead of a failure. ``inv`` (scratch)
    holds the reciprocal pivots: one division per field instead of one per entry."""
    d = a.shape[0]
    for i in range(d):
        for j in range(i + 1):
            s = a[i, j]
            for k in range(j):
                s -= low[i, k] * low[j, k]
            if i == j:
                floor = 1e-12 * max(abs(a[i, i]), 1e-300)
                low[i, i] = math.sqrt(s if s > floor else floor)
                inv[i] = 1.0 / low[i, i]
            else:
                low[i, j] = s * inv[j]
    for i in range(d):  # forward: low z = r
        s = r[i]
        for k in range(i):
            s -= low[i, k] * y[k]
        y[i] = s * inv[i]
    for i in range(d - 1, -1, -1):  # back: low' y = z
        s = y[i]
        for k in range(i + 1, d):
            s -= low[k, i] * y[k]
        y[i] = s * inv[i]


@jit
def _mahalanobis_rows(slot: np.ndarray, x: np.ndarray, mean: np.ndarray, cov: np.ndarray, count: np.ndarray,
                      params: np.ndarray, out: np.ndarray, learn: np.ndarray) -> None:
    """Row t is a sample of entity ``slot[t]``, rows in time order per entity.

    x (rows, d); mean (E, d); cov (E, d, d); count (E,); out (rows, 1 + 2d) =
    [score, d contributions, d residuals]; learn (rows,) bool: whether row t is learnt after
    it is scored. The batch API feeds (T, E, d) as T*E rows.
    """
    alpha, ridge, clip, warmup = params[ALPHA], params[RIDGE], params[CLIP], params[WARMUP]
    d = x.shape[1]
    reg = np.empty((d, d))
    low = np.empty((d, d))
    inv = np.empty(d)
    r = np.empty(d)
    y = np.empty(d)
    present = np.empty(d, dtype=np.bool_)
    bound = d + clip * math.sqrt(2.0 * d)
    for t in range(x.shape[0]):
        e = slot[t]
        n = count[e]
        seen = 0
        for i in range(d):
            v = x[t, i]
            present[i] = math.isfinite(v)
            if present[i]:
                seen += 1
                r[i] = v - mean[e, i] if n >= 1.0 else 0.0
            else:
                r[i] = 0.0
            out[t, 1 + i] = 0.0
            out[t, 1 + d + i] = r[i]
        if seen == 0:
            out[t, 0] = np.nan
            continue
        d2 = 0.0
        if n >= 2.0:
            # Shrink the correlations towards 0 (diagonal kept) and load the diagonal a hair,
            # so a constant field is a huge distance when it moves, not a failure. The floor
            # (a field's smallest meaningful variance, e.g. one step of an integer reading)
            # keeps a field that sat still from turning its first tiny move into an alarm.
            for i in range(d):
                for j in range(i):
                    reg[i, j] = (1.0 - ridge) * cov[e, i, j]
                m = mean[e, i]
                reg[i, i] = max(cov[e, i, i], params[FLOOR + i]) + 1e-9 * (1.0 + m * m)
            _cholesky_solve(reg, r, low, inv, y)
            for i in range(d):
                d2 += r[i] * y[i]
            d2 = max(d2, 0.0)
        if n < warmup:
            out[t, 0] = 0.0
        else:
            out[t, 0] = math.sqrt(d2 / d)
            if n >= 2.0:
                for i in range(d):
                    out[t, 1 + i] = r[i] * y[i]
        if not learn[t]:
            continue
        if n < 1.0:
            for i in range(d):
                mean[e, i] = x[t, i] if present[i] else 0.0
            count[e] = 1.0
            continue
        a = max(alpha, 1.0 / (n + 1.0))
        w = 1.0
        if n >= warmup and d2 > bound:
            w = bound / d2
        # A missing field learns as a sample at its mean (r_i = 0): C stays a sum of positive
        # semi-definite terms, which skipping its rows and columns would not keep.
        for i in range(d):
            for j in range(d):
                cov[e, i, j] = (1.0 - a) * cov[e, i, j] + a * (1.0 - a) * w * r[i] * r[j]
        for i in range(d):
            mean[e, i] += a * w * r[i]
        count[e] = n + 1.0


class OnlineMahalanobis:
    """Per-entity online robust Mahalanobis distance with per-field contributions (module
    docstring). ``update``/``score`` take ``(T, n_entities, n_fields)`` or one step
    ``(n_entities, n_fields)`` and return :class:`MultivariateScores`; ``update_rows`` /
    ``score_rows`` take rows that each name their entity (a frame's ``slot`` column) and return
    :class:`RowScores`.

    Parameters: ``alpha`` EWMA rate of mean and covariance; ``ridge`` shrinkage of the
    correlations towards 0 (0..1); ``clip`` robust bound in chi-square
    standard deviations; ``warmup`` samples before scoring (default ``2 * n_fields + 10``);
    ``min_scale`` each field's smallest meaningful standard deviation in its own unit (one value
    or one per field; default 0): the variance the solve uses is at least its square.
    The Cholesky solve reads only the lower triangle of the shrunk covariance.
    """

    name: ClassVar[str] = "mahalanobis"

    def __init__(self, n_entities: int, n_fields: int, alpha: float = 0.01, ridge: float = 0.001,
                 clip: float = 3.0, warmup: int | None = None, field_names: Sequence[str] | None = None,
                 health: PipelineHealth | None = None,
                 min_scale: float | Sequence[float] | np.ndarray = 0.0) -> None:
        for key, v in (("n_entities", n_entities), ("n_fields", n_fields)):
            if int(v) != v or v < 1:
                raise ValueError(f"{self.name}: {key} must be a positive integer, got {v!r}")
        if not (np.isfinite(alpha) and 0.0 < alpha <= 1.0):
            raise ValueError(f"{self.name}: alpha must be in (0, 1], got {alpha!r}")
        if not (np.isfinite(ridge) and 0.0 <= ridge < 1.0):
            raise ValueError(f"{self.name}: ridge must be in [0, 1), got {ridge!r}")
        if not (np.isfinite(clip) and clip > 0.0):
            raise ValueError(f"{self.name}: clip must be positive, got {clip!r}")
        warmup = 2 * int(n_fields) + 10 if warmup is None else warmup
        if int(warmup) != warmup or warmup < 0:
            raise ValueError(f"{self.name}: warmup must be a non-negative integer, got {warmup!r}")
        if field_names is not None and len(field_names) != n_fields:
            raise ValueError(f"{self.name}: {len(field_names)} field names for {n_fields} fields")
        floor = np.broadcast_to(np.asarray(min_scale, dtype=np.float64), (int(n_fields),))
        if not np.all(np.isfinite(floor) & (floor >= 0.0)):
            raise ValueError(f"{self.name}: min_scale must be finite and >= 0, got {min_scale!r}")
        self.n_entities, self.n_fields = int(n_entities), int(n_fields)
        self.field_names = list(field_names) if field_names is not None else [f"f{i}" for i in range(n_fields)]
        self.health = health
        self.params = np.concatenate([[alpha, ridge, clip, warmup], floor ** 2]).astype(np.float64)
        self.s_mean = np.zeros((self.n_entities, self.n_fields))
        self.s_cov = np.zeros((self.n_entities, self.n_fields, self.n_fields))
        self.s_count = np.zeros(self.n_entities)

    def _apply(self, x: Any, learn: bool) -> MultivariateScores:
        arr = np.asarray(x, dtype=np.float64)
        single = arr.ndim == 2
        if single:
            arr = arr[None]
        if arr.ndim != 3 or arr.shape[1:] != (self.n_entities, self.n_fields):
            raise ValueError(f"{self.name}: expected shape (T, {self.n_entities}, {self.n_fields}) "
                             f"or ({self.n_entities}, {self.n_fields}), got {np.shape(x)}")
        steps, d = arr.shape[0], self.n_fields
        # step-major rows, entity after entity: each entity's samples stay in time order
        slot = np.tile(np.arange(self.n_entities, dtype=np.int64), steps)
        out = self._run(slot, arr.reshape(-1, d), np.full(len(slot), learn))
        score = out[:, 0].reshape(steps, self.n_entities)
        contrib = out[:, 1:1 + d].reshape(steps, self.n_entities, d)
        if single:
            return MultivariateScores(score[0], contrib[0])
        return MultivariateScores(score, contrib)

    def _run(self, slot: np.ndarray, x: np.ndarray, learn: np.ndarray) -> np.ndarray:
        """The kernel over validated rows; returns its (rows, 1 + 2 fields) output."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if self.health is not None and x.size:
            self.health.problem(self.name, "non_finite_input", int(np.count_nonzero(~np.isfinite(x))))
        out = np.empty((x.shape[0], 1 + 2 * self.n_fields))
        if x.shape[0]:
            _mahalanobis_rows(slot, x, self.s_mean, self.s_cov, self.s_count, self.params, out, learn)
        return out

    def _apply_rows(self, slot: Any, x: Any, learn: bool | np.ndarray) -> RowScores:
        arr = np.asarray(x, dtype=np.float64)
        idx = np.ascontiguousarray(slot, dtype=np.int64).reshape(-1)
        if arr.ndim != 2 or arr.shape[1] != self.n_fields or len(idx) != arr.shape[0]:
            raise ValueError(f"{self.name}: expected (rows, {self.n_fields}) values and (rows,) entities, "
                             f"got {np.shape(x)} and {np.shape(slot)}")
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n_entities):
            raise ValueError(f"{self.name}: entity index outside 0..{self.n_entities - 1}")
        mask = np.ascontiguousarray(np.broadcast_to(np.asarray(learn, dtype=np.bool_), idx.shape))
        out = self._run(idx, arr, mask)
        d = self.n_fields
        return RowScores(out[:, 0], out[:, 1:1 + d], out[:, 1 + d:])

    def update(self, x: Any) -> MultivariateScores:
        """Score each step against the state so far, then learn it."""
        return self._apply(x, learn=True)

    def score(self, x: Any) -> MultivariateScores:
        """Score each step against the current state; learn nothing."""
        return self._apply(x, learn=False)

    def update_rows(self, slot: Any, x: Any, learn: Any = True) -> RowScores:
        """Rows ``x`` (rows, fields), row i a sample of entity ``slot[i]`` (rows in time order per
        entity, e.g. a frame): score each against its entity's state so far, then learn it —
        only the rows where ``learn`` (one flag, or one per row) is true."""
        return self._apply_rows(slot, x, learn=learn)

    def score_rows(self, slot: Any, x: Any) -> RowScores:
        """As :meth:`update_rows`, learning nothing (each row against the current state)."""
        return self._apply_rows(slot, x, learn=False)

    def top_fields(self, contributions: np.ndarray, k: int = 3) -> list[list[tuple[str, float]]]:
        """For one step's ``(n_entities, n_fields)`` contributions: each entity's ``k`` largest,
        as (field name, share of D^2)."""
        c = np.asarray(contributions, dtype=np.float64)
        total = np.maximum(c.sum(axis=-1, keepdims=True), 1e-300)
        order = np.argsort(-c, axis=-1)[:, :k]
        return [[(self.field_names[i], float(c[e, i] / total[e, 0])) for i in order[e]] for e in range(c.shape[0])]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"s_mean": self.s_mean.copy(), "s_cov": self.s_cov.copy(), "s_count": self.s_count.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own = self.state_dict()
        if set(state) != set(own):
            raise ValueError(f"{self.name}: state keys {sorted(state)} != expected {sorted(own)}")
        for key, ref in own.items():
            arr = np.asarray(state[key], dtype=np.float64)
            if arr.shape != ref.shape:
                raise ValueError(f"{self.name}: state {key!r} has shape {arr.shape}, expected {ref.shape}")
            getattr(self, key)[...] = arr  # in place: a detector holding these arrays keeps them

    def state_nbytes(self) -> int:
        return self.s_mean.nbytes + self.s_cov.nbytes + self.s_count.nbytes
