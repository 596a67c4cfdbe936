"""The Makefile as a user drives it: `make -n` shows what a target would do and does none of it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_dry_run_of_make_test_prints_the_suite_and_runs_nothing(tmp_path) -> None:
    # make runs any recipe line that names $(MAKE) even under -n; `make test` is one line that
    # starts the services, warms Numba and runs the whole suite, so a dry run would do all of it.
    # The tools it would call are stand-ins here that leave a file behind if they are run.
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "pytest", "mypy"):
        stand_in = bin_dir / tool
        stand_in.write_text(f"#!/bin/sh\ntouch '{tmp_path}/ran-{tool}'\n")
        stand_in.chmod(0o755)
    (tmp_path / ".venv" / ".installed").touch()

    proc = subprocess.run(["make", "-n", "test"], cwd=tmp_path, capture_output=True, text=True, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert ".venv/bin/pytest -n 2" in proc.stdout  # it shows the suite it would run
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == []
