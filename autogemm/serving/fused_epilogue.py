"""The epilogue inside a generated kernel's own store: repeated calls on tensors run a config rendered
with the epilogue (templates/common.cuh.j2's macros): one launch, D written once, no product in
memory and no pass after it (serving/epilogue_step.py says when). The config is

- the one a tune of the problem with this epilogue kept (`autogemm tune ... --bias --activation`: its
  record is under the epilogue's key, measured against cuBLAS and the pass or cuBLASLt's epilogue);
  where that tune kept cuBLAS, none (the GEMM as served, then the pass or cuBLASLt's epilogue);
- where no such tune ran, the one that serves the bare GEMM for good (the record, the prediction,
  the guard's verdict), where its config applies the epilogue (GemmConfig.epilogue_refusal).

The accumulators go through the epilogue in FP32 (FP64) before they are rounded to D's type, where
the pass rounds the product first: D is at least as accurate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..epilogue import Epilogue
from ..gpu import launch as gpu_launch
from ..gpu.operands import KernelOperand
from . import plan as plan_module
from .guard import Guard
from .torch_fast_path import TorchOutputs, needs_general_path, torch_stream


def current_record(dispatcher: Any, problem: Any, device: Any) -> Any:
    """The cached record of a tune of `problem` (with its epilogue) on `device`, where it is of the current
    protocol, not stale, and its kernel compiled here as when it was measured (no guard checks a fused kernel
    on its first calls, as one serving a bare GEMM is: select.choose); else None."""
    found = dispatcher.cache.lookup(problem, device.slug)
    if found is None or found[0].stale or not found[0].current_protocol or found[0].compiled_by_another_nvrtc:
        return None
    return found[0]


def tuned_kernel(dispatcher: Any, problem: Any, device: Any) -> Any:
    """What a tune of `problem` (with its epilogue) found, where its record is cached (current_record): (True,
    the config it kept, or None where it kept cuBLAS and the pass, or cuBLASLt's epilogue: no generated kernel
    then takes the epilogue); (False, None) where there is none."""
    record = current_record(dispatcher, problem, device)
    if record is None:
        return False, None
    if record.is_cublas:
        return True, None
    config = record.config_object
    return (False, None) if config.check(problem, device) else (True, config)


def settled_kernel(gemm_plan: Any) -> Any:
    """The config whose kernel serves `gemm_plan` (a torch fast-path plan.Plan) for good: chosen, and
    not on trial by the guard or beaten there; None where cuBLAS serves it or the guard has not
    decided yet (a plan filed now is filed again once it has: the plans keep `gemm_launch`)."""
    config = gemm_plan.choice.config
    if config is None or isinstance(gemm_plan.launch, Guard):
        return None
    verdict = gemm_plan.choice.details.get("guard")
    if verdict is not None and not verdict.get("kernel_won", False):
        return None
    return config


class TorchFusedEpiloguePlan:
    """A call on CUDA tensors whose GEMM a generated kernel serves, with the epilogue in that kernel:
    one launch on PyTorch's current stream, D from its TorchOutputs. `call` gives None
    where the GEMM's torch fast-path plan changed (the memo dropped it, or its launcher is no longer
    the one this plan was filed beside), the current device or an operand's differs, or A's and B's
    addresses are not aligned as the kernel's vector widths assumed (the general path serves those)."""

    def __init__(self, dispatcher: Any, gemm_key: Any, gemm_plan: Any, launch: Any, outputs: TorchOutputs, device: int, name: str,
                 alignment: tuple[Any, ...], tuned: bool):
        self.dispatcher, self.gemm_key, self.gemm, self.launch = dispatcher, gemm_key, gemm_plan, launch
        self.gemm_launch = gemm_plan.launch  # (the bare GEMM's launcher when this plan was filed)
        self.outputs, self.device, self.name = outputs, device, name
        self.alignment = alignment  # A's and B's addresses modulo 16 that the kernel's vector widths assume
        self.tuned = tuned  # whether a tune with the epilogue chose the config (else the bare GEMM's choice)
        self.streams: dict[str, Any] = {}
        self._native: tuple | None = None

    def native_launch(self) -> tuple | None:
        """The launch as linear's C++ memo makes it itself (serving/native_prepared_kernel.h's PreparedKernel):
        the launcher's `native_description`, then the output's shape, the alignment of A's and B's addresses
        the kernel assumes (modulo 16) and the device; None where the launcher cannot be described (more than
        one launch, a workspace, copies of operands or a dependent grid: packed_launch.native_description_of's
        callers) or a tune with the epilogue did not choose the config (the bare GEMM's choice follows its guard,
        which the memo would not see). Made once."""
        if self._native is None:
            describe = getattr(self.launch, "native_description", None)
            described = describe() if describe is not None and self.tuned else None
            self._native = () if described is None else (
                *described, tuple(self.outputs.template.shape), self.alignment, self.device)
        return self._native or None

    def call(self, a: Any, b: Any, bias: Any, residual: Any, alpha: float) -> Any:
        gemm, device = self.gemm, self.device
        if self.dispatcher.torch_fast.get(self.gemm_key) is not gemm or gemm.launch is not self.gemm_launch \
                or plan_module.current_device() != device or b.get_device() != device \
                or needs_general_path(a, b, bias, residual):
            return None
        pa, pb = a.data_ptr(), b.data_ptr()
        if (pa % 16, pb % 16) != self.alignment:
            return None
        if (bias is not None and bias.get_device() != device) or (residual is not None and residual.get_device() != device):
            return None
        pointer = plan_module.torch_raw_stream(device)
        stream = self.streams.get(pointer)
        if stream is None:
            stream = torch_stream(self.streams, pointer, device)
        d, keep = self.outputs.take(pointer)
        self.launch(pa, pb, d.data_ptr(), alpha, 0.0, stream, 0 if bias is None else bias.data_ptr(),
                    0 if residual is None else residual.data_ptr())
        if keep:
            self.outputs.after_launch(pointer)
        return d


