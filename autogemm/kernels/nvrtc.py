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


def _bindings():
    try:
        from cuda.bindings import nvrtc  # (lazy: cuda-bindings)
    except ImportError:
        raise NvrtcError("compiling kernels needs NVIDIA's cuda-bindings package: pip install "
                         "'autogemm[cuda13]' (or [cuda12])") from None
    return nvrtc


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
        raise NvrtcError(f"NVRTC cannot be loaded ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                         "install the CUDA toolkit or the nvidia-cuda-nvrtc wheel of your CUDA version") from None
    return int(major), int(minor)


def compile_cubin(code: str, name: str, arch: str, options: tuple[str, ...]) -> bytes:
    """The cubin of `code` for `arch` (sm_90, sm_90a, ...); NvrtcError with the compile log where
    NVRTC refuses it."""
    version()  # a clear error where the library is missing
    nvrtc = _bindings()
    program = _check(nvrtc, nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], []), "program creation")
    try:
        arguments = [o.encode() for o in (*options, f"-arch={arch}", "--device-as-default-execution-space")]
        (error,) = nvrtc.nvrtcCompileProgram(program, len(arguments), arguments)
        if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(program), "log size")
            log = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetProgramLog(program, log), "log")
            raise NvrtcError(f"NVRTC compilation failed: {error.name}", log.rstrip(b"\0 ").decode(errors="replace"))
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(program), "cubin size")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), "cubin")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)
