"""PyTorch tensors through `matmul`: tensors in, tensors out, on PyTorch's current stream.

The operands are seen as CuPy arrays through DLPack (zero-copy, and unlike
__cuda_array_interface__ it carries bfloat16), the call runs with PyTorch's current stream of
the operands' device as CuPy's current stream (so it is ordered after the work PyTorch queued
there, and what PyTorch queues next is ordered after it), and a fresh result goes back as a tensor
on the same memory (`torch.from_dlpack`). An `out` tensor is written in place and returned.
Such a call registers its plan for `dispatch.matmul`'s torch fast path (`dispatch.remember_torch`,
`torch_fast_path.register`): the next call of the same shapes, strides, dtypes, device and compute
skips all of this.

torch is imported only once a tensor is seen: `is_tensor` looks at the type's module name.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..gpu.operands import describe
from ..gpu.runtime import cupy_stream


def is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def to_cupy(x: Any, name: str) -> Any:
    """A CUDA tensor as a CuPy array on the same memory; anything else as it is (a CPU tensor
    raises the error `operands.describe` gives it)."""
    if not is_tensor(x):
        return x
    if not getattr(x, "is_cuda", False):
        describe(x, name)  # says where the tensor is and how to move it
    if x.requires_grad:
        raise TypeError(f"{name} requires grad: autogemm.matmul records no autograd graph; "
                        f"pass {name}.detach()")
    import cupy  # (lazy: CuPy)

    return cupy.from_dlpack(x)


def call(run: Any, a: Any, b: Any, out: Any, *, remember: Any = None, **options: Any) -> Any:
    """`run(a, b, out=out, **options)` (matmul on CuPy arrays) for operands of which at least one
    is a tensor: on PyTorch's current stream of the tensors' device; a tensor back where no `out`
    was given, `out` itself (the tensor, written in place) where one was. Where two plain tensors of
    that device gave a fresh result, `remember(a, b, a_arr, b_arr, result_arr, result, compute,
    device)` is told how (dispatch.remember_torch, which registers the plan for the torch fast path)."""
    device = next(x.device for x in (a, b, out) if is_tensor(x))
    if getattr(device, "type", None) != "cuda":  # a CPU tensor: to_cupy raises, naming it
        return run(to_cupy(a, "a"), to_cupy(b, "b"), out=to_cupy(out, "out"), **options)
    import torch  # (lazy: PyTorch)

    with _on_torch_stream(device):
        a_arr, b_arr = to_cupy(a, "a"), to_cupy(b, "b")
        result = run(a_arr, b_arr, out=to_cupy(out, "out"), **options)
        if out is not None:
            return out
        tensor = torch.from_dlpack(result)
        if remember is not None and type(a) is torch.Tensor and type(b) is torch.Tensor \
                and a.get_device() == b.get_device() == device.index:
            remember(a, b, a_arr, b_arr, result, tensor, options.get("compute"), device.index)
        return tensor


def call_all(run: Any, **arrays: Any) -> Any:
    """`run(**arrays)` (on CuPy arrays) where some of `arrays` (None for absent ones) are tensors: each
    tensor seen as a CuPy array, on PyTorch's current stream of the tensors' device (ValueError where
    the tensors are on different devices); a tensor back unless `out` was given (then `out`)."""
    tensors = [(name, x) for name, x in arrays.items() if is_tensor(x)]
    devices = {str(x.device) for _, x in tensors}
    if len(devices) > 1:
        raise ValueError("the tensors are on different devices (" + ", ".join(f"{name} on {x.device}" for name, x in tensors)
                         + "): put them on one GPU")
    device = tensors[0][1].device
    if device.type != "cuda":  # a CPU tensor: to_cupy raises, naming it
        return run(**{name: to_cupy(x, name) if x is not None else None for name, x in arrays.items()})
    import torch  # (lazy: PyTorch)

    with _on_torch_stream(device):
        result = run(**{name: to_cupy(x, name) if x is not None else None for name, x in arrays.items()})
        out = arrays.get("out")
        return out if out is not None else torch.from_dlpack(result)


@contextlib.contextmanager
def _on_torch_stream(device):
    """Within the block, CuPy works on the tensors' GPU and on PyTorch's current stream there."""
    import cupy  # (lazy: CuPy)
    import torch  # (lazy: PyTorch)

    pointer = torch.cuda.current_stream(device).cuda_stream
    with cupy.cuda.Device(device.index), cupy_stream(pointer, device.index):
        yield
