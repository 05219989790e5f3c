"""GPU test runs shared by the quick tier and the exhaustive samples: edge shapes, operands (fresh
random values, misaligned views where asked, outputs poisoned with NaN), a config run on a case
against float64, and the ahead-of-time compilation of every kernel a list of runs needs, in
parallel (the tests then load the cubins from disk)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from autogemm.problem import LAYOUTS, Device, Problem


@contextlib.contextmanager
def serving(dtypes_cublas_serves):
    """Within the block, untuned problems of these dtypes are served by cuBLAS and the others by the
    built-in default kernels (select.CUBLAS_SERVES), with the plans made so far forgotten on entry
    and on exit."""
    import autogemm
    from autogemm.serving import select

    saved = select.CUBLAS_SERVES
    select.CUBLAS_SERVES = dtypes_cublas_serves
    autogemm.reset()
    try:
        yield
    finally:
        select.CUBLAS_SERVES = saved
        autogemm.reset()


@dataclass(frozen=True)
class Case:
    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    misalign: bool = False  # operands are views one element into wider buffers


EDGE_CASES = (
    Case("1x1x1", 1, 1, 1),
    Case("1xNxK", 1, 300, 200),
    Case("127x129x65", 127, 129, 65),
    Case("255x257x1023", 255, 257, 1023, alpha=0.75),
    Case("K=1", 64, 96, 1),
    Case("batch3-alpha-beta", 70, 50, 90, batch=3, alpha=1.5, beta=-0.5),
    Case("aligned-tails", 132, 260, 68, beta=0.25),
    Case("misaligned-view", 100, 84, 76, batch=2, alpha=-1.0, beta=0.5, misalign=True),
)


def tile_multiple(config) -> Case:
    """Two tiles each way, and enough K tiles for every split of split-K to have some."""
    return Case("tile-multiple", 2 * config.bm, 2 * config.bn, max(4, 2 * config.split_k) * config.bk)


@dataclass(frozen=True)
class Run:
    config: object
    case: Case
    layout: str
    dtype: str = "float32"
    compute: str = ""

    @property
    def problem(self) -> Problem:
        c = self.case
        return Problem.from_layout(c.m, c.n, c.k, self.layout, batch=c.batch, dtype=self.dtype, compute=self.compute)

    def runnable(self, device: Device):
        """The config to run (split-K clamped to the K tiles of a small K), or None if it cannot."""
        problem = self.problem
        if not self.config.check(problem, device):
            return self.config
        clamped = self.config.replace(split_k=max(1, min(self.config.split_k, self.config.tiles_k(problem))))
        return None if clamped.check(problem, device) else clamped

    def __str__(self) -> str:
        return f"{self.config.name} {self.dtype}/{self.compute or 'default'} {self.case.name} {self.layout}"


def runs_for(config, dtype: str, compute: str, device: Device, offset: int = 0) -> list[Run]:
    """The config on every edge case and on two tiles, in layouts taken in turn (from `offset`):
    where it cannot run a case in that layout, the next layout it can."""
    runs = []
    for index, case in enumerate((tile_multiple(config), *EDGE_CASES)):
        for step in range(4):
            run = Run(config, case, LAYOUTS[(index + offset + step) % 4], dtype, compute)
            if run.runnable(device) is not None:
                runs.append(run)
                break
    return runs


def _operand(shape, batch, misalign, dtype, seed, fill=True):
    import cupy

    from autogemm.measure.bench import random_uniform

    full = (batch, *shape) if batch > 1 else shape
    rows, cols = shape
    if misalign:
        full = (batch, rows, cols + 3) if batch > 1 else (rows, cols + 3)
    x = random_uniform(full, dtype, seed=seed) if fill else cupy.empty(full, dtype="uint16" if dtype == "bfloat16" else dtype)
    return x[..., 1: cols + 1] if misalign else x


def operands(run: Run, seed: int, fill: bool = True):
    """(a, b, c) of a run, stored as its layout says; c is poisoned with NaN unless beta reads it."""
    import cupy

    from autogemm.measure.bench import poison, random_uniform

    p, case = run.problem, run.case
    a = _operand((p.k, p.m) if p.trans_a else (p.m, p.k), case.batch, case.misalign, run.dtype, seed, fill)
    b = _operand((p.n, p.k) if p.trans_b else (p.k, p.n), case.batch, case.misalign, run.dtype, seed + 1, fill)
    c_shape = (case.batch, p.m, p.n) if case.batch > 1 else (p.m, p.n)
    if case.beta != 0 and fill:
        c = random_uniform(c_shape, run.dtype, seed=seed + 2)
    else:
        c = cupy.empty(c_shape, dtype=a.dtype)
        poison(c)  # beta == 0 must never read C
    return a, b, c


def precompile(runs: list[Run], device: Device, jobs: int | None = None) -> int:
    """Compiles the kernel of every run in worker processes (cubins land in the shared cubin
    directory, where the runs' own compilation finds them); returns how many distinct kernels.
    pytest-xdist's workers each run a module's fixture: one of them compiles under a lock in that
    directory while the others wait, then find the cubins stored (each worker compiling them all at
    once put six times the work on the cores). `jobs`: compiler processes (default: all cores but one)."""
    from filelock import FileLock

    from autogemm.kernels import compile as kernel_compile
    from autogemm.gpu.launch import resolve
    from autogemm.kernels.render import render

    sources = {}
    for run in runs:
        config = run.runnable(device)
        a, b, c = operands(run, 0, fill=False)
        call = resolve(config, a, b, c, trans_a=run.problem.trans_a, trans_b=run.problem.trans_b,
                       alpha=run.case.alpha, beta=run.case.beta)
        if call.problem is not None:
            source = render(config, call.problem, call.widths)
            sources[source.kernel] = source
    with FileLock(os.path.join(os.environ["AUTOGEMM_CUBIN_DIR"], "precompile.lock")):
        # (compile_many starts no pool where every cubin is stored: the workers after the first find them)
        kernel_compile.compile_many(list(sources.values()), device.arch, jobs=jobs or max(1, (os.cpu_count() or 2) - 1))
    return len(sources)


def execute(run: Run, device: Device, seed: int) -> float:
    """Runs the case and checks every element against float64 (norm-wise and element-wise bounds,
    as tuning does); returns the relative error."""
    import cupy

    from autogemm.measure.bench import check_result, reference_gemm
    from autogemm.gpu.launch import gemm

    config, p, case = run.runnable(device), run.problem, run.case
    a, b, c = operands(run, seed)
    before = c.copy() if case.beta != 0 else None
    expected = reference_gemm(a, b, c, trans_a=p.trans_a, trans_b=p.trans_b, alpha=case.alpha, beta=case.beta)
    gemm(config, a, b, c, trans_a=p.trans_a, trans_b=p.trans_b, alpha=case.alpha, beta=case.beta)
    cupy.cuda.Device().synchronize()
    verdict = check_result(c, a, b, p, c=before, alpha=case.alpha, beta=case.beta, reference=expected)
    assert verdict.ok, f"{config.name} {run}: {verdict.message}"
    return verdict.rel_error
