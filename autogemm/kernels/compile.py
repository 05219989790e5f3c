"""CUDA source -> loaded kernel (NVRTC, `nvrtc.py`). Without a GPU, `ptxas_report.py` compiles for ptxas's
report of registers and spills.

GPU path: `compile_to_cubin` runs NVRTC and needs no GPU context (so worker processes can compile
in parallel); `load` turns a cubin into launchable CUDA functions and records their registers,
shared and local memory. Cubins are kept on disk under the cache directory, keyed by the source
digest, the architecture and the NVRTC version, so a kernel is compiled once per machine; each
with the SHA-256 of what was compiled beside it (`<cubin>.sha256`), and one that does not match
it (truncated, replaced, or without one) is compiled again rather than loaded. Where the disk
cannot take one (full, read-only), it is handed on and loaded from memory instead.

Modules are loaded with CUDA's module API directly rather than through `cupy.RawModule`, which
keeps every module it ever loaded for the life of the process: a tune loads hundreds of candidates,
and `unloaded_after` lets the measuring side free each one once it has been measured.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import multiprocessing
import os
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import nvrtc
from ..atomic_write import write_atomically
from ..paths import cubin_dir, user_cache_dir
from .render import Source

NVRTC_OPTIONS = ("-std=c++17",)


class CompileError(RuntimeError):
    """The compiler rejected a rendered kernel. `source_path` holds the source for inspection."""

    def __init__(self, message: str, log: str, source_path: Path | None):
        where = f" (source saved to {source_path})" if source_path else ""
        super().__init__(f"{message}{where}\n{log.strip()}")
        self.message = message
        self.log = log
        self.source_path = source_path

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries from compile workers
        return (type(self), (self.message, self.log, self.source_path))


def save_failed_source(source: Source) -> Path | None:
    """Keeps the source of a kernel that failed, so that the user can read and rebuild it. Written
    atomically (a new file renamed over the path), so that a symbolic link planted at that
    predictable path in a shared cache directory is replaced, never followed; nothing is written
    where the folder itself is a link."""
    try:
        folder = user_cache_dir() / "failed"
        if folder.is_symlink():
            return None
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{source.kernel}.cu"
        write_atomically(path, source.code.encode())
        return path
    except OSError:
        return None


# ---- NVRTC (GPU path) -----------------------------------------------------------------------------
def _cubin_path(source: Source, arch: str) -> Path:
    major, minor = nvrtc.version()
    return cubin_dir() / f"{source.kernel[:80]}-{source.digest}-{arch}-nvrtc{major}.{minor}.cubin"


def _nvidia_namespace() -> list[str]:
    """The folders of the `nvidia` namespace package (NVIDIA's CUDA wheels), wherever they are installed."""
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("nvidia")
        if spec is not None and spec.submodule_search_locations is not None:
            return list(spec.submodule_search_locations)
    return []


def _include_roots() -> list[list[Path]]:
    """Where CUDA headers may be, in groups, first the headers of NVRTC's own version: beside the NVRTC
    library in use (a toolkit has lib64/ and include/; NVIDIA's CUDA 13 packages put both under
    nvidia/cu13/) and the include directories of NVIDIA's other packages beside it (CUDA 12's are one
    per component: nvidia/cuda_runtime/include has mma.h, nvidia/cuda_nvcc/include crt/mma.h); then
    those with the packages' headers in the namespace's other folders; then CuPy's CUDA path,
    $CUDA_PATH, $CUDA_HOME, /usr/local/cuda and nvcc's toolkit."""
    import cupy  # (lazy: CuPy)

    own: list[Path] = []
    spread: list[Path] = []  # the same packages' headers in the other folders of the `nvidia` namespace
    with contextlib.suppress(nvrtc.NvrtcError):
        library, _ = nvrtc.library()
        if library:
            beside = Path(library).resolve().parent.parent
            own.append(beside / "include")
            if beside.parent.name == "nvidia":  # a package of NVIDIA's: its siblings' headers, then those
                # of every other folder the namespace package spans (a user site or --target beside a venv's)
                own += sorted(beside.parent.glob("*/include"))
                for folder in (Path(p) for p in _nvidia_namespace() if Path(p).resolve() != beside.parent):
                    spread += [folder / beside.name / "include", *sorted(folder.glob("*/include"))]
    others = [Path(root) / "include" for root in (cupy.cuda.get_cuda_path(), os.environ.get("CUDA_PATH"),
                                                  os.environ.get("CUDA_HOME"), "/usr/local/cuda") if root]
    nvcc = shutil.which("nvcc")
    if nvcc:
        others.append(Path(nvcc).resolve().parent.parent / "include")
    return [own, own + spread, others]


@functools.lru_cache(maxsize=1)
def _include_options() -> tuple[str, ...]:
    """NVRTC's include options for the complete <mma.h> (it includes crt/mma.h), which the
    tensor-core kernels need and NVRTC does not carry: from the first group of `_include_roots` that
    has both, the first directory with both, else the first with each (CUDA 12's packages split
    them). None found leaves NVRTC to its built-in headers."""
    for roots in _include_roots():
        for root in roots:
            if (root / "mma.h").is_file() and (root / "crt" / "mma.h").is_file():
                return (f"-I{root}",)
        top = next((root for root in roots if (root / "mma.h").is_file()), None)
        crt = next((root for root in roots if (root / "crt" / "mma.h").is_file()), None)
        if top and crt:
            return (f"-I{top}", f"-I{crt}")
    return ()


def nvrtc_options() -> tuple[str, ...]:
    """The options every kernel is compiled with (NVRTC adds the architecture's)."""
    return NVRTC_OPTIONS + _include_options()


def refused_by_nvrtc(source: Source, target: str, error: nvrtc.NvrtcError) -> CompileError:
    """The CompileError of a kernel NVRTC refused (its log, the source saved), for the kernels compiled to be
    served and for ptxas_report's, alike."""
    return CompileError(f"NVRTC failed for {source.kernel} ({target}): {error}", error.log, save_failed_source(source))


@dataclass(frozen=True)
class UnstoredCubin:
    """A compiled kernel the disk would not take (`reason`: the error), to be loaded from memory.
    It crosses process boundaries (compile worker -> tuner -> measuring process) by value."""

    name: str  # the file name it would have had
    data: bytes
    reason: str


# Cubins that could not be stored, by file name: the last few, so that a kernel compiled in this
# process (or handed to it with `remember`) is not compiled again while the disk stays full.
UNSTORED_KEPT = 64
_unstored: OrderedDict[str, UnstoredCubin] = OrderedDict()
_unstored_lock = threading.Lock()


def remember(cubin: UnstoredCubin) -> None:
    with _unstored_lock:
        _unstored[cubin.name] = cubin
        _unstored.move_to_end(cubin.name)
        while len(_unstored) > UNSTORED_KEPT:
            _unstored.popitem(last=False)


def compile_to_cubin(source: Source, arch: str) -> Path | UnstoredCubin:
    """Compiles with NVRTC (no GPU context needed) and returns the cubin's path, reusing a cached
    one; where it cannot be stored (a full or read-only disk) returns it as an `UnstoredCubin`."""
    target = source.target(arch)
    path = _cubin_path(source, target)
    if stored_cubin_intact(path):
        return path
    with _unstored_lock:
        kept = _unstored.get(path.name)
    if kept is not None:
        return kept
    try:
        cubin = nvrtc.compile_cubin(source.code, f"{source.kernel}.cu", target, nvrtc_options())
    except nvrtc.NvrtcError as exc:
        raise refused_by_nvrtc(source, target, exc) from None
    try:
        store_cubin(path, cubin)
    except OSError as exc:  # a full or read-only disk: the kernel is still good, from memory
        unstored = UnstoredCubin(path.name, bytes(cubin), f"cannot store compiled kernels in {path.parent}: "
                                                          f"{type(exc).__name__}: {exc}")
        remember(unstored)
        return unstored
    return path


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def stored_cubin_intact(path: Path) -> bool:
    """Whether the cubin at `path` is what was compiled: its SHA-256 is the one stored beside it."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == _digest_path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):  # either missing or unreadable: not to be trusted
        return False


def store_cubin(path: Path, data: bytes) -> None:
    """Writes a cubin, then its SHA-256 beside it, each atomically (atomic_write.py), readable by all
    (0644), so that concurrent compilers of the same kernel never see half a file (a reader between
    the two writes sees a mismatch and compiles again); on a failure (a full disk) no temporary file
    is left."""
    write_atomically(path, bytes(data))
    write_atomically(_digest_path(path), hashlib.sha256(data).hexdigest().encode() + b"\n")


_shared_pool = None  # a campaign worker's RemoteCompilePool (compile_service.py), when it has one


def share_compile_pool(pool: Any) -> None:
    """Makes `pool` (a campaign's shared compile service, as its worker sees it) the pool every
    tune of this process compiles in, instead of a pool of its own."""
    global _shared_pool
    _shared_pool = pool


def shared_compile_pool() -> Any:
    return _shared_pool


def compile_pool(jobs: int) -> ProcessPoolExecutor:
    """Worker processes for parallel NVRTC compilation. They are spawned, not forked: a fork of a
    process that holds a CUDA context is unsafe, and the workers never need a GPU."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))


def compile_many(sources: list[Source], arch: str, jobs: int) -> dict[str, Path | CompileError]:
    """Compiles many sources in parallel; maps each kernel name to its cubin or its CompileError. Those
    whose cubin is stored already are not handed to the pool, which is not started when none is left
    (its worker processes cost more than finding every cubin)."""
    results: dict[str, Path | CompileError] = {}
    to_compile = {}
    for source in {s.kernel: s for s in sources}.values():
        stored = _cubin_path(source, source.target(arch))
        if stored_cubin_intact(stored):
            results[source.kernel] = stored
        else:
            to_compile[source.kernel] = source
    if not to_compile:
        return results
    with compile_pool(jobs) as pool:
        futures = {name: pool.submit(compile_to_cubin, source, arch) for name, source in to_compile.items()}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except CompileError as exc:
                results[name] = exc
    return results


@dataclass
class CompiledKernel:
    source: Source
    gemm: object  # cupy.cuda.function.Function of the GEMM kernel (it holds its module)
    reduce: object | None  # the split-K reduction's Function
    repack: object | None  # the operand repacking's Function
    registers: int
    shared_bytes: int
    local_bytes: int


def _attribute(function, name: str) -> int:
    from cupy.cuda import driver  # (lazy: CuPy)

    return driver.funcGetAttribute(getattr(driver, f"CU_FUNC_ATTRIBUTE_{name}"), function.ptr)


def load(source: Source, cubin: Path | UnstoredCubin, dynamic_smem: int) -> CompiledKernel:
    """Loads a cubin (a file, or bytes that could not be stored) on the current device; raises the
    kernel's dynamic shared-memory limit when static and dynamic shared memory together exceed the
    default 48 KB of a block. The module is unloaded when its functions are no longer referenced."""
    from cupy.cuda.function import Module  # (lazy: CuPy)
    from cupy.cuda import driver  # (lazy: CuPy)

    module = Module()
    if isinstance(cubin, UnstoredCubin):
        module.load(cubin.data)
    else:
        module.load_file(str(cubin))
    gemm = module.get_function(source.kernel)
    static_smem = _attribute(gemm, "SHARED_SIZE_BYTES")
    if static_smem + dynamic_smem > 48 * 1024:
        driver.funcSetAttribute(gemm.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
    reduce = module.get_function(source.reduce_kernel) if source.reduce_kernel else None
    repack = module.get_function(source.repack_kernel) if source.repack_kernel else None
    return CompiledKernel(
        source=source,
        gemm=gemm,
        reduce=reduce,
        repack=repack,
        registers=_attribute(gemm, "NUM_REGS"),
        shared_bytes=static_smem + dynamic_smem,
        local_bytes=_attribute(gemm, "LOCAL_SIZE_BYTES"),
    )


_loaded: dict[tuple[str, str, int], CompiledKernel] = {}
_loaded_lock = threading.Lock()


def compile_source(source: Source, arch: str, dynamic_smem: int) -> CompiledKernel:
    """Compile (or reuse) and load `source` on the current device; memoized per process and device."""
    import cupy  # (lazy: CuPy)

    key = (source.kernel, source.digest, cupy.cuda.Device().id)
    with _loaded_lock:
        if key in _loaded:
            return _loaded[key]
    kernel = load(source, compile_to_cubin(source, arch), dynamic_smem)
    with _loaded_lock:
        return _loaded.setdefault(key, kernel)


@contextlib.contextmanager
def unloaded_after():
    """Kernels first loaded inside the block are forgotten at its end, so that their modules are
    unloaded once nothing else holds them (the measuring side: one candidate after another)."""
    with _loaded_lock:
        before = set(_loaded)
    try:
        yield
    finally:
        with _loaded_lock:
            for key in [key for key in _loaded if key not in before]:
                del _loaded[key]
