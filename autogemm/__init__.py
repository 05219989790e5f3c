"""autogemm: generated, tuned and cached CUDA GEMM kernels.

    import autogemm
    c = autogemm.matmul(a, b)            # the cached best kernel for this problem and GPU
    y = autogemm.linear(x, w, bias, activation="gelu")   # act(x @ w.T + bias), w in torch's layout
    autogemm.explain(a, b)               # which kernel that is, and why
    y = autogemm.grouped_matmul(tokens, expert_weights, offsets)   # a mixture-of-experts layer's GEMMs
    result = autogemm.tune(4096)         # search, verify and cache the best kernel for 4096^3

The GPU-facing parts (compilation, launching, tuning) import CuPy and Optuna lazily, so that
configurations, search spaces and rendering work on machines without a GPU. PyTorch is imported
only by `autogemm.torch` (torch.ops.autogemm.matmul, autogemm.torch.Linear), on its first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .serving.dispatch import linear, matmul, reset
from .serving.explain import explain
from .serving.scaled import scaled_matmul
from .serving.grouped import grouped_matmul, grouped_matmul_masked
from .families import SimtConfig, TensorCoreConfig, config_from_dict, config_from_name
from .problem import Device, Problem
from .kernels.render import render
from .gpu.runtime import GpuUnavailable
from .version import __version__

if TYPE_CHECKING:
    from .tuning.options import TuneOptions
    from .tuning.result import TuneResult


def tune(problem_or_m: Problem | int, n: int | None = None, k: int | None = None, *, batch: int = 1,
         dtype: str = "float32", compute: str = "", layout: str = "nn", options: TuneOptions | None = None,
         **keywords: Any) -> TuneResult:
    """Tunes one problem on the current GPU and caches the winner; returns a `TuneResult`.

    Either a `Problem` or M (N and K default to M) with batch, dtype, compute and layout. The tune's
    options are `options` (an `autogemm.tuning.options.TuneOptions`) or given by name, which makes
    one (trials, timeout, patience, seed, sampler, space, storage...); `cache`, `evaluator` and
    `progress` are also taken, as `autogemm.tuning.tuner.tune` takes them.
    """
    from .tuning.tuner import tune as run  # (lazy: Optuna)

    if isinstance(problem_or_m, Problem):
        problem = problem_or_m
    else:
        m = problem_or_m
        problem = Problem.from_layout(m, n or m, k or m, layout, batch=batch, dtype=dtype, compute=compute)
    result = run(problem, options, **keywords)
    reset()  # calls made from now on see the new entry
    return result


def __getattr__(name: str) -> Any:
    """`autogemm.torch` (the PyTorch operator and Linear layer, which import torch) on first use."""
    if name == "torch":

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Device", "GpuUnavailable", "Problem", "SimtConfig", "TensorCoreConfig", "config_from_dict", "config_from_name",
           "explain", "grouped_matmul", "grouped_matmul_masked", "linear", "matmul", "render", "reset", "scaled_matmul",
           "tune", "__version__"]
