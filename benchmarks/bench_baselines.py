"""The fallback autogemm serves where nothing generated is chosen (cuBLASLt with its heuristic and a
workspace, `cublas_gemm`) against what a user would call instead: torch.matmul and cupy.matmul on the
same memory, and cublasGemmEx (cuBLAS's legacy API, the call cupy.matmul makes) through the same
bindings. Each competitor is timed the same way (autogemm/measure/timing.py): GPU time in steady state behind
the gate, and latency one call at a time on an idle GPU, the competitors taking turns.

autogemm.matmul runs with an empty user cache and no shipped results, so every call is the fallback.
The bar: at least as fast as the faster of torch.matmul and cupy.matmul, in both figures, on every
shape. Writes benchmarks/results/baselines-<device>.md (and .json).

    python benchmarks/bench_baselines.py [--only TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import geomean, make_operands, problem_label, results_path  # noqa: E402

# (dtype, compute, layout, batch, M, N, K): decode and prefill products, squares, skinny and odd shapes
SHAPES = [
    ("float16", "fp32", "nn", 1, 1, 4096, 4096), ("float16", "fp32", "nt", 1, 16, 4096, 4096),
    ("float16", "fp32", "nt", 1, 64, 11008, 4096), ("float16", "fp32", "nn", 1, 256, 256, 256),
    ("float16", "fp32", "nn", 1, 1024, 1024, 1024), ("float16", "fp32", "nn", 1, 4096, 4096, 4096),
    ("float16", "fp32", "nt", 1, 2048, 4096, 4096), ("float16", "fp32", "nn", 1, 4096, 4096, 128),
    ("float16", "fp32", "nn", 1, 127, 4096, 4096), ("float16", "fp32", "nn", 32, 512, 512, 64),
    ("bfloat16", "fp32", "nt", 1, 8, 4096, 14336), ("bfloat16", "fp32", "nn", 1, 32, 8192, 8192),
    ("bfloat16", "fp32", "nn", 1, 1000, 1000, 1000), ("bfloat16", "fp32", "nt", 1, 4096, 14336, 4096),
    ("bfloat16", "fp32", "nn", 1, 8192, 8192, 8192),
    ("float32", "fp32", "nn", 1, 256, 256, 256), ("float32", "fp32", "nn", 1, 1024, 1024, 1024),
    ("float32", "fp32", "nn", 1, 4096, 4096, 4096), ("float32", "fp32", "nn", 1, 127, 4096, 4096),
    ("float32", "fp32", "nn", 1, 8192, 64, 8192), ("float32", "fp32", "tn", 1, 4096, 4096, 128),
    ("float32", "tf32", "nn", 1, 1024, 1024, 1024), ("float32", "tf32", "nt", 1, 4096, 4096, 4096),
    ("float64", "fp64", "nn", 1, 512, 512, 512), ("float64", "fp64", "nn", 1, 2048, 2048, 2048),
]
AUTOGEMM, LEGACY = "autogemm.matmul", "cublasGemmEx"


def measure_one(spec) -> dict:
    import autogemm
    from autogemm.measure import baselines
    from autogemm.measure.bench import relative_error, tolerance
    from autogemm.gpu.operands import describe

    problem, a, b = make_operands(spec, seed=0)
    compute = problem.compute if problem.compute == "tf32" else None
    calls = {AUTOGEMM: lambda: autogemm.matmul(a, b, compute=compute)}
    calls.update(baselines.user_calls(a, b, problem.compute))
    import cupy

    out = cupy.empty(calls[AUTOGEMM]().shape, dtype=a.dtype)
    layouts = [describe(x, name).layout() for x, name in ((a, "a"), (b, "b"), (out, "out"))]
    from autogemm.gpu.cublas_gemm import cublas_launcher

    gemmex = cublas_launcher(problem, *layouts, api="gemmex")

    def legacy():
        gemmex(layouts[0].pointer, layouts[1].pointer, out.data.ptr, 1.0, 0.0)
        return out

    calls[LEGACY] = legacy
    reference = _values(calls[baselines.CUPY_MATMUL](), problem)
    for name, call in calls.items():
        error = relative_error(_values(call(), problem), reference)
        if not error <= 2 * tolerance(problem):
            raise SystemExit(f"{problem.key}: {name} differs from cupy.matmul by {error:.3g}")
    figures = baselines.measure(calls)
    gpu, latency, gpu_name, latency_name = baselines.faster_baseline(figures)
    ours = figures[AUTOGEMM]
    return {"problem": problem.key, "label": problem_label(problem),
            "figures": {name: {"gpu_us": f.gpu_us, "latency_us": f.latency_us, "spread": f.spread}
                        for name, f in figures.items()},
            "gpu_ratio": gpu / ours.gpu_us, "latency_ratio": latency / ours.latency_us,
            "faster_gpu": gpu_name, "faster_latency": latency_name,
            "legacy_gpu_ratio": figures[LEGACY].gpu_us / ours.gpu_us}


def _values(result, problem):
    """A result of any competitor (CuPy array or PyTorch tensor) as float64 CuPy values."""
    import cupy

    from autogemm.measure.bench import to_float64

    if not isinstance(result, cupy.ndarray):  # a PyTorch tensor
        import torch

        result = cupy.asarray(result.view(torch.int16)).view("uint16") if problem.dtype == "bfloat16" \
            else cupy.asarray(result)
    if problem.dtype == "bfloat16":
        result = result.view("uint16")
    return to_float64(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="only shapes whose label contains one of these comma-separated texts")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one shape, in a TF32 process
    args = parser.parse_args()
    os.environ.setdefault("AUTOGEMM_CACHE_DIR", tempfile.mkdtemp(prefix="autogemm-baselines-"))
    import autogemm.results.cache

    autogemm.results.cache.shipped_cache_dir = lambda: None  # the fallback everywhere
    if args.child:
        print(json.dumps(measure_one(json.loads(args.child))))
        return 0
    from autogemm.gpu.launch import current_device

    wanted = args.only.split(",") if args.only else None
    rows = []
    for spec in SHAPES:
        label = "/".join(map(str, spec))
        if wanted and not any(text in label for text in wanted):
            continue
        if spec[1] == "tf32":
            child = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                   text=True, env={**os.environ, "CUPY_TF32": "1"})
            if child.returncode:
                raise SystemExit(f"{label}: the TF32 process failed:\n{child.stderr[-3000:]}")
            row = json.loads(child.stdout.strip().splitlines()[-1])
        else:
            row = measure_one(spec)
        rows.append(row)
        f = row["figures"]
        print(f"{row['label']:<36} gpu {row['gpu_ratio']:.3f} (legacy {row['legacy_gpu_ratio']:.3f}) latency "
              f"{row['latency_ratio']:.3f}  " + "  ".join(f"{n} {v['gpu_us']:.1f}/{v['latency_us']:.1f}"
                                                        for n, v in f.items()), flush=True)
    device = current_device()
    lines = [f"# The served fallback against torch.matmul and cupy.matmul on {device.name}", "",
             "autogemm.matmul with nothing tuned (cuBLASLt, its heuristic, a 32 MiB workspace) against the faster "
             "of torch.matmul and cupy.matmul, each timed the same way in one run (autogemm/measure/timing.py). "
             "Ratios > 1: autogemm is faster. GPU time in steady state (>= 100 ms of work behind the gate); latency "
             "one call at a time on an idle GPU (median of 25). Figures in us: GPU time / latency.", "",
             "| problem | GPU ratio | latency ratio | autogemm | torch.matmul | cupy.matmul | cublasGemmEx |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        f = row["figures"]
        cell = lambda n: f"{f[n]['gpu_us']:.1f} / {f[n]['latency_us']:.1f}" if n in f else "-"  # noqa: E731
        lines.append(f"| {row['label']} | {row['gpu_ratio']:.3f} | {row['latency_ratio']:.3f} | {cell(AUTOGEMM)} | "
                     f"{cell('torch.matmul')} | {cell('cupy.matmul')} | {cell(LEGACY)} |")
    lines += ["", f"GPU ratio: geomean {geomean(r['gpu_ratio'] for r in rows):.3f}, min "
              f"{min(r['gpu_ratio'] for r in rows):.3f}; latency ratio: geomean "
              f"{geomean(r['latency_ratio'] for r in rows):.3f}, min {min(r['latency_ratio'] for r in rows):.3f}"]
    path = results_path(f"baselines-{device.slug}")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"device": device.name, "rows": rows}, indent=1))
    print("\n".join(lines[-1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
