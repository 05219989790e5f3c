"""Runs a configuration on CuPy operands: derives the problem and strides from the arrays, picks the
vector widths their alignment allows, compiles (once) and launches with the grid of the config."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from .compile import CompiledKernel, CompileError, compile_source
from .config import SimtConfig, VectorWidths, WmmaConfig, widest_vector, wmma_type
from .problem import COMPUTE_MODES, Device, Problem
from .render import render

# How each dtype is held in CuPy arrays. CuPy has no bfloat16: bfloat16 operands are uint16 arrays
# of the raw bits (`bench.to_bfloat16` makes them; PyTorch bfloat16 tensors view as such).
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "float64": np.float64}
_STORED = {np.dtype(v): k for k, v in STORAGE.items()}


def dtype_of(array, name: str) -> str:
    """The GEMM dtype of a CuPy array (uint16 holds bfloat16 bits)."""
    dtype = _STORED.get(np.dtype(array.dtype))
    if dtype is None:
        raise TypeError(f"{name} has dtype {array.dtype}; supported: float32, float16, float64 "
                        "and bfloat16 (as uint16 bits)")
    return dtype


def compute_mode(config, dtype: str) -> str:
    """The compute mode a config family implies for a dtype (WMMA on float32 means TF32)."""
    if config.family == "wmma" and dtype == "float32":
        return "tf32"
    return COMPUTE_MODES[dtype][0]

_REDUCE_THREADS = 256


@functools.lru_cache(maxsize=None)
def device_info(ordinal: int) -> Device:
    return Device.current(ordinal)


def current_device() -> Device:
    import cupy

    return device_info(cupy.cuda.Device().id)


@dataclass(frozen=True)
class Operand:
    """A matrix operand as the kernel sees it: rows of unit stride, a row pitch and a batch stride."""

    rows: int
    cols: int
    ld: int  # elements between consecutive rows
    batch: int  # 1 for a 2-D operand (broadcast over the batch with stride 0)
    batch_stride: int  # elements between consecutive matrices
    pointer: int

    @classmethod
    def of(cls, array, name: str) -> Operand:
        if array.ndim not in (2, 3):
            raise ValueError(f"{name} must be 2-D or 3-D (batched), got {array.ndim}-D of shape {array.shape}")
        item = array.itemsize
        strides = [s // item for s in array.strides]
        if any(s * item != t for s, t in zip(strides, array.strides)):
            raise ValueError(f"{name} has strides {array.strides} that are not multiples of its element size")
        rows, cols = array.shape[-2:]
        if cols > 1 and strides[-1] != 1:
            raise ValueError(f"{name} must have unit stride along its last axis, has strides {array.strides}")
        ld = strides[-2] if rows > 1 else max(cols, 1)
        if rows > 1 and ld < cols:
            raise ValueError(f"{name} rows overlap: row stride {ld} < row length {cols}")
        batch = array.shape[0] if array.ndim == 3 else 1
        batch_stride = (strides[0] if batch > 1 else rows * ld) if array.ndim == 3 else 0
        return cls(rows, cols, ld, batch, batch_stride, array.data.ptr)

    def vector_width(self, limit: int, itemsize: int = 4) -> int:
        """Widest access the operand's pointer, row pitch and batch stride all stay aligned to."""
        if self.pointer % itemsize:
            return 1
        return widest_vector(limit, self.ld, self.batch_stride, self.pointer // itemsize)


def vector_widths(config, a: Operand, b: Operand, c: Operand, itemsize: int = 4) -> VectorWidths:
    """The widest accesses, up to the config's `vec`, that the operands' alignment allows. Split-K
    writes its partial products to an aligned workspace (the reduction is scalar), so C then gets
    the config's width whatever its alignment. WMMA kernels write C element by element."""
    if config.family == "wmma":
        return VectorWidths(a=a.vector_width(config.vec, itemsize), b=b.vector_width(config.vec, itemsize), c=1)
    return VectorWidths(
        a=a.vector_width(config.vec),
        b=b.vector_width(config.vec),
        c=config.vec if config.split_k > 1 else c.vector_width(config.vec),
    )


@dataclass
class PreparedGemm:
    """A kernel compiled for one problem class, with its launch geometry."""

    config: SimtConfig | WmmaConfig
    problem: Problem
    kernel: CompiledKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    tiles_per_split: int


def prepare(config, problem: Problem, widths: VectorWidths | None = None,
            device: Device | None = None) -> PreparedGemm:
    device = device or current_device()
    reasons = config.check(problem, device)
    if reasons:
        raise ValueError(f"config {config.name} cannot run {problem}: " + "; ".join(reasons))
    source = render(config, problem, widths)
    smem = config.smem_bytes(problem)
    kernel = compile_source(source, device.arch, smem)
    if getattr(config, "max_registers", 0) and kernel.local_bytes:
        # an explicit register cap is allowed somewhat under the estimate; where ptxas had to spill
        # under it, the kernel is not worth running
        raise CompileError(f"{source.kernel}: spills to local memory ({kernel.local_bytes} bytes per thread) "
                           f"under max_registers={config.max_registers}", "", None)
    tiles_k = config.tiles_k(problem)
    tiles = -(-problem.m // config.bm) * -(-problem.n // config.bn)
    grid = (tiles, problem.batch * config.split_k, 1)
    if getattr(config, "stream_k", False):
        grid = (stream_k_blocks(kernel, config.threads, smem, device), 1, 1)
    return PreparedGemm(
        config=config,
        problem=problem,
        kernel=kernel,
        grid=grid,
        block=(config.threads, 1, 1),
        smem=smem,
        tiles_per_split=-(-tiles_k // config.split_k),
    )


def stream_k_blocks(kernel: CompiledKernel, threads: int, smem: int, device: Device) -> int:
    """Blocks of a stream-K grid: as many as the device holds at once (more would wait for a
    second wave; the kernel deals the work out over whatever the grid is)."""
    from cupy_backends.cuda.api import driver

    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.gemm.kernel.ptr, threads, smem)
    return max(1, per_sm * device.sm_count)


def gemm(config, a, b, c=None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, stream=None):
    """C = alpha * op(A) @ op(B) + beta * C with the kernel of `config`; returns C.

    `a` is stored M×K (or K×M with trans_a), `b` K×N (or N×K with trans_b), each 2-D or 3-D
    (a 2-D operand is shared by every matrix of the batch), rows of unit stride. C is M×N
    row-major and is allocated when not given (then beta is ignored).
    """
    run, c = bind(config, a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    run(stream)
    return c


def bind(config, a, b, c=None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0):
    """Validates the operands, compiles the kernel and returns (run, c): `run(stream=None)`
    launches it with every argument prepared, for repeated calls (timing, tuning)."""
    import cupy

    dtype = dtype_of(a, "A")
    if dtype_of(b, "B") != dtype:
        raise TypeError(f"A and B differ in dtype: {a.dtype} and {b.dtype}")
    compute = compute_mode(config, dtype)
    if config.family == "wmma" and wmma_type(Problem(1, 1, 1, dtype=dtype, compute=compute)) is None:
        raise TypeError(f"the WMMA family has no kernel for {dtype}")
    if config.family == "simt" and dtype != "float32":
        raise TypeError(f"A has dtype {a.dtype}; the SIMT family computes float32")
    opa, opb = Operand.of(a, "A"), Operand.of(b, "B")
    m, k = (opa.cols, opa.rows) if trans_a else (opa.rows, opa.cols)
    k_b, n = (opb.cols, opb.rows) if trans_b else (opb.rows, opb.cols)
    if k != k_b:
        raise ValueError(f"inner dimensions differ: op(A) is {m}x{k}, op(B) is {k_b}x{n}")
    batch = max(opa.batch, opb.batch)
    if opa.batch not in (1, batch) or opb.batch not in (1, batch):
        raise ValueError(f"batch sizes differ: A has {opa.batch}, B has {opb.batch}")
    if c is None:
        c = cupy.empty((batch, m, n) if a.ndim == 3 or b.ndim == 3 else (m, n), dtype=a.dtype)
        beta = 0.0
    if c.dtype != a.dtype:
        raise TypeError(f"C has dtype {c.dtype}; expected {a.dtype}")
    opc = Operand.of(c, "C")
    if (opc.rows, opc.cols) != (m, n) or opc.batch != batch:
        raise ValueError(f"C has shape {c.shape}, expected {(batch, m, n) if batch > 1 else (m, n)}")
    if m == 0 or n == 0:
        return (lambda stream=None: None), c
    if k == 0:  # no products: C = beta * C, and beta == 0 must not propagate what C held
        def scale(stream=None):
            with stream if stream is not None else contextlib.nullcontext():
                if beta == 0:
                    c.fill(0)
                else:
                    c[...] *= beta
        return scale, c

    problem = Problem(m, n, k, batch=batch, dtype=dtype, compute=compute, trans_a=trans_a, trans_b=trans_b)
    prepared = prepare(config, problem, vector_widths(config, opa, opb, opc, a.itemsize))
    launch = launcher(prepared, opa.ld, opb.ld, opc.ld, opa.batch_stride, opb.batch_stride, opc.batch_stride)

    def run(stream=None):
        launch(opa.pointer, opb.pointer, opc.pointer, alpha, beta, stream)

    return run, c


def launcher(prepared: PreparedGemm, lda: int, ldb: int, ldc: int, stride_a: int, stride_b: int, stride_c: int):
    """`launch(pa, pb, pc, alpha, beta, stream)` for operands of these pitches and batch strides
    (elements): every argument but the pointers and scalars is built once, here."""
    import cupy

    problem, config = prepared.problem, prepared.config
    i32, i64 = np.int32, np.int64
    # alpha and beta in the accumulator's type; split-K partials too
    f32 = np.float64 if problem.dtype == "float64" else np.float32
    function = prepared.kernel.gemm.kernel  # the loaded CUDA function: CuPy's leanest launch
    grid, block, smem = prepared.grid, prepared.block, prepared.smem
    m, n, batch = problem.m, problem.n, problem.batch
    tiles = i32(prepared.tiles_per_split)
    if config.split_k == 1:
        head = (i32(m), i32(n), i32(problem.k), i32(lda), i32(ldb), i32(ldc),
                i64(stride_a), i64(stride_b), i64(stride_c))
        if getattr(config, "stream_k", False):
            return _stream_k_launcher(prepared, head)

        def launch(pa, pb, pc, alpha, beta, stream=None):
            function(grid, block, (np.uintp(pa), np.uintp(pb), np.uintp(pc), *head, f32(alpha), f32(beta), tiles),
                     shared_mem=smem, stream=stream)

        return launch

    ldw = -(-n // 4) * 4  # 16-byte aligned rows, so the partials are stored as vectors
    stride_w = m * ldw
    head = (i32(m), i32(n), i32(problem.k), i32(lda), i32(ldb), i32(ldw), i64(stride_a), i64(stride_b), i64(stride_w))
    tail = (i32(m), i32(n), i32(ldw), i64(stride_w), i32(ldc), i64(stride_c), i32(batch))
    reduce = prepared.kernel.reduce
    reduce_grid = (min(-(-(batch * m * n) // _REDUCE_THREADS), 65535), 1, 1)

    def launch_split(pa, pb, pc, alpha, beta, stream=None):
        # The workspace comes from CuPy's pool per call, ordered on the launch stream.
        with stream if stream is not None else contextlib.nullcontext():
            workspace = cupy.empty((batch * config.split_k, m, ldw), dtype=f32)
        function(grid, block, (np.uintp(pa), np.uintp(pb), workspace, *head, f32(1.0), f32(0.0), tiles),
                 shared_mem=smem, stream=stream)
        reduce(reduce_grid, (_REDUCE_THREADS, 1, 1), (workspace, np.uintp(pc), *tail, f32(alpha), f32(beta)),
               stream=stream)

    return launch_split


def _stream_k_launcher(prepared: PreparedGemm, head: tuple):
    """The stream-K kernel takes the plain kernel's arguments (`head`: sizes, pitches, strides) and
    a workspace: two BM x BN partial-sum slots per block and a counter per tile, which must be
    zero at launch (the kernel leaves them zero again). Both come from CuPy's pool per call,
    ordered on the launch stream, so concurrent calls never share one."""
    import cupy

    problem, config = prepared.problem, prepared.config
    function = prepared.kernel.gemm.kernel
    grid, block, smem = prepared.grid, prepared.block, prepared.smem
    tiles = -(-problem.m // config.bm) * -(-problem.n // config.bn) * problem.batch
    partial_floats = 2 * grid[0] * config.bm * config.bn
    batch = np.int32(problem.batch)

    def launch_stream_k(pa, pb, pc, alpha, beta, stream=None):
        with stream if stream is not None else contextlib.nullcontext():
            partials = cupy.empty(partial_floats, dtype=np.float32)
            counters = cupy.zeros(tiles, dtype=np.int32)
        function(grid, block, (np.uintp(pa), np.uintp(pb), np.uintp(pc), *head, np.float32(alpha), np.float32(beta),
                               np.int32(0), batch, partials, counters),
                 shared_mem=smem, stream=stream)

    return launch_stream_k
