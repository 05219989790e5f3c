"""The table of benchmarks/bench_unseen_epilogues.py's rows (`--report`): each layer's ratios to eager,
torch.compile and cuBLASLt's epilogue, untuned and tuned, sustained and in latency; the ceiling (eager over the
GEMM alone) and the share of it captured. Its own module, as tuned_half_table.py is the tuned-half bench's: the
draw and the measuring stay in the script, the table's format here; the names of the competitors and the single
calls a latency is the median of are the rows' (the script measures with them)."""

from __future__ import annotations

import statistics

from bench_common import geomean, kernels_kept, mixed_codes, partial_draw, rounds_noise

CAPTURE_FROM_M = 1024  # the share of the ceiling captured is judged from this M up
LATENCY_ROUNDS = 200  # single calls a competitor (cheap; bench_epilogues' ROUNDS says why not 25)
AUTOGEMM, EAGER, COMPILED, CUBLASLT = "autogemm", "eager", "torch.compile", "cuBLASLt epilogue"
AUTOGEMM_TANH = "autogemm (gelu_tanh)"  # timed beside cuBLASLt's tanh GELU
GEMM_ALONE = "GEMM alone"
# eager timed a second time under another name, one call at a time only: what a latency ratio moves by between two
# identical competitors (`latency_floor`), beside the bar of 0.98x on every row
EAGER_AGAIN = "eager (again)"
COMPETITORS = (EAGER, COMPILED, CUBLASLT)


def ours_against(name: str, figures: dict) -> str:
    """Which of autogemm's timings in `figures` the competitor `name` is compared with: against cuBLASLt, autogemm
    with cuBLASLt's GELU form where that was timed."""
    return AUTOGEMM_TANH if name == CUBLASLT and AUTOGEMM_TANH in figures else AUTOGEMM


def ratio(figures: dict, name: str) -> float | None:
    """The competitor's time over autogemm's (ours_against: the same GELU form as cuBLASLt's)."""
    if name not in figures:
        return None
    return figures[name] / figures[ours_against(name, figures)]


def ceiling(figures: dict) -> tuple[float, float | None]:
    """(eager over the GEMM alone, the share of that gain autogemm captures; None where eager's epilogue
    costs nothing measurable)."""
    eager, alone, ours = figures[EAGER], figures[GEMM_ALONE], figures[AUTOGEMM]
    return eager / alone, ((eager - ours) / (eager - alone) if eager > alone else None)


def ceiling_noise(phase: dict) -> float | None:
    """How far the ceiling (eager over the GEMM alone) may be off, as the tune measures a comparison's noise
    (timing.Sustained.noise: twice the standard error of the rounds' paired ratios over their mean, at least 1%);
    None for a phase timed before its rounds were kept. A share of a gain within that noise is a share of noise:
    a bias that cuBLASLt adds in its epilogue for eager costs it nothing measurable."""
    rounds = phase.get("sustained_rounds_us") or {}
    return rounds_noise(rounds.get(GEMM_ALONE) or [], rounds.get(EAGER) or [])


def within_noise(phase: dict) -> bool:
    """Whether eager beats the GEMM alone by no more than their rounds' noise, where the keep rule would call a
    kernel no faster than cuBLAS (tuning/outcome.py keeps_cublas). False for a phase without its rounds."""
    noise = ceiling_noise(phase)
    return noise is not None and ceiling(phase["sustained_us"])[0] <= 1 + noise


def judged_share(phase: dict) -> float | None:
    """The share of the ceiling captured where it is judged: a gain that is not within its noise (within_noise)."""
    return None if within_noise(phase) else ceiling(phase["sustained_us"])[1]


def latency_rounds(rows: list[dict]) -> str:
    """The single calls each latency is the median of, as the rows say (rows of before it was recorded: 25)."""
    counts = sorted({r[phase].get("latency_rounds", 25) for r in rows for phase in ("untuned", "tuned") if phase in r})
    return " or ".join(map(str, counts)) or str(LATENCY_ROUNDS)


