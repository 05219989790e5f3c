"""Grouped GEMM for mixture-of-experts layers: `autogemm.grouped_matmul` as it serves today against a loop
of `torch.matmul` over the experts and against `torch._grouped_mm`, in the same run, in BF16.

Layers: Mixtral-8x7B's (E = 8, K = 4096, N = 14336) and Qwen3-30B-A3B-like ones (E = 128, K = 2048,
N = 768 and 1536), at 4096 and 65536 routed rows (tokens sorted by expert), routed uniformly
(every expert the same count, give or take one) and skewed (counts falling as 1/rank^1.2, some experts
with none). A (total_M × K), the weights (E, K, N) as the transpose of contiguous (E, N, K) ones (torch's
Linear layout), the offsets on the GPU.

Competitors, each checked against the loop first (relative Frobenius error):
- the loop: torch.matmul on each expert's rows into the output's slice, the offsets read on the host
  beforehand (outside the timing: the loop's host sync is not charged to it);
- torch._grouped_mm: one launch, the offsets on the GPU;
- autogemm's grouped kernel (the Hopper family's, `gpu/grouped_launch.py`): the fastest of GROUPED_CONFIGS,
  untuned, each checked against the loop (a wrong one is reported and not timed);
- autogemm.grouped_matmul, told the routing bucket (`routing=`): what it serves, host checks included: the
  tuned grouped kernel where the problem's record of that bucket kept one (`autogemm tune --groups E
  --routing R`), else the faster baseline where the record kept one, else torch._grouped_mm, or the loop where
  each expert's product fills the GPU by itself.
  Where it serves the loop, the loop's time stands for it: it reads the offsets on the host each call, a
  sync that GPU time behind the gate cannot measure (timed so, it read 11-15% faster than the same loop:
  the batch ran unqueued).

Timing: GPU time, back-to-back calls behind the gate (`autogemm.measure.timing.gpu_time`), the same for
every competitor, in three rounds (the order rotated), each timing after 30 ms of its calls untimed (the
clocks settle under its load), each competitor's fastest round kept. Ratios: the loop's time / the
competitor's (> 1: faster than the loop), and torch._grouped_mm's time / autogemm's. Writes benchmarks/results/grouped-<device>.md (and .json).

    python benchmarks/bench_grouped.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import geomean, results_path  # noqa: E402

from autogemm.routing import ROUTINGS, counts_for, offsets_for  # noqa: E402

LAYERS = {"Mixtral-8x7B": (8, 4096, 14336), "Qwen3-30B-A3B-like N=1536": (128, 2048, 1536),
          "Qwen3-30B-A3B-like N=768": (128, 2048, 768)}  # (E, K, N)
TOKENS = (4096, 65536)
GPU_TIME_MS = 60.0
SOAK_MS = 30.0
LOOP, TORCH, SERVED = "loop of torch.matmul", "torch._grouped_mm", "autogemm.grouped_matmul"
KERNEL = "autogemm grouped kernel"
# the Hopper family's grouped kernels tried (the fastest is the KERNEL column): two consumers on 128 x 256 and
# 128 x 128 tiles, pingpong, and one consumer on 64-row tiles for groups of few rows
GROUPED_CONFIGS = ("hopper_128x256x64_w64x256_s3_g8_k1_o1_p", "hopper_128x128x64_w64x128_s5_g8_k1_o1_p",
                   "hopper_128x128x64_w64x128_s4_g8_k1_o1_p_pp", "hopper_64x128x64_w64x128_s6_g8_k1_o1_p")


def soak(call) -> None:
    """Runs `call` for about SOAK_MS untimed, so that the GPU's clocks settle under its load first."""
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    stop.record()
    stop.synchronize()
    for _ in range(min(200, int(SOAK_MS / max(start.elapsed_time(stop), 1e-3)))):
        call()
    torch.cuda.synchronize()


