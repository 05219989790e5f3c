"""What a GEMM does to its accumulators before it stores them (`Epilogue`): a bias, an activation, a
residual and the output's type, as an LLM or MLP layer needs them (`act(x @ W.T + bias) + residual`).

The order, for C = alpha · op(A) @ op(B) in FP32 (FP64 for float64) accumulators:

    D = act(alpha · acc + bias) + residual + beta · C

`bias` is a vector broadcast along the rows (one value per column, "n": torch's Linear) or along the
columns (one value per row, "m": the same layer with the problem's operands swapped, C^T = B^T A^T).
`residual` is a tensor of D's shape. `beta · C` stays what it was without an epilogue. The activations:

- relu: max(x, 0)
- gelu: x · Φ(x) = 0.5 · x · (1 + erf(x / √2)) (PyTorch's default GELU)
- gelu_tanh: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))) (PyTorch's approximate="tanh")
- silu: x · sigmoid(x) = x / (1 + exp(-x))

An epilogue is part of a problem's identity (`Problem.epilogue`, in its cache key after the shape) and
of a kernel's. The identity epilogue (nothing added, the inputs' dtype out) leaves keys as they were.
`reference` computes D in float64 from the product, the figure kernels are checked against; its
`error_bound` says how far a correct kernel may be from it, element by element.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from . import dtypes

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
# the scales of a scaled (FP8) product, D = act(scale_a · scale_b · alpha · acc + bias) + ...: "tensor", one
# FP32 scalar per operand (device memory); "row", one per row of A (M values) and one per column of B (N);
# "block", one per row of A and 128 of K (1 x 128: M x ceil(K/128) values) and one per 128 x 128 block of B
# (ceil(K/128) x ceil(N/128)), applied to each 128 of K's partial sums (DeepSeek-V3's recipe)
SCALES = ("tensor", "row", "block")
# the activations with a cheaper form than the accurate math functions' (templates/common.cuh.j2,
# epilogue_functions' `fast`: GELU's erf by Abramowitz and Stegun, the hardware's exponential and quotient),
# within the same EVALUATION_ROUNDINGS: the epilogue pass computes them so, a Hopper kernel where asked
FAST_FORM_ACTIVATIONS = ("gelu", "silu")
BLOCK = 128  # the K (and B's N) extent of one block scale
BIAS_AXES = ("n", "m")  # "n": one value per column (along N); "m": one per row (along M)
# The largest |act'(x)| over all x: how much an activation may grow an error of its input
# (gelu's derivative peaks at 1.1289 near x = 2.42, gelu_tanh's likewise, silu's at 1.0998 near 2.40).
SLOPES = {"": 1.0, "relu": 1.0, "gelu": 1.129, "gelu_tanh": 1.13, "silu": 1.1}
# How many unit roundoffs of the accumulator (relative to |x|) evaluating act(x) may cost: erf, tanh
# and exp are accurate to about 2 ulps, and the products, sums and the quotient around them each add
# one rounding; where act(x) is small against x (gelu of a negative x: 1 + erf(x/sqrt 2) cancels),
# those roundings are of x's size, not of act(x)'s. relu and the identity round nothing.
EVALUATION_ROUNDINGS = {"": 0, "relu": 0, "gelu": 8, "gelu_tanh": 10, "silu": 8}
# D's dtypes by the products' dtype (Epilogue.output_dtype)
OUTPUT_DTYPES: dict[str, tuple[str, ...]] = {"float16": ("float16", "bfloat16", "float32"), "bfloat16": ("bfloat16", "float16", "float32"),
                 "float32": ("float32", "bfloat16", "float16"), "float64": ("float64", "float32")}
_KEY = re.compile(r"(?:scale_(?P<scale>tensor|row|block))?\+?(?:bias_(?P<bias>[nm]))?\+?(?P<activation>relu|gelu_tanh|gelu|silu)?\+?(?P<gated>gate)?\+?"
                  r"(?P<residual>res)?(?:>(?P<out>[a-z0-9]+))?")


@dataclass(frozen=True)
class Epilogue:
    bias: str = ""  # "": no bias; "n" or "m": the axis the bias vector runs along (BIAS_AXES)
    activation: str = ""  # "": none; else one of ACTIVATIONS
    residual: bool = False  # a tensor of the output's shape, added after the activation
    out_dtype: str = ""  # "": the inputs' dtype; else a dtype name of `dtypes` (accumulators converted to it)
    # a gated linear unit (SwiGLU with silu, GeGLU with gelu): the product has 2N columns, the gate's N
    # then the up projection's N (one GEMM against the stacked weights [W_gate; W_up] reads x once),
    # and D (N columns) = act(gate + bias_gate) * (up + bias_up); a bias then has 2N values
    gated: bool = False
    scale: str = ""  # "": unscaled; else one of SCALES (the FP8 dtypes' products, and only theirs)

    def __post_init__(self) -> None:
        if self.bias not in ("", *BIAS_AXES):
            raise ValueError(f"Epilogue.bias must be '', 'n' or 'm' (the axis the bias runs along), got {self.bias!r}")
        if self.activation not in ("", *ACTIVATIONS):
            raise ValueError(f"unknown activation {self.activation!r}; expected one of {', '.join(ACTIVATIONS)}")
        if not isinstance(self.gated, bool):
            raise TypeError(f"Epilogue.gated must be a bool, got {self.gated!r}")
        if self.gated and self.bias == "m":
            raise ValueError("a gated epilogue's halves are the product's columns: its bias runs along N")
        if not isinstance(self.residual, bool):
            raise TypeError(f"Epilogue.residual must be a bool, got {self.residual!r}")
        if self.scale not in ("", *SCALES):
            raise ValueError(f"unknown scaling {self.scale!r}; expected one of {', '.join(SCALES)}")
        if self.scale and self.gated:
            raise ValueError("a scaled (FP8) product is not gated")
        if self.out_dtype and self.out_dtype not in {row.name for row in dtypes.ROWS}:
            known = ", ".join(sorted({row.name for row in dtypes.ROWS}))
            raise ValueError(f"unknown output dtype {self.out_dtype!r}; expected one of {known}")

    @property
    def is_identity(self) -> bool:
        return not (self.bias or self.activation or self.residual or self.out_dtype or self.gated or self.scale)

    @property
    def key(self) -> str:
        """The epilogue's part of a problem key ('' for the identity), e.g. ``bias_n+gelu+res>bfloat16``
        (a scaled product's starts with its scaling: ``scale_tensor>bfloat16``)."""
        parts = [f"scale_{self.scale}"] if self.scale else []
        parts += [f"bias_{self.bias}"] if self.bias else []
        parts += [self.activation] if self.activation else []
        parts += ["gate"] if self.gated else []
        parts += ["res"] if self.residual else []
        return "+".join(parts) + (f">{self.out_dtype}" if self.out_dtype else "")

    @property
    def identifier(self) -> str:
        """The key spelled for a kernel's name ('' for the identity), e.g. ``bias_n_gelu_res_bfloat16``."""
        return re.sub(r"[^0-9a-z]+", "_", self.key)

    @classmethod
    def from_key(cls, key: str) -> Epilogue:
        match = _KEY.fullmatch(key)
        if not key or not match or not any(match.groupdict().values()):
            raise ValueError(f"not an epilogue key: {key!r} (expected like bias_n+gelu+res>bfloat16)")
        epilogue = cls(bias=match["bias"] or "", activation=match["activation"] or "", residual=bool(match["residual"]),
                       out_dtype=match["out"] or "", gated=bool(match["gated"]), scale=match["scale"] or "")
        if epilogue.key != key:  # (one spelling per epilogue: keys are compared as strings)
            raise ValueError(f"not an epilogue key: {key!r} (this epilogue's key is {epilogue.key!r})")
        return epilogue

    def swapped(self) -> Epilogue:
        """The same epilogue for the problem with its operands swapped (C^T = B^T A^T): a bias along N
        runs along M of the transposed output, and the other way round."""
        if self.gated:
            raise ValueError("a gated epilogue is not computed on the swapped product (its halves are columns)")
        if self.scale in ("row", "block"):
            raise ValueError(f"a {self.scale}-scaled product is not computed swapped (its scales would change roles)")
        if not self.bias:
            return self
        return replace(self, bias="m" if self.bias == "n" else "n")

    def output_dtype(self, dtype: str) -> str:
        """D's dtype for products of `dtype`: out_dtype where given, else `dtype`. ValueError where the
        pair is not one the kernels write: FP16, BF16 and FP32 products go to any of the three (an FP32
        accumulator written as BF16, or FP16 products kept in FP32), FP64 to FP64 or FP32."""
        row = dtypes.lookup(dtype)
        if row.output_dtypes and not self.out_dtype:
            raise ValueError(f"{dtype} products are written as {', '.join(row.output_dtypes)}: name one as out_dtype")
        out = self.out_dtype or dtype
        allowed = row.output_dtypes or OUTPUT_DTYPES.get(dtype, (dtype,))
        if out not in allowed:
            raise ValueError(f"out_dtype {out} is not written for {dtype} products; choose from {', '.join(allowed)}")
        return out

    def for_products(self, dtype: str) -> Epilogue:
        """This epilogue as the one key spells it for products of `dtype`: an out_dtype that names
        the products' own dtype is no conversion, so it is dropped."""
        return replace(self, out_dtype="") if self.out_dtype == dtype else self

    def template_context(self, dtype: str) -> dict[str, Any]:
        """What the templates' epilogue macros read (common.cuh.j2, epilogue_functions) for products
        of `dtype`: the epilogue's parts, and D's C++ type with its conversions from and to the
        accumulator (bias and residual have D's type)."""
        row = dtypes.lookup(dtype)
        out = dtypes.lookup(self.output_dtype(dtype))
        return {"active": not self.is_identity, "key": self.key, "bias": self.bias, "activation": self.activation,
                "residual": self.residual, "gated": self.gated, "scale": self.scale, "out": out.element, "out_bytes": out.itemsize,
                "out_to_acc": f"Acc({out.to_acc})", "acc_to_out": out.from_acc, "double": row.accumulator == "double"}

    def __str__(self) -> str:
        return self.key or "none"


def require_measurable(problem: Any, what: str) -> None:
    """ValueError where `problem`'s epilogue is one tuning does not measure: another output dtype or a
    gate (a fused kernel writes D in the operands' dtype, without a gate; matmul serves those with the
    pass), so that nothing is tuned or recorded under such a key. Bias, activation and residual are
    tuned: each candidate verified with its epilogue and timed against what matmul would serve
    without it (measure/measuring.py). An FP8 product's scaling and output dtype are its own (a
    record of one is served by scaled_matmul)."""
    epilogue = problem.epilogue
    if (epilogue.out_dtype and not epilogue.scale) or epilogue.gated:
        raise ValueError(f"{what}: {problem} has the epilogue {epilogue}; tuning measures bias, activation and "
                         "residual, not another output dtype or a gate (matmul serves those with its pass)")


def activate(x: Any, activation: str, xp: Any = None) -> Any:
    """`activation` of the float64 array `x`, with the array module `xp` (NumPy by default; CuPy for
    CuPy arrays)."""
    if xp is None:
        import numpy as xp  # (NumPy unless CuPy is given: the reference runs on either)
    if activation == "":
        return x
    if activation == "relu":
        return xp.maximum(x, 0.0)
    if activation == "gelu":
        erf = _erf(xp)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if activation == "silu":
        return x / (1.0 + xp.exp(-x))
    raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")


def _erf(xp):
    """The module's elementwise erf: NumPy has none (SciPy's, else math.erf vectorized); CuPy's
    cupyx.scipy.special has one."""
    if xp.__name__ == "numpy":
        try:
            from scipy.special import erf  # (optional: SciPy)

            return erf
        except ImportError:
            return xp.vectorize(math.erf, otypes=[float])
    from cupyx.scipy.special import erf  # (lazy: CuPy)

    return erf


def reference(product: Any, epilogue: Epilogue, *, alpha: float = 1.0, beta: float = 0.0, c: Any = None, bias: Any = None,
              residual: Any = None, xp: Any = None, scale_a: Any = None, scale_b: Any = None) -> Any:
    """D in float64 from the exact product (float64, M×N or batch×M×N): act(alpha·product + bias) +
    residual + beta·c (module docstring). `bias` has N values (bias "n") or M (bias "m"). Gated: the
    product has 2N columns and the bias 2N values; D = act(gate half) * (up half) + residual + beta·c.
    Scaled: the product is multiplied by `scale_a` and `scale_b` first (`scales`)."""
    if xp is None:
        import numpy as xp  # (NumPy unless CuPy is given)
    y = alpha * product
    if epilogue.scale:
        y = y * scales(epilogue, scale_a, scale_b)
    if epilogue.bias:
        if bias is None:
            raise ValueError(f"the epilogue {epilogue} adds a bias: give it")
        y = y + (bias.reshape(-1) if epilogue.bias == "n" else bias.reshape(-1, 1))
    if epilogue.gated:
        half = y.shape[-1] // 2
        y = activate(y[..., :half], epilogue.activation, xp) * y[..., half:]
    else:
        y = activate(y, epilogue.activation, xp)
    if epilogue.residual:
        if residual is None:
            raise ValueError(f"the epilogue {epilogue} adds a residual: give it")
        y = y + residual
    if beta != 0:
        y = y + beta * c
    return y


def scales(epilogue: Epilogue, scale_a: Any, scale_b: Any) -> Any:
    """What a scaled product is multiplied by, broadcast against it: scale_a · scale_b (per tensor), or
    scale_a's M values down the rows times scale_b's N across the columns (per row)."""
    if scale_a is None or scale_b is None:
        raise ValueError(f"the epilogue {epilogue} scales the product: give scale_a and scale_b")
    if epilogue.scale == "block":
        raise ValueError("block scales scale the operands' K blocks, not the product: dequantize the operands "
                         "(dequantized) and take the product of those")
    if epilogue.scale == "tensor":
        return scale_a.reshape(()) * scale_b.reshape(())
    return scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)