def latency_floor(rows: list[dict]) -> list[str]:
    """A line on eager against itself one call at a time (EAGER over EAGER_AGAIN, as a ratio's competitor over
    autogemm, both phases of the rows that timed it): how far a row's latency ratio moves with no difference
    between the two sides; none without them."""
    values = [r[phase]["latency_us"][EAGER] / r[phase]["latency_us"][EAGER_AGAIN] for r in rows
              for phase in ("untuned", "tuned") if EAGER_AGAIN in r[phase]["latency_us"]]
    if not values:
        return []
    return ["", f"Eager against itself, one call at a time (the same layer timed twice under two names, {len(values)} "
                f"phases): {min(values):.3f} to {max(values):.3f}, geomean {geomean(values):.3f}. A row's latency ratio "
                f"moves by as much with no difference between the two sides.", *paired_latency(rows)]


def paired_latency(rows: list[dict]) -> list[str]:
    """A line on the latency ratios paired by round (bench_unseen_epilogues.paired_latency: the median of each round's
    ratio, where the table's are ratios of medians), over the phases that kept them: eager against itself, and each
    phase's ratio to eager. Beside the line above, it says whether pairing narrows the noise; none without them."""
    floor = [r[phase]["latency_paired_floor"] for r in rows for phase in ("untuned", "tuned")
             if "latency_paired_floor" in r[phase]]
    if not floor:
        return []
    against = []
    for phase in ("untuned", "tuned"):
        values = [r[phase]["latency_paired"][EAGER] for r in rows if EAGER in r[phase].get("latency_paired", {})]
        if values:
            against.append(f"{phase} {geomean(values):.3f}x eager (min {min(values):.3f}, {len(values)} problems)")
    return ["", f"Paired by round instead (the median of each round's ratio, the calls of a round adjacent in time): eager "
            f"against itself {min(floor):.3f} to {max(floor):.3f} over {len(floor)} phases; " + "; ".join(against) + "."]


def served_over_tuned(row: dict) -> float | None:
    """The served layer's sustained time over its tune's own time of the kernel it kept, where the tune kept one,
    timed it sustained and the layer was served by it (the row's `tune` figures and its served column; None
    otherwise, and for rows of before the figures were kept). Above 1: the kernel served slower than its tune timed
    it, and the tune's lead over the baselines overstates the draw's."""
    tune = row.get("tune") or {}
    if tune.get("kept_cublas", True) or not tune.get("kernel_us") or not tune.get("sustained") \
            or f" {tune.get('config')} " not in row["tuned"].get("served", ""):
        return None
    return row["tuned"]["sustained_us"][AUTOGEMM] / tune["kernel_us"]


def tune_against_draw(rows: list[dict]) -> list[str]:
    """A line on how the kept kernels served against their tunes' own sustained times; none where no row has both."""
    values = [v for r in rows if (v := served_over_tuned(r)) is not None]
    if not values:
        return []
    layers = f"{len(values)} layer" + ("s" if len(values) > 1 else "")
    return ["", f"Where a tune kept a kernel timed sustained ({layers}), the served layer took "
                f"{min(values):.3f} to {max(values):.3f}x the tune's own time of that kernel (geomean "
                f"{geomean(values):.3f}): above 1, it served slower than its tune timed it."]


