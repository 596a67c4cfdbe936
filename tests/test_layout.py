"""The package layout: everything imports as foreshock.*, and nothing else leaks out.

DESIGN.md maps root folders to subpackages of one namespace. These tests check the mapping the
way a user meets it: from an unrelated directory, and from a wheel installed in a fresh
environment.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("cli", "simulator", "streams", "detectors", "exporters", "dashboards")


def _run(python: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_generic_top_level_names_do_not_resolve_to_this_project(tmp_path) -> None:
    for name in ("detectors", "exporters", "streams", "simulator", "dashboards", "core", "cli"):
        proc = _run(sys.executable, f"import {name}; print({name}.__file__)", tmp_path)
        assert proc.returncode != 0 or str(ROOT) not in proc.stdout, f"`import {name}` resolved to {proc.stdout}"
    proc = _run(sys.executable, "import foreshock.detectors.bank, foreshock.exporters.prometheus; "
                "import foreshock; print(foreshock.__file__)", tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_built_wheel_installs_and_resolves_every_subpackage(tmp_path) -> None:
    wheel_dir = tmp_path / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(wheel_dir), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = wheel_dir.glob("foreshock-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "foreshock/fields.csv" in names and "foreshock/py.typed" in names
    assert not any(n.startswith(("detectors/", "exporters/", "core/", "tests/")) for n in names)
    for data in ("foreshock/simulator/scenarios/cooling-loss.yaml",
                 "foreshock/dashboards/generated/foreshock-gpu.json"):
        assert data in names, f"{data} missing from the wheel"
    # A fresh environment; pip (run from this environment, aimed at the new interpreter) installs
    # the wheel into it the way a user would, console script included. The dependencies come from
    # this environment's site-packages through a path entry (not a .pth-processed site dir, so the
    # editable install of the checkout stays invisible there).
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                           "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    site = next(env_dir.glob("lib/python*/site-packages"))
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site / "deps.pth").write_text(deps + "\n")
    code = ("import foreshock, importlib; "
            + "".join(f"importlib.import_module('foreshock.{s}'); " for s in SUBPACKAGES)
            + "import foreshock.detectors.bank, foreshock.exporters.prometheus, foreshock.streams.embedded; "
            "from foreshock.fields import load_fields; assert len(load_fields()) > 40; "
            "from foreshock.simulator.scenario import list_scenarios; assert 'cooling-loss' in list_scenarios(); "
            "print(foreshock.__file__)")
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(site)), proc.stdout
    # the installed `foreshock` command lists every subcommand (each module imports from the wheel)
    proc = subprocess.run([str(env_dir / "bin" / "foreshock"), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("demo", "import", "replay", "simulate"):
        assert f"  {name} " in proc.stdout, proc.stdout
