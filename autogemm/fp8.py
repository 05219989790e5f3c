"""FP8 values as autogemm holds them: raw bits in uint8 arrays (CuPy has no FP8 type), read as
float64 and made from any float values. The two types are ml_dtypes' (and PyTorch's) float8_e4m3fn
(no infinities, 0x7F/0xFF NaN, up to 448) and float8_e5m2 (IEEE-like, up to 57344).

Both directions go through a 256-entry table of every bit pattern's value, which works the same on
NumPy and CuPy arrays (`xp`): decoding indexes it, quantizing searches its sorted finite values for
the nearest one as ml_dtypes rounds (half to even), saturating at the largest finite value (as
torch's conversion does not: a value past it, or an infinity, is a caller's error in torch and is
clamped here), NaN kept NaN.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import dtypes

FP8_DTYPES = tuple(row.name for row in dtypes.ROWS if row.scaled)


@functools.lru_cache(maxsize=None)
def values(dtype: str) -> np.ndarray:
    """float64 value of each of the 256 bit patterns of `dtype` (NaN where the pattern is one)."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"{dtype} is not an FP8 type; FP8 types: {', '.join(FP8_DTYPES)}")
    import ml_dtypes  # (lazy: the FP8 types' NumPy definitions)

    return np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, dtype)).astype(np.float64)


@functools.lru_cache(maxsize=None)
def _sorted_finite(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The finite values of `dtype` in increasing order, and their bit patterns (one per value:
    +0 for zero)."""
    table = values(dtype)
    bits = np.flatnonzero(np.isfinite(table) & ~((table == 0) & np.signbit(table))).astype(np.uint8)
    order = np.argsort(table[bits], kind="stable")
    return table[bits][order], bits[order]


def to_float64(bits: Any, dtype: str, xp: Any = np) -> Any:
    """The values of an array of `dtype`'s bit patterns (uint8), as float64."""
    return xp.asarray(values(dtype))[bits]


@functools.lru_cache(maxsize=None)
def _nan_bits(dtype: str) -> int:
    """The bit pattern ml_dtypes gives a NaN of `dtype`."""
    import ml_dtypes  # (lazy: the FP8 types' NumPy definitions)

    return int(np.array(np.nan).astype(getattr(ml_dtypes, dtype)).view(np.uint8))


def quantize(x: Any, dtype: str, xp: Any = np) -> Any:
    """The bit patterns (uint8) of the values of `dtype` nearest to the float array `x`, as ml_dtypes
    rounds (a tie to the even pattern), saturating at the largest finite value (±inf included: the
    e5m2 infinities are not made), NaN to ml_dtypes' NaN pattern."""
    finite, bits = (xp.asarray(v) for v in _sorted_finite(dtype))
    x = xp.asarray(x, dtype=np.float64)
    nan = xp.isnan(x)
    x = xp.clip(xp.where(nan, 0.0, x), finite[0], finite[-1])  # (beyond the largest finite value: it)
    above = xp.clip(xp.searchsorted(finite, x), 1, finite.size - 1)  # finite[above - 1] < x <= finite[above]
    below = above - 1
    to_below, to_above = x - finite[below], finite[above] - x
    # halfway: the even pattern (its last mantissa bit 0), as IEEE round-to-nearest-even does
    tie_down = (to_below == to_above) & (bits[above] % 2 == 1)
    nearest = xp.where((to_below < to_above) | tie_down, below, above)
    return xp.where(nan, np.uint8(_nan_bits(dtype)), bits[nearest]).astype(np.uint8)
