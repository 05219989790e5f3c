"""What a user would call instead of autogemm, timed the way autogemm is timed (timing.py): torch.matmul
on PyTorch tensors and cupy.matmul on CuPy arrays, over the same memory. The benchmarks compare
`autogemm.matmul` with the faster of the two, in latency and in GPU time, shape by shape.

TF32: torch.matmul computes float32 in TF32 where `torch.backends.cuda.matmul.allow_tf32` is set, and
cupy.matmul where CuPy was imported with CUPY_TF32=1 (read once, at import): a TF32 comparison runs
in a process started that way (`tf32_environment`), where both are switched on.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from .timing import gpu_time, latencies

TORCH_MATMUL, CUPY_MATMUL = "torch.matmul", "cupy.matmul"


def torch_available() -> bool:
    try:
        import torch  # (lazy: PyTorch)
    except ImportError:
        return False
    return torch.cuda.is_available()


def tf32_environment() -> dict[str, Any]:
    """The environment variables of a process whose cupy.matmul computes float32 in TF32."""
    return {"CUPY_TF32": "1"}


def cupy_in_tf32() -> bool:
    return os.environ.get("CUPY_TF32") == "1"


def as_torch(x: Any) -> Any:
    """A PyTorch view of a CuPy array (no copy), bfloat16 (ml_dtypes' or raw uint16 bits) included."""
    import torch  # (lazy: PyTorch)

    if x.dtype.kind == "V" or x.dtype == np.uint16:  # bfloat16: shared as bits, viewed as torch's type
        return torch.as_tensor(x.view(np.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(x, device="cuda")


def user_calls(a: Any, b: Any, compute: str = "") -> dict[str, Any]:
    """name -> zero-argument call of each library a user would call for a @ b (CuPy operands,
    transposed views included): cupy.matmul where it computes the operands' type in their form, and
    torch.matmul on views of the same memory where PyTorch has CUDA. Both run on the current stream
    (the default stream of both libraries)."""
    import cupy  # (lazy: CuPy)

    if compute == "tf32" and not cupy_in_tf32():
        raise RuntimeError("a TF32 comparison needs a process started with CUPY_TF32=1 (baselines.tf32_environment)")
    calls = {}
    try:  # CuPy cannot multiply every type in every form (batched bfloat16, in CuPy 14.2): then a user cannot either
        cupy.matmul(a, b)
        calls[CUPY_MATMUL] = lambda: cupy.matmul(a, b)
    except (TypeError, NotImplementedError):
        pass
    if torch_available():
        import torch  # (lazy: PyTorch)

        torch.backends.cuda.matmul.allow_tf32 = compute == "tf32"
        ta, tb = as_torch(a), as_torch(b)
        matmul = torch.matmul
        calls[TORCH_MATMUL] = lambda: matmul(ta, tb)
    return calls


@dataclass
class Figures:
    """One competitor's figures on one problem: GPU time and latency, microseconds (medians)."""

    gpu_us: float
    latency_us: float
    spread: float = 0.0  # relative spread of the GPU-time rounds


GPU_ROUNDS = 3


def measure(calls: dict[str, Any], *, target_ms: float = 100.0, latency_calls: int = 25) -> dict[str, Any]:
    """Figures of each competitor in `calls` (name -> zero-argument call): its latency (timing.latencies,
    the competitors taking turns), then its GPU time (timing.gpu_time: GPU_ROUNDS rounds in which the
    competitors take turns, each a steady run of target_ms / GPU_ROUNDS, so that none is always
    measured on a cooler or hotter GPU; the median of its rounds)."""
    waits = latencies(calls, rounds=latency_calls)
    names = list(calls)
    rounds: dict[str, list[Any]] = {name: [] for name in names}
    for r in range(GPU_ROUNDS):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            rounds[name].append(gpu_time(lambda i, call=calls[name]: call(), target_ms=target_ms / GPU_ROUNDS))
    out = {}
    for name in names:
        medians = [timed.median_ms for timed in rounds[name]]
        spread = (max(medians) - min(medians)) / (2 * statistics.median(medians))
        out[name] = Figures(statistics.median(medians) * 1e3, statistics.median(waits[name]) * 1e3, spread)
    return out


def faster_baseline(figures: dict[str, Any], names: Any = (TORCH_MATMUL, CUPY_MATMUL)) -> tuple[float, float, str, str]:
    """(GPU us, latency us, which for GPU time, which for latency): the faster of the named
    competitors present, in each figure separately."""
    present = [name for name in names if name in figures]
    gpu = min(present, key=lambda n: figures[n].gpu_us)
    latency = min(present, key=lambda n: figures[n].latency_us)
    return figures[gpu].gpu_us, figures[latency].latency_us, gpu, latency
