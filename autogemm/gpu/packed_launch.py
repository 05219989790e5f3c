"""The lean way to launch a generated kernel again and again: its arguments packed once into one
buffer, and workspaces (split-K partial sums, stream-K slots) kept per stream instead of allocated
per call.

Why: CuPy's `Function.__call__` converts every argument on every call (a GEMM kernel has 15), which
costs more host time than `cublasGemmEx` takes for a whole call; a short product served one call at
a time then loses to cuBLAS on host time alone. `cuLaunchKernel` reads each argument through a
pointer, so here a call rewrites the three operand pointers (and alpha, beta) in place and hands the
driver the same array of pointers. The driver copies the arguments at launch, so the buffer may be
rewritten by the next call at once; a lock keeps two threads from interleaving their writes.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from . import capture
from .dependent_launch import DependentLauncher


PER_THREAD_STREAM = 2  # cudaStreamPerThread
# the host-side copy of the arguments aligns each to its size up to this (a 128-byte tensor map
# needs no more: the driver copies every argument from its pointer into the kernel's own layout)
MAX_ALIGNMENT = 8


def current_stream_pointer(stream: Any = None) -> int:
    """The handle of `stream`, or of CuPy's current stream (the null or per-thread default stream
    when none was set)."""
    if stream is not None:
        return stream.ptr
    import cupy  # (lazy: CuPy)

    return cupy.cuda.get_current_stream().ptr


class KernelArgumentError(ValueError):
    """A launcher's arguments do not name the kernel's parameters (a template changed its signature
    and the launcher was not changed with it)."""


def driver_launch() -> Any:
    """cuLaunchKernel, as CuPy's driver module offers it."""
    from cupy.cuda import driver  # (lazy: CuPy)

    return driver.launchKernel


