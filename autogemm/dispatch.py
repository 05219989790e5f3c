"""`matmul()`: validate the operands, pick a kernel (memo -> cache -> nearest tuned shape ->
default by size -> cupy.matmul), launch it on the operands' GPU and the current stream.

Validation happens before anything touches the GPU and names the problem. A call's "plan" (kernel,
launch geometry, vector widths) is memoized per (device, shapes, strides, alignment), so that a
repeated call costs one dictionary lookup and one launch.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from .config import SimtConfig, WmmaConfig
from .problem import COMPUTE_MODES, Problem

SUPPORTED_DTYPES = ("float32", "float64", "float16", "bfloat16")
# Problems a template computes: float32/fp32 the SIMT family, the rest the tensor-core (WMMA) family.
TEMPLATE_DTYPES = {("float32", "fp32"), ("float32", "tf32"), ("float16", "fp32"), ("bfloat16", "fp32"),
                   ("float64", "fp64")}
AUTOTUNE_TRIALS = 40
AUTOTUNE_TIMEOUT_S = 30.0


# ---- inputs -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArrayInfo:
    """What validation needs of an operand, read without touching the GPU."""

    name: str
    shape: tuple
    strides: tuple  # bytes
    dtype: str
    pointer: int
    device: int | None  # None: not known without asking the driver (a __cuda_array_interface__ object)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    def byte_range(self) -> tuple[int, int]:
        low = high = self.pointer
        for extent, stride in zip(self.shape, self.strides):
            if extent == 0:
                return self.pointer, self.pointer
            reach = (extent - 1) * stride
            if reach < 0:
                low += reach
            else:
                high += reach
        return low, high + self.itemsize


_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
_TYPESTR = {"<f4": "float32", "<f8": "float64", "<f2": "float16", "|V2": "bfloat16", "<V2": "bfloat16"}


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return "bfloat16" if name in ("bfloat16", "|V2") else name


def array_info(x, name: str) -> ArrayInfo:
    """Operand description from a CuPy array or any object with __cuda_array_interface__."""
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a NumPy array in host memory; move it to the GPU first, e.g. cupy.asarray({name})")
    cupy_device = getattr(x, "device", None)
    if type(x).__module__.startswith("cupy") and hasattr(x, "data") and hasattr(x, "strides"):
        dtype = _dtype_name(x.dtype)
        return ArrayInfo(name, tuple(x.shape), tuple(x.strides), dtype, x.data.ptr, cupy_device.id)
    interface = getattr(x, "__cuda_array_interface__", None)
    if interface is None:
        raise TypeError(f"{name} must be a CuPy array or support __cuda_array_interface__ "
                        f"(PyTorch CUDA tensors, Numba device arrays); got {type(x).__name__}")
    typestr = interface["typestr"]
    if typestr not in _TYPESTR:
        kind = {"i": "integer", "u": "unsigned integer", "c": "complex", "b": "boolean"}.get(typestr[1:2], typestr)
        raise TypeError(f"{name} has unsupported dtype {np.dtype(typestr).name if typestr[1] in 'iucbf' else typestr} "
                        f"({kind}); matmul takes {', '.join(SUPPORTED_DTYPES)}")
    dtype = _TYPESTR[typestr]
    shape = tuple(interface["shape"])
    strides = interface.get("strides")
    if strides is None:  # C-contiguous
        strides, step = [], _ITEMSIZE[dtype]
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= max(extent, 1)
    return ArrayInfo(name, shape, tuple(strides), dtype, int(interface["data"][0]), None)


def validate(a: ArrayInfo, b: ArrayInfo, out: ArrayInfo | None, alpha: float, beta: float,
             compute: str | None) -> tuple[tuple, str]:
    """Checks every operand; returns (output shape, compute mode). Raises TypeError/ValueError
    that name the problem."""
    for x in (a, b):
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{x.name} has unsupported dtype {x.dtype}; matmul takes {', '.join(SUPPORTED_DTYPES)}")
        if len(x.shape) not in (2, 3):
            raise ValueError(f"matmul takes 2-D matrices or 3-D batches of them; {x.name} is {len(x.shape)}-D "
                             f"with shape {x.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} and b is {b.dtype}: give both operands the same dtype")
    if a.device is not None and b.device is not None and a.device != b.device:
        raise ValueError(f"a is on GPU {a.device} and b on GPU {b.device}: put both on the same device")
    m, k = a.shape[-2:]
    k_b, n = b.shape[-2:]
    if k != k_b:
        raise ValueError(f"inner dimensions differ: a is {a.shape} ({m}x{k}), b is {b.shape} ({k_b}x{n})")
    batch_a = a.shape[0] if len(a.shape) == 3 else None
    batch_b = b.shape[0] if len(b.shape) == 3 else None
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        raise ValueError(f"batch sizes differ: a has {batch_a}, b has {batch_b} (a 2-D operand is broadcast)")
    batch = batch_a if batch_a is not None else batch_b
    shape = (m, n) if batch is None else (batch, m, n)
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError(f"alpha and beta must be finite, got alpha={alpha}, beta={beta}")
    if beta != 0 and out is None:
        raise ValueError("beta != 0 needs out= (C = alpha*a@b + beta*out)")
    if out is not None:
        if tuple(out.shape) != shape:
            raise ValueError(f"out has shape {out.shape}, expected {shape}")
        if out.dtype != a.dtype:
            raise TypeError(f"out has dtype {out.dtype}, expected {a.dtype}")
        if out.device is not None and a.device is not None and out.device != a.device:
            raise ValueError(f"out is on GPU {out.device} and the operands on GPU {a.device}")
        out_low, out_high = out.byte_range()
        for x in (a, b):
            low, high = x.byte_range()
            if out_low < high and low < out_high:
                raise ValueError(f"out overlaps {x.name} in memory; give an output buffer of its own")
    allowed = COMPUTE_MODES[a.dtype]
    compute = compute or allowed[0]
    if compute not in allowed:
        raise ValueError(f"compute={compute!r} is not available for {a.dtype}; choose from {', '.join(allowed)}")
    return shape, compute


def operand_layout(x: ArrayInfo) -> tuple[bool, int, int] | None:
    """(stored transposed, leading dimension, batch stride) in elements, or None when the operand
    needs a contiguous copy. Row-major rows map to layout n, column-major (a transposed view, as
    `x.T` gives) to layout t; batches may have any non-negative stride (0: broadcast)."""
    item = x.itemsize
    if any(s % item for s in x.strides):
        return None
    rows, cols = x.shape[-2:]
    s_row, s_col = x.strides[-2] // item, x.strides[-1] // item
    batch_stride = 0
    if len(x.shape) == 3 and x.shape[0] > 1:
        batch_stride = x.strides[0] // item
        if batch_stride < 0:
            return None
    if (cols == 1 or s_col == 1) and (rows == 1 or s_row >= cols):
        return False, (s_row if rows > 1 else max(cols, 1)), batch_stride
    if (rows == 1 or s_row == 1) and (cols == 1 or s_col >= rows):
        return True, (s_col if cols > 1 else max(rows, 1)), batch_stride
    return None


# ---- selection (pure) -----------------------------------------------------------------------------
@dataclass
class Choice:
    source: str  # "cache", "shipped cache", "nearest", "default", "cupy", "autotune"
    config: SimtConfig | None
    reason: str
    record: object | None = None  # the cache record the choice came from
    details: dict = field(default_factory=dict)


# Built-in configurations by problem size, tried in order until one passes check(): a big-tile
# kernel for large outputs, smaller tiles for small ones, split-K when K dwarfs the output.
DEFAULT_CONFIGS = (
    # stream-K: 0.989x cuBLAS at 4096^3 on an H100 where the same tiles in a plain grid made 0.968x
    ("large", SimtConfig(128, 256, 16, 64, 64, 8, 16, 4, 4, 3, "pad", 8, 1, 1, "registers", stream_k=True)),
    ("large", SimtConfig(128, 256, 16, 64, 64, 8, 16, 4, 4, 3, "pad", 8, 1, 1, "registers")),
    ("large", SimtConfig(32, 256, 16, 16, 256, 8, 16, 4, 4, 3, "pad", 16, 1, 3)),
    ("large", SimtConfig(64, 128, 16, 32, 64, 8, 8, 4, 4, 3, "swizzle", 8, 1, 1)),
    ("medium", SimtConfig(64, 64, 16, 32, 32, 4, 8, 4, 4, 3, "pad", 8, 1, 2)),
    ("small", SimtConfig(32, 32, 16, 16, 32, 2, 8, 4, 2, 3, "pad", 8, 1, 4)),
    ("small", SimtConfig(16, 32, 8, 16, 16, 2, 4, 1, 2, 2, "plain", 1, 1, 4)),
)


def size_class(problem: Problem) -> str:
    outputs = problem.m * problem.n * problem.batch
    if outputs >= 2048 * 2048:
        return "large"
    if outputs >= 256 * 256:
        return "medium"
    return "small"


# Tensor-core defaults per (dtype, compute): (size class, config) pairs, largest first. The mma.sync
# ones were the fastest found by hand at 4096^3 on an H100 (NOTES.md); the WMMA ones stay as the
# fallback where mma.sync cannot run (FP64 before sm_90) and for small problems.
# Hopper's wgmma first (the first for NN, the second for NT/TT), then mma.sync (other devices, TN)
_SIXTEEN_BIT_DEFAULTS = (("large", "wmma_256x128x64_w256x64_v8_s4_pad_g8_k1_o1_wgmma"),
                         ("large", "wmma_128x256x64_w64x256_v8_s4_pad_g8_k1_o1_wgmma"),
                         ("large", "wmma_128x256x64_w64x64_v8_s3_pad_g8_k1_o1_mma"),
                         ("large", "wmma_128x128x32_w64x64_v8_s3_pad_g8_k1_o1"),
                         ("medium", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1_mma"),
                         ("medium", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1"),
                         ("small", "wmma_32x32x16_w16x32_v8_s2_pad_g8_k1_o1"))
DEFAULT_WMMA_CONFIGS = {
    ("float16", "fp32"): _SIXTEEN_BIT_DEFAULTS,
    ("bfloat16", "fp32"): _SIXTEEN_BIT_DEFAULTS,
    # Hopper's wgmma first (the first for NN, the second for NT/TT: its register fit rejects the
    # other's layout); elsewhere, and for TN, mma.sync
    ("float32", "tf32"): (("large", "wmma_256x128x32_w256x64_v4_s4_pad32_g8_k1_o1_wgmma"),
                          ("large", "wmma_128x256x32_w64x256_v4_s4_pad32_g8_k1_o1_wgmma"),
                          ("large", "wmma_128x256x32_w64x64_v4_s3_pad32_g8_k1_o1_mma"),
                          ("large", "wmma_128x128x16_w32x64_v4_s4_pad_g8_k1_o1"),
                          ("medium", "wmma_64x64x16_w32x32_v4_s3_pad32_g8_k1_o1_mma"),
                          ("medium", "wmma_64x64x16_w32x32_v4_s3_pad_g8_k1_o1"),
                          ("small", "wmma_32x32x8_w16x32_v4_s2_pad_g8_k1_o1")),
    ("float64", "fp64"): (("large", "wmma_64x128x16_w32x32_v2_s4_pad32_g8_k1_o1_mma"),
                          ("large", "wmma_64x64x8_w32x32_v2_s4_pad_g8_k1_o1"),
                          ("medium", "wmma_32x32x8_w16x16_v2_s3_pad32_g8_k1_o1_mma"),
                          ("medium", "wmma_32x32x4_w16x16_v1_s3_pad_g8_k1_o1"),
                          ("small", "wmma_16x16x4_w8x16_v1_s2_pad_g8_k1_o1")),
}


def default_config(problem: Problem, device):
    """The built-in config for a problem nothing was tuned for: those of its size class first, then
    the others (largest first), the first that can run it; None when none can."""
    wanted = size_class(problem)
    wmma = DEFAULT_WMMA_CONFIGS.get((problem.dtype, problem.compute))
    if wmma is not None:
        ranked = [(cls, WmmaConfig.from_name(name)) for cls, name in wmma]
    else:
        ranked = list(DEFAULT_CONFIGS)
    order = [c for cls, c in ranked if cls == wanted] + [c for cls, c in ranked if cls != wanted]
    for config in order:
        if problem.k >= 8 * max(problem.m, problem.n) and wanted != "large":
            # a long K and a small output leave most SMs idle: split K across blocks
            splits = min(8, config.tiles_k(problem))
            split_config = config.replace(split_k=max(1, 2 ** int(math.log2(max(splits, 1)))))
            if not split_config.check(problem, device):
                return split_config
        if not config.check(problem, device):
            return config
    return None


def log_distance(p: Problem, q: Problem) -> float:
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in ((p.m, q.m), (p.n, q.n), (p.k, q.k), (p.batch, q.batch))))


def choose(problem: Problem, device, exact, records) -> Choice:
    """Pure selection over cache contents: `exact` is (record, source) of this problem or None;
    `records` are the device's current records (for the nearest shape)."""
    if (problem.dtype, problem.compute) not in TEMPLATE_DTYPES:
        return Choice("cupy", None, f"no template for {problem.dtype}/{problem.compute} yet: cupy.matmul")
    if exact is not None:
        record, source = exact
        config = record.config_object
        if not config.check(problem, device):
            where = "shipped cache" if source == "shipped" else "cache"
            return Choice(where, config, f"tuned for this problem ({record.ratio:.3f}x cuBLAS on {record.date[:10]})",
                          record)
    same_kind = [r for r in records
                 if (r.problem_object.dtype, r.problem_object.compute, r.problem_object.layout)
                 == (problem.dtype, problem.compute, problem.layout)]
    for record in sorted(same_kind, key=lambda r: log_distance(problem, r.problem_object)):
        config = record.config_object
        if config.check(problem, device) and config.split_k > 1:
            config = config.replace(split_k=max(1, min(config.split_k, config.tiles_k(problem))))
        if not config.check(problem, device):
            return Choice("nearest", config, f"tuned for the nearest shape {record.problem} "
                          f"(log-distance {log_distance(problem, record.problem_object):.2f})", record)
    config = default_config(problem, device)
    if config is not None:
        return Choice("default", config, f"built-in {size_class(problem)}-problem configuration (nothing tuned nearby)")
    return Choice("cupy", None, "no configuration of the template can run this problem: cupy.matmul")