def dequantized(a: Any, b: Any, scale_a: Any, scale_b: Any, xp: Any = None) -> tuple[Any, Any]:
    """The operands' values times their block scales (float64 A, M x K, and B, N x K, as stored for layout
    NT): A's row m, K block kb times scale_a[m, kb]; B's 128 x 128 block (nb, kb) times scale_b[kb, nb].
    Their product is a block-scaled product's exact value."""
    if xp is None:
        import numpy as xp  # (NumPy unless CuPy is given)
    m, k = a.shape
    n = b.shape[0]
    along_k = xp.repeat(xp.asarray(scale_a, dtype=xp.float64).reshape(m, -1), BLOCK, axis=1)[:, :k]
    blocks = xp.asarray(scale_b, dtype=xp.float64).reshape(-1, -(-n // BLOCK)).T  # (nb, kb)
    b_scales = xp.repeat(xp.repeat(blocks, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]
    return a * along_k, b * b_scales


def error_bound(pre_activation_bound: Any, epilogue: Epilogue, result_magnitude: Any, out_unit_roundoff: float,
                residual_magnitude: Any = 0.0, *, pre_activation_magnitude: Any = 0.0,
                accumulator_unit_roundoff: float = 0.0, out_smallest_normal: float = 0.0, up_magnitude: Any = 0.0,
                up_bound: Any = 0.0, activated_magnitude: Any = 0.0) -> Any:
    """How far a correct kernel's D may be from `reference`, element by element:

    - the bound of the error of what the activation is given (the product's, with the bias added),
      grown by the activation's largest slope (SLOPES);
    - the activation's own evaluation in the accumulator's type (erf, tanh, exp and the products
      around them: EVALUATION_ROUNDINGS unit roundoffs of the accumulator, relative to the
      magnitude of what it is given);
    - the roundings the epilogue adds in D's type: the final conversion of the result and of the
      residual's sum (two unit roundoffs of each), and where D's type has subnormals that matter
      (FP16), half of their spacing.

    Gated (D = act(g) * u): the gate's part (what the activation is given: `pre_activation_*`) is
    scaled by |u| (`up_magnitude`), the up half's error bound (`up_bound`) by |act(g)|
    (`activated_magnitude`), and the product adds one rounding of the accumulator."""
    slope = SLOPES[epilogue.activation]
    rounding = 2 * out_unit_roundoff * result_magnitude + out_unit_roundoff * out_smallest_normal
    if epilogue.residual:
        rounding = rounding + 2 * out_unit_roundoff * residual_magnitude
    evaluation = EVALUATION_ROUNDINGS[epilogue.activation] * accumulator_unit_roundoff * pre_activation_magnitude
    core = slope * pre_activation_bound + evaluation
    if epilogue.gated:
        core = (core * up_magnitude + activated_magnitude * up_bound
                + accumulator_unit_roundoff * activated_magnitude * up_magnitude)
    return core + rounding
