"""benchmarks/served_routes.py without a GPU: the problems it reads from the command line, and those it refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "served_routes.py"

tool = load_script(SCRIPT)


def test_problems_read_as_bench_unseens_labels():
    assert tool.parse_problem("bfloat16:nn:2238x2243x2243") == ("bfloat16", "fp32", "nn", 1, 2238, 2243, 2243)
    assert tool.parse_problem("float64:tt:48x1061x288x88") == ("float64", "fp64", "tt", 48, 1061, 288, 88)


@pytest.mark.parametrize("text", ["int8:nn:2x2x2", "float16:ab:2x2x2", "float16:nn:2x2", "float16:nn:0x2x2",
                                  "float16:nn:2x2x2x2x2", "float16:nn:2x2x-2", "float16:nn:2x2x999999999",
                                  "float16:nn"])
def test_a_problem_that_does_not_read_so_is_refused_by_name(text):
    with pytest.raises(ValueError, match="is not a problem"):
        tool.parse_problem(text)


def test_a_problem_too_large_for_memory_is_refused_before_anything_is_allocated():
    with pytest.raises(ValueError, match="more than 8 GB"):
        tool.parse_problem("float64:nn:131072x131072x131072")


def test_the_command_line_names_a_bad_problem_before_anything_runs():
    done = subprocess.run([sys.executable, str(SCRIPT), "float16:nn:2x2x2", "float16:xx:2x2x2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "'float16:xx:2x2x2' is not a problem" in done.stderr