# ---- plans and launches ---------------------------------------------------------------------------
class Dispatcher:
    """Per-process state of `matmul`: the plan memo (thread-safe) and the cache."""

    def __init__(self, cache=None):
        self.plans: dict = {}  # full key (shapes, strides, dtype, compute, alignments, device, out) -> plan
        self.fast: dict = {}  # key of the fast path (CuPy operands, no out, alpha only) -> plan
        self.lock = threading.Lock()
        self._cache = cache

    @property
    def cache(self):
        """The cache given at construction, else the user's (its directory read on each use, so
        that $AUTOGEMM_CACHE_DIR set after import is honoured)."""
        if self._cache is not None:
            return self._cache
        from .cache import TuningCache

        return TuningCache()

    def clear(self) -> None:
        """Forgets every plan (after tuning, say, so that the next call looks at the cache again)."""
        with self.lock:
            self.plans.clear()
            self.fast.clear()

    # -- selection with side effects (cache reads, autotuning) --
    def select(self, problem: Problem, device, tune: bool) -> Choice:
        slug = device.slug
        exact = self.cache.lookup(problem, slug)
        if exact is None and tune and (problem.dtype, problem.compute) in TEMPLATE_DTYPES:
            from .tuner import tune as run_tune

            result = run_tune(problem, trials=AUTOTUNE_TRIALS, timeout=AUTOTUNE_TIMEOUT_S, cache=self.cache)
            exact = self.cache.lookup(problem, slug)
            if exact is not None:
                choice = choose(problem, device, exact, [])
                choice.source, choice.reason = "autotune", f"tuned now ({result.valid} trials, {result.ratio:.3f}x cuBLAS)"
                return choice
        records = [r for _, r in self.cache.records(slug) if not r.stale]
        return choose(problem, device, exact, records)