def measure(torch, label: str, experts: int, k: int, n: int, tokens: int, routing: str) -> dict:
    import autogemm
    from autogemm.measure import timing
    from autogemm.serving import grouped, grouped_plan

    counts = counts_for(experts, tokens, routing)
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(tokens, k, device="cuda", generator=generator) / k ** 0.25).to(torch.bfloat16)
    weights = (torch.randn(experts, n, k, device="cuda", generator=generator) / k ** 0.25).to(torch.bfloat16)
    b = weights.transpose(1, 2)
    ends = offsets_for(experts, tokens, routing)
    offsets = torch.tensor(ends, device="cuda", dtype=torch.int32)
    offs = offsets[1:].contiguous()
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)

    def loop():
        for e in range(experts):
            if ends[e + 1] > ends[e]:
                torch.matmul(a[ends[e]:ends[e + 1]], b[e], out=out[ends[e]:ends[e + 1]])
        return out

    calls = {LOOP: loop, SERVED: lambda: autogemm.grouped_matmul(a, b, offsets, routing=routing)}
    # where grouped_matmul serves the loop, it reads the offsets on the host each call: a sync inside the call,
    # which GPU time behind the gate cannot measure (the batch no longer queues); the loop's own time stands
    # for it (the same kernels; the sync costs the host, not the GPU)
    call = grouped.check_grouped(a, b, offsets, masked=False)
    plan = grouped_plan.kernel_plan(call, routing)
    tuned = isinstance(plan, grouped_plan.KernelPlan)
    serves_loop = not tuned and grouped_plan.serves_the_loop(torch, call, plan)
    served = f"tuned {plan.config.name}" if tuned else "loop" if serves_loop else TORCH
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is not None:
        calls[TORCH] = lambda: grouped_mm(a, b, offs=offs)
    # the grouped kernels: each checked against the loop below, the fastest kept as KERNEL
    from autogemm.families import config_from_name
    from autogemm.gpu.grouped_launch import bind_grouped, grouped_problem

    kernel_out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    problem = grouped_problem(tokens, n, k, experts, "bfloat16", True)
    kernels = {name: bind_grouped(config_from_name(name), problem, a.data_ptr(), b.data_ptr(), offsets.data_ptr(),
                                  kernel_out.data_ptr()) for name in GROUPED_CONFIGS}
    reference = loop().float().clone()
    errors = {}
    for name, call in list(calls.items()):
        try:
            value = call().float()
        except RuntimeError as exc:  # (torch refuses the call: left out)
            print(f"{label} {tokens} {routing}: {name} refuses it ({str(exc).splitlines()[0][:120]})", flush=True)
            del calls[name]
            continue
        errors[name] = float((value - reference).norm() / reference.norm().clamp(min=1e-30))
    flops = 2 * tokens * k * n
    kernel_us, kernel_errors = {}, {}
    for name, run in kernels.items():
        kernel_out.fill_(float("nan"))
        run()
        kernel_errors[name] = float((kernel_out.float() - reference).norm() / reference.norm().clamp(min=1e-30))
        if not kernel_errors[name] < 1e-2:  # (a wrong kernel is reported, never timed)
            print(f"{label} {tokens} {routing}: {name} is wrong (relative error {kernel_errors[name]:.1e})", flush=True)
            continue
        kernel_us[name] = timing.gpu_time(lambda i, run=run: run(), target_ms=GPU_TIME_MS).us
    # three rounds in rotated order, each competitor's fastest kept, each timing after SOAK_MS of the same calls
    # untimed: a large product's GPU time moves by several percent with the clocks, which follow the power
    # drawn just before (with two rounds and no soak, grouped_matmul serving torch._grouped_mm read 1-6%
    # faster than torch._grouped_mm itself, having followed the loop's light load each time)
    times: dict[str, float] = {}
    timed = [name for name in calls if not (name == SERVED and serves_loop)]
    for shift in range(3):
        for name in timed[shift % len(timed):] + timed[:shift % len(timed)]:
            # (the loop launches a product per expert with rows: the gated batches are cut to the launch queue)
            launches = sum(1 for count in counts if count) if name == LOOP else 1
            soak(calls[name])
            us = timing.gpu_time(lambda i, call=calls[name]: call(), target_ms=GPU_TIME_MS, launches_per_call=launches).us
            times[name] = min(us, times.get(name, us))
    if serves_loop:
        times[SERVED] = times[LOOP]
    times = {name: times[name] for name in calls}
    best = min(kernel_us, key=kernel_us.get) if kernel_us else None
    if best is not None:
        times[KERNEL] = kernel_us[best]
        errors[KERNEL] = kernel_errors[best]
    row = {"label": label, "experts": experts, "k": k, "n": n, "tokens": tokens, "routing": routing,
           "counts_min": min(counts), "counts_max": max(counts), "us": times, "errors": errors,
           "served": served, "kernel": best, "kernels_us": kernel_us,
           "tflops": {name: flops / (us * 1e-6) / 1e12 for name, us in times.items()}}
    print(f"{label:<30} {tokens:>6} {routing:<8} " + "  ".join(f"{name} {us:9.1f} us" for name, us in times.items()),
          flush=True)
    return row


