"""FP8 at 8192³, sustained: per-tensor and block scales, autogemm's kernels and torch._scaled_mm, each run back
to back for several seconds, with the SM clock and board power nvidia-smi reads meanwhile.

Why: an H100 running FP8 GEMMs back to back reaches its board power limit within a fraction of a second and
lowers its clock from then on. bench_fp8.py times each competitor for tens of milliseconds, after the
reference's work, so its figures mix clock states; a long run is what a training or serving job meets, and it
shows where block scaling's cost goes (the promotion's FP32 work lowers the clock under the cap, the way cuBLAS's
block kernel does too). The calls are timed as one stretch of work (CUDA events around them), not by
`timing.gpu_time`, whose gate holds the GPU between its 2 ms samples: the same loop for all four.

Competitors, each checked against the float64 reference first: torch._scaled_mm (use_fast_accum=False) and
autogemm's kernel for each scaling. The kernels default to bench_fp8's fastest at 8192³ (its results JSON);
--tensor-config and --block-config name others. Block scales are given in torch's layout to both sides.
Rounds alternate the four competitors; the median round is reported. Writes
benchmarks/results/fp8-sustained-<device>.md (and .json).

    python benchmarks/bench_fp8_sustained.py --seconds 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import results_path  # noqa: E402
from bench_fp8 import checked_kernel, operands, torch_operands  # noqa: E402

SIZE = 8192
SAMPLE_MS = 100
SKIP_SAMPLES = 10  # the first second of readings: the clock settling under the power limit


def fastest_configs(slug: str) -> dict[str, str]:
    """bench_fp8's fastest kernel at 8192³ per scaling, from its results JSON ({} where none)."""
    path = results_path(f"fp8-{slug}").with_suffix(".json")
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())["rows"]
    return {r["scaling"]: r["best"] for r in rows if (r["m"], r["n"], r["k"]) == (SIZE,) * 3 and r.get("best")}


def sustained(call, seconds: float, synchronize) -> dict:
    """TFLOP/s of `call` run back to back for `seconds`, with nvidia-smi's median SM clock and power meanwhile."""
    call()
    synchronize()
    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                "-lms", str(SAMPLE_MS)], stdout=subprocess.PIPE, text=True)
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, started = 0, time.monotonic()
    begin.record()
    while time.monotonic() - started < seconds:
        for _ in range(20):
            call()
        calls += 20
        synchronize()   # (a bounded queue: the host never runs seconds ahead of the GPU)
    end.record()
    end.synchronize()
    result = {"tflops": 2 * SIZE ** 3 * calls / begin.elapsed_time(end) / 1e9, "calls": calls}
    if smi is not None:
        smi.terminate()
        readings = [line.split(",") for line in smi.communicate()[0].strip().splitlines()[SKIP_SAMPLES:]]
        readings = [r for r in readings if len(r) == 2]
        if readings:
            result["sm_mhz"] = statistics.median(float(r[0]) for r in readings)
            result["watts"] = statistics.median(float(r[1]) for r in readings)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of back-to-back calls a competitor")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the four competitors (median reported)")
    parser.add_argument("--tensor-config", help="autogemm's per-tensor kernel (default: bench_fp8's fastest)")
    parser.add_argument("--block-config", help="autogemm's block-scaled kernel (default: bench_fp8's fastest)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be positive and --rounds at least 1")
    import torch

    from autogemm import config_from_name
    from autogemm.gpu.launch import current_device

    if not torch.cuda.is_available() or current_device().compute_capability != (9, 0):
        raise SystemExit("bench_fp8_sustained needs an sm_90 GPU and PyTorch with CUDA")
    device = current_device()
    configs = fastest_configs(device.slug)
    configs.update({k: v for k, v in (("tensor", args.tensor_config), ("block", args.block_config)) if v})
    missing = [s for s in ("tensor", "block") if s not in configs]
    if missing:
        parser.error(f"no kernel for {', '.join(missing)} scales: run bench_fp8.py --block first or name one "
                     "with --tensor-config / --block-config")

    calls = {}
    for scaling in ("tensor", "block"):
        a, b, scale_a, scale_b = operands(SIZE, SIZE, SIZE, scaling)   # (the same A and B: seeded by the shape)
        ta, tb, tsa, tsb, kernel_scales = torch_operands(a, b, scale_a, scale_b, scaling)
        calls[("torch._scaled_mm", scaling)] = (
            lambda ta=ta, tb=tb, tsa=tsa, tsb=tsb: torch._scaled_mm(ta, tb, tsa, tsb, out_dtype=torch.bfloat16))
        calls[("autogemm", scaling)] = checked_kernel(config_from_name(configs[scaling]), a, b, scale_a, scale_b,
                                                      kernel_scales, scaling)[0]
    rounds = []
    for index in range(args.rounds):
        measured = {}
        for (who, scaling), call in calls.items():
            measured[f"{who} {scaling}"] = sustained(call, args.seconds, torch.cuda.synchronize)
            print(f"round {index}: {who} {scaling}: {measured[f'{who} {scaling}']}", flush=True)
        rounds.append(measured)

    def median(name, key):
        values = [r[name][key] for r in rounds if key in r[name]]
        return statistics.median(values) if values else None

    names = list(rounds[0])
    summary = {name: {key: median(name, key) for key in ("tflops", "sm_mhz", "watts")} for name in names}
    ours = summary["autogemm block"]["tflops"] / summary["autogemm tensor"]["tflops"]
    theirs = summary["torch._scaled_mm block"]["tflops"] / summary["torch._scaled_mm tensor"]["tflops"]
    fmt = lambda value, spec: "-" if value is None else format(value, spec)  # noqa: E731
    lines = [f"# FP8 at 8192³, sustained, on {device.name}", "",
             f"Generated by `benchmarks/bench_fp8_sustained.py --seconds {args.seconds:g} --rounds {args.rounds}`: "
             f"each competitor {args.seconds:g} s of back-to-back calls, {args.rounds} alternated rounds, the median "
             "round; SM clock and board power are nvidia-smi's medians after the first second. e4m3, D in BF16; "
             "block scales 1 × 128 for A, 128 × 128 for B, in torch's layout for both sides.", "",
             f"- autogemm: block scales at **{ours:.3f}** of per-tensor speed "
             f"({configs['block']} against {configs['tensor']})",
             f"- torch._scaled_mm: block scales at {theirs:.3f} of its per-tensor speed", "",
             "| competitor | scales | TFLOP/s | SM clock (MHz) | power (W) |", "| --- | --- | ---: | ---: | ---: |"]
    for name in names:
        who, scaling = name.rsplit(" ", 1)
        s = summary[name]
        lines.append(f"| {who} | {scaling} | {s['tflops']:.0f} | {fmt(s['sm_mhz'], '.0f')} | {fmt(s['watts'], '.0f')} |")
    path = results_path(f"fp8-sustained-{device.slug}")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"device": device.name, "seconds": args.seconds,
                                                     "configs": configs, "rounds": rounds, "summary": summary,
                                                     "block_over_tensor": {"autogemm": ours, "torch": theirs}},
                                                    indent=1))
    print("\n".join(lines))
    print(f"written: {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
