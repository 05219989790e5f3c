"""benchmarks/bench_epilogue_pass.py without a GPU: the bytes each step must move, the report's figures
against the copy, and its options refused where they name nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_epilogue_pass.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

bench = load_script(SCRIPT)


def test_the_bytes_each_step_moves():
    assert bench.moved_bytes("bias+silu", 2048, 14336, 2) == 2 * 2048 * 14336 * 2  # P read, D written
    assert bench.moved_bytes("residual", 10, 20, 2) == 3 * 10 * 20 * 2  # and the residual read
    assert bench.moved_bytes("copy", 10, 20, 2) == 2 * 10 * 20 * 2


def test_the_report_gives_each_rate_as_a_share_of_the_copy():
    rows = [{"case": "bias+silu", "dtype": "bfloat16", "m": 2048, "n": 14336, "us": {bench.AUTOGEMM: 40.0, bench.EAGER: 32.0,
             bench.COPY: 30.0}, "of_copy": {bench.AUTOGEMM: 0.75, bench.EAGER: 0.9375}},
            {"case": "residual", "dtype": "float16", "m": 4096, "n": 4096, "us": {bench.AUTOGEMM: 20.0, bench.EAGER: 21.0,
             bench.COPY: 12.0}, "of_copy": {bench.AUTOGEMM: 0.9, bench.EAGER: 0.857}}]
    text = "\n".join(bench.report(rows, "GPU"))
    assert f"geomean **{(0.75 * 0.9) ** 0.5:.0%}** of the copy's rate (min 75%); at least 85% on 1 of 2" in text
    assert "| bias+silu | bfloat16 | 2048x14336 | 40.0 | 32.0 | 30.0 | 75% | 94% |" in text


def test_options_that_name_nothing_are_refused():
    for argv in (["--shapes", "2048"], ["--shapes", "0x5"], ["--cases", "bias+relu"], ["--dtypes", "float32"]):
        run = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True)
        assert run.returncode == 2 and "error:" in run.stderr, (argv, run.stderr)
