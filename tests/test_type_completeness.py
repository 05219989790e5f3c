"""The package's types as a user's type checker sees them (py.typed): `pyright --verifytypes autogemm`
scores at least 90% and reports nothing on the public names (`autogemm.__all__`). Run where pyright is
installed (`pip install pyright`; it fetches its Node.js build the first time), skipped elsewhere; the
package is installed as a user installs it (a wheel, not editable) into a virtual environment of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import autogemm

ROOT = Path(__file__).resolve().parent.parent
SCORE = 0.90


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    pyright = shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright is not installed (pip install pyright)")
    folder = tmp_path_factory.mktemp("typed")
    # the wheel built as pip builds it (its own build environment), installed without its dependencies
    # (--ignoreexternal: their types are theirs)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    env_dir = folder / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *map(str, folder.glob("autogemm-*.whl"))],
                   check=True, capture_output=True, timeout=600)
    environment = {**os.environ, "VIRTUAL_ENV": str(env_dir), "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([pyright, "--verifytypes", "autogemm", "--ignoreexternal", "--outputjson"],
                          capture_output=True, text=True, timeout=900, cwd=folder, env=environment)
    found = json.loads(done.stdout)["typeCompleteness"]
    # pyright found the installed package (else every count is 0, and nothing below could fail)
    assert found["packageRootDirectory"].startswith(str(env_dir)) and found["exportedSymbolCounts"]["withKnownType"] > 1000, \
        (found.get("packageRootDirectory"), done.stderr[-500:])
    return found


def test_the_package_is_typed_as_its_users_type_checkers_need_and_its_public_names_without_an_error(report):
    """(one test: pyright's run is the fixture, which every pytest-xdist worker would run again for a second)"""
    counts = report["exportedSymbolCounts"]
    assert report["completenessScore"] >= SCORE, counts
    public = set(autogemm.__all__) - {"__version__"}
    faults = {}
    for symbol in report["symbols"]:
        names = [symbol["name"], *symbol.get("alternateNames", [])]
        if not any(name.count(".") == 1 and name.split(".")[1] in public for name in names):
            continue
        errors = [d["message"].splitlines()[0] for d in symbol.get("diagnostics", []) if d["severity"] == "error"]
        if errors or not symbol["isTypeKnown"]:
            faults[symbol["name"]] = errors or ["type not known"]
    assert faults == {}
