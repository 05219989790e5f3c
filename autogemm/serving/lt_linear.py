"""A layer whose bias is its whole epilogue, where cuBLAS serves its GEMM: cuBLASLt's BIAS epilogue prepared
once, where F.linear would prepare it on every call.

`F.linear(x, w, bias)` builds cuBLASLt's descriptors and asks its heuristic for an algorithm on each call,
then allocates its output and launches. Here the descriptors and the algorithm are made once per layer
shape, with PyTorch's workspace size, so that the heuristic picks the kernel F.linear runs; and the
output of a call is made after the launch of the one before (TorchOutputs' spare), so that a call's
launch waits for no allocation. Measured on an H200's host (16-bit layers of 1-256 tokens, where the host
sets the pace): F.linear cost 31-38 us a call; the route here, with every check it makes, 31-38 as well
back to back, and an allocation from Python alone 8-10 us, which the spare takes off the time to the
launch. The same kernel ran (its GPU time within 0.3% of F.linear's).

Why PyTorch's workspace size: cuBLASLt's heuristic picks by it. With 32 MiB it gave FP16 256x4608x3584 a
4x2-cluster 80x128 kernel where F.linear, with PyTorch's default 1 MiB (CUBLASLT_WORKSPACE_SIZE, in KiB,
changes it), runs a 144x64 one.

A call is refused (None: F.linear serves it) where anything differs from what the layer was prepared for:
the weight's or the bias's shape, strides, dtype or device (a `.data =` may change them on the same
tensor), a lazily negated view (cuBLASLt reads the memory as it is), the current device, an address less
aligned than 256 bytes, or a CUDA graph capture (PyTorch's own call captures with the graph's workspace).
The spare outputs are shared by the plan's two forms (matmul's key and linear's): where one leaves the memo,
its budget goes back and the other allocates at each call, as F.linear does.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

from .. import dtypes
from ..gpu import capture
from ..gpu.cublas_epilogue import prepared_bias_launcher
from ..gpu.cublas_gemm import CublasUnavailable
from ..gpu.operands import KernelOperand
from ..problem import Problem
from . import plan as plan_module
from .torch_fast_path import MAX_TORCH_SPARES, TorchOutputs, make_torch_blas_handle

ALIGNMENT = 256  # bytes every address keeps, as PyTorch's blocks do (the heuristic is told so)
TORCH_LT_WORKSPACE_KIB = 1024  # PyTorch's default cuBLASLt workspace (CUBLASLT_WORKSPACE_SIZE, KiB)
MAX_WORKSPACE_KIB = 32 * 1024  # what autogemm allocates a stream (cublas_gemm.WORKSPACE_BYTES)


def torch_workspace_bytes() -> int:
    """The cuBLASLt workspace PyTorch gives F.linear: CUBLASLT_WORKSPACE_SIZE (KiB) where it is a whole
    number from 0 to MAX_WORKSPACE_KIB, else the default (with a warning for a value out of that range)."""
    text = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "").strip()
    if not text:
        return TORCH_LT_WORKSPACE_KIB * 1024
    if text.isdigit() and int(text) <= MAX_WORKSPACE_KIB:
        return int(text) * 1024
    warnings.warn(f"CUBLASLT_WORKSPACE_SIZE={text[:40]!r} is not a size in KiB from 0 to {MAX_WORKSPACE_KIB}: "
                  f"autogemm's prepared cuBLASLt calls use {TORCH_LT_WORKSPACE_KIB} KiB", stacklevel=2)
    return TORCH_LT_WORKSPACE_KIB * 1024


class PreparedBiasLinear:
    """y = x @ weight.T + bias through cuBLASLt's BIAS epilogue, prepared for the shapes of one call
    (`prepare`): x C-contiguous (..., K), the weight N x K row-major, the bias N contiguous, one 16-bit dtype.
    `__call__` gives None where a call does not suit (module docstring)."""

    def __init__(self, dispatcher: Any, launch: Any, x: Any, weight: Any, bias: Any, result: Any, device: int):
        self.launch, self.device = launch, device
        self.weight_shape, self.weight_stride, self.dtype = weight.shape, weight.stride(), weight.dtype
        self.bias_shape, self.bias_stride = bias.shape, bias.stride()
        self.outputs = TorchOutputs(dispatcher, result)
        self.lock = threading.Lock()  # (the bias's address lives in the descriptor: one call sets and uses it)
        # PyTorch's own C readers of the current device and of whether its current stream captures a graph
        # (a tenth of CuPy's getDevice and streamIsCapturing from Python, 0.5 and 0.8 us on an H200's host),
        # CuPy's where this PyTorch lacks them
        import torch  # (a tensor was given)

        self._current_device = getattr(torch._C, "_cuda_getDevice", None) or plan_module.current_device
        self._capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)

    def __call__(self, x: Any, weight: Any, bias: Any) -> Any:
        device = self.device
        # (x's shape, strides, dtype and device are in the memo keys that lead here)
        if weight.shape != self.weight_shape or weight.stride() != self.weight_stride or weight.dtype is not self.dtype \
                or bias.shape != self.bias_shape or bias.stride() != self.bias_stride or bias.dtype is not self.dtype \
                or weight.get_device() != device or bias.get_device() != device \
                or x.is_neg() or weight.is_neg() or bias.is_neg() or self._current_device() != device:
            return None
        stream = plan_module.torch_raw_stream(device)  # (the current stream: `device` is current)
        try:
            if self._capturing() if self._capturing is not None else capture.capturing(stream):
                return None
        except RuntimeError:  # (another stream's capture, which this one would join: F.linear raises its own error)
            return None
        # (a capture's F.linear would create PyTorch's cuBLAS handle where this thread has none, and lose the
        # capture: a thread whose calls only this prepared call served, one that warmed up a layer another
        # thread had planned, then captured it; native_linear.cpp's make_torch_blas_handle does the same)
        make_torch_blas_handle(device, known_uncaptured=True)
        pa, pb, pbias = x.data_ptr(), weight.data_ptr(), bias.data_ptr()
        if (pa | pb | pbias) % ALIGNMENT:
            return None
        outputs = self.outputs
        spares = outputs.spares
        y = spares.pop(stream, None) if spares is not None else None
        if y is None:
            y = outputs.empty_like(outputs.template)
        with self.lock:
            self.launch(pa, pb, y.data_ptr(), stream, pbias)
        if spares is not None:  # the next call's output, made while the GPU works
            if len(spares) >= MAX_TORCH_SPARES:
                spares.clear()
            spares[stream] = outputs.empty_like(outputs.template)
        return y


def prepare(dispatcher: Any, x: Any, weight: Any, bias: Any, result: Any, device: int) -> PreparedBiasLinear | None:
    """A PreparedBiasLinear for F.linear(x, weight, bias) giving `result`, where the operands are laid out as
    it assumes (PreparedBiasLinear) and every address keeps ALIGNMENT; else None, also where cuBLASLt has
    no algorithm for it or cannot be loaded."""
    if bias is None or weight.dim() != 2 or bias.dim() != 1 or x.dim() < 2 or not x.is_contiguous() \
            or not weight.is_contiguous() or not bias.is_contiguous() or not result.is_contiguous() \
            or len({x.dtype, weight.dtype, bias.dtype, result.dtype}) != 1 or not result.numel():
        return None
    # (the heuristic is told the addresses' alignment alone, as F.linear tells it, so that it picks F.linear's
    # kernel; cublas_epilogue_launcher also lowers it to what the pitches keep, which could pick another)
    if any(t.data_ptr() % ALIGNMENT for t in (x, weight, bias, result)):
        return None
    n, k = weight.shape
    m = x.numel() // k
    dtype = dtypes.from_array_name(str(x.dtype).removeprefix("torch."))
    try:
        launch = prepared_bias_launcher(Problem(m, n, k, dtype=dtype, trans_a=False, trans_b=True),
                                        KernelOperand(False, k, 0, x.data_ptr()), KernelOperand(True, k, 0, weight.data_ptr()),
                                        KernelOperand(False, n, 0, result.data_ptr()), bias.data_ptr(), ALIGNMENT, device,
                                        torch_workspace_bytes())
    except CublasUnavailable:  # (F.linear serves, as it did)
        return None
    return None if launch is None else PreparedBiasLinear(dispatcher, launch, x, weight, bias, result, device)
