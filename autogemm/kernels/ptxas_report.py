"""Without a GPU: ptxas's report of a kernel's registers, stack, spills and serialized wgmmas, which `autogemm
check` prints and the CPU tests hold kernels to. `nvrtc_resources` compiles with NVRTC, as kernels are compiled to
be served (`compile.py`; its options, ptxas's verbose report added), so that the report is of the very code a GPU
runs; `nvcc_resources` with the CUDA toolkit's `nvcc`, for a machine with the toolkit but without NVRTC's
package. NVRTC also takes about half nvcc's time for the same kernels (it runs in the process, with no host
compiler behind it): 30 s against 55 s for the CPU suite's 80 sampled kernels, one at a time (NVRTC 13.5, nvcc
13.0)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import nvrtc
from .compile import CompileError, nvrtc_options, refused_by_nvrtc, save_failed_source
from .render import Source


class CompilerNotFound(RuntimeError):
    """Neither NVRTC nor nvcc can be used: nothing can compile a kernel for its report."""


class NvccNotFound(CompilerNotFound):
    pass


@dataclass(frozen=True)
class ResourceUsage:
    kernel: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int  # static shared memory (the GEMM kernels use dynamic shared memory)
    # ptxas serialized the kernel's wgmmas (its C7514 note: registers of wgmmas in flight read or
    # copied), which costs a Hopper kernel most of its speed while it still computes right
    wgmma_serialized: bool = False

    @property
    def spills(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


# where a CUDA toolkit's nvcc is when it is neither on PATH nor named by $CUDA_HOME / $CUDA_PATH
NVCC_FALLBACKS = ("/usr/local/cuda/bin/nvcc",)


def find_nvcc() -> str:
    """The nvcc to compile with: on PATH, in $CUDA_HOME/bin or $CUDA_PATH/bin, or a usual place;
    raises NvccNotFound naming where it looked."""
    candidates = [shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
    candidates += NVCC_FALLBACKS
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise NvccNotFound(
        f"nvcc was not found (looked on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin and {', '.join(NVCC_FALLBACKS)}); "
        "install the CUDA toolkit to compile kernels without a GPU"
    )


_PTXAS_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_PTXAS_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized.*in the function '(\w+)'")


def nvcc_resources(source: Source, arch: str = "sm_90") -> dict[str, ResourceUsage]:
    """Compiles with `nvcc -cubin -Xptxas -v` and returns each kernel's resource usage."""
    nvcc = find_nvcc()
    with tempfile.TemporaryDirectory(prefix="autogemm-") as tmp:
        cu = Path(tmp) / f"{source.kernel}.cu"
        cu.write_text(source.code)
        cmd = [nvcc, "-cubin", f"-arch={source.target(arch)}", "-std=c++17", "-Xptxas", "-v", "-o", str(cu.with_suffix(".cubin")), str(cu)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed for {source.kernel} ({source.target(arch)})", proc.stderr + proc.stdout, save_failed_source(source))
    return _usage(proc.stderr, source)


def nvrtc_resources(source: Source, arch: str = "sm_90") -> dict[str, ResourceUsage]:
    """Compiles with NVRTC, with the options that serve kernels and ptxas's verbose report, and returns each
    kernel's resource usage; NvrtcError where NVRTC cannot be loaded at all."""
    nvrtc.version()  # (a missing library is that error, not a kernel's compile error)
    target = source.target(arch)
    try:
        _, log = nvrtc.compile_cubin_with_log(source.code, f"{source.kernel}.cu", target,
                                              (*nvrtc_options(), "-Xptxas", "-v"))
    except nvrtc.NvrtcError as exc:
        raise refused_by_nvrtc(source, target, exc) from None
    return _usage(log, source)


def _usage(report_text: str, source: Source) -> dict[str, ResourceUsage]:
    """Each kernel's resource usage from ptxas's verbose report (as nvcc prints it and NVRTC logs it)."""
    report: dict[str, ResourceUsage] = {}
    serialized = set(_PTXAS_SERIALIZED.findall(report_text))
    current = None
    frame = (0, 0, 0)
    for line in report_text.splitlines():
        if m := _PTXAS_FUNCTION.search(line):
            current, frame = m.group(1), (0, 0, 0)
        elif (m := _PTXAS_FRAME.search(line)) and current:
            frame = tuple(int(x) for x in m.groups())
        elif (m := _PTXAS_USED.search(line)) and current:
            report[current] = ResourceUsage(
                kernel=current,
                registers=int(m.group(1)),
                stack_bytes=frame[0],
                spill_store_bytes=frame[1],
                spill_load_bytes=frame[2],
                shared_bytes=int(m.group(2) or 0),
                wgmma_serialized=current in serialized,
            )
            current = None
    if source.kernel not in report:
        raise CompileError(f"no ptxas report for {source.kernel}", report_text, save_failed_source(source))
    return report


@dataclass(frozen=True)
class ReportCompiler:
    """What `autogemm check` compiles with: its name as the table's heading gives it, and its report."""

    name: str
    resources: Callable[[Source, str], dict[str, ResourceUsage]]


def report_compiler() -> ReportCompiler:
    """NVRTC where it can be loaded with the headers it is given (what serves kernels), else the toolkit's nvcc;
    CompilerNotFound, saying why of each, where neither can."""
    try:
        major, minor = nvrtc.version()
        nvrtc_options()  # (the headers beside NVRTC are found through CuPy's CUDA path too)
        return ReportCompiler(f"NVRTC {major}.{minor}", nvrtc_resources)
    except (nvrtc.NvrtcError, ImportError) as exc:
        why_not_nvrtc = str(exc)
    try:
        find_nvcc()
    except NvccNotFound as exc:
        raise CompilerNotFound(f"{why_not_nvrtc}; and {exc}") from None
    return ReportCompiler("nvcc", nvcc_resources)