_DISPATCHER = Dispatcher()


def reset() -> None:
    """Forgets the kernels chosen so far in this process, so that the next calls consult the cache
    again (after `autogemm tune` added entries, say)."""
    _DISPATCHER.clear()


def _device_of(info: ArrayInfo) -> int:
    if info.device is not None:
        return info.device
    import cupy

    return cupy.cuda.runtime.pointerGetAttributes(info.pointer).device


def _as_cupy(x):
    import cupy

    if isinstance(x, cupy.ndarray):
        return x
    return cupy.asarray(x)  # zero-copy view of a __cuda_array_interface__ object


def _fast_key(a, b, data_a, data_b) -> tuple:
    """What a repeated call on CuPy arrays must share with the call that made its plan: shapes,
    strides, dtypes, 16-byte alignment and devices (`data_*`: the arrays' `.data`, read once)."""
    return (a.shape, a.strides, b.shape, b.strides, a.dtype, b.dtype, data_a.ptr % 16, data_b.ptr % 16,
            data_a.device_id, data_b.device_id)


def matmul(a, b, *, out=None, alpha: float = 1.0, beta: float = 0.0, compute: str | None = None,
           tune: bool | None = None):
    """C = alpha · a @ b (+ beta · out): the cached best kernel for this problem and GPU.

    `a` (M×K) and `b` (K×N) are CuPy arrays or objects with __cuda_array_interface__ (PyTorch CUDA
    tensors, Numba arrays), 2-D or 3-D batches (a 2-D operand is broadcast over the batch).
    Transposed views run as the TN/NT/TT kernels without copies; other strides are copied once.
    `compute="tf32"` opts float32 into TF32 (the tensor-core template).
    Nothing is tuned unless `tune=True` or AUTOGEMM_TUNE=1 (then a problem without a cached entry
    is tuned once, with a small budget, and cached). Returns a CuPy array (`out` when given).
    """
    import cupy

    # Fast path: a repeated call on CuPy arrays with a known plan skips validation (it passed for
    # exactly these shapes, strides, dtypes, devices and alignments).
    if out is None and beta == 0 and compute is None and tune is None and type(a) is cupy.ndarray \
            and type(b) is cupy.ndarray:
        data_a, data_b = a.data, b.data
        plan = _DISPATCHER.fast.get(_fast_key(a, b, data_a, data_b))
        if plan is not None and math.isfinite(alpha):
            return plan.call_fast(a, b, data_a.ptr, data_b.ptr, alpha)

    ia, ib = array_info(a, "a"), array_info(b, "b")
    io = array_info(out, "out") if out is not None else None
    alpha, beta = float(alpha), float(beta)
    shape, compute = validate(ia, ib, io, alpha, beta, compute)
    device_a = _device_of(ia)
    device_b = _device_of(ib)
    if device_a != device_b:
        raise ValueError(f"a is on GPU {device_a} and b on GPU {device_b}: put both on the same device")
    if io is not None and _device_of(io) != device_a:
        raise ValueError(f"out is on GPU {_device_of(io)} and the operands on GPU {device_a}")
    if tune is None:
        tune = os.environ.get("AUTOGEMM_TUNE", "") not in ("", "0")

    with cupy.cuda.Device(device_a):
        out_arr = _as_cupy(out) if out is not None else cupy.empty(shape, dtype=_cupy_dtype(ia.dtype))
        m, n = shape[-2:]
        k = ia.shape[-1]
        if out_arr.size == 0:
            return out_arr
        if k == 0:  # no products: beta * out, or zeros (beta == 0 never reads out)
            if beta == 0:
                out_arr.fill(0)
            else:
                out_arr *= beta
            return out_arr
        key = (ia.shape, ia.strides, ib.shape, ib.strides, ia.dtype, compute, ia.pointer % 16, ib.pointer % 16,
               device_a, out_arr.strides, out_arr.data.ptr % 16, bool(tune))
        plan = _DISPATCHER.plans.get(key)
        if plan is None:
            plan = _make_plan(a, ia, b, ib, out_arr, shape, compute, device_a, tune)
            with _DISPATCHER.lock:
                _DISPATCHER.plans[key] = plan
                if out is None and compute == "fp32" and ia.dtype == "float32" and type(a) is cupy.ndarray \
                        and type(b) is cupy.ndarray:
                    _DISPATCHER.fast[_fast_key(a, b, a.data, b.data)] = plan
        return plan.call(a, b, out_arr, alpha, beta)


