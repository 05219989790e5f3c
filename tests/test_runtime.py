"""Without CuPy, autogemm imports and everything that needs no GPU works; what needs CuPy says
which extra to install, from the library and from the command line."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["cupy"] = None  # as if CuPy were not installed
import autogemm
from autogemm.families import SimtConfig
from autogemm.problem import Problem
assert autogemm.render(SimtConfig(), Problem(64, 64, 64)).code
try:
    autogemm.matmul(object(), object())
except ImportError as exc:
    print("matmul:", exc)
from autogemm.cli import main
print("exit", main(["bench", "--M", "64"]))
"""


def test_without_cupy_the_error_names_the_extra_to_install():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert 'matmul: autogemm needs CuPy to run kernels' in result.stdout
    assert 'pip install "autogemm[cuda13]"' in result.stdout
    assert "exit 3" in result.stdout and 'pip install "autogemm[cuda13]"' in result.stderr
