"""`autogemm report --profile`: Nsight Compute's figures for a problem's winner and for cuBLAS,
side by side. Each side runs in its own process under `ncu`: a small driver script makes the
operands, warms the call up (compiling, planning) outside the profiled range, and makes one call
between cudaProfilerStart and cudaProfilerStop, so that ncu sees only that call's kernels (a
split-K reduction or a repacking copy shows as a kernel of its own).

Metrics a GPU does not have (the pipes differ by architecture) are dropped before asking, where
`ncu --query-metrics` can tell; whatever ncu refuses is shown on the page as its message.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..gpu.runtime import GpuUnavailable, require_gpu

# metric -> what the page calls it
METRICS = {
    "gpu__time_duration.sum": "duration",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM throughput",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe, wgmma (sm_90)",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe, mma/wmma",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "FMA pipe",
    "launch__registers_per_thread": "registers per thread",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy",
}
# the folder autogemm is imported from, for the driver's PYTHONPATH
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600  # ncu replays each kernel once per metric pass: slow, but not this slow

DRIVER = r'''
import sys
import cupy
import autogemm
from autogemm import dtypes
from autogemm.measure.bench import cublas_runner, random_uniform
from autogemm.families import config_from_name
from autogemm.gpu.launch import bind
from autogemm.problem import Problem

problem, side, config = Problem.from_key(sys.argv[1]), sys.argv[2], sys.argv[3]
batch = (problem.batch,) if problem.batch > 1 else ()
a = random_uniform(batch + ((problem.k, problem.m) if problem.trans_a else (problem.m, problem.k)), problem.dtype, seed=1)
b = random_uniform(batch + ((problem.n, problem.k) if problem.trans_b else (problem.k, problem.n)), problem.dtype, seed=2)
if side == "cublas":
    run = cublas_runner(problem, a, b, cupy.empty(batch + (problem.m, problem.n), dtypes.lookup(problem.dtype, problem.compute).storage))
elif config:  # a config matmul does not serve (cuBLAS kept, or not cached): launched directly
    launch, _ = bind(config_from_name(config), a, b, trans_a=problem.trans_a, trans_b=problem.trans_b)
    run = lambda: launch()
else:
    if problem.dtype == "bfloat16":
        import ml_dtypes
        a, b = a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16)
    op_a = cupy.swapaxes(a, -1, -2) if problem.trans_a else a
    op_b = cupy.swapaxes(b, -1, -2) if problem.trans_b else b
    compute = "tf32" if problem.compute == "tf32" else None
    run = lambda: autogemm.matmul(op_a, op_b, compute=compute)
for _ in range(3):
    run()
cupy.cuda.Device().synchronize()
cupy.cuda.runtime.profilerStart()
run()
cupy.cuda.Device().synchronize()
cupy.cuda.runtime.profilerStop()
'''


class ProfilerUnavailable(RuntimeError):
    """Nsight Compute or a GPU is missing."""


@dataclass
class KernelMetrics:
    side: str
    kernel: str
    values: dict[str, tuple[str, str]] = field(default_factory=dict)  # metric -> (value, unit)

    def shown(self, metric: str) -> str:
        if metric not in self.values:
            return "n/a"
        value, unit = self.values[metric]
        return f"{value} {unit}".strip()


@dataclass
class ProfileOutcome:
    kernels: list[KernelMetrics] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)
    error: str = ""


def require_profiler() -> str:
    """The path of `ncu`, where it and a GPU are present; ProfilerUnavailable saying which is not."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise ProfilerUnavailable("--profile needs Nsight Compute's 'ncu' on PATH, and it is not there (it comes with "
                                  "the CUDA toolkit, or as the nsight-compute package); run without --profile")
    try:
        require_gpu()
    except GpuUnavailable as exc:  # (no CuPy included) the same words as tune's
        raise ProfilerUnavailable(f"--profile runs kernels: {exc}") from None
    return ncu


def available_metrics(ncu: str) -> dict[str, str]:
    """METRICS less the pipes this GPU does not have, where `ncu --query-metrics` lists the GPU's
    metrics (every one otherwise). Only the pipes differ by architecture; the others are asked
    for whatever the listing says (launch__ metrics are not counters, and may not be listed)."""
    try:
        listing = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return dict(METRICS)
    known = set(re.findall(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", listing, re.M))
    return {m: label for m, label in METRICS.items()
            if not known or not m.startswith("sm__pipe_") or m.split(".")[0] in known}


def parse_csv(text: str, side: str) -> list[KernelMetrics]:
    """Kernel rows of `ncu --csv` (details page: a row per kernel and metric); ncu's own messages
    and the application's output around them are passed over."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    kernels: dict[str, KernelMetrics] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        ident, metric = row.get("ID"), row.get("Metric Name")
        if ident is None or metric is None or ident == "ID":  # a header repeated (log file, then stdout)
            continue
        entry = kernels.setdefault(ident, KernelMetrics(side, row.get("Kernel Name", "?")))
        entry.values[metric] = (row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return list(kernels.values())


def profile_problem(ncu: str, problem: Any, winner: Any, metrics: dict[str, str]) -> ProfileOutcome:
    """ncu's metrics of the winner (through autogemm.matmul where it serves the winner) and of
    cuBLAS for `problem`; a ProfileOutcome with ncu's message where it failed."""
    # matmul serves a cached generated kernel; a winner it does not serve is launched by name
    direct = "" if winner is None or winner.served_by_matmul else winner.config_name
    sides = [(f"autogemm {direct}" if direct else "autogemm.matmul", "autogemm", direct), ("cuBLAS", "cublas", "")]
    outcome = ProfileOutcome(metrics=metrics)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_PARENT),
                                                                      os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="autogemm-profile-") as folder:
        driver = Path(folder) / "driver.py"
        driver.write_text(DRIVER)
        for label, side, config in sides:
            log = Path(folder) / f"{side}.csv"
            command = [ncu, "--csv", "--print-units", "base", "--profile-from-start", "off", "--log-file", str(log),
                       "--metrics", ",".join(metrics), sys.executable, str(driver), problem.key, side, config]
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as exc:
                outcome.error = f"{label}: {type(exc).__name__}: {exc}"
                return outcome
            text = (log.read_text(errors="replace") if log.exists() else "") + "\n" + done.stdout
            kernels = parse_csv(text, label)
            if done.returncode != 0 or not kernels:
                message = (done.stderr or text).strip().splitlines()[-3:]
                outcome.error = f"{label}: ncu exited {done.returncode}: " + " / ".join(message)[:500]
                return outcome
            outcome.kernels += kernels
    return outcome