def fused_plan(dispatcher: Any, gemm_key: Any, gemm_plan: Any, epilogue: Epilogue, product: Any, result: Any, residual: Any, ldr: int,
               stride_r: int) -> Any:
    """A TorchFusedEpiloguePlan where a tune with `epilogue` kept a generated kernel (tuned_kernel), or
    else a generated kernel serves the GEMM for good (settled_kernel) and its config applies `epilogue`,
    and A and B are read in place; else None. `product` and `result` are the general path's product and
    D (contiguous), `ldr` and `stride_r` the residual's pitch and batch stride (elements)."""
    if gemm_plan.layouts is None or gemm_plan.copy_a or gemm_plan.copy_b or gemm_plan.copy_out \
            or tuple(product.shape) != tuple(result.shape) or epilogue.out_dtype or epilogue.gated:
        return None
    tuned, config = tuned_kernel(dispatcher, dataclasses.replace(gemm_plan.problem, epilogue=epilogue),
                                 gpu_launch.device_info(gemm_plan.device))
    if not tuned:
        config = settled_kernel(gemm_plan)
    if config is None or config.epilogue_refusal(epilogue):
        return None
    m, n = result.shape[-2:]
    layout_a, layout_b = gemm_plan.layouts
    layout_d = KernelOperand(False, n, m * n, 0)
    layout_residual = KernelOperand(False, ldr, stride_r, 0) if residual is not None else None
    device = gpu_launch.device_info(gemm_plan.device)
    problem = dataclasses.replace(gemm_plan.problem, epilogue=epilogue)
    widths = config.vector_widths(layout_a, layout_b, layout_d, result.element_size())
    prepared = gpu_launch.prepare(config, problem, widths, device)
    launch = gpu_launch.launcher(prepared, layout_a, layout_b, layout_d, ordinal=gemm_plan.device,
                                 residual=layout_residual)
    return TorchFusedEpiloguePlan(dispatcher, gemm_key, gemm_plan, launch, TorchOutputs(dispatcher, result),
                                  gemm_plan.device, prepared.kernel.source.kernel,
                                  (layout_a.pointer % 16, layout_b.pointer % 16), tuned)
