"""Numba options for every kernel in foreshock, in one place (the stumpy convention).

fastmath is a named flag *set* without ``nnan`` and ``ninf``: telemetry carries NaN for
missing samples, and kernels test for it with ``x != x``; letting LLVM assume NaN never happens
would silently delete those checks.

``cache=True`` writes compiled kernels next to the modules (or to ``NUMBA_CACHE_DIR``) so the
test suite and the CLI do not pay compilation on every start.
"""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

import numba

FASTMATH: set[str] = {"nsz", "arcp", "contract", "afn", "reassoc"}
"""fastmath flags that are safe with NaN/inf inputs."""

JIT_OPTIONS: dict[str, Any] = {"nogil": True, "cache": True, "fastmath": FASTMATH}
"""Options for serial kernels."""

PARALLEL_OPTIONS: dict[str, Any] = {**JIT_OPTIONS, "parallel": True}
"""Options for kernels that use ``prange``; they write per-thread slices, then reduce."""

F = TypeVar("F", bound=Callable[..., Any])


def jit(func: F) -> F:
    """Compile ``func`` with foreshock's serial options."""
    return numba.njit(**JIT_OPTIONS)(func)  # type: ignore[no-any-return]


def jit_parallel(func: F) -> F:
    """Compile ``func`` with foreshock's parallel options."""
    return numba.njit(**PARALLEL_OPTIONS)(func)  # type: ignore[no-any-return]


def jit_disabled() -> bool:
    """True when ``NUMBA_DISABLE_JIT=1`` (the coverage run): kernels run as Python."""
    return os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")
