"""What the tests of linear's memo in C++ share (tests/test_native_linear.py: the memo itself;
tests/test_native_linear_serving.py: how serving builds, asks and files it): a small layer of CPU tensors.
Whether the memo can be built here is conftest's `native_unbuildable`, which its `memo_type` fixture asks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def layer(dtype=torch.float32, m=(3, 5), n=12, k=16):
    """(x, weight, bias, residual) of a seeded layer: x of shape m + (k,), weight n x k."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*m, k, generator=g, dtype=dtype)
    w = torch.randn(n, k, generator=g, dtype=dtype)
    return x, w, torch.randn(n, generator=g, dtype=dtype), torch.randn(*m, n, generator=g, dtype=dtype)
