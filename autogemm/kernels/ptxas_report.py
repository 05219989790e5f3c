"""Without a GPU: a kernel compiled by the CUDA toolkit's `nvcc` for ptxas's report of its registers, stack,
spills and serialized wgmmas (`nvcc_resources`), which `autogemm kernels` prints and the CPU tests hold kernels
to. The GPU path (NVRTC, then loading) is `compile.py`'s."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .compile import CompileError, save_failed_source
from .render import Source


class NvccNotFound(RuntimeError):
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
    report: dict[str, ResourceUsage] = {}
    serialized = set(_PTXAS_SERIALIZED.findall(proc.stderr))
    current = None
    frame = (0, 0, 0)
    for line in proc.stderr.splitlines():
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
        raise CompileError(f"no ptxas report for {source.kernel}", proc.stderr, save_failed_source(source))
    return report
