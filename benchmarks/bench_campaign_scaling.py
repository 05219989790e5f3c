"""Campaign scaling: one fixed campaign slice (16 problems, 24 trials each, seed 0) on 1 GPU, then on
2 GPUs, then on 1 GPU again, each run from nothing (its own storage, cache and compiled-kernel
directory, in a temporary folder), timed end to end with `autogemm campaign run`. Needs a host with
two GPUs of one model.

    python benchmarks/bench_campaign_scaling.py

Writes benchmarks/results/campaign-scaling-<device>.json (problems per hour of each run, each
problem's best TFLOP/s and ratio to cuBLAS per run) and prints the table.
"""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
ROOT = Path(tempfile.mkdtemp(prefix="autogemm-scaling-"))
PROBLEMS = '''
[[problems]]
M = [512, 768, 1000, 1024, 1280, 1536, 1792, 2048]
dtype = ["float32", "float16"]
'''
runs = [("one-gpu-first", [0]), ("two-gpus", [0, 1]), ("one-gpu-again", [0])]
summary = {}
for label, devices in runs:
    base = ROOT / label
    base.mkdir(parents=True, exist_ok=True)
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
    env = {**os.environ, "AUTOGEMM_CUBIN_DIR": str(base / "cubin"), "AUTOGEMM_CACHE_DIR": str(base / "user")}
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "autogemm", "campaign", "run", str(toml)], env=env,
                         capture_output=True, text=True)
    wall = time.perf_counter() - started
    print(run.stderr[-3000:], file=sys.stderr)
    status = subprocess.run([sys.executable, "-m", "autogemm", "campaign", "status", str(toml), "--json"], env=env,
                            capture_output=True, text=True)
    results = json.loads(status.stdout)["results"]
    done = sum(r["done"] for r in results)
    helping = (run.stdout + run.stderr).count(": helping ")
    summary[label] = {"rc": run.returncode, "wall_s": wall, "done": done, "problems_per_hour": done / wall * 3600,
                      "helping_events": helping,
                      "results": {r["problem"]: {"tflops": r["tflops"], "ratio": r["ratio"], "config": r["config"],
                                                 "kept_cublas": r["kept_cublas"]} for r in results}}
    print(f"{label}: rc {run.returncode}, {done} problems in {wall:.1f} s = {done / wall * 3600:.0f} problems/hour, "
          f"helping events {helping}", flush=True)
from autogemm.campaign import list_gpus

OUT.mkdir(parents=True, exist_ok=True)
slug = list_gpus()[0].name.lower().replace(" ", "-")
(OUT / f"campaign-scaling-{slug}.json").write_text(json.dumps(summary, indent=1))
one = [summary["one-gpu-first"]["problems_per_hour"], summary["one-gpu-again"]["problems_per_hour"]]
print(f"speed-up, 2 GPUs over the mean of the 1-GPU runs: {summary['two-gpus']['problems_per_hour'] / (sum(one) / 2):.2f}x")
print(f"{'problem':40} " + " ".join(f"{l:>22}" for l, _ in runs))
for key in summary["one-gpu-first"]["results"]:
    cells = []
    for label, _ in runs:
        r = summary[label]["results"].get(key, {})
        cells.append(f"{(r.get('tflops') or 0):8.1f} TF {(r.get('ratio') or 0):6.3f}x" + ("*" if r.get("kept_cublas") else " "))
    print(f"{key:40} " + " ".join(f"{c:>22}" for c in cells))
