"""Campaign scaling: one fixed campaign slice (30 problems: M = N = K in 512..2048, float32, float16 and
bfloat16; 24 trials each, seed 0) on 1 GPU, then on 2 GPUs, then on 1 GPU again, each run from
nothing (its own storage, cache and compiled-kernel directory, in a temporary folder), timed end to
end with `autogemm campaign run`. Needs a host with two GPUs of one model.

    python benchmarks/bench_campaign_scaling.py

Writes benchmarks/results/campaign-scaling-<device>.{json,md}: problems per hour of each run, the
2-GPU run against the mean of the two 1-GPU runs, and each problem's best TFLOP/s and ratio to
cuBLAS per run (the same search on 1 or 2 GPUs should find figures within the search's noise).

A slice of 30 problems rather than the 16 of the first runs: a tune of these sizes now takes about
4 s, and each run's fixed start (the workers' interpreters and their first measuring processes,
about 2.5 s) would otherwise weigh as much as two problems.
"""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
PROBLEMS = '''
[[problems]]
M = [512, 640, 768, 896, 1000, 1024, 1280, 1536, 1792, 2048]
dtype = ["float32", "float16", "bfloat16"]
'''
RUNS = [("one-gpu-first", [0]), ("two-gpus", [0, 1]), ("one-gpu-again", [0])]


def campaign_file(base: Path, devices: list[int]) -> Path:
    toml = base / "campaign.toml"
    toml.write_text(f'''[campaign]
name = "scaling"
storage = "sqlite:///{base}/studies.db"
devices = {devices}
timeout = 120
trials = 24
seed = 0
grace = 60
cache_dir = "{base}/cache"
''' + PROBLEMS)
    return toml


def run(label: str, devices: list[int], root: Path) -> dict:
    base = root / label
    base.mkdir(parents=True)
    toml = campaign_file(base, devices)
    env = {**os.environ, "AUTOGEMM_CUBIN_DIR": str(base / "cubin"), "AUTOGEMM_CACHE_DIR": str(base / "user")}
    started = time.perf_counter()
    campaign = subprocess.run([sys.executable, "-m", "autogemm", "campaign", "run", str(toml)], env=env,
                              capture_output=True, text=True)
    wall = time.perf_counter() - started
    (base / "campaign.log").write_text(campaign.stderr)
    if campaign.returncode != 0:
        print(campaign.stderr[-3000:], file=sys.stderr)
    status = subprocess.run([sys.executable, "-m", "autogemm", "campaign", "status", str(toml), "--json"], env=env,
                            capture_output=True, text=True)
    results = json.loads(status.stdout)["results"]
    done = sum(r["done"] for r in results)
    helping = campaign.stderr.count(": helping ")
    print(f"{label}: rc {campaign.returncode}, {done} problems in {wall:.1f} s = {done / wall * 3600:.0f} "
          f"problems/hour, helping events {helping}", flush=True)
    return {"rc": campaign.returncode, "wall_s": wall, "done": done, "problems_per_hour": done / wall * 3600,
            "helping_events": helping,
            "results": {r["problem"]: {"tflops": r["tflops"], "ratio": r["ratio"], "config": r["config"],
                                       "kept_cublas": r["kept_cublas"]} for r in results}}


def main() -> int:
    from autogemm.campaigns.campaign import CampaignError, list_gpus

    try:
        gpus = list_gpus()
    except CampaignError as exc:
        print(f"bench_campaign_scaling: {exc}", file=sys.stderr)
        return 2
    if len(gpus) < 2 or gpus[0].name != gpus[1].name:
        print(f"bench_campaign_scaling needs two GPUs of one model; this host has "
              f"{', '.join(g.name for g in gpus) or 'none'}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="autogemm-scaling-"))
    summary = {label: run(label, devices, root) for label, devices in RUNS}
    one = (summary["one-gpu-first"]["problems_per_hour"] + summary["one-gpu-again"]["problems_per_hour"]) / 2
    speedup = summary["two-gpus"]["problems_per_hour"] / one
    slug = gpus[0].name.lower().replace(" ", "-")
    (OUT / f"campaign-scaling-{slug}.json").write_text(json.dumps({"speedup": speedup, "runs": summary}, indent=1))
    lines = [f"# Campaign scaling on 2 {gpus[0].name}", "",
             f"`benchmarks/bench_campaign_scaling.py` ({time.strftime('%Y-%m-%d')}): 30 problems (M = N = K in "
             "512..2048; float32, float16, bfloat16), 24 trials each, seed 0; each run from an empty storage, cache "
             "and compiled-kernel directory.", "",
             "| run | problems | wall s | problems/hour | helping events |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {label} | {s['done']} | {s['wall_s']:.1f} | {s['problems_per_hour']:.0f} | {s['helping_events']} |"
              for label, s in summary.items()]
    lines += ["", f"2 GPUs against the mean of the two 1-GPU runs: {speedup:.2f}x", "",
              "| problem | 1 GPU TFLOP/s, ratio | 2 GPUs | 1 GPU again |", "| --- | ---: | ---: | ---: |"]
    for key in summary["one-gpu-first"]["results"]:
        cells = []
        for label, _ in RUNS:
            r = summary[label]["results"].get(key, {})
            cells.append(f"{(r.get('tflops') or 0):.1f}, {(r.get('ratio') or 0):.3f}x"
                         + (" (cuBLAS kept)" if r.get("kept_cublas") else ""))
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    (OUT / f"campaign-scaling-{slug}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
