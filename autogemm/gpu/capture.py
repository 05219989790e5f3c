"""Served calls inside a CUDA graph capture (`torch.cuda.graph`, CuPy's `Stream.begin_capture`).

A captured call is replayed later, any number of times, possibly on another stream, possibly while
the capturing stream runs other work. So under capture:

- nothing may allocate the way it does outside one: under PyTorch's capture (its default mode is
  global) a `cudaMalloc` is refused and invalidates the capture. Every buffer a captured call needs
  (output, temporaries, workspaces) comes from `memory` or `allocator`: from PyTorch's caching
  allocator while PyTorch captures (the graph's private pool, which lives as long as the graph),
  from CuPy's pool otherwise, and then kept for the rest of the process, since CuPy cannot say
  when a graph is destroyed and memory handed back to its pool would be handed to someone else
  while a replay still writes it;
- a workspace is never shared with calls outside the graph, nor between two captures: a graph
  replayed on one stream while the capturing stream runs the same plan would otherwise race on it;
- nothing synchronizes, compiles, tunes, races, times or writes the cache: a call with no plan
  ready raises `CaptureError` before it touches the GPU (the capture stays valid), the online
  guard serves its fallback untimed.

The check is `cudaStreamIsCapturing` (0.16 us on an H100's host), asked where a call would do one
of those things: the launchers with workspaces, the guard, the CuPy fast path (whose outputs are
kept ready ahead of time), and the general path.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .runtime import cupy_stream

WORKSPACE_ALIGN = 256  # bytes: what cudaMalloc gives, and what every kernel's workspace assumes


class CaptureError(RuntimeError):
    """A call that cannot be served inside a CUDA graph capture (nothing was launched; the capture
    is still valid)."""


_stream_is_capturing = None  # cupy.cuda.runtime.streamIsCapturing, bound on first use
_lock = threading.Lock()
# (device, stream, purpose) -> (capture id, address, bytes, owner): a workspace of the capture under way on
# that stream
_held: dict[tuple[Any, ...], tuple[int, int, int, object]] = {}
_kept: list[Any] = []  # buffers of CuPy captures, kept for the process


def capturing(stream_pointer: int) -> bool:
    """Whether work queued on the stream `stream_pointer` is being captured into a graph."""
    global _stream_is_capturing
    if _stream_is_capturing is None:
        from cupy.cuda import runtime  # (lazy: CuPy)

        _stream_is_capturing = runtime.streamIsCapturing
    try:
        return _stream_is_capturing(stream_pointer) != 0
    except Exception as exc:
        if "StreamCaptureImplicit" not in str(exc):
            raise
        # the legacy default stream, asked while another (blocking) stream captures
        raise CaptureError(
            f"a CUDA graph is being captured on another stream and this call would run on the legacy default "
            f"stream, which would join that capture ({exc}); run it on the capturing stream or a non-blocking "
            f"one") from None


def require_plan(problem_text: str) -> CaptureError:
    """The error of a call that has no plan ready while its stream is captured."""
    return CaptureError(
        f"autogemm.matmul of {problem_text} was first called inside a CUDA graph capture: choosing and loading "
        f"its kernel cannot happen inside one (it reads the cache, may compile, and measures). Call it once "
        f"with the same shapes, strides and dtypes before capturing (a warm-up, as torch.cuda.graph asks for)")


def _capture_id(stream_pointer: int) -> int:
    from cuda.bindings import runtime  # (lazy: cuda-bindings)

    result = runtime.cudaStreamGetCaptureInfo(stream_pointer)
    if int(result[0]) != 0:
        raise CaptureError(f"cannot read the capture of stream {stream_pointer:#x}: {result[0]}")
    return int(result[2])


def _torch_captures(device: int, stream_pointer: int):
    """torch, where PyTorch is capturing this stream (its current stream on `device`), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    try:
        if torch.cuda.current_stream(device).cuda_stream != stream_pointer:
            return None
        return torch if torch.cuda.is_current_stream_capturing() else None
    except RuntimeError:
        return None


def _allocate(device: int, stream_pointer: int, nbytes: int, zeroed: bool):
    """(address, owner) of `nbytes` for work on that stream under its capture: from PyTorch's graph
    pool where PyTorch captures it, else from CuPy's pool (owner kept for the process)."""
    nbytes = max(WORKSPACE_ALIGN, -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN)
    torch = _torch_captures(device, stream_pointer)
    if torch is not None:
        make = torch.zeros if zeroed else torch.empty
        tensor = make(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))
        return tensor.data_ptr(), tensor
    import cupy  # (lazy: CuPy)

    with cupy.cuda.Device(device), cupy_stream(stream_pointer, device):
        memory = cupy.get_default_memory_pool().malloc(nbytes)
        if zeroed:
            memory.memset_async(0, nbytes)
    with _lock:
        _kept.append(memory)
    return memory.ptr, memory


def memory(device: int, stream_pointer: int, purpose: str, nbytes: int, zeroed: bool = False) -> int:
    """The address of a workspace of at least `nbytes` for `purpose`, for the capture under way on
    the stream: one per capture, stream and purpose (calls of one capture on one stream run in
    order, so they share it). A zeroed one is zeroed by a memset captured before its first use, so
    every replay starts from zero."""
    identity = _capture_id(stream_pointer)
    key = (device, stream_pointer, purpose)
    with _lock:
        held = _held.get(key)
    if held is not None and held[0] == identity and held[2] >= nbytes:
        return held[1]
    address, owner = _allocate(device, stream_pointer, nbytes, zeroed)
    with _lock:
        # an older capture's buffer: PyTorch's goes back to that graph's pool (still the graph's), CuPy's
        # stays in _kept
        _held[key] = (identity, address, nbytes, owner)
    return address


def allocator(device: int, stream_pointer: int) -> Any:
    """A CuPy allocator (for `cupy.cuda.using_allocator`) that gives every array of a call made under
    the capture of that stream memory that lives as long as the graph (see the module's doc)."""
    import cupy  # (lazy: CuPy)

    def allocate(nbytes: int):
        address, owner = _allocate(device, stream_pointer, nbytes, zeroed=False)
        if hasattr(owner, "data_ptr"):  # a PyTorch tensor: the array holds it
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(address, max(nbytes, 1), owner, device), 0)
        return owner

    return allocate
