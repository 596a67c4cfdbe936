"""Numba options for every kernel in foreshock, in one place (the stumpy convention).

fastmath is a named flag *set* without ``nnan`` and ``ninf``: telemetry carries NaN for
missing samples, and kernels test for it with ``x != x``; letting LLVM assume NaN never happens
would silently delete those checks.

``cache=True`` keeps compiled kernels on disk so the test suite and the CLI do not pay
compilation on every start. Numba checks a cached kernel only against its *own* source file, so a
kernel that inlines constants or other kernels from a module that changed since would be reused
stale (it happened: a kernel kept reading an old column layout and wrote out of bounds). The cache
therefore lives in a folder named after a hash of every foreshock source file
(``<NUMBA_CACHE_DIR or ~/.cache/foreshock/numba>/foreshock-<hash>``): any change to the package
compiles afresh, and folders unused for a week are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import numba

CACHE_PREFIX = "foreshock-"
STALE_CACHE_S = 7 * 86400.0


def source_fingerprint(package_dir: Path | None = None) -> str:
    """A short hash of every ``.py`` file of the foreshock package (path and content)."""
    root = package_dir or Path(__file__).parent  # unresolved: an editable install links the files here
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def configure_cache() -> Path | None:
    """Point numba's cache at this source version's folder (see the module docstring)."""
    try:
        configured = os.environ.get("NUMBA_CACHE_DIR", "")
        base = Path(configured) if configured else Path.home() / ".cache" / "foreshock" / "numba"
        if base.name.startswith(CACHE_PREFIX):  # inherited from a parent process already set up
            base = base.parent
        folder = base / f"{CACHE_PREFIX}{source_fingerprint()}"
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)
        for old in base.glob(f"{CACHE_PREFIX}*"):
            if old != folder and time.time() - old.stat().st_mtime > STALE_CACHE_S:
                shutil.rmtree(old, ignore_errors=True)
    except OSError:  # a read-only home: numba's default (next to the sources) still works
        return None
    # numba re-reads NUMBA_* variables when any changes: keep both in step
    os.environ["NUMBA_CACHE_DIR"] = str(folder)
    setattr(numba.config, "CACHE_DIR", str(folder))  # set at runtime from NUMBA_* variables
    return folder


CACHE_DIR = configure_cache()

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


EXACT_OPTIONS: dict[str, Any] = {**JIT_OPTIONS, "fastmath": {"nsz"}}
"""Options for kernels whose arithmetic is about exact float64 results in the order written: the
counter rates (``M - last`` first because it is exact, a glitch's ``v - before - counted``; a
plain-Python reference equal delta for delta). ``reassoc`` let LLVM regroup ``v - before - counted``
as ``v - (before + counted)``, 1 ulp off the reference where unrelated code in the kernel changed,
and ``contract``/``arcp`` may fuse or approximate; only ``nsz`` is kept."""


def jit_exact(func: F) -> F:
    """Compile ``func`` with :data:`EXACT_OPTIONS`."""
    return numba.njit(**EXACT_OPTIONS)(func)  # type: ignore[no-any-return]


def jit_parallel(func: F) -> F:
    """Compile ``func`` with foreshock's parallel options."""
    return numba.njit(**PARALLEL_OPTIONS)(func)  # type: ignore[no-any-return]


def jit_disabled() -> bool:
    """True when ``NUMBA_DISABLE_JIT=1`` (the coverage run): kernels run as Python."""
    return os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")
