"""NVRTC, CUDA's runtime compiler, through NVIDIA's own Python bindings (`cuda.bindings.nvrtc`,
the `cuda-bindings` package of the cuda12/cuda13 extras): CUDA C++ source to a cubin for one
architecture, with no GPU context, so that compile workers need no GPU.

The options match what CuPy passes for a cubin (`-arch=sm_XX` and
`--device-as-default-execution-space`), so the kernels are the same as when CuPy compiled them.
"""

from __future__ import annotations

import functools


class NvrtcError(RuntimeError):
    """NVRTC refused a program (`log`: its compile log) or could not be used at all."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


# what brings NVRTC: the CUDA extra of the driver's major version (its cuda-toolkit[nvrtc] is NVIDIA's
# nvidia-cuda-nvrtc package)
INSTALL_HINT = ("pip install 'autogemm[cuda13]' (or [cuda12] with a CUDA 12 driver) brings it: cuda-bindings, and "
                "NVRTC itself as NVIDIA's nvidia-cuda-nvrtc package (cuda-toolkit[nvrtc])")


def _bindings():
    try:
        from cuda.bindings import nvrtc  # (lazy: cuda-bindings)
    except ImportError:
        raise NvrtcError(f"compiling kernels needs NVIDIA's cuda-bindings package; {INSTALL_HINT}") from None
    return nvrtc


@functools.lru_cache(maxsize=1)
def library() -> tuple[str, str]:
    """(path, how it was found) of the NVRTC library that cuda-bindings loads: cuda-pathfinder's
    search, the one cuda-bindings itself makes ("site-packages" where NVIDIA's package brought it;
    "system-search", "CUDA_PATH" or "conda" for a toolkit installed otherwise). NvrtcError naming the
    package where there is none."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # (lazy: cuda-pathfinder)
    except ImportError:
        raise NvrtcError(f"finding NVRTC needs NVIDIA's cuda-pathfinder package; {INSTALL_HINT}") from None
    try:
        loaded = load_nvidia_dynamic_lib("nvrtc")
    except Exception as exc:  # DynamicLibNotFoundError, and whatever a broken install raises
        raise NvrtcError(f"NVRTC (libnvrtc) cannot be found or loaded ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); {INSTALL_HINT}") from None
    return str(loaded.abs_path or ""), str(getattr(loaded, "found_via", "unknown"))


def _check(nvrtc, result, what: str):
    error, *values = result
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"NVRTC {what} failed: {error.name}")
    return values[0] if len(values) == 1 else values


@functools.lru_cache(maxsize=1)
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version (part of the compiled kernels' cache key)."""
    nvrtc = _bindings()
    try:
        major, minor = _check(nvrtc, nvrtc.nvrtcVersion(), "version")
    except NvrtcError:
        raise
    except Exception as exc:  # the library itself cannot be found or loaded
        raise NvrtcError(f"NVRTC (libnvrtc) cannot be loaded ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); {INSTALL_HINT}") from None
    return int(major), int(minor)


def compile_cubin(code: str, name: str, arch: str, options: tuple[str, ...]) -> bytes:
    """The cubin of `code` for `arch` (sm_90, sm_90a, ...); NvrtcError with the compile log where
    NVRTC refuses it."""
    return compile_cubin_with_log(code, name, arch, options)[0]


def compile_cubin_with_log(code: str, name: str, arch: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    """`compile_cubin`'s cubin and NVRTC's log of it: its warnings, and ptxas's report of each kernel's
    resources where `options` ask for it (`-Xptxas -v`: kernels/ptxas_report.py)."""
    version()  # a clear error where the library is missing
    nvrtc = _bindings()
    program = _check(nvrtc, nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], []), "program creation")
    try:
        arguments = [o.encode() for o in (*options, f"-arch={arch}", "--device-as-default-execution-space")]
        (error,) = nvrtc.nvrtcCompileProgram(program, len(arguments), arguments)
        # (NVRTC writes into the buffers it is given: writable ones of their own. `b" " * size` was the
        # process's shared b" " where the log is empty (size 1): NVRTC's NUL in it turned every b" ", and
        # the " " of each module compiled after, into NUL)
        size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(program), "log size")
        log = bytearray(size)
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(program, log), "log")
        text = log.rstrip(b"\0 ").decode(errors="replace")
        if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"NVRTC compilation failed: {error.name}", text)
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(program), "cubin size")
        cubin = bytearray(size)
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), "cubin")
        return bytes(cubin), text
    finally:
        nvrtc.nvrtcDestroyProgram(program)
