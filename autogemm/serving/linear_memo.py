"""A first memo of `linear` on tensors, by the weight's and the bias's identity: where PyTorch's F.linear
serves a layer whole (cuBLAS serves its GEMM and the bias is the whole epilogue:
eager_epilogue.TorchEagerEpiloguePlan without a pass), a repeated call needs only x's metadata to find its
plan. The full key (epilogue_step.torch_linear_key) reads the weight's and the bias's shape, strides and
dtype every call too: 1.7 us of Python against 0.7 here, and on an H200's host a layer's GEMM can take
less than 20 us.

Why identity suffices for these plans and for no other: F.linear reads its operands as they are (shape,
strides, dtype, device, autograd, lazily negated views) and refuses what it cannot compute, as a user's own
call would. A weight whose metadata changed in place (`.data =`, `set_`) is still multiplied right; only the
choice of F.linear might be stale, and `Dispatcher.clear` (every tune) empties this memo. So does the
dispatcher whenever a torch fast-path plan is retired or replaced, so that an entry's plan is served
(`call_whole`) without looking its GEMM's plan up each call. A plan that reads addresses (a kernel, a pass)
is filed by the full key alone. An entry holds weak references: an id whose
object died and was reused by another tensor finds no entry (`entry.matches`).
"""

from __future__ import annotations

import weakref
from typing import Any

from .eager_epilogue import TorchEagerEpiloguePlan

MAX_ENTRIES = 1024  # emptied when full (a process's layers times its distinct token counts)


def key(x: Any, weight: Any, bias: Any, out_dtype: Any) -> tuple[Any, ...]:
    """The memo key of `linear(x, weight, bias, out_dtype=...)`, a call without an activation, a residual or
    a gate: the only calls F.linear can serve whole, and so the only ones that look here (dispatch.linear
    builds the key inline)."""
    return (id(weight), id(bias), x.shape, x.stride(), x.dtype, x.get_device(), out_dtype)


class Entry:
    """A plan filed for one weight and one bias (or none), held weakly."""

    __slots__ = ("weight", "bias", "plan")

    def __init__(self, weight: Any, bias: Any, plan: Any):
        self.weight = weakref.ref(weight)
        self.bias = None if bias is None else weakref.ref(bias)
        self.plan = plan

    def matches(self, weight: Any, bias: Any) -> bool:
        """Whether `weight` and `bias` are the tensors this entry was filed for (not others at their ids)."""
        return self.weight() is weight and (self.bias is None if bias is None else
                                            self.bias is not None and self.bias() is bias)


def serves_whole(plan: Any) -> bool:
    """Whether F.linear alone computes `plan`'s calls (the plans this memo may hold)."""
    return isinstance(plan, TorchEagerEpiloguePlan) and plan.finish is None and not plan.transposed


def file(dispatcher: Any, x: Any, weight: Any, bias: Any, out_dtype: Any, plan: Any) -> None:
    """Files `plan` for these operands where F.linear serves it whole (`serves_whole`); else nothing."""
    if not serves_whole(plan):
        return
    memo = dispatcher.linear_by_weight
    entry = Entry(weight, bias, plan)
    with dispatcher.lock:
        if len(memo) >= MAX_ENTRIES:
            memo.clear()
        memo[key(x, weight, bias, out_dtype)] = entry