def report(rows: list[dict], device_name: str) -> str:
    lines = [f"# Grouped GEMM on {device_name}", "",
             f"`benchmarks/bench_grouped.py` ({time.strftime('%Y-%m-%d')}): BF16 mixture-of-experts layers, the "
             "tokens sorted by expert (A total_M × K), the weights (E, K, N) as the transpose of contiguous (E, N, K) "
             "ones, offsets on the GPU. GPU time, back-to-back calls behind the gate, the same for every competitor, the "
             "fastest of three rounds (the order rotated, each timing after 30 ms of the same calls untimed). "
             f"Ratios: the {LOOP}'s time / the competitor's (> 1: faster than the loop, whose offsets were read on "
             f"the host beforehand). {KERNEL}: the Hopper family's grouped kernel, the fastest of "
             f"{', '.join(GROUPED_CONFIGS)}, untuned. {SERVED} (told the routing bucket) serves the tuned grouped kernel "
             "where the problem's record of that bucket kept one, else the faster baseline where the record kept one, "
             "else torch._grouped_mm, or the loop where each "
             "expert's product fills the GPU by itself.", ""]
    for name in (TORCH, SERVED):
        ratios = [r["us"][LOOP] / r["us"][name] for r in rows if name in r["us"]]
        if ratios:
            lines.append(f"- {name} against the loop: geomean **{geomean(ratios):.3f}x** (min {min(ratios):.3f}x) "
                         f"over {len(ratios)} problems")
    mine = [r["us"][LOOP] / r["us"][KERNEL] for r in rows if KERNEL in r["us"]]
    if mine:
        lines.append(f"- {KERNEL} (the fastest of {len(GROUPED_CONFIGS)} configs, no tuning) against the loop: geomean "
                     f"**{geomean(mine):.3f}x** (min {min(mine):.3f}x) over {len(mine)} problems")
    against_torch = [r["us"][TORCH] / r["us"][KERNEL] for r in rows if KERNEL in r["us"] and TORCH in r["us"]]
    if against_torch:
        lines.append(f"- {KERNEL} against torch._grouped_mm: geomean **{geomean(against_torch):.3f}x** "
                     f"(min {min(against_torch):.3f}x)")
    both = [r["us"][TORCH] / r["us"][SERVED] for r in rows if TORCH in r["us"] and SERVED in r["us"]]
    if both:
        tuned = sum(1 for r in rows if r["served"].startswith("tuned"))
        lines.append(f"- {SERVED} against torch._grouped_mm: geomean **{geomean(both):.3f}x** (min {min(both):.3f}x), "
                     f"the tuned kernel on {tuned} of {len(rows)} problems")
    lines += ["", "| layer | E | K | N | rows | routing | rows an expert (min-max) | loop us | torch._grouped_mm us | "
                  "served | served us | torch / loop | served / loop | served TFLOP/s | error torch | error served | kernel | "
                  "kernel us | kernel / loop | kernel / torch | kernel TFLOP/s | error kernel |",
              "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: "
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        us = r["us"]
        torch_us = f"{us[TORCH]:.1f}" if TORCH in us else "-"
        torch_ratio = f"{us[LOOP] / us[TORCH]:.3f}x" if TORCH in us else "-"
        lines.append(f"| {r['label']} | {r['experts']} | {r['k']} | {r['n']} | {r['tokens']} | {r['routing']} | "
                     f"{r['counts_min']}-{r['counts_max']} | {us[LOOP]:.1f} | {torch_us} | {r['served']} | {us[SERVED]:.1f} | "
                     f"{torch_ratio} | {us[LOOP] / us[SERVED]:.3f}x | {r['tflops'][SERVED]:.0f} | "
                     f"{r['errors'].get(TORCH, float('nan')):.1e} | {r['errors'][SERVED]:.1e} | " + (
                         f"{r['kernel']} | {us[KERNEL]:.1f} | {us[LOOP] / us[KERNEL]:.3f}x | "
                         f"{us[TORCH] / us[KERNEL]:.3f}x | {r['tflops'][KERNEL]:.0f} | {r['errors'][KERNEL]:.1e} |"
                         if KERNEL in us and TORCH in us else "- | - | - | - | - | - |"))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS), help="routed rows (default 4096 65536)")
    args = parser.parse_args()
    import torch

    from autogemm.gpu.launch import current_device

    if not torch.cuda.is_available():
        print("bench_grouped needs a CUDA GPU", file=sys.stderr)
        return 2
    device = current_device()
    rows = []
    for label, (experts, k, n) in LAYERS.items():
        for tokens in args.tokens:
            for routing in ROUTINGS:
                rows.append(measure(torch, label, experts, k, n, tokens, routing))
                torch.cuda.empty_cache()  # (the problem's tensors are gone with measure's frame)
    path = results_path(f"grouped-{device.slug}" + ("" if args.tokens == list(TOKENS) else "-partial"))
    path.with_suffix(".json").write_text(json.dumps({"device": device.name, "rows": rows}, indent=1) + "\n")
    text = report(rows, device.name)
    path.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