class PackedKernel:
    """A loaded kernel with its grid, block, shared memory and arguments, launched by `launch`
    after the arguments that change between calls have been rewritten in place (`slot`, `slots`,
    `point`).

    Arguments are given by name, and packed in the order of the kernel's parameters as its source
    declares them (`render.Source.parameters`): a launcher never depends on where a template puts a
    parameter, and one that names a parameter the kernel does not have (or misses one) fails here,
    when it is built. Names are resolved to positions once, when a launcher is built, never per call."""

    def __init__(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                 parameters: Sequence[str], arguments: Mapping[str, np.generic], dependent: bool = False):
        if len(set(parameters)) != len(parameters):
            raise KernelArgumentError(f"the kernel's parameters ({', '.join(parameters)}) repeat a name")
        missing = [name for name in parameters if name not in arguments]
        unknown = [name for name in arguments if name not in parameters]
        if missing or unknown:
            raise KernelArgumentError(
                f"the launcher's arguments do not match the kernel's parameters ({', '.join(parameters)}): "
                f"missing {', '.join(missing) or 'none'}; not parameters of the kernel {', '.join(unknown) or 'none'}")
        # (dependent: a kernel that waits for the grid before it, launched so that it may start early)
        self.dependent = dependent
        self._launch_kernel = DependentLauncher() if dependent else driver_launch()
        self.function = function  # held: the module stays loaded while this launcher lives
        self._geometry = (function.ptr, *grid, *block, smem)
        values = [arguments[name] for name in parameters]
        self.parameters = tuple(parameters)
        self.argument_dtypes = {name: value.dtype for name, value in zip(parameters, values)}
        self._index = {name: index for index, name in enumerate(parameters)}
        offsets, end = [], 0
        for value in values:  # each argument at its natural alignment, as a C struct would be
            size = value.dtype.itemsize
            end = -(-end // min(size, MAX_ALIGNMENT)) * min(size, MAX_ALIGNMENT)
            offsets.append(end)
            end += size
        self._raw = np.zeros(max(1, -(-end // 8)), dtype=np.uint64)  # 8-byte aligned storage
        raw_bytes = self._raw.view(np.uint8)
        for value, offset in zip(values, offsets):
            raw_bytes[offset:offset + value.dtype.itemsize] = np.frombuffer(value.tobytes(), dtype=np.uint8)
        self._sizes = [value.dtype.itemsize for value in values]
        self._raw_bytes = [value.dtype.kind == "V" for value in values]
        self._offsets = tuple(offsets)
        self._pointers = np.array([self._raw.ctypes.data + offset for offset in offsets], dtype=np.uintp)
        self._address = self._pointers.ctypes.data
        # one typed view per type, shared by its arguments (so that the pointers, or alpha and beta,
        # are rewritten through one array); raw-byte arguments (tensor maps) are redirected with
        # `point`, not rewritten through a typed view
        views = {}
        self._slots = [(raw_bytes, offset) if value.dtype.kind == "V" else
                       (views.setdefault(value.dtype, self._raw.view(value.dtype)), offset // value.dtype.itemsize)
                       for value, offset in zip(values, offsets)]

    def index(self, name: str) -> int:
        """The position of parameter `name` among the kernel's (for `point`)."""
        try:
            return self._index[name]
        except KeyError:
            raise KernelArgumentError(f"the kernel has no parameter {name!r} ({', '.join(self.parameters)})") from None

    def slot(self, name: str) -> Any:
        """(array, position): `array[position] = value` rewrites argument `name` in place."""
        return self._slots[self.index(name)]

    def slots(self, *names: str) -> tuple[np.ndarray, tuple[int, ...]]:
        """(array, positions) of arguments of one type: `array[positions[i]] = value` rewrites the
        i-th of `names` (the three operand pointers, or alpha and beta, in one array)."""
        found = [self.slot(name) for name in names]
        if any(array is not found[0][0] for array, _ in found):
            raise KernelArgumentError(f"arguments {', '.join(names)} are not of one type: "
                                      f"{', '.join(str(self.argument_dtypes[name]) for name in names)}")
        return found[0][0], tuple(position for _, position in found)

    def point(self, index: int, address: int) -> None:
        """Makes the launch read argument `index` (`index(name)`) from host memory at `address`
        (storage the caller keeps alive, of the argument's size) instead of this buffer: a tensor
        map is switched by one pointer instead of a copy of its 128 bytes."""
        self._pointers[index] = address

    def launch(self, stream_pointer: int) -> None:
        self._launch_kernel(*self._geometry, stream_pointer, self._address, 0)

    def description(self) -> tuple | None:
        """What a launcher outside Python needs to make this launch itself with cuLaunchKernel (linear's C++
        memo, serving/native_linear.cpp): (the CUfunction's address, the grid, the block, the shared memory's
        bytes, the packed arguments' bytes as they stand, each argument's offset in them). The caller copies the
        bytes and rewrites what changes in its copy (`slot`'s array and position give an offset). None where an
        argument is read from elsewhere (`point`), or where the kernel is launched as a dependent grid. The
        CUfunction lives as long as this launcher."""
        if self.dependent:  # (cuLaunchKernel cannot ask for its early start)
            return None
        base = self._raw.ctypes.data
        if any(int(pointer) != base + offset for pointer, offset in zip(self._pointers, self._offsets)):
            return None
        return self.packed()

    def offset(self, name: str) -> int:
        """Where argument `name` lies in the packed bytes (`packed`)."""
        return self._offsets[self.index(name)]

    def packed(self) -> tuple:
        """(the CUfunction's address, the grid, the block, the shared memory's bytes, the packed arguments' bytes
        as they stand, each argument's offset in them), whatever `point` redirected: a caller that launches from
        a copy of these bytes writes those arguments into it itself (a tensor map launcher's maps:
        tma_launch's `native_description`). The CUfunction lives as long as this launcher."""
        function, *grid_block, smem = self._geometry
        return (int(function), tuple(grid_block[:3]), tuple(grid_block[3:]), int(smem), self._raw.tobytes(),
                self._offsets)

    def arguments(self) -> dict[str, Any]:
        """The arguments as they stand, by name in the kernel's order (for tests and debugging;
        raw-byte ones as the bytes their pointer reaches)."""

        return {name: ctypes.string_at(int(self._pointers[i]), self._sizes[i]) if self._raw_bytes[i]
                else array[position].item()
                for i, (name, (array, position)) in enumerate(zip(self.parameters, self._slots))}


def native_description_of(kernel: PackedKernel, scalar: Any, order: tuple[int, int], launch: Any,
                          maps: tuple = (None, None, None), c_mapped: str | None = None, encode: Any = None) -> tuple:
    """What linear's C++ memo needs to make a launcher's launch of `kernel` itself (serving/
    native_prepared_kernel.h), a kernel that writes D with an epilogue in one launch: `kernel.packed()`; the
    offsets of the A, B and C tensor maps (None each where the operand goes as a pointer; `maps` names them), of
    the A and B pointers (None where they go as maps), of C's pointer, the bias's, the residual's, the C-mapped
    flag (int32; None: the kernel has none), alpha and beta; the bytes of alpha's type (`scalar`); `order`, the
    kernel's roles the launch's first and second pointers take (a launcher that swaps the operands: (1, 0));
    `encode(role, address)`, the map of an operand at an address (None where there are no maps); and `launch`,
    which keeps the kernel loaded while the memo holds it."""
    offset = kernel.offset
    map_at = tuple(None if name is None else offset(name) for name in maps)
    pointer_at = tuple(offset(name) if at is None else None for name, at in zip("AB", map_at[:2]))
    return (*kernel.packed(), map_at, pointer_at, offset("C"), offset("bias"), offset("residual"),
            None if c_mapped is None else offset(c_mapped), offset("alpha"), offset("beta"), np.dtype(scalar).itemsize,
            tuple(order), encode, launch)


def epilogue_arguments(problem: Any, residual: Any) -> dict[str, Any]:
    """The arguments a kernel that applies `problem`'s epilogue takes after its own (common.cuh.j2's
    epilogue_parameters), by name: the bias's and the residual's pointers (set per launch; a scaled
    product's scales' too, and the layout of block scales) and the residual's pitch and batch stride (`residual`, a KernelOperand in the user's layout, as C; None
    where the epilogue adds none). Empty for the identity epilogue."""
    epilogue = problem.epilogue
    if epilogue.is_identity:
        return {}
    if epilogue.residual and residual is None:
        raise ValueError(f"the epilogue {epilogue} adds a residual: the launcher needs its layout")
    arguments = dict(bias=np.uintp(0), residual=np.uintp(0), ldr=np.int32(residual.ld if residual else 0),
                     stride_r=np.int64(residual.batch_stride if residual else 0))
    if epilogue.scale:  # (FP8: the scales' addresses, set per launch too)
        arguments.update(scale_a=np.uintp(0), scale_b=np.uintp(0))
    if epilogue.scale == "block":  # (and whether they are in torch's outer-dimension-major layout)
        arguments.update(scales_outer=np.int32(0))
    return arguments


def compiled_kernel(kernel: Any, role: str, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                    arguments: Mapping[str, np.generic], dependent: bool = False) -> PackedKernel:
    """The PackedKernel of one kernel of a compiled source (`compile.CompiledKernel`): `role`
    "gemm", "reduce" (the split-K reduction) or "repack" (the operand copy), its arguments by name;
    `dependent`: launched with programmatic dependent launch (`dependent_launch`)."""
    source = kernel.source
    name = {"gemm": source.kernel, "reduce": source.reduce_kernel, "repack": source.repack_kernel}[role]
    return PackedKernel(getattr(kernel, role), grid, block, smem, source.parameters(name), arguments, dependent)


class WorkspacePool:
    """Device scratch memory kept per (device, stream, purpose) and grown on demand, as cuBLAS keeps
    its workspace: calls on one stream run in order, so they can share one buffer; calls on
    different streams get different buffers. Zeroed buffers (stream-K's tile counters) are zeroed
    once, when made; the kernels that use them leave them zero again.

    At most `capacity` buffers are kept, the least recently used going first (a program that makes
    a stream per call would otherwise grow the pool without end). A dropped buffer goes back to
    CuPy's memory pool, which hands it out again only to work ordered after it on its stream."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._buffers: OrderedDict[tuple[Any, ...], object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, device: int, stream_pointer: int, purpose: str, nbytes: int, zeroed: bool = False) -> int:
        """The address of at least `nbytes` bytes for work ordered on that stream. Under a CUDA graph
        capture, a buffer of that capture's own (capture.memory), which lives as long as the graph."""
        if capture.capturing(stream_pointer):
            return capture.memory(device, stream_pointer, purpose, nbytes, zeroed)
        key = (device, stream_pointer, purpose)
        if stream_pointer == PER_THREAD_STREAM:  # one handle, but a different stream in each thread
            key += (threading.get_ident(),)
        with self._lock:
            buffer = self._buffers.get(key)
            if buffer is None or buffer.nbytes < nbytes:
                self._buffers.pop(key, None)  # the old one returns to CuPy's pool, ordered on its stream
                buffer = self._allocate(device, stream_pointer, nbytes, zeroed)
                self._buffers[key] = buffer
                while len(self._buffers) > self.capacity:
                    self._buffers.popitem(last=False)
            else:
                self._buffers.move_to_end(key)
            return buffer.data.ptr

    @staticmethod
    def _allocate(device: int, stream_pointer: int, nbytes: int, zeroed: bool):
        import cupy  # (lazy: CuPy)

        stream = cupy.cuda.ExternalStream(stream_pointer, device)
        with cupy.cuda.Device(device), stream:
            words = -(-max(nbytes, 1) // 8)
            return cupy.zeros(words, dtype=np.uint64) if zeroed else cupy.empty(words, dtype=np.uint64)

    def clear(self) -> None:
        """Drops every buffer (the next call allocates again)."""
        with self._lock:
            self._buffers.clear()

    def __len__(self) -> int:
        return len(self._buffers)


WORKSPACES = WorkspacePool()
