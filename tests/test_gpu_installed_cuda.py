"""On a GPU with the system CUDA toolkit out of sight (PATH, LD_LIBRARY_PATH, CUDA_HOME and CUDA_PATH
without it), as on a machine that has a driver and nothing else: the libraries come from the installed
Python packages, `matmul` serves on CuPy arrays (a generated kernel, compiled by that NVRTC with the
headers beside it, and cuBLAS through that cuBLASLt), and a small tune finishes.

The child process reads its own memory map to say which files it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

CHILD = r"""
import json, os, sys
import numpy as np, cupy, autogemm
from autogemm.families import config_from_name
from autogemm.gpu.launch import gemm
from autogemm.kernels import compile as kernel_compile, nvrtc
from autogemm.measure.bench import random_uniform, reference_gemm, relative_error

errors = {}
a, b = random_uniform((300, 200), "float16", seed=1), random_uniform((200, 500), "float16", seed=2)
errors["matmul"] = float(relative_error(autogemm.matmul(a, b), reference_gemm(a, b)))
# a tensor-core kernel needs <mma.h> and crt/mma.h: the headers beside NVRTC
c = cupy.full((300, 500), np.nan, dtype=np.float16)
gemm(config_from_name("wmma_64x64x32_w32x32_v8_s2_pad_g8_k1_o1_mma"), a, b, c)
errors["generated"] = float(relative_error(c, reference_gemm(a, b)))
from autogemm.gpu import cublas_gemm
errors["cublaslt"] = float(relative_error(cublas_gemm.gemm(a, b), reference_gemm(a, b)))
result = autogemm.tune(192, dtype="float16", trials=2, timeout=120)
errors["tuned"] = float(result.rel_error)
with open("/proc/self/maps") as maps:
    loaded = sorted({line.split()[-1] for line in maps if any(
        name in line for name in ("libnvrtc.so", "libcublasLt.so", "libcublas.so", "libcudart.so"))})
print(json.dumps({"errors": errors, "loaded": loaded, "nvrtc": nvrtc.library(),
                  "include": kernel_compile._include_options(), "valid_trials": result.valid,
                  "failures": result.failures}))
"""


def _without_toolkit() -> dict:
    """This process's environment with every path of a CUDA toolkit taken out of PATH and
    LD_LIBRARY_PATH, and CUDA_HOME/CUDA_PATH unset."""
    env = dict(os.environ)
    roots = {os.path.realpath(p) for p in (env.pop("CUDA_HOME", ""), env.pop("CUDA_PATH", ""), "/usr/local/cuda") if p}
    for variable in ("PATH", "LD_LIBRARY_PATH"):
        kept = [p for p in env.get(variable, "").split(os.pathsep)
                if p and "cuda" not in p.lower().replace("site-packages", "") and
                not any(os.path.realpath(p).startswith(root) for root in roots)]
        env[variable] = os.pathsep.join(kept)
    return env


@pytest.mark.long(seconds=16)
def test_matmul_and_a_tune_with_only_the_installed_packages(tmp_path):
    env = _without_toolkit()
    env["AUTOGEMM_CACHE_DIR"] = str(tmp_path)
    env["AUTOGEMM_CUBIN_DIR"] = str(tmp_path / "cubin")
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert all(error <= 1e-2 for error in report["errors"].values()), report["errors"]
    assert report["nvrtc"][1] == "site-packages", report["nvrtc"]
    names = {os.path.basename(path).split(".so")[0] for path in report["loaded"]}
    assert {"libnvrtc", "libcublasLt"} <= names, report["loaded"]
    assert all("site-packages" in path for path in report["loaded"]), report["loaded"]
    assert report["include"] and "site-packages" in report["include"][0], report["include"]
    assert report["valid_trials"] >= 1, report["failures"]
