"""benchmarks/linear_latency.py without a GPU: the layers it is given on the command line, and those it refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "linear_latency.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

bench = load_script(SCRIPT)


def test_layers_read_as_dtype_activation_and_sizes():
    assert bench.parse_layers("float16:silu:1x14336x4096, bfloat16:bias:128x4096x14336") == (
        ("float16", "silu", 1, 14336, 4096), ("bfloat16", None, 128, 4096, 14336))


@pytest.mark.parametrize("text", ["float32:silu:1x2x3", "float16:relu:1x2x3", "float16:silu:1x2",
                                  "float16:silu:0x2x3", "float16:silu:1x2x3x4", "float16:silu:1x2x-3",
                                  "float16:silu:1x2x99999999", "float16:silu"])
def test_a_layer_that_does_not_read_so_is_refused_by_name(text):
    with pytest.raises(ValueError, match="is not a layer"):
        bench.parse_layers(text)


def test_the_command_line_names_a_bad_layer_before_anything_runs():
    done = subprocess.run([sys.executable, str(SCRIPT), "--layers", "float16:tanh:1x2x3"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "'float16:tanh:1x2x3' is not a layer" in done.stderr
