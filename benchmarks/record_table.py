"""Measures every valid configuration of a (small) search space on this GPU and writes the table
that the tuner tests and the search-efficiency benchmark replay without a GPU.

    python benchmarks/record_table.py --space tests/data/simt_small.toml --M 4096 \\
        --out tests/data/simt_small_4096.jsonl

Each configuration goes through the tuner's own protocol (compiled ahead in worker processes,
verified on fresh inputs against float64 with the output poisoned, then timed); failures are kept
as rows with their kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from autogemm.results.provenance import now, runtime_versions
from autogemm.measure.evaluate import GpuEvaluator
from autogemm.measure.recorded import RecordedTable
from autogemm.gpu.launch import current_device
from autogemm.problem import Problem
from autogemm.kernels.render import template_hash
from autogemm.kernels.space import SearchSpace
from autogemm.tuning.tuner import default_jobs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", required=True)
    parser.add_argument("--M", type=int, default=4096)
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=default_jobs())
    args = parser.parse_args(argv)

    device = current_device()
    problem = Problem(args.M, args.M, args.M)
    space = SearchSpace.load(args.space)
    configs = space.valid_configs(problem, device)
    started = time.perf_counter()
    evaluator = GpuEvaluator(problem, device, args.jobs)
    rows = {}
    try:
        handles = [evaluator.start(c) for c in configs]  # the pool compiles them all, in order
        best_ms = None
        for i, (config, handle) in enumerate(zip(configs, handles)):
            m = evaluator.finish(handle, best_ms)
            rows[config.name] = m
            if m.ok and (best_ms is None or m.time_ms < best_ms):
                best_ms = m.time_ms
            if (i + 1) % 100 == 0:
                print(f"{i + 1}/{len(configs)} measured, best {problem.flops / best_ms / 1e9:.1f} TFLOP/s, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
    finally:
        evaluator.close()
    header = {
        "problem": problem.key,
        "device": dataclasses.asdict(device),
        "cublas_ms": evaluator.cublas_ms,
        "space": args.space,
        "template_hash": template_hash(),
        "versions": runtime_versions(),
        "date": now(),
        "note": "tuner protocol: verified (NaN-poisoned output, float64 reference), median of CUDA-event timings",
    }
    table = RecordedTable(problem, device, evaluator.cublas_ms, rows, header)
    table.write(args.out)
    ok = sum(m.ok for m in rows.values())
    name, best = table.best
    print(f"wrote {args.out}: {len(rows)} configs ({ok} ok) in {time.perf_counter() - started:.0f} s; "
          f"best {name} {best.tflops:.1f} TFLOP/s = {evaluator.cublas_ms / best.time_ms:.3f}x cuBLAS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
