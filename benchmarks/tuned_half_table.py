"""The table of benchmarks/bench_tuned_half.py's rows (`--report`): the classes of M, each row's GPU time,
eager and latency ratios with its noise, and the max-autotune rows where they were run. Its own module, so
that the draw and the measuring stay in the script and the table's format in one place; the names of the
competitors and the calls a CUDA graph holds are the rows' (the script measures with them)."""

from __future__ import annotations

import math
import statistics

from autogemm.measure.timing import SUSTAINED_ROUNDS  # (the eager rounds)
from bench_common import geomean, kernels_kept, mixed_codes, partial_draw, rounds_noise

AUTOGEMM, TORCH = "autogemm.matmul", "torch.matmul"
# calls of each competitor in its CUDA graph: the smallest product drawn (about 8 us) then replays for
# over 100 us, far over a replay's host time
GRAPH_CALLS = 16
M_CLASSES = ((640, "M <= 640"), (2048, "M <= 2048"), (math.inf, "M > 2048"))
# GPU time rounds a row is timed in (timing.sustained_times' rounds of about 50 ms a competitor). 60 since
# session 68: at 20, a row whose two sides were one kernel (cuBLAS kept, so torch.matmul against itself) measured
# 0.980, one of its rounds throttled on one side (341 against 290 us); one such round moves the mean of 20 by over
# 1%, of 60 by a third of that, and the noise of the paired ratios shrinks by sqrt(3). The eager rounds stay
# timing's default.
GPU_ROUNDS = 60
EARLIER_GPU_ROUNDS = 20  # what rows that do not record their rounds were timed in


def summary(rows) -> list[str]:
    lines = ["| class | problems | GPU time geomean | min | eager geomean | eager min | latency geomean | generated kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    low = 0
    for high, name in M_CLASSES:
        group = [r for r in rows if low < r["spec"][2] <= high]
        low = high
        if group:
            lines.append(_summary_row(name, group))
    for dtype in ("bfloat16", "float16"):
        group = [r for r in rows if r["spec"][0] == dtype]
        if group:
            lines.append(_summary_row(dtype, group))
    lines.append(_summary_row("all", rows))
    return lines


def inductor_summary(rows) -> list[str]:
    """max-autotune with autogemm among Inductor's choices against max-autotune without it (--inductor)."""
    timed = [r for r in rows if "inductor_ratio" in r]
    if not timed:
        return []
    lines = ["torch.compile(mode=\"max-autotune-no-cudagraphs\") of `a @ b`, with autogemm.torch.enable_inductor() "
             "against without it, each compiled afresh after the tune, timed sustained in the same rounds (ratio > 1: "
             "autogemm's choice is faster).", "", "| problem | without us | with autogemm us | ratio |",
             "| --- | ---: | ---: | ---: |"]
    for row in sorted(timed, key=lambda r: r["inductor_ratio"]):
        us = row["inductor_us"]
        lines.append(f"| {row['label']} | {us['max-autotune']:.1f} | {us['max-autotune + autogemm']:.1f} | "
                     f"{row['inductor_ratio']:.3f} |")
    lines.append(f"| geomean ({len(timed)}) | | | {geomean(r['inductor_ratio'] for r in timed):.3f} |")
    return lines + [""]


def _summary_row(name, group) -> str:
    ratios, eager = [r["ratio"] for r in group], [r["eager_ratio"] for r in group]
    return (f"| {name} | {len(group)} | {geomean(ratios):.3f} | {min(ratios):.3f} | {geomean(eager):.3f} | "
            f"{min(eager):.3f} | {geomean(r['latency_ratio'] for r in group):.3f} | {sum(r['generated'] for r in group)} |")


def paired_noise(row) -> float | None:
    """The noise of the row's GPU time ratio as the tune's keep rule measures a comparison's (timing.Sustained.noise:
    twice the standard error of the rounds' paired ratios, torch.matmul's time over autogemm.matmul's in the same
    round, over their mean, at least MIN_NOISE), a fraction of the ratio. None for a row without its rounds."""
    rounds = row.get("gpu_rounds_us") or {}
    return rounds_noise(rounds.get(AUTOGEMM) or [], rounds.get(TORCH) or [])


def gpu_rounds(rows) -> str:
    """The GPU time rounds the rows were timed in, as the table says it: "60", or "20 to 60" for a file of both."""
    counts = sorted({len(r["gpu_rounds_us"][TORCH]) if r.get("gpu_rounds_us") else EARLIER_GPU_ROUNDS for r in rows})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def report(rows, device_name: str, seed: int, drawn: int | None = None) -> list[str]:
    """The Markdown table of `rows`; `drawn`: the problems of the draw, said beside those run where fewer ran."""
    clocks = [r["sm_clock_mhz"] for r in rows if r.get("sm_clock_mhz")]
    power = [r["power_w"] for r in rows if r.get("power_w")]
    seen = (f" SM clock during the timings: median {statistics.median(clocks):.0f} MHz, board power median "
            f"{statistics.median(power):.0f} W." if clocks else "")
    lines = [f"# Tuned half precision: {device_name}, seed {seed}", "", *mixed_codes(rows),
             *partial_draw(rows, drawn),
             f"{len(rows)} BF16 and FP16 problems drawn by benchmarks/bench_tuned_half.py (seed {seed}), none of "
             "them in campaigns/, cache/ or another benchmark. Each tuned with the default budget "
             "(`autogemm.tune(problem)`) in a user cache of its own, the shipped results on"
             f"{kernels_kept(rows)}; then autogemm.matmul and "
             "torch.matmul on the same PyTorch tensors. Ratios are torch.matmul's time over autogemm.matmul's (> 1: "
             "autogemm is faster). GPU time: "
             f"{GRAPH_CALLS} calls captured in a CUDA graph, the graphs replayed back to back in {gpu_rounds(rows)} rounds of "
             "about 50 ms each in random order (means), so that clocks and power settle and the host's time is not in it. "
             f"Eager: {SUSTAINED_ROUNDS} such rounds of plain calls from Python, where a product shorter than a call's "
             "host time measures the host. "
             f"Latency: one call at a time on an idle GPU, host time included (medians of 25).{seen} Noise: the GPU time "
             "ratio's, as a tune measures its own comparison's: twice the standard error of the rounds' paired ratios "
             "(torch.matmul's time over autogemm.matmul's in the same round) over their mean, at least 1%. Where the tune kept cuBLAS, autogemm.matmul "
             "hands PyTorch tensors to torch.matmul itself, so such a row times torch.matmul against itself.", "",
             *summary(rows), "", *inductor_summary(rows),
             "| problem | GPU time ratio | noise | eager ratio | latency ratio | autogemm us | torch us | tune | served by "
             "| waves |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: r["ratio"]):
        us = row["gpu_us"]
        tune = "cuBLAS kept" if row["kept_cublas"] else f"kernel {row['tune_ratio']:.3f}x"
        served = row["source"] + (f": {row['config']}" if row["config"] else "")
        noise = paired_noise(row)
        lines.append(f"| {row['label']} | {row['ratio']:.3f} | {'' if noise is None else f'±{100 * noise:.1f}%'} | "
                     f"{row['eager_ratio']:.3f} | {row['latency_ratio']:.3f} | "
                     f"{us[AUTOGEMM]:.1f} | {us[TORCH]:.1f} | {tune} | {served} | "
                     f"{row['waves'] or row['tuned_waves'] + ' (best generated)'} |")
    return lines
