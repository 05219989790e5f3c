"""autogemm.matmul inside CUDA graph captures (issue 37): `torch.cuda.graph` and CuPy's stream
capture, once per served path (cuBLASLt, cublasGemmEx, a generated kernel, split-K with a
second-kernel or fused reduction, stream-K, operands repacked to an aligned pitch, an operand copied
by the general path, a guarded kernel, the Hopper TMA kernel). Each graph is replayed on new operand
values and checked element-wise; then the memory around it is shaken (plans' own calls outside the
graph, the workspace pools emptied, the pool's free blocks handed out again and filled with a
sentinel) and it is replayed again: what a graph uses must live as long as the graph. A first call
with no plan raises CaptureError and leaves the capture valid; nothing under a capture writes the
cache or allocates outside PyTorch's graph pool."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
from gpu_cases import serving

import autogemm
from autogemm.serving import select
from autogemm.results.cache import CUBLAS, Record, TuningCache
from autogemm.gpu.capture import CaptureError
from autogemm.families import HopperConfig, SimtConfig
from autogemm.gpu.launch import current_device
from autogemm.problem import Problem
from autogemm.results.record import cublas_record
from autogemm.kernels.render import kernel_template_hash
from autogemm.measure.timing import PROTOCOL

pytestmark = pytest.mark.gpu

M, N, K = 256, 256, 512  # whole tiles of every config here, and enough K for two splits
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}  # of the largest |value| of the product


def _record(problem: Problem, config, ratio: float = 2.0, protocol: int = PROTOCOL, baselines=None) -> Record:
    """A record that serves `config` for `problem` (`ratio` times faster than cuBLAS)."""
    time_ms = problem.flops / 40.0 / 1e9
    return Record(problem=problem.key, family=config.family,
                  config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
                  time_ms=time_ms, tflops=40.0, cublas_ms=time_ms * ratio, cublas_tflops=40.0 / ratio, ratio=ratio,
                  rel_error=1e-7, template_hash=kernel_template_hash(config.template), device="x", date="2026-11-26",
                  protocol=protocol, baselines=dict(baselines or {}))


@dataclass(frozen=True)
class Path:
    """A served path: the record that makes `matmul` serve it (None: cuBLAS, as for any untuned
    problem), the dtype, and how `a` is stored ("pitch": rows one element longer than K, "strided":
    every other column of a wider array)."""

    records: tuple = ()
    dtype: str = "float32"
    a_stored: str = "dense"
    warmups: int = 3
    served: str = ""  # what explain() must name: a config's name, or "cuBLAS"
    hopper: bool = False
    note: dict = field(default_factory=dict)


def _paths() -> dict[str, Path]:
    problem = Problem(M, N, K)
    half = Problem(M, N, K, dtype="float16")
    plain = SimtConfig(64, 64, 16, 32, 32, 8, 4, 4, 4, 2)
    split = plain.replace(split_k=2)
    fused = plain.replace(split_k=2, split_reduce="fused")
    stream_k = plain.replace(stream_k=True)
    repack = plain.replace(repack=True)
    hopper = HopperConfig()
    lt_ms = problem.flops / 40.0 / 1e9
    gemmex = cublas_record(_record(problem, plain, ratio=0.5, baselines={"cublaslt": lt_ms * 2, "cupy.matmul": lt_ms}))
    return {
        "cublaslt": Path(served=CUBLAS),
        "cublas-gemmex": Path(records=(gemmex,), served=CUBLAS),
        "kernel": Path(records=(_record(problem, plain),), served=plain.name),
        "split-k": Path(records=(_record(problem, split),), served=split.name),
        "split-k-fused": Path(records=(_record(problem, fused),), served=fused.name),
        "stream-k": Path(records=(_record(problem, stream_k),), served=stream_k.name),
        "repacked": Path(records=(_record(problem, repack),), a_stored="pitch", served=repack.name),
        "copied-operand": Path(records=(_record(problem, plain),), a_stored="strided", served=plain.name),
        # a record of the old timing protocol is guarded: one warm-up leaves the guard undecided
        "guarded": Path(records=(_record(problem, plain, protocol=1),), warmups=1, served=plain.name),
        "hopper-tma": Path(records=(_record(half, hopper),), dtype="float16", served=hopper.name, hopper=True),
    }


PATHS = _paths()


def _values(xp, shape, seed, dtype):
    rng = np.random.default_rng(seed)
    return xp.asarray((rng.random(shape) * 2 - 1).astype(dtype))


class _Operands:
    """a (stored as the path says) and b, as CuPy arrays or torch tensors, refilled in place."""

    def __init__(self, path: Path, framework: str):
        import cupy

        self.path, self.framework = path, framework
        if path.a_stored == "pitch":
            self._a_store = cupy.zeros((M, K + 1), dtype=path.dtype)
            a = self._a_store[:, :K]
        elif path.a_stored == "strided":
            self._a_store = cupy.zeros((M, 2 * K), dtype=path.dtype)
            a = self._a_store[:, ::2]
        else:
            a = self._a_store = cupy.zeros((M, K), dtype=path.dtype)
        b = cupy.zeros((K, N), dtype=path.dtype)
        self.a_cupy, self.b_cupy = a, b
        if framework == "torch":
            import torch

            self.a, self.b = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
        else:
            self.a, self.b = a, b

    def fill(self, seed: int):
        import cupy

        self.a_cupy[...] = _values(cupy, (M, K), seed, self.path.dtype)
        self.b_cupy[...] = _values(cupy, (K, N), seed + 1, self.path.dtype)

    def check(self, result) -> None:
        import cupy

        values = cupy.asarray(result).astype(cupy.float64)
        expected = self.a_cupy.astype(cupy.float64) @ self.b_cupy.astype(cupy.float64)
        worst = float(cupy.abs(values - expected).max())
        assert worst <= TOLERANCE[self.path.dtype] * float(cupy.abs(expected).max()), f"max error {worst:.3g}"


def _serve(path: Path):
    if path.hopper and current_device().compute_capability < (9, 0):
        pytest.skip("the Hopper TMA kernels need an sm_90 GPU")
    for record in path.records:
        TuningCache().store(record, current_device().slug)
    autogemm.reset()


def _shake(sentinels: list) -> None:
    """What could take memory a graph still uses: the pools emptied, then the free blocks handed out
    again, filled with a sentinel."""
    import cupy

    from autogemm.gpu import cublas_gemm
    from autogemm.gpu.packed_launch import WORKSPACES

    WORKSPACES.clear()
    for state in cublas_gemm._STATES.values():
        state.workspaces.clear()
    gc.collect()
    for size in (M * N, M * K, 8 << 20, 32 << 20):
        sentinels.append(cupy.full(size // 4, 7.0, dtype=cupy.float32))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.cuda.synchronize()
        sentinels.extend(torch.full((size // 4,), 7.0, device="cuda") for size in (M * N, 8 << 20, 32 << 20))


def _sentinels_intact(sentinels: list) -> bool:
    import cupy

    return all(bool((cupy.asarray(x) == 7.0).all()) for x in sentinels)


def _cache_files() -> dict:
    folder = os.environ["AUTOGEMM_CACHE_DIR"]
    return {os.path.join(root, name): os.stat(os.path.join(root, name)).st_mtime_ns
            for root, _, names in os.walk(folder) for name in names}


def _torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return torch


@pytest.mark.parametrize("name", list(PATHS))
def test_a_torch_cuda_graph_replays_each_served_path(name):
    torch = _torch()
    import cupy

    path = PATHS[name]
    with serving(select.CUBLAS_SERVES):
        _serve(path)
        operands = _Operands(path, "torch")
        operands.fill(1)
        for _ in range(path.warmups):  # plans made on the default stream; the graph's stream has no workspace
            autogemm.matmul(operands.a, operands.b)
        torch.cuda.synchronize()
        explained = autogemm.explain(operands.a, operands.b)
        assert (explained["config"] or CUBLAS) == path.served, explained["reason"]
        pool = cupy.get_default_memory_pool()
        cupy_bytes, files = pool.total_bytes(), _cache_files()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = autogemm.matmul(operands.a, operands.b)
        assert pool.total_bytes() == cupy_bytes, "a captured call allocated outside the graph's pool"
        assert _cache_files() == files
        for seed in (5, 9):
            operands.fill(seed)
            graph.replay()
            torch.cuda.synchronize()
            operands.check(result)
        for _ in range(3):  # the same plan outside the graph, on the default stream and a side stream
            operands.check(autogemm.matmul(operands.a, operands.b))
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                autogemm.matmul(operands.a, operands.b)
            side.synchronize()
        sentinels = []
        _shake(sentinels)
        operands.fill(13)
        graph.replay()
        torch.cuda.synchronize()
        operands.check(result)
        assert _sentinels_intact(sentinels), "a replay wrote memory the graph no longer owned"


@pytest.mark.parametrize("name", list(PATHS))
def test_a_cupy_stream_capture_replays_each_served_path(name):
    import cupy

    path = PATHS[name]
    with serving(select.CUBLAS_SERVES):
        _serve(path)
        operands = _Operands(path, "cupy")
        operands.fill(1)
        for _ in range(path.warmups):
            autogemm.matmul(operands.a, operands.b)
        cupy.cuda.Device().synchronize()
        explained = autogemm.explain(operands.a, operands.b)
        assert (explained["config"] or CUBLAS) == path.served, explained["reason"]
        files = _cache_files()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            result = autogemm.matmul(operands.a, operands.b)
            graph = stream.end_capture()
        assert _cache_files() == files
        for seed in (5, 9):
            operands.fill(seed)
            cupy.cuda.Device().synchronize()
            graph.launch(stream)
            stream.synchronize()
            operands.check(result)
        for _ in range(3):
            operands.check(autogemm.matmul(operands.a, operands.b))
            with stream:
                autogemm.matmul(operands.a, operands.b)
            stream.synchronize()
        address = result.data.ptr
        del result  # the graph still writes there: the memory must not be handed out again
        sentinels = []
        _shake(sentinels)
        operands.fill(13)
        cupy.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        assert _sentinels_intact(sentinels), "a replay wrote memory the graph no longer owned"
        kept = cupy.ndarray((M, N), dtype=path.dtype, memptr=cupy.cuda.MemoryPointer(
            cupy.cuda.UnownedMemory(address, M * N * np.dtype(path.dtype).itemsize, None), 0))
        operands.check(kept)


def test_a_first_call_inside_a_torch_capture_says_to_warm_up_and_leaves_the_capture_valid():
    torch = _torch()
    with serving(select.CUBLAS_SERVES):
        autogemm.reset()
        a, b = torch.rand(96, 80, device="cuda"), torch.rand(80, 72, device="cuda")
        x = torch.rand(64, device="cuda")
        files = _cache_files()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            doubled = x * 2
            with pytest.raises(CaptureError, match="warm-up"):
                autogemm.matmul(a, b)
            tripled = doubled + x
        assert _cache_files() == files
        x.fill_(2.0)
        graph.replay()
        torch.cuda.synchronize()
        assert bool((doubled == 4.0).all()) and bool((tripled == 6.0).all())
        result = autogemm.matmul(a, b)  # outside the capture: planned and served
        torch.cuda.synchronize()
        assert float((result.double() - a.double() @ b.double()).abs().max()) <= 1e-4


def test_a_first_call_inside_a_cupy_capture_says_to_warm_up_and_leaves_the_capture_valid():
    import cupy

    with serving(select.CUBLAS_SERVES):
        autogemm.reset()
        a, b = _values(cupy, (96, 80), 1, "float32"), _values(cupy, (80, 72), 2, "float32")
        x = cupy.ones(64, dtype=cupy.float32)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            doubled = x * 2
            with pytest.raises(CaptureError, match="warm-up"):
                autogemm.matmul(a, b)
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        assert bool((doubled == 2.0).all())
        result = autogemm.matmul(a, b)
        assert float(cupy.abs(result - a @ b).max()) <= 1e-4


def test_the_torch_operator_is_captured_with_its_output_in_the_graph_pool():
    torch = _torch()
    import autogemm.torch as autogemm_torch  # noqa: F401 (registers torch.ops.autogemm)

    with serving(select.CUBLAS_SERVES):
        autogemm.reset()
        a, b = torch.rand(128, 64, device="cuda"), torch.rand(64, 96, device="cuda")
        torch.ops.autogemm.matmul(a, b)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = torch.ops.autogemm.matmul(a, b, 0.5)
        for scale in (1.0, -2.0):
            a.mul_(scale)
            graph.replay()
            torch.cuda.synchronize()
            assert float((result.double() - 0.5 * (a.double() @ b.double())).abs().max()) <= 1e-4


def test_a_capture_on_a_stream_with_a_spare_output_takes_its_output_from_the_graph_pool():
    """The torch fast path keeps the next output of each stream ready (made after a launch); a call
    under capture on that stream must not hand it out (it is not the graph's memory: it would be
    freed, and reused, while the graph still writes it), nor replace it. (alpha = 0.5: the plan's own launcher
    serves the tensors, as torch.matmul, which takes no alpha, serves them without one.)"""
    torch = _torch()
    from autogemm.serving import dispatch, torch_fast_path

    with serving(select.CUBLAS_SERVES):
        autogemm.reset()
        a, b = torch.rand(128, 64, device="cuda"), torch.rand(64, 96, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                autogemm.matmul(a, b, alpha=0.5)
        stream.synchronize()
        plan = dispatch._DISPATCHER.torch_fast[torch_fast_path.torch_fast_key(a, b, None)]
        spare = plan.torch_spares[stream.cuda_stream]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            result = autogemm.matmul(a, b, alpha=0.5)
        assert result.data_ptr() != spare.data_ptr() and plan.torch_spares[stream.cuda_stream] is spare
        del spare
        with torch.cuda.stream(stream):  # outside the capture the spare serves, and a new one is made
            outside = autogemm.matmul(a, b, alpha=0.5)
        stream.synchronize()
        a.mul_(-1.0)
        graph.replay()
        torch.cuda.synchronize()
        assert float((result.double() - 0.5 * (a.double() @ b.double())).abs().max()) <= 1e-4
        assert float((outside.double() + 0.5 * (a.double() @ b.double())).abs().max()) <= 1e-4
