"""The epilogue's one pass after a cuBLAS GEMM: at memory speed? autogemm's elementwise kernel
(gpu/epilogue_pass.py, what `matmul(..., bias=, activation=, residual=)` runs where nothing fuses the
epilogue: packed once, as the torch fast path launches it) against PyTorch's own kernel for the step that
follows `F.linear` in eager code, and a device copy of the same bytes.

For each product P (M x N, BF16 or FP16; the widths of LLM layers) and each epilogue:
- autogemm: D = act(P + bias) or P + residual, one pass (P read, the bias's N values, D written);
- eager: what eager PyTorch runs after `F.linear(x, w, bias)`, whose bias cuBLASLt adds in its GEMM:
  `F.silu(P)`, `F.gelu(P)`, `P + residual`;
- copy: `D.copy_(P)`, the same bytes read and written; the pass's floor.
Each timed sustained (autogemm/measure/timing.py `sustained_times`: back-to-back launches in 20 rounds of
about 50 ms each, in random order; means). Reported: GB/s of the bytes each one must move (P and D, and the
residual), and the fraction of the copy's rate (the epilogue issue asks the pass for 85% of it).
Writes benchmarks/results/epilogue-pass-<device>.md (and .json).

    python benchmarks/bench_epilogue_pass.py
    python benchmarks/bench_epilogue_pass.py --shapes 2048x14336 --dtypes bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import case_epilogue, geomean, results_path  # noqa: E402

# (M, N) of LLM layers' outputs: the MLP's up projection, the attention's output, at prefill token counts
SHAPES = ((2048, 14336), (4096, 13824), (1024, 18944), (8192, 5120), (512, 28672), (4096, 4096))
CASES = ("bias+silu", "bias+gelu", "residual")
DTYPES = ("bfloat16", "float16")
AUTOGEMM, EAGER, COPY = "autogemm pass", "eager (PyTorch)", "copy"
PASS_TARGET = 0.85  # of the copy's rate
ITEMSIZE = 2  # bytes of a BF16 or FP16 value


def moved_bytes(case: str, m: int, n: int, itemsize: int) -> int:
    """What the step must move: P read and D written, and the residual read (the bias's N values aside); a
    copy moves P and D."""
    return (3 if case == "residual" else 2) * m * n * itemsize


def calls(case: str, dtype: str, m: int, n: int) -> dict:
    """The three competitors as zero-argument launches on PyTorch's current stream (torch tensors), their
    results checked against float64 first."""
    import torch
    import torch.nn.functional as F

    from autogemm.gpu.epilogue_pass import pass_kernel, vector_width

    device = torch.cuda.current_device()
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator(device="cuda").manual_seed(m + n)
    p = torch.randn(m, n, device="cuda", dtype=torch_dtype, generator=generator)
    bias = torch.randn(n, device="cuda", dtype=torch_dtype, generator=generator)
    residual = torch.randn(m, n, device="cuda", dtype=torch_dtype, generator=generator)
    d, copied = torch.empty_like(p), torch.empty_like(p)
    epilogue = case_epilogue(case)
    vector = vector_width(dtype, epilogue, n, (n, m * n, n, m * n), [(x.data_ptr(), ITEMSIZE) for x in (p, d, bias, residual)])
    expected = p.double() + (residual.double() if epilogue.residual else bias.double())
    expected = {"bias+silu": F.silu, "bias+gelu": F.gelu}.get(case, lambda y: y)(expected)
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

    def packed_pass():
        """autogemm's pass, checked against float64."""
        pointed = pass_kernel(dtype, epilogue, device, 1, m, n, n, m * n, n if epilogue.residual else 0,
                              m * n if epilogue.residual else 0, vector)
        d.fill_(7)
        pointed.launch(stream(), p.data_ptr(), d.data_ptr(), bias.data_ptr() if epilogue.bias else 0,
                       residual.data_ptr() if epilogue.residual else 0)
        torch.cuda.synchronize()
        error = float(torch.linalg.norm(d.double() - expected) / torch.linalg.norm(expected))
        if not error <= 1e-2:
            raise SystemExit(f"{case} {dtype} {m}x{n}: autogemm's pass differs from float64 "
                             f"by {error:.3g}")
        packed = pointed.packed  # (its pointers stay as the checked launch set them: timed without the lock)
        return lambda: packed.launch(stream())

    eager = {"bias+silu": lambda: F.silu(p), "bias+gelu": lambda: F.gelu(p), "residual": lambda: p + residual}[case]
    return {AUTOGEMM: packed_pass(), EAGER: eager, COPY: lambda: copied.copy_(p)}


def measure(case: str, dtype: str, m: int, n: int) -> dict:
    from autogemm.measure import timing

    launches = calls(case, dtype, m, n)
    # (PyTorch's current stream is the legacy default stream, CuPy's current one too: the rounds' events)
    rounds = timing.sustained_times({name: (lambda i, call=call: call()) for name, call in launches.items()})
    us = {name: statistics.fmean(times) * 1e3 for name, times in rounds.items()}
    copy_gb_s = moved_bytes("copy", m, n, ITEMSIZE) / us[COPY] / 1e3
    gb_s = {name: moved_bytes(case, m, n, ITEMSIZE) / us[name] / 1e3 for name in us if name != COPY}
    return {"case": case, "dtype": dtype, "m": m, "n": n, "us": us, "gb_s": gb_s, "copy_gb_s": copy_gb_s,
            "of_copy": {name: rate / copy_gb_s for name, rate in gb_s.items()}}


def report(rows: list[dict], device_name: str) -> list[str]:
    passes = [AUTOGEMM]
    lines = [f"# The epilogue's pass: {device_name}", "",
             "benchmarks/bench_epilogue_pass.py: autogemm's elementwise epilogue kernel (packed, as the torch fast path "
             "launches it after a cuBLAS GEMM) against PyTorch's "
             "kernel for the step eager code runs after `F.linear` and a device copy of the same bytes, sustained "
             "(back-to-back launches, 20 rounds of about 50 ms, means). Rates are the bytes each must move (P read, "
             "D written, and the residual) over its time; of copy: over the copy's rate.", ""]
    for name in passes + [EAGER]:
        shares = [r["of_copy"][name] for r in rows if name in r["of_copy"]]
        target = f"; at least {PASS_TARGET:.0%} on {sum(x >= PASS_TARGET for x in shares)} of {len(shares)}" \
            if name != EAGER else ""
        lines.append(f"- {name}: geomean **{geomean(shares):.0%}** of the copy's rate (min {min(shares):.0%}){target}")
    header = " | ".join(f"{name} us" for name in passes)
    lines += ["", f"| epilogue | dtype | M x N | {header} | eager us | copy us | "
                  + " | ".join(f"{name} of copy" for name in passes) + " | eager of copy |",
              "| --- | --- | --- | " + "---: | " * (2 * len(passes) + 3)]
    for r in rows:
        us, share = r["us"], r["of_copy"]
        cell = lambda table, name, form: form.format(table[name]) if name in table else "-"  # noqa: E731
        lines.append(f"| {r['case']} | {r['dtype']} | {r['m']}x{r['n']} | "
                     + " | ".join(cell(us, name, "{:.1f}") for name in passes)
                     + f" | {us[EAGER]:.1f} | {us[COPY]:.1f} | "
                     + " | ".join(cell(share, name, "{:.0%}") for name in passes) + f" | {share[EAGER]:.0%} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES), help="MxN, comma-separated")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {', '.join(DTYPES)}")
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
        if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
            raise ValueError
    except ValueError:
        parser.error(f"--shapes takes MxN pairs of positive sizes, comma-separated, got {args.shapes!r}")
    cases, kinds = args.cases.split(","), args.dtypes.split(",")
    if not set(cases) <= set(CASES) or not set(kinds) <= set(DTYPES):
        parser.error(f"--cases takes {', '.join(CASES)}; --dtypes {', '.join(DTYPES)}")
    from autogemm.gpu.launch import current_device

    device = current_device()
    rows = []
    for dtype in kinds:
        for case in cases:
            for m, n in shapes:
                row = measure(case, dtype, m, n)
                rows.append(row)
                print(f"{case:10s} {dtype:9s} {m}x{n}: " + ", ".join(f"{name} {share:.0%}" for name, share in
                                                                     row["of_copy"].items()) + " of copy", flush=True)
    path = results_path(f"epilogue-pass-{device.slug}")
    path.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    path.with_suffix(".md").write_text("\n".join(report(rows, device.name)) + "\n")
    print("\n".join(report(rows, device.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
