"""FP8 values as autogemm holds them: raw bits in uint8 arrays (CuPy has no FP8 type), read as
float64 and made from any float values. The two types are ml_dtypes' (and PyTorch's) float8_e4m3fn
(no infinities, 0x7F/0xFF NaN, up to 448) and float8_e5m2 (IEEE-like, up to 57344).

Both directions go through a 256-entry table of every bit pattern's value, which works the same on
NumPy and CuPy arrays (`xp`): decoding indexes it, quantizing searches its sorted finite values for
the nearest one (saturating at the largest finite value, as torch's conversion does not: a value past
it is a caller's error in torch and is clamped here).
"""

from __future__ import annotations

import functools

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


def to_float64(bits, dtype: str, xp=np):
    """The values of an array of `dtype`'s bit patterns (uint8), as float64."""
    return xp.asarray(values(dtype))[bits]


def quantize(x, dtype: str, xp=np):
    """The bit patterns (uint8) of the values of `dtype` nearest to the float array `x` (saturating at
    the largest finite value)."""
    finite, bits = (xp.asarray(v) for v in _sorted_finite(dtype))
    x = xp.asarray(x, dtype=np.float64)
    above = xp.clip(xp.searchsorted(finite, x), 1, finite.size - 1)
    below = above - 1
    nearest = xp.where(xp.abs(x - finite[below]) <= xp.abs(finite[above] - x), below, above)
    return bits[nearest]
