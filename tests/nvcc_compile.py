"""Compiling a sample of (config, problem) variants with nvcc, for the no-GPU compile tests."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from autogemm.compile import CompileError, nvcc_resources
from autogemm.render import render


def compile_variants(variants, arch: str):
    """Compiles every variant in parallel; returns (results, errors, spilling): results as
    (config, problem, resource report or None) and the failures and spills as readable lines."""

    def compile_one(variant):
        config, problem = variant
        try:
            return config, problem, nvcc_resources(render(config, problem), arch), None
        except CompileError as exc:
            return config, problem, None, str(exc)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        compiled = list(pool.map(compile_one, variants))
    errors = [f"{c.name} {p}: {e}" for c, p, _, e in compiled if e]
    spilling = [
        f"{c.name} {p}: {u.kernel} spills {u.spills} bytes ({u.registers} registers)"
        for c, p, report, _ in compiled
        if report and not getattr(c, "max_registers", 0)  # under an explicit cap, refused when loaded
        for u in report.values()
        if u.spills or u.stack_bytes
    ]
    return [(c, p, r) for c, p, r, _ in compiled], errors, spilling