def _cupy_dtype(name: str):
    import cupy

    if name == "bfloat16":
        try:
            import ml_dtypes  # CuPy's bfloat16 is ml_dtypes'
        except ImportError:
            raise TypeError("bfloat16 arrays need the ml_dtypes package") from None
        return cupy.dtype(ml_dtypes.bfloat16)
    return cupy.dtype(name)


@dataclass
class _Plan:
    """Everything a call needs but the pointers: the choice, the problem, and a launcher."""

    choice: Choice
    problem: Problem
    shape: tuple
    dtype: object
    device: int
    launch: object = None  # launch(pa, pb, pc, alpha, beta, stream); None: cupy.matmul
    copy_a: bool = False
    copy_b: bool = False

    def call_fast(self, a, b, pointer_a: int, pointer_b: int, alpha: float):
        """A repeated call on CuPy operands with a fresh output (matmul's fast path): when the
        kernel needs no copies and the operands' device is current, no device switch either."""
        import cupy

        if self.launch is None or self.copy_a or self.copy_b or cupy.cuda.runtime.getDevice() != self.device:
            return self.call(a, b, None, alpha, 0.0)
        out_arr = cupy.empty(self.shape, dtype=self.dtype)
        self.launch(pointer_a, pointer_b, out_arr.data.ptr, alpha, 0.0, cupy.cuda.get_current_stream())
        return out_arr

    def call(self, a, b, out_arr, alpha: float, beta: float):
        import cupy

        with cupy.cuda.Device(self.device):
            if out_arr is None:
                out_arr = cupy.empty(self.shape, dtype=self.dtype)
            a_arr, b_arr = _as_cupy(a), _as_cupy(b)
            if self.launch is None:
                product = cupy.matmul(a_arr, b_arr)
                if beta == 0:
                    out_arr[...] = product if alpha == 1 else alpha * product
                else:
                    out_arr[...] = alpha * product + beta * out_arr
                return out_arr
            if self.copy_a:
                a_arr = cupy.ascontiguousarray(a_arr)
            if self.copy_b:
                b_arr = cupy.ascontiguousarray(b_arr)
            self.launch(a_arr.data.ptr, b_arr.data.ptr, out_arr.data.ptr, alpha, beta,
                        cupy.cuda.get_current_stream())
            return out_arr