def summary(rows: list[dict]) -> list[str]:
    """The figures the epilogue issue judges, each over the rows that have it."""
    lines = ["| phase | figure | against | problems | geomean | min |", "| --- | --- | --- | ---: | ---: | ---: |"]
    for phase in ("untuned", "tuned"):
        for figure in ("sustained_us", "latency_us"):
            for name in COMPETITORS:
                values = [v for r in rows if (v := ratio(r[phase][figure], name)) is not None]
                if values:
                    lines.append(f"| {phase} | {figure.removesuffix('_us')} | {name} | {len(values)} | "
                                 f"{geomean(values):.3f} | {min(values):.3f} |")
    large = [r for r in rows if r["spec"][2] >= CAPTURE_FROM_M]
    judged = [share for r in large if (share := judged_share(r["tuned"])) is not None]
    within = sum(ceiling(r["tuned"]["sustained_us"])[1] is not None and within_noise(r["tuned"]) for r in large)
    if judged:
        lines += ["", f"Tuned, sustained, at M >= {CAPTURE_FROM_M}: the share of eager's gain over the GEMM alone "
                      f"captured is at least 60% on {sum(s >= 0.6 for s in judged)} of {len(judged)} problems "
                      f"(median {statistics.median(judged):.0%}, min {min(judged):.0%})"
                      + (f"; on {within} more eager's gain over the GEMM alone is within its noise, and not judged."
                         if within else ".")]
    return lines + latency_floor(rows) + tune_against_draw(rows)


def report(rows: list[dict], device_name: str, seed: int, drawn: int | None = None) -> list[str]:
    """The Markdown table of `rows`; `drawn`: the layers of the draw, said beside those run where fewer ran."""
    ms = [row["spec"][2] for row in rows]
    lines = [f"# Unseen epilogue layers: {device_name}, seed {seed}", "", *mixed_codes(rows),
             *partial_draw(rows, drawn, "layers"),
             f"{len(rows)} layers drawn by benchmarks/bench_unseen_epilogues.py (seed {seed}): BF16 and FP16, "
             "bias, bias + GELU, bias + SiLU and residual, widths of model families no campaign names, M drawn from "
             f"1 to 8192 (in these rows {min(ms)} to {max(ms)}). Each untuned (a fresh user cache, the shipped results on{kernels_kept(rows)}), then tuned with the "
             "default budget. "
             "Ratios are the competitor's time over autogemm.linear's (> 1: autogemm is faster): sustained, back-to-"
             "back calls in 20 rounds of about 50 ms each (means); latency, one call at a time on an idle GPU (medians "
             f"of {latency_rounds(rows)}). Ceiling: eager over the GEMM alone (`F.linear(x, w)`); captured: (eager - autogemm) / (eager - "
             "GEMM alone), sustained" + (
                 ", judged where eager beats the GEMM alone by more than the noise of their rounds' paired ratios (twice "
                 "their standard error over their mean, at least 1%, as a tune's keep rule measures it)."
                 if any(ceiling_noise(r["tuned"]) is not None for r in rows) else "."), "", *summary(rows), "",
             "| layer | untuned eager | untuned latency | tuned eager | tuned compile | tuned cuBLASLt | tuned latency | "
             "ceiling | captured | tune | served (tuned) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for row in sorted(rows, key=lambda r: (r["spec"][1], r["spec"][2])):
        untuned, tuned = row["untuned"], row["tuned"]
        top, share = ceiling(tuned["sustained_us"])
        captured = "-" if share is None else \
            f"{share:.0%} (gain within ±{ceiling_noise(tuned):.1%})" if within_noise(tuned) else f"{share:.0%}"
        served_ratio = served_over_tuned(row)
        tune = "no kernel measured" if row["tune"].get("error") else \
            "cuBLAS kept" if row["tune"]["kept_cublas"] else f"kernel {row['tune']['ratio']:.3f}x" + (
                f", served in {served_ratio:.3f}x its time" if served_ratio is not None else "")
        lines.append(f"| {row['label']} | {cell(ratio(untuned['sustained_us'], EAGER))} | "
                     f"{cell(ratio(untuned['latency_us'], EAGER))} | {cell(ratio(tuned['sustained_us'], EAGER))} | "
                     f"{cell(ratio(tuned['sustained_us'], COMPILED))} | {cell(ratio(tuned['sustained_us'], CUBLASLT))} | "
                     f"{cell(ratio(tuned['latency_us'], EAGER))} | {top:.3f} | "
                     f"{captured} | {tune} | {tuned['served']} |")
    return lines


def cell(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"
