"""FP8 on Hopper: autogemm's FP8 kernels (the Hopper family's wgmma m64nNk32 path) against
torch._scaled_mm (cuBLASLt's FP8) on the same bits and scales, in the same run.

Problems: 4096³ and 8192³, and Llama-3 8B and 70B linear layers (the up projection, N = intermediate and
K = hidden; the down projection, N = hidden and K = intermediate) at M (tokens) in 16, 128 and 4096; e4m3
operands, A M × K and B N × K (as torch._scaled_mm takes a and b = w.t()), D in BF16. Per-tensor scales for
every problem; per-row scales too with --row, block scales (1 × 128 for A, 128 × 128 for B, promoted into
FP32 every 128 of K) with --block.

Competitors, each checked first (autogemm's kernels against the float64 reference of the operands' values,
within `check_epilogue_result`'s bound; torch's relative error is reported):
- torch._scaled_mm with torch's default use_fast_accum=False: the baseline of the ratio;
- torch._scaled_mm with use_fast_accum=True: reported (cuBLASLt adds its partial sums up in FP32 less often);
- autogemm: the fastest of the hopper_fp8 search space's seed configs and the kernel the problem's tune
  found, whether the record kept it or kept torch (campaigns/fp8.toml ships the records);
- served: what `scaled_matmul` runs, the record's kernel where a tune kept one, else torch._scaled_mm itself
  (ratio 1); and its latency, single calls on an idle GPU with host time included, against torch._scaled_mm
  called directly.

Timing: GPU time, back-to-back calls behind the gate (`autogemm.measure.timing.gpu_time`), the same for
every competitor. Ratio = torch._scaled_mm's time / autogemm's (> 1: autogemm is faster). Block scales
against per-tensor ones (with --block): autogemm's fastest kernel of each, timed by turns on the same
problem in --alternate-rounds rounds, the median round's ratio; the scalings' sections run minutes apart,
and an H100 running FP8 back to back changes its clock under the power limit in between (at 8192³ the
sections' figures put the block kernel at 0.82 and at 0.88 of per tensor in two runs of the same code).
Writes benchmarks/results/fp8-<device>.md (and .json).

    python benchmarks/bench_fp8.py
    python benchmarks/bench_fp8.py --shapes 8192x8192x8192 --row    # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import geomean, results_path  # noqa: E402

MODELS = {"Llama-3-8B": (4096, 14336), "Llama-3-70B": (8192, 28672)}  # (hidden, intermediate)
MS = (16, 128, 4096)
SQUARES = (4096, 8192)
GPU_TIME_MS = 40.0
DTYPE = "float8_e4m3fn"
TORCH, FAST, AUTOGEMM = "torch._scaled_mm", "torch._scaled_mm fast accum", "autogemm"
SERVED = "autogemm.scaled_matmul"
LATENCY_ROUNDS = 25
ALTERNATE_ROUNDS = 5


def problems(shapes: list[str] | None) -> list[tuple[str, int, int, int]]:
    """(label, M, N, K) of the run."""
    if shapes:
        return [("given", *map(int, shape.split("x"))) for shape in shapes]
    rows = [(f"{size}³", size, size, size) for size in SQUARES]
    for model, (hidden, intermediate) in MODELS.items():
        for layer, (n, k) in (("up", (intermediate, hidden)), ("down", (hidden, intermediate))):
            rows += [(f"{model} {layer}", m, n, k) for m in MS]
    return rows


def operands(m: int, n: int, k: int, scaling: str) -> tuple:
    """e4m3 A (M × K) and B (N × K) with values in (-1, 1), and the scaling's FP32 scales, row-major (per tensor
    0.5 and 2; per row and per block in [0.5, 1.5)), on the GPU as CuPy arrays, seeded by the shape."""
    import cupy
    import numpy as np

    from autogemm import fp8

    rng = cupy.random.default_rng(m * 31 + n + k)
    a = fp8.quantize(rng.random((m, k), dtype=np.float32) * 2 - 1, DTYPE, cupy)
    b = fp8.quantize(rng.random((n, k), dtype=np.float32) * 2 - 1, DTYPE, cupy)
    if scaling == "tensor":
        scale_a, scale_b = cupy.array([0.5], dtype=np.float32), cupy.array([2.0], dtype=np.float32)
    elif scaling == "row":
        scale_a = (rng.random((m, 1), dtype=np.float32) + 0.5).astype(np.float32)
        scale_b = (rng.random((1, n), dtype=np.float32) + 0.5).astype(np.float32)
    else:  # 1 x 128 for A, 128 x 128 for B
        scale_a = (rng.random((m, -(-k // 128)), dtype=np.float32) + 0.5).astype(np.float32)
        scale_b = (rng.random((-(-k // 128), -(-n // 128)), dtype=np.float32) + 0.5).astype(np.float32)
    return a, b, scale_a, scale_b


def torch_operands(a, b, scale_a, scale_b, scaling: str) -> tuple:
    """(a, b, scale_a, scale_b) as torch._scaled_mm takes them (b = the N × K array's transpose; block scales in
    its outer-dimension-major layout), and the scales the kernels are given: the very ones torch is given, as
    scaled_matmul passes them on (the values are the operands'; a check reads the row-major arrays)."""
    import cupy
    import torch

    from autogemm.gpu.scaled_launch import torch_scales

    ta, tb = torch.from_dlpack(a).view(torch.float8_e4m3fn), torch.from_dlpack(b).view(torch.float8_e4m3fn).t()
    tsa, tsb = torch_scales(torch, torch.from_dlpack(scale_a), torch.from_dlpack(scale_b), scaling)
    kernel_scales = (cupy.from_dlpack(tsa), cupy.from_dlpack(tsb)) if scaling == "block" else (scale_a, scale_b)
    return ta, tb, tsa, tsb, kernel_scales


def checked_kernel(config, a, b, scale_a, scale_b, kernel_scales, scaling: str, references=None) -> tuple:
    """autogemm's kernel `config` on one problem's operands (`kernel_scales`: the scales as torch is given them,
    torch_operands), run once into a NaN-poisoned D and checked against the float64 product of the operands'
    values (`references`: those values, where the caller holds them); (its runner, the verdict). SystemExit,
    naming the kernel, where it is wrong."""
    import cupy

    from autogemm import fp8
    from autogemm.gpu.scaled_launch import bind_scaled, scaled_problem
    from autogemm.measure.bench import check_epilogue_result, poison

    (m, k), n = a.shape, b.shape[0]
    a64, b64 = references if references is not None else (fp8.to_float64(a, DTYPE, cupy), fp8.to_float64(b, DTYPE, cupy))
    run, d = bind_scaled(config, a, b, *kernel_scales, dtype=DTYPE, out_dtype="bfloat16")
    poison(d)
    run()
    verdict = check_epilogue_result(d, a64, b64, scaled_problem(m, n, k, DTYPE, scaling, "bfloat16", False),
                                    scale_a=scale_a, scale_b=scale_b)
    if not verdict.ok:
        raise SystemExit(f"{m}x{n}x{k} {scaling} scales: {config.name} is wrong: {verdict.message}")
    return run, verdict


def tensor_row_of(rows: list[dict], row: dict) -> dict | None:
    """The per-tensor row of `row`'s problem, where the run measured one."""
    return next((t for t in rows if t["scaling"] == "tensor" and (t["m"], t["n"], t["k"]) == (row["m"], row["n"], row["k"])),
                None)


def measure(label: str, m: int, n: int, k: int, scaling: str, gpu_time_ms: float) -> dict | None:
    import cupy
    import numpy as np
    import torch

    from autogemm import fp8
    from autogemm.epilogue import dequantized
    from autogemm.gpu.scaled_launch import scaled_problem
    from autogemm.kernels.space import SearchSpace
    from autogemm.measure import timing
    from autogemm.measure.bench import relative_error
    from autogemm.gpu.launch import current_device
    from autogemm.paths import search_spaces_dir
    from autogemm.results.cache import TuningCache

    a, b, scale_a, scale_b = operands(m, n, k, scaling)
    problem = scaled_problem(m, n, k, DTYPE, scaling, "bfloat16", False)
    a64, b64 = fp8.to_float64(a, DTYPE, cupy), fp8.to_float64(b, DTYPE, cupy)
    if scaling == "block":
        scaled_a, scaled_b = dequantized(a64, b64, scale_a, scale_b, cupy)
        expected = scaled_a @ scaled_b.T
    else:
        expected = (a64 @ b64.T) * (scale_a.astype(np.float64) * scale_b.astype(np.float64))
    ta, tb, tsa, tsb, kernel_scales = torch_operands(a, b, scale_a, scale_b, scaling)
    calls = {TORCH: lambda i: torch._scaled_mm(ta, tb, tsa, tsb, out_dtype=torch.bfloat16),
             FAST: lambda i: torch._scaled_mm(ta, tb, tsa, tsb, out_dtype=torch.bfloat16, use_fast_accum=True)}
    if scaling == "block":  # (cuBLASLt has no fast accumulation with block scales)
        del calls[FAST]
    try:
        errors = {name: relative_error(cupy.from_dlpack(call(0).float()), expected) for name, call in calls.items()}
    except RuntimeError as exc:  # (a shape torch does not take: the problem is left out)
        print(f"{label} {m}x{n}x{k} {scaling}: torch._scaled_mm refuses it ({str(exc).splitlines()[0][:120]}): "
              "left out", flush=True)
        return None
    row = {"label": label, "m": m, "n": n, "k": k, "scaling": scaling, "errors": errors, "kernels": {}}
    times = {name: timing.gpu_time(call, target_ms=gpu_time_ms).us for name, call in calls.items()}

    device = current_device()
    space = SearchSpace.load(search_spaces_dir() / "hopper_fp8.toml")
    # the problem's record (user cache or shipped) where a tune kept a kernel: what scaled_matmul serves
    found = TuningCache().lookup(problem, device.slug)
    record = found[0] if found is not None else None
    tuned = record.config_object if record is not None and not record.is_cublas else None
    row["served"] = tuned.name if tuned is not None else TORCH
    # the tune's best kernel too where the record kept torch: the search's finding, timed in this run
    found_by_tune = record.generated_config if record is not None else None
    candidates = list(space.seeds) + ([found_by_tune] if found_by_tune is not None and found_by_tune not in space.seeds
                                      else [])
    best = None
    for config in candidates:
        if config.check(problem, device):
            continue
        run, verdict = checked_kernel(config, a, b, scale_a, scale_b, kernel_scales, scaling, references=(a64, b64))
        us = timing.gpu_time(lambda i, run=run: run(), target_ms=gpu_time_ms).us
        row["kernels"][config.name] = {"us": us, "rel_error": verdict.rel_error}
        if best is None or us < row["kernels"][best]["us"]:
            best = config.name
    if best is not None:
        times[AUTOGEMM] = row["kernels"][best]["us"]
        errors[AUTOGEMM] = row["kernels"][best]["rel_error"]
        row["best"] = best
    row["us"] = times
    row["tflops"] = {name: 2 * m * n * k / (us * 1e-6) / 1e12 for name, us in times.items()}
    row["ratio"] = times[TORCH] / times[AUTOGEMM] if AUTOGEMM in times else None
    # what a user meets: the record's kernel where a tune kept one (timed here), else torch._scaled_mm itself
    row["served_ratio"] = times[TORCH] / row["kernels"][tuned.name]["us"] if tuned is not None else 1.0
    # and one call at a time on an idle GPU, host time included: scaled_matmul as a user calls it, against
    # torch._scaled_mm called directly (the same tensors and scales)
    import autogemm

    # (the scales as torch takes them: block scales in its outer-dimension-major layout, which scaled_matmul takes too)
    served = lambda: autogemm.scaled_matmul(ta, tb, tsa, tsb, out_dtype=torch.bfloat16)  # noqa: E731
    waits = timing.latencies({TORCH: lambda: calls[TORCH](0), SERVED: served}, rounds=LATENCY_ROUNDS)
    row["latency_us"] = {name: statistics.median(values) * 1e3 for name, values in waits.items()}
    row["latency_ratio"] = row["latency_us"][TORCH] / row["latency_us"][SERVED]
    row["ratio_fast"] = times[FAST] / times[AUTOGEMM] if AUTOGEMM in times and FAST in times else None
    return row


def block_against_tensor(m: int, n: int, k: int, tensor_config: str, block_config: str, rounds: int,
                         gpu_time_ms: float) -> list[float]:
    """autogemm's block-scaled kernel against its per-tensor one on one problem: each checked against the float64
    reference, then timed by turns (the first of a round alternating), `rounds` rounds; each round's per-tensor
    time / block time (< 1: block scales are slower)."""
    from autogemm.families import config_from_name
    from autogemm.measure import timing

    runs = {}
    for scaling, name in (("tensor", tensor_config), ("block", block_config)):
        a, b, scale_a, scale_b = operands(m, n, k, scaling)
        kernel_scales = torch_operands(a, b, scale_a, scale_b, scaling)[4]
        runs[scaling] = checked_kernel(config_from_name(name), a, b, scale_a, scale_b, kernel_scales, scaling)[0]
    ratios = []
    for round_ in range(rounds):
        order = ("tensor", "block") if round_ % 2 == 0 else ("block", "tensor")
        us = {s: timing.gpu_time(lambda i, run=runs[s]: run(), target_ms=gpu_time_ms).us for s in order}
        ratios.append(us["tensor"] / us["block"])
    return ratios


def report(rows: list[dict], device, args) -> list[str]:
    lines = [f"# FP8 on {device.name}", "",
             f"`benchmarks/bench_fp8.py` ({time.strftime('%Y-%m-%d')}): e4m3 operands (A M × K, B N × K), D in BF16, "
             "autogemm's FP8 kernels against torch._scaled_mm on the same bits and scales (block scales in torch's "
             "outer-dimension-major layout for both), in the same run. GPU time "
             f"(back-to-back calls behind the gate, {args.gpu_time_ms:g} ms of work a competitor). autogemm: the "
             "fastest of the hopper_fp8 space's seed configs and the kernel the problem's tune found (kept or not), "
             "each checked against the float64 reference first. Served: what `scaled_matmul` runs, the record's "
             "kernel where a tune kept one (its time in this run), else torch._scaled_mm itself (ratio 1). Ratio: torch._scaled_mm's time / autogemm's (> 1: autogemm is faster). "
             "Errors: relative (Frobenius) to the float64 product of the operands' values.", ""]
    for scaling in ("tensor", "row", "block"):
        measured = [r for r in rows if r["scaling"] == scaling and r["ratio"] is not None]
        if measured:
            served = [r["served_ratio"] for r in measured]
            kernels = sum(r["served"] != TORCH for r in measured)
            lines.append(f"- per {scaling}, as `scaled_matmul` serves it (a tuned record's kernel, else torch._scaled_mm "
                         f"itself): geomean **{geomean(served):.3f}x** (min {min(served):.3f}x), a kernel on "
                         f"{kernels} of {len(measured)}")
            latency = [r["latency_ratio"] for r in measured]
            lines.append(f"- per {scaling}, one call at a time on an idle GPU (host time included): scaled_matmul's "
                         f"latency against torch._scaled_mm called directly: geomean **{geomean(latency):.3f}x** "
                         f"(min {min(latency):.3f}x)")
            fast = [r["ratio_fast"] for r in measured if r["ratio_fast"] is not None]
            lines.append(f"- per {scaling}: geomean **{geomean([r['ratio'] for r in measured]):.3f}x** torch._scaled_mm "
                         f"over {len(measured)} problems (min {min(r['ratio'] for r in measured):.3f}x)"
                         + (f"; {geomean(fast):.3f}x its fast accumulation" if fast else
                            " (cuBLASLt has no fast accumulation with block scales)"))
    for r in rows:  # block scales against per-tensor ones on the same problem, both autogemm's
        same = tensor_row_of(rows, r)
        if r["scaling"] == "block" and same and "against_tensor" in r:
            ratios = r["against_tensor"]
            lines.append(f"- {r['label']}: block scales at **{statistics.median(ratios):.3f}** of per-tensor scales' "
                         f"speed, by turns ({len(ratios)} rounds, {min(ratios):.3f}-{max(ratios):.3f}); in the "
                         f"sections, minutes apart: {r['tflops'][AUTOGEMM]:.0f} TFLOP/s against "
                         f"{same['tflops'][AUTOGEMM]:.0f}, {same['us'][AUTOGEMM] / r['us'][AUTOGEMM]:.3f}")
        elif r["scaling"] == "block" and same and AUTOGEMM in r["us"] and AUTOGEMM in same["us"]:  # (no rounds)
            lines.append(f"- {r['label']}: block scales at {r['tflops'][AUTOGEMM]:.0f} TFLOP/s, "
                         f"{same['us'][AUTOGEMM] / r['us'][AUTOGEMM]:.3f} of per-tensor scales' speed in the "
                         f"sections, minutes apart ({same['tflops'][AUTOGEMM]:.0f} TFLOP/s)")
    lines += ["", "| problem | M | N | K | scales | autogemm TFLOP/s | torch TFLOP/s | ratio | fast accum TFLOP/s | "
              "ratio to fast | error autogemm | error torch | error fast | kernel | served | latency us | latency ratio |",
              "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"]
    for r in rows:
        t, e = r["tflops"], r["errors"]
        ours = f"{t[AUTOGEMM]:.0f}" if AUTOGEMM in t else "-"
        fast = f"{t[FAST]:.0f} | {r['ratio_fast']:.3f}x" if FAST in t else "- | -"
        error = lambda name: f"{e[name]:.1e}" if name in e else "-"  # noqa: E731
        lines.append(f"| {r['label']} | {r['m']} | {r['n']} | {r['k']} | {r['scaling']} | {ours} | {t[TORCH]:.0f} | "
                     f"{r['ratio']:.3f}x | {fast} | {error(AUTOGEMM)} | {error(TORCH)} | {error(FAST)} | "
                     f"{r.get('best', '-')} | {r['served']} {r['served_ratio']:.3f}x | "
                     f"{r['latency_us'][SERVED]:.1f} | {r['latency_ratio']:.3f}x |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", help="MxNxK problems instead of the published set")
    parser.add_argument("--row", action="store_true", help="per-row scales too")
    parser.add_argument("--block", action="store_true", help="block scales too (1 x 128 for A, 128 x 128 for B)")
    parser.add_argument("--gpu-time-ms", type=float, default=GPU_TIME_MS,
                        help=f"GPU time of each competitor, ms of work (default {GPU_TIME_MS:g})")
    parser.add_argument("--alternate-rounds", type=int, default=ALTERNATE_ROUNDS,
                        help="rounds of block against per-tensor kernels timed by turns, with --block "
                             f"(default {ALTERNATE_ROUNDS}; 0: none)")
    args = parser.parse_args(argv)
    if args.alternate_rounds < 0:
        parser.error(f"--alternate-rounds takes a count of 0 or more, got {args.alternate_rounds}")
    try:
        chosen = problems(args.shapes)
    except ValueError:
        parser.error(f"--shapes takes MxNxK, got {args.shapes}")
    import torch

    from autogemm.gpu.launch import current_device

    if not torch.cuda.is_available() or current_device().compute_capability != (9, 0):
        raise SystemExit("bench_fp8 needs an sm_90 GPU and PyTorch with CUDA")
    rows = []
    for scaling in ("tensor",) + (("row",) if args.row else ()) + (("block",) if args.block else ()):
        for label, m, n, k in chosen:
            row = measure(label, m, n, k, scaling, args.gpu_time_ms)
            if row is None:
                continue
            rows.append(row)
            print(f"{label:<18} {m}x{n}x{k} {scaling:<6} " + "  ".join(
                f"{name} {value:.0f}" for name, value in row["tflops"].items()) + f" TFLOP/s  ratio {row['ratio']:.3f}"
                f"  [{row.get('best')}]", flush=True)
            torch.cuda.empty_cache()
    for row in rows:  # (after every section: the kernels each scaling found fastest)
        tensor = tensor_row_of(rows, row)
        if row["scaling"] == "block" and args.alternate_rounds and tensor and "best" in row and "best" in tensor:
            row["against_tensor"] = block_against_tensor(row["m"], row["n"], row["k"], tensor["best"], row["best"],
                                                         args.alternate_rounds, args.gpu_time_ms)
            print(f"{row['label']:<18} {row['m']}x{row['n']}x{row['k']} block / tensor by turns: "
                  + " ".join(f"{ratio:.3f}" for ratio in row["against_tensor"]), flush=True)
            torch.cuda.empty_cache()
    device = current_device()
    path = results_path(f"fp8-{device.slug}" + ("" if not args.shapes else "-partial"))
    lines = report(rows, device, args)
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"device": device.name, "gpu_time_ms": args.gpu_time_ms,
                                                     "rows": rows}, indent=1))
    print("\n".join(lines[:8]))
    print(f"written: {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