def _make_plan(a, ia, b, ib, out_arr, shape, compute, device_id, tune) -> _Plan:
    import cupy

    from .launch import Operand, device_info, launcher, prepare, vector_widths

    device = device_info(device_id)
    layout_a, layout_b = operand_layout(ia), operand_layout(ib)
    copy_a, copy_b = layout_a is None, layout_b is None
    a_arr = cupy.ascontiguousarray(_as_cupy(a)) if copy_a else _as_cupy(a)
    b_arr = cupy.ascontiguousarray(_as_cupy(b)) if copy_b else _as_cupy(b)
    trans_a, lda, stride_a = layout_a or operand_layout(array_info(a_arr, "a"))
    trans_b, ldb, stride_b = layout_b or operand_layout(array_info(b_arr, "b"))
    m, n = shape[-2:]
    k = ia.shape[-1]
    batch = shape[0] if len(shape) == 3 else 1
    problem = Problem(m, n, k, batch=batch, dtype=ia.dtype, compute=compute, trans_a=trans_a, trans_b=trans_b)
    choice = _DISPATCHER.select(problem, device, tune)
    plan = _Plan(choice, problem, shape, out_arr.dtype, device_id, copy_a=copy_a, copy_b=copy_b)
    if choice.config is None:
        return plan
    config = choice.config
    item = out_arr.itemsize
    ldc = out_arr.strides[-2] // item if m > 1 else n
    stride_c = out_arr.strides[0] // item if len(shape) == 3 and shape[0] > 1 else 0
    widths = vector_widths(
        config,
        Operand(*a_arr.shape[-2:], lda, 1, stride_a, a_arr.data.ptr),
        Operand(*b_arr.shape[-2:], ldb, 1, stride_b, b_arr.data.ptr),
        Operand(m, n, ldc, 1, stride_c, out_arr.data.ptr),
        item,
    )
    prepared = prepare(config, problem, widths, device)
    choice.details.update(kernel=prepared.kernel.source.kernel, registers=prepared.kernel.registers)
    plan.launch = launcher(prepared, lda, ldb, ldc, stride_a, stride_b, stride_c)
    return plan


