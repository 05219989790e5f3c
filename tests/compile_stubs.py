"""Stand-ins for the compiler, run in compile workers by tests/test_evaluate.py: they need no NVRTC."""

from __future__ import annotations

import os


def compile_or_die(source, arch):
    """Kills its worker for the kernel of group_m 3 (after a moment, so that the others are in
    flight in the same pool); for every other kernel returns a made-up path."""
    import time

    if "_g3_" in source.kernel:
        time.sleep(0.5)
        os._exit(1)
    time.sleep(0.2)
    return f"/nonexistent/{source.kernel}.cubin"


def compile_unstored(source, arch):
    """A compiler on a full disk: every kernel compiles, none can be stored."""
    from autogemm.kernels.compile import UnstoredCubin

    return UnstoredCubin(f"{source.kernel}.cubin", b"\x7fELF " + source.kernel.encode(),
                         "cannot store compiled kernels in /cache/cubins: OSError: [Errno 28] No space left on device")


def compile_error(source, arch):
    """A compiler that refuses every kernel."""
    from autogemm.kernels.compile import CompileError

    raise CompileError(f"made-up error in {source.kernel}", "log", None)


def compile_nothing(source, arch):
    """A compiler for measuring-process stand-ins, which load nothing: a made-up path at once."""
    return f"/nonexistent/{source.kernel}.cubin"
