"""What is being multiplied (`Problem`) and on what (`Device`), with the cache keys of both.

A problem is `C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]` for `b < batch`, where C is M×N
row-major, op(A) is M×K and op(B) is K×N. The layout says how A and B are stored (row-major
always): `n` means as-is (A is M×K, B is K×N), `t` means transposed (A is K×M, B is N×K).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import dtypes
from .epilogue import Epilogue
from .routing import ROUTINGS

LAYOUTS = ("nn", "nt", "tn", "tt")


@dataclass(frozen=True)
class Problem:
    """One GEMM as autogemm tunes and serves it: C = op(A) · op(B) of M x K by K x N (times `batch`, or
    `batch` groups of a grouped product), its dtype and compute mode, the layout (`trans_a`, `trans_b`)
    and the epilogue. `key` names it in the cache (float32/fp32/nn/b1/4096x4096x4096); `from_key` and
    `from_layout` make one."""

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "float32"
    compute: str = ""  # empty: the dtype's default compute mode
    trans_a: bool = False
    trans_b: bool = False
    epilogue: Epilogue = Epilogue()  # what is done to the accumulators before the store (epilogue.py)
    # a grouped product (mixture of experts): `batch` groups of rows of A (M rows in all, split by offsets
    # the kernel reads on the GPU), each times its own matrix of B, into its rows of one C
    grouped: bool = False
    # a grouped product's routing bucket (routing.ROUTINGS: how its rows fall to the groups, which the
    # kernel's speed depends on); "uniform" where not given; empty for every other product
    routing: str = ""

    def __post_init__(self) -> None:
        for dim in ("m", "n", "k", "batch"):
            value = getattr(self, dim)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Problem.{dim} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"Problem.{dim} must be >= 1, got {value}")
        object.__setattr__(self, "compute", dtypes.lookup(self.dtype, self.compute).compute)
        if self.grouped and not self.routing:
            object.__setattr__(self, "routing", ROUTINGS[0])
        if self.grouped and self.routing not in ROUTINGS:
            raise ValueError(f"a grouped product's routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if self.routing and not self.grouped:
            raise ValueError(f"only grouped products have a routing; got routing={self.routing!r} without groups")
        if not isinstance(self.epilogue, Epilogue):
            raise TypeError(f"Problem.epilogue must be an Epilogue, got {self.epilogue!r}")
        row = dtypes.lookup(self.dtype, self.compute)
        if row.scaled and not self.epilogue.scale:
            raise ValueError(f"{self.dtype} products are scaled: the epilogue must name a scaling (scale_tensor or "
                             f"scale_row) and an output dtype ({', '.join(row.output_dtypes)})")
        if self.epilogue.scale and not row.scaled:
            raise ValueError(f"only FP8 products are scaled; a {self.dtype} problem takes no {self.epilogue.scale} scales")
        if row.output_dtypes:
            self.epilogue.output_dtype(self.dtype)  # (ValueError where D's dtype is missing or not written)

    @classmethod
    def from_layout(cls, m: int, n: int, k: int, layout: str = "nn", **kwargs: Any) -> Problem:
        layout = layout.lower()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
        return cls(m, n, k, trans_a=layout[0] == "t", trans_b=layout[1] == "t", **kwargs)

    @property
    def layout(self) -> str:
        return ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")

    def swapped(self) -> Problem:
        """The same product with the operands' roles swapped: C^T = B^T A^T, N x M. B becomes the first
        operand (its storage read transposed: op(A') = B^T), A the second (op(B') = A^T). A grouped product
        has none: its groups are rows of A (ValueError rather than an ungrouped product)."""
        if self.grouped:
            raise ValueError(f"{self} has no swapped form: its groups are rows of A")
        return Problem(self.n, self.m, self.k, batch=self.batch, dtype=self.dtype, compute=self.compute,
                       trans_a=not self.trans_b, trans_b=not self.trans_a, epilogue=self.epilogue.swapped())

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * (1 if self.grouped else self.batch)

    @property
    def key(self) -> str:
        """Stable cache key, e.g. ``float32/fp32/nn/b1/4096x4096x4096``; an epilogue follows the shape
        (``float16/fp32/nt/b1/16x4096x4096/bias_n+gelu``), the identity one adds nothing."""
        batch = f"g{self.batch}-{self.routing}" if self.grouped else f"b{self.batch}"
        key = f"{self.dtype}/{self.compute}/{self.layout}/{batch}/{self.m}x{self.n}x{self.k}"
        return key if self.epilogue.is_identity else f"{key}/{self.epilogue.key}"

    @classmethod
    def from_key(cls, key: str) -> Problem:
        match = re.fullmatch(r"(\w+)/(\w+)/([nt]{2})/(?:b(\d+)|g(\d+)-([a-z]{1,16}))/(\d+)x(\d+)x(\d+)"
                             r"(?:/([a-z0-9_+>]{1,64}))?", key)
        if not match:
            raise ValueError(f"not a problem key: {key!r} (expected like float32/fp32/nn/b1/64x64x64, or for "
                             "groups .../g8-uniform/...)")
        dtype, compute, layout, batch, groups, routing, m, n, k, epilogue = match.groups()
        problem = cls.from_layout(int(m), int(n), int(k), layout, batch=int(batch or groups), dtype=dtype,
                                  compute=compute, epilogue=Epilogue.from_key(epilogue) if epilogue else Epilogue(),
                                  grouped=groups is not None, routing=routing or "")
        if problem.key != key:  # (leading zeros, full-width digits: one problem, one key, as records file it)
            raise ValueError(f"not a canonical problem key: {key!r} (the canonical key is {problem.key!r})")
        return problem

    def __str__(self) -> str:
        batch = f"{self.batch} groups ({self.routing}) of " if self.grouped else f"{self.batch}×" if self.batch > 1 else ""
        epilogue = "" if self.epilogue.is_identity else f" + {self.epilogue}"
        return f"{batch}{self.m}×{self.n}×{self.k} {self.dtype}/{self.compute} {self.layout.upper()}{epilogue}"


REGISTERS_PER_BLOCK = 65536  # the register file a block may use, on every architecture below

# Architecture limits from the CUDA C++ Programming Guide (compute capability tables). They are used
# only where no GPU can be queried (rendering and `nvcc` checks on a build machine); on a GPU,
# `Device.current()` reads every limit from the device itself.
_ARCH_LIMITS = {
    # cc: (shared memory per block with opt-in, shared memory per SM, registers per block,
    #      threads per block, threads per SM)
    (7, 0): (96 * 1024, 96 * 1024, REGISTERS_PER_BLOCK, 1024, 2048),
    (7, 5): (64 * 1024, 64 * 1024, REGISTERS_PER_BLOCK, 1024, 1024),
    (8, 0): (163 * 1024, 164 * 1024, REGISTERS_PER_BLOCK, 1024, 2048),
    (8, 6): (99 * 1024, 100 * 1024, REGISTERS_PER_BLOCK, 1024, 1536),
    (8, 9): (99 * 1024, 100 * 1024, REGISTERS_PER_BLOCK, 1024, 1536),
    (9, 0): (227 * 1024, 228 * 1024, REGISTERS_PER_BLOCK, 1024, 2048),
}


@dataclass(frozen=True)
class Device:
    """A GPU's limits as the kernel families check a configuration against them (compute capability,
    SMs, shared memory, registers, threads); `Device.current()` reads them off the GPU in use,
    `Device.for_arch("sm_90")` gives an architecture's own where no GPU is queried."""

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block: int = 48 * 1024
    smem_per_block_optin: int = 48 * 1024
    regs_per_block: int = REGISTERS_PER_BLOCK
    max_threads_per_block: int = 1024
    smem_per_sm: int = 64 * 1024
    max_threads_per_sm: int = 2048
    l2_bytes: int = 0
    clock_khz: int = field(default=0, compare=False)  # SM clock, for time-limit estimates
    # device memory's peak bandwidth, bytes/s, from its clock and bus width (0: unknown)
    memory_bandwidth: float = field(default=0.0, compare=False)
    # Which GPU of this machine; not part of the identity (two identical cards share a cache).
    ordinal: int = field(default=0, compare=False)

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def slug(self) -> str:
        """File-name-safe identity of the device model, e.g. ``nvidia-h100-80gb-hbm3-sm90``."""
        base = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return f"{base}-{self.arch.replace('_', '')}"

    @property
    def key(self) -> str:
        return self.slug

    @classmethod
    def for_arch(cls, arch: str = "sm_90") -> Device:
        """A device description for compiling without a GPU (limits of the architecture)."""
        match = re.fullmatch(r"sm_(\d+)(\d)a?", arch)
        if not match:
            raise ValueError(f"not a CUDA architecture: {arch!r} (expected like sm_90)")
        cc = (int(match.group(1)), int(match.group(2)))
        if cc not in _ARCH_LIMITS:
            known = ", ".join(f"sm_{a}{b}" for a, b in _ARCH_LIMITS)
            raise ValueError(f"no architecture limits known for {arch}; known: {known}")
        smem_optin, smem_sm, regs, threads, threads_sm = _ARCH_LIMITS[cc]
        return cls(
            name=f"generic {arch}",
            compute_capability=cc,
            sm_count=1,
            smem_per_block_optin=smem_optin,
            regs_per_block=regs,
            max_threads_per_block=threads,
            smem_per_sm=smem_sm,
            max_threads_per_sm=threads_sm,
        )

    @classmethod
    def current(cls, ordinal: int | None = None) -> Device:
        """Reads the limits of a GPU (default: CuPy's current device)."""
        import cupy  # (lazy: CuPy)

        if ordinal is None:
            ordinal = cupy.cuda.Device().id
        props = cupy.cuda.runtime.getDeviceProperties(ordinal)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else name
        return cls(
            name=name,
            compute_capability=(int(props["major"]), int(props["minor"])),
            sm_count=int(props["multiProcessorCount"]),
            smem_per_block=int(props["sharedMemPerBlock"]),
            smem_per_block_optin=int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"])),
            regs_per_block=int(props["regsPerBlock"]),
            max_threads_per_block=int(props["maxThreadsPerBlock"]),
            smem_per_sm=int(props.get("sharedMemPerMultiprocessor", props["sharedMemPerBlock"])),
            max_threads_per_sm=int(props.get("maxThreadsPerMultiProcessor", props["maxThreadsPerBlock"])),
            l2_bytes=int(props.get("l2CacheSize", 0)),
            clock_khz=int(props.get("clockRate", 0)),
            memory_bandwidth=_memory_bandwidth(ordinal),
            ordinal=ordinal,
        )


def _memory_bandwidth(ordinal: int) -> float:
    """Peak bandwidth of a GPU's memory, bytes/s: two transfers per memory clock over the bus
    (cudaDevAttrMemoryClockRate, kHz; cudaDevAttrGlobalMemoryBusWidth, bits); 0 where the driver does
    not say."""
    import cupy  # (lazy: CuPy)

    try:
        clock_khz = cupy.cuda.runtime.deviceGetAttribute(36, ordinal)
        bus_bits = cupy.cuda.runtime.deviceGetAttribute(37, ordinal)
    except Exception:  # noqa: BLE001 - an attribute this driver does not have
        return 0.0
    return 2.0 * clock_khz * 1e3 * bus_bits / 8
