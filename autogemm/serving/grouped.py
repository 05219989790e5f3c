"""`grouped_matmul()` and `grouped_matmul_masked()`: the GEMMs of a mixture-of-experts layer in one call.

    out[offsets[e]:offsets[e+1]] = act(a[offsets[e]:offsets[e+1]] @ b[e] + bias[e])     for each expert e
    out[e, :counts[e]]           = act(a[e, :counts[e]] @ b[e] + bias[e])                (masked, decode)

`a` holds the tokens sorted by expert, (total_M, K) with rows contiguous; `b` the experts' weights, (E, K, N),
either N-contiguous or the transpose of a contiguous (E, N, K) weight (`w.transpose(1, 2)`: K contiguous).
`offsets` are E + 1 row offsets (from 0, non-decreasing, to total_M), an integer vector on the GPU, so that
routing never waits for the host. The masked variant takes `a` as (E, max_M, K) with `counts`, E token
counts on the GPU; rows of `out` from counts[e] on are left as the padding computes them. Its calls are
capturable in CUDA graphs. `bias` is (E, N), one row per expert; `activation` one of
`autogemm.epilogue.ACTIVATIONS`.

What serves a call on PyTorch tensors (`grouped_plan.py` decides):
- the Hopper family's grouped kernel (`gpu/grouped_launch.py`, one launch, no host sync) where this very
  problem (E, total_M, K, N, dtype, b's layout) has records on this GPU that kept it (`autogemm tune
  --groups E --routing ...`). A record is of one routing bucket (`autogemm.routing`), and the host cannot see
  a call's routing without reading the offsets: the caller names it (`routing=`), or else the kernel serves
  only where both buckets' records kept the same kernel (it beat torch under either);
- else, where the records kept the baseline, the faster of the two they measured (torch._grouped_mm or the
  loop below; a routing bucket's records must agree, as for the kernel);
- else `torch._grouped_mm` where it takes the problem (one launch, no host sync), unless each expert's
  product fills the GPU by itself (`LOOP_WAVES`);
- else a loop of `torch.matmul` over the experts, which reads the offsets on the host (never inside a CUDA
  graph capture).
The masked variant is one batched `torch.bmm`. CuPy arrays go through a loop of `cupy.matmul`, and
`cupy.matmul` batched for the masked variant. Every argument is checked first; each fault is named (shape,
dtype, device, layout) before anything runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes
from ..epilogue import ACTIVATIONS, activate
from ..gpu.operands import contiguous_strides
from ..routing import ROUTINGS
from .grouped_plan import GroupedCall, KernelPlan, kernel_plan, serves_the_loop
from .torch_tensors import is_tensor

DTYPES = ("float16", "bfloat16", "float32")
INDEX_DTYPES = ("int32", "int64")


def _dtype_name(x) -> str:
    """The dtype of an array or tensor as autogemm names it (what it is, where it has none)."""
    dtype = getattr(x, "dtype", None)
    return type(x).__name__ if dtype is None else dtypes.name_of(dtype)


def _device(x, tensors: bool):
    return x.get_device() if tensors else getattr(getattr(x, "device", None), "id", None)


def _strides(x, tensors: bool) -> tuple[Any, ...]:
    """Strides in elements (torch's are; CuPy's are bytes)."""
    if tensors:
        return tuple(x.stride())
    itemsize = np.dtype(x.dtype).itemsize
    return tuple(s // itemsize for s in x.strides)


def check_grouped(a: Any, b: Any, index: Any, bias: Any = None, activation: Any = None, *, masked: bool, out: Any = None) -> GroupedCall:
    """The GroupedCall of grouped_matmul's (or, `masked`, grouped_matmul_masked's) arguments; `index` is
    `offsets` (or `counts`). TypeError/ValueError naming the fault."""
    tensors = is_tensor(a)
    if tensors != is_tensor(b) or tensors != is_tensor(index):
        raise TypeError(f"a, b and {'counts' if masked else 'offsets'} must all be PyTorch tensors or all CuPy "
                        f"arrays; got {type(a).__name__}, {type(b).__name__} and {type(index).__name__}")
    dtype = _dtype_name(a)
    if dtype not in DTYPES:
        raise TypeError(f"a is {dtype}: grouped_matmul multiplies {', '.join(DTYPES)}")
    if not tensors and dtype == "bfloat16":
        raise TypeError("CuPy arrays have no bfloat16 product: pass BF16 operands as PyTorch tensors")
    if _dtype_name(b) != dtype:
        raise TypeError(f"a is {dtype} and b {_dtype_name(b)}: the tokens and the weights must have one dtype")
    if len(b.shape) != 3:
        raise ValueError(f"b must hold one K × N matrix per expert, shaped (E, K, N); got shape {tuple(b.shape)}")
    experts, k, n = (int(v) for v in b.shape)
    if masked:
        if len(a.shape) != 3 or int(a.shape[0]) != experts:
            raise ValueError(f"a must be (E, max_M, K) with E = {experts} (b's experts); got shape {tuple(a.shape)}")
        rows, k_a = int(a.shape[1]), int(a.shape[2])
    else:
        if len(a.shape) != 2:
            raise ValueError(f"a must be (total_M, K), the tokens sorted by expert; got shape {tuple(a.shape)}")
        rows, k_a = (int(v) for v in a.shape)
    if k_a != k:
        raise ValueError(f"a's rows have K = {k_a} values and b's experts K = {k}: they must match")
    if experts == 0:
        raise ValueError("b has no experts (E = 0)")
    strides_a = _strides(a, tensors)
    if rows * k and (strides_a[-1] != 1 or (rows > 1 and strides_a[-2] != k)):
        raise ValueError(f"a's rows must be contiguous (K values a row, rows K apart); got strides {strides_a}")
    if masked and experts > 1 and rows * k and strides_a[0] != rows * k:
        raise ValueError(f"a must be contiguous (E, max_M, K); got strides {strides_a}")
    strides_b = _strides(b, tensors)
    if strides_b[1:] == (n, 1) or (n == 1 and strides_b[1] == 1):
        b_k_major = False
    elif strides_b[1:] == (1, k) or (k == 1 and strides_b[2] == 1):
        b_k_major = True
    else:
        raise ValueError(f"b must be (E, K, N) with N contiguous, or the transpose of a contiguous (E, N, K) weight "
                         f"(K contiguous); got strides {strides_b}")
    device = _device(a, tensors)
    if device is None or device < 0:
        raise ValueError("a must be on a GPU")
    index_name, index_shape = ("counts", (experts,)) if masked else ("offsets", (experts + 1,))
    if _dtype_name(index) not in INDEX_DTYPES or tuple(index.shape) != index_shape:
        raise ValueError(f"{index_name} must be an integer vector ({' or '.join(INDEX_DTYPES)}) of "
                         f"{index_shape[0]} values ({'one per expert' if masked else 'E + 1 row offsets'}); got "
                         f"{_dtype_name(index)} of shape {tuple(index.shape)}")
    named = [("b", b), (index_name, index)]
    if bias is not None:
        if tuple(bias.shape) != (experts, n) or _dtype_name(bias) != dtype:
            raise ValueError(f"bias must be (E, N) = ({experts}, {n}) of a's dtype {dtype}, one row per expert; got "
                             f"{_dtype_name(bias)} of shape {tuple(bias.shape)}")
        if is_tensor(bias) != tensors:
            raise TypeError(f"bias must be a {'tensor' if tensors else 'CuPy array'} like a")
        named.append(("bias", bias))
    if out is not None:
        shape = (experts, rows, n) if masked else (rows, n)
        if is_tensor(out) != tensors or tuple(out.shape) != shape or _dtype_name(out) != dtype or \
                (rows * n and _strides(out, tensors) != contiguous_strides(shape, 1)):
            raise ValueError(f"out must be a contiguous {'tensor' if tensors else 'CuPy array'} of shape {shape} and "
                             f"dtype {dtype}; got {_dtype_name(out)} of shape {tuple(out.shape)}")
        named.append(("out", out))
    for name, x in named:
        if _device(x, tensors) != device:
            raise ValueError(f"{name} is on GPU {_device(x, tensors)}, a on GPU {device}: one GPU for all")
    activation = activation or ""
    if activation not in ("", *ACTIVATIONS):
        raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    return GroupedCall(experts, rows, k, n, dtype, b_k_major, bias is not None, activation, masked, device)


def grouped_matmul(a: Any, b: Any, offsets: Any, *, out: Any = None, bias: Any = None,
                   activation: str | None = None, routing: str | None = None) -> Any:
    """act(a[rows of e] @ b[e] + bias[e]) for each expert e, the rows of e being offsets[e]:offsets[e+1]
    (the module's docstring says what each argument is). `routing`: how the rows fall to the experts, where
    the caller knows it (one of autogemm.routing.ROUTINGS), which picks the tuned kernel of that bucket."""
    call = check_grouped(a, b, offsets, bias, activation, masked=False, out=out)
    if routing is not None and routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)} (or None: not known), got {routing!r}")
    if is_tensor(a):
        return _torch_grouped(call, a, b, offsets, out, bias, routing)
    return _cupy_loop(call, a, b, offsets, out, bias)


def grouped_matmul_masked(a: Any, b: Any, counts: Any, *, out: Any = None, bias: Any = None,
                          activation: str | None = None) -> Any:
    """act(a[e, :counts[e]] @ b[e] + bias[e]) into out[e, :counts[e]] for each expert e, a being
    (E, max_M, K); rows from counts[e] on are left as the padding computes them. No host sync: CUDA graphs
    capture it."""
    call = check_grouped(a, b, counts, bias, activation, masked=True, out=out)
    if is_tensor(a):
        import torch  # (lazy: torch)

        result = torch.bmm(a, b, out=out) if out is not None else torch.bmm(a, b)
        return _torch_epilogue(call, result, bias[:, None, :] if bias is not None else None)
    import cupy  # (lazy: CuPy)

    result = cupy.matmul(a, b, out=out)
    return _cupy_epilogue(call, result, bias[:, None, :] if bias is not None else None)


_TORCH_REFUSED: set[Any] = set()  # (dtype, K-major b, K, N, GPU) torch._grouped_mm refused: the loop serves them


def _torch_grouped(call: GroupedCall, a, b, offsets, out, bias, routing: str | None = None):
    import torch  # (lazy: torch)

    plan = kernel_plan(call, routing)
    if isinstance(plan, KernelPlan):
        result = out if out is not None else torch.empty((call.rows, call.n), dtype=a.dtype, device=a.device)
        if plan.run(torch, a, b, offsets, result):
            return _torch_epilogue(call, result, _rows_bias(torch, call, offsets, bias))
    key = (call.dtype, call.b_k_major, call.k, call.n, call.device)
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is not None and key not in _TORCH_REFUSED and call.rows and not serves_the_loop(torch, call, plan):
        try:
            # torch's offs are the E group ends (from 0), int32
            result = grouped_mm(a, b, offs=offsets[1:].to(torch.int32))
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            _TORCH_REFUSED.add(key)  # (this dtype, layout or GPU: not torch's; once asked, not again)
        else:
            if out is not None:
                out.copy_(result)
                result = out
            return _torch_epilogue(call, result, _rows_bias(torch, call, offsets, bias))
    ends = _host_offsets(call, offsets.tolist())
    result = out if out is not None else torch.empty((call.rows, call.n), dtype=a.dtype, device=a.device)
    for e, (start, end) in enumerate(zip(ends, ends[1:])):
        if end > start:
            torch.matmul(a[start:end], b[e], out=result[start:end])
    return _torch_epilogue(call, result, _rows_bias(torch, call, offsets, bias))


def _host_offsets(call: GroupedCall, values: list[Any]) -> list[Any]:
    """The offsets read on the host (the loop's), checked: from 0, non-decreasing, to total_M."""
    values = [int(v) for v in values]
    if values[0] != 0 or values[-1] != call.rows or any(x > y for x, y in zip(values, values[1:])):
        raise ValueError(f"offsets must run from 0 to total_M = {call.rows} without decreasing; got "
                         f"{values[:8]}{' ...' if len(values) > 8 else ''}")
    return values


class _RowsBias:
    """Each row's expert's bias, added on the GPU without a host sync: a one-hot (total_M, E) matrix of the rows'
    experts times bias (E, N), added by one GEMM (result += onehot @ bias: one non-zero term a sum, so the
    same single rounding as adding the row), instead of gathering a (total_M, N) copy of the bias rows."""

    def __init__(self, torch, call: GroupedCall, offsets, bias):
        rows = torch.arange(call.rows, device=offsets.device, dtype=offsets.dtype)
        expert = torch.searchsorted(offsets[1:].contiguous(), rows, right=True).clamp_(max=call.experts - 1)
        self.onehot = torch.zeros(call.rows, call.experts, device=bias.device, dtype=bias.dtype)
        self.onehot.scatter_(1, expert[:, None], 1)
        self.bias = bias

    def add_to(self, result) -> None:
        result.addmm_(self.onehot, self.bias)


def _rows_bias(torch, call: GroupedCall, offsets, bias):
    return _RowsBias(torch, call, offsets, bias) if bias is not None else None


def _torch_epilogue(call: GroupedCall, result, bias):
    import torch.nn.functional as functional  # (lazy: torch)

    if isinstance(bias, _RowsBias):
        bias.add_to(result)
    elif bias is not None:
        result.add_(bias)
    if call.activation == "relu":
        result.relu_()
    elif call.activation in ("gelu", "gelu_tanh"):
        result.copy_(functional.gelu(result, approximate="tanh" if call.activation == "gelu_tanh" else "none"))
    elif call.activation == "silu":
        functional.silu(result, inplace=True)
    return result


def _cupy_loop(call: GroupedCall, a, b, offsets, out, bias):
    import cupy  # (lazy: CuPy)

    ends = _host_offsets(call, cupy.asnumpy(offsets).tolist())
    result = out if out is not None else cupy.empty((call.rows, call.n), dtype=a.dtype)
    for e, (start, end) in enumerate(zip(ends, ends[1:])):
        if end > start:
            cupy.matmul(a[start:end], b[e], out=result[start:end])
            _cupy_epilogue(call, result[start:end], bias[e] if bias is not None else None)
    return result


def _cupy_epilogue(call: GroupedCall, result, bias):
    """bias and activation on `result` in place, in FP32 (the reference's formulas: epilogue.activate)."""
    if bias is None and not call.activation:
        return result
    import cupy  # (lazy: CuPy)

    value = result.astype(cupy.float32)
    if bias is not None:
        value += bias.astype(cupy.float32)
    result[...] = activate(value, call.activation, cupy).astype(result.dtype)
    return result