def explain(a, b, *, out=None, compute: str | None = None, tune: bool | None = None) -> dict:
    """Which kernel `matmul(a, b, ...)` would run, and why: the source of the choice, the config
    and the figures cached with it. Runs nothing (but may compile the chosen kernel)."""
    ia, ib = array_info(a, "a"), array_info(b, "b")
    io = array_info(out, "out") if out is not None else None
    shape, compute = validate(ia, ib, io, 1.0, 0.0, compute)
    from .launch import device_info

    device = device_info(_device_of(ia))
    layout_a, layout_b = operand_layout(ia), operand_layout(ib)
    trans_a = layout_a[0] if layout_a else False
    trans_b = layout_b[0] if layout_b else False
    m, n = shape[-2:]
    problem = Problem(max(m, 1), max(n, 1), max(ia.shape[-1], 1), batch=shape[0] if len(shape) == 3 else 1,
                      dtype=ia.dtype, compute=compute, trans_a=trans_a, trans_b=trans_b)
    choice = _DISPATCHER.select(problem, device, bool(tune))
    record = choice.record
    return {
        "problem": problem.key,
        "device": device.name,
        "source": choice.source,
        "config": choice.config.name if choice.config else None,
        "reason": choice.reason,
        "copies": [x.name for x, lay in ((ia, layout_a), (ib, layout_b)) if lay is None],
        "cached": None if record is None else {
            "problem": record.problem, "tflops": record.tflops, "cublas_tflops": record.cublas_tflops,
            "ratio": record.ratio, "date": record.date, "rel_error": record.rel_error,
        },
    }
