"""The numba cache is keyed on the whole package's sources (core/numba_config.py): numba itself
only checks a kernel's own file, and a kernel that inlines another module's constants or
kernels would otherwise be reused stale after that module changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numba
import pytest

from foreshock import numba_config


def make_package(root: Path) -> Path:
    (root / "detectors").mkdir(parents=True)
    (root / "numba_config.py").write_text("X = 1\n")
    (root / "detectors" / "power.py").write_text("from . import thermal\n")
    (root / "detectors" / "thermal.py").write_text("COLUMNS = 21\n")
    return root


def test_the_fingerprint_changes_when_any_module_changes(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    before = numba_config.source_fingerprint(pkg)
    assert numba_config.source_fingerprint(pkg) == before
    (pkg / "detectors" / "thermal.py").write_text("COLUMNS = 26\n")  # power.py itself is unchanged
    assert numba_config.source_fingerprint(pkg) != before
    (pkg / "detectors" / "__pycache__").mkdir()
    (pkg / "detectors" / "__pycache__" / "x.nbi").write_bytes(b"\0")  # caches are not sources
    (pkg / "detectors" / "thermal.py").write_text("COLUMNS = 21\n")
    assert numba_config.source_fingerprint(pkg) == before


def test_the_cache_folder_is_per_source_version_and_old_ones_are_pruned(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "cache"
    stale = base / "foreshock-0000000000000000"
    recent = base / "foreshock-1111111111111111"
    for d in (stale, recent):
        d.mkdir(parents=True)
    old = time.time() - numba_config.STALE_CACHE_S - 60
    os.utime(stale, (old, old))
    saved = getattr(numba.config, "CACHE_DIR")
    try:
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(base))
        folder = numba_config.configure_cache()
        assert folder == base / f"foreshock-{numba_config.source_fingerprint()}"
        assert folder.is_dir() and getattr(numba.config, "CACHE_DIR") == str(folder) == os.environ["NUMBA_CACHE_DIR"]
        assert not stale.exists() and recent.exists()
        # a child process inherits the folder itself as NUMBA_CACHE_DIR: no nesting
        assert numba_config.configure_cache() == folder
    finally:
        setattr(numba.config, "CACHE_DIR", saved)
