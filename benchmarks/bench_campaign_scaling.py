"""Campaign scaling: the "wider evidence" section of campaigns/shipped.toml (30 problems: NT/TN LLM
layouts, batches, TF32, FP64) tuned with 10 s of search each (patience off, so every problem searches
its whole budget), on 1 GPU and on 2 GPUs of one host, timed end to end with `autogemm campaign run`.

Three runs, each with its own storage (a journal file, what the campaign docs advise for several GPUs
of one host: on SQLite the workers' study writes wait for each other, bench_campaign_overhead.py), campaign
cache and user cache:

- `fill`: 1 GPU, cold: it fills the on-disk caches a later run can use (the compiled kernels of
  AUTOGEMM_CUBIN_DIR, shared by the three runs; CuPy's own kernel cache);
- `one-gpu`: 1 GPU, warm (after `fill`): the single-GPU figure the 2-GPU run is judged against;
- `two-gpus`: 2 GPUs, warm.

The headline is the 2-GPU run against the warm single-GPU run (problems per hour), labelled as such;
the mean of the two single-GPU runs is reported beside it. Where the time goes, per run, read from the
campaign's own log (each problem's "tuning" and "done" lines): the seconds inside the tunes (search and
final re-timing) against the run's wall time times its GPUs; the rest is start-up, claims and the end
of the run, when one GPU has finished and the other has not. Trials per problem show whether a GPU of
the 2-GPU run searched as much as the single GPU did (a shared compile pool or a contended storage
would show there first).

    python benchmarks/bench_campaign_scaling.py                          # the three runs, then the report
    python benchmarks/bench_campaign_scaling.py --root DIR --runs fill   # one run at a time (a machine's
    python benchmarks/bench_campaign_scaling.py --root DIR --runs one-gpu,two-gpus   # limit per command)

Each run's summary is kept in DIR (`<run>.json`); once all three are there, writes
benchmarks/results/campaign-scaling-<device>.{json,md}. The warm runs' records are the benchmark's
by-product: `<DIR>/one-gpu/cache/<device>.json` is a document of this section's problems under the
current timing protocol (`autogemm cache merge` adds it to cache/). Needs a host with two GPUs of one model.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results"
SHIPPED = ROOT / "campaigns" / "shipped.toml"
SECTION = "# ---- wider evidence"  # the section of shipped.toml this benchmark tunes (to the next "# ----")
TIMEOUT_S, TRIALS, SEED = 10, 400, 0
# the runs' study storage, in a run's folder (the first published run, 2026-11-26, used SQLite)
STORAGE, STORAGE_FILE = "journal", "studies.log"
RUNS = {"fill": [0], "one-gpu": [0], "two-gpus": [0, 1]}
TITLES = {"fill": "1 GPU, cold (fills the caches)", "one-gpu": "1 GPU, warm", "two-gpus": "2 GPUs, warm"}


def section() -> str:
    """The problems' tables of the benchmark's section of shipped.toml."""
    text = SHIPPED.read_text()
    start = text.find(SECTION)
    if start < 0:
        raise SystemExit(f"{SHIPPED} has no section {SECTION!r}")
    end = text.find("\n# ---- ", start + len(SECTION))
    return text[start:] if end < 0 else text[start:end + 1]


def campaign_file(base: Path, devices: list[int]) -> Path:
    toml = base / "campaign.toml"
    toml.write_text(f'''[campaign]
name = "scaling"
storage = "{STORAGE}:///{base / STORAGE_FILE}"
devices = {devices}
timeout = {TIMEOUT_S}
trials = {TRIALS}
patience = 0
seed = {SEED}
grace = 60
cache_dir = "cache"

''' + section())
    return toml


def run(label: str, root: Path) -> dict:
    """One run of the campaign (its own storage and caches; the compiled kernels shared), summarized."""
    devices = RUNS[label]
    base = root / label
    if base.exists():
        raise SystemExit(f"{base} exists: a run is made once per root (remove it to run {label} again)")
    base.mkdir(parents=True)
    toml = campaign_file(base, devices)
    env = {**os.environ, "AUTOGEMM_CUBIN_DIR": str(root / "cubin"), "AUTOGEMM_CACHE_DIR": str(base / "user")}
    started = time.perf_counter()
    campaign = subprocess.run([sys.executable, "-m", "autogemm", "campaign", "run", str(toml)], env=env,
                              capture_output=True, text=True)
    wall = time.perf_counter() - started
    (base / "campaign.log").write_text(campaign.stderr)
    if campaign.returncode != 0:
        print(campaign.stderr[-3000:], file=sys.stderr)
    records = {}
    for document in (base / "cache").glob("*.json"):
        records.update(json.loads(document.read_text()).get("entries", {}))
    tunes = tune_seconds(campaign.stderr)
    busy = sum(seconds for _, seconds in tunes.values())
    trials = [r["trials"]["valid"] + r["trials"]["rejected"] + r["trials"]["failed"]
              for r in records.values() if isinstance(r.get("trials"), dict)]
    summary = {"devices": devices, "storage": STORAGE, "rc": campaign.returncode, "wall_s": wall, "done": len(records),
               "problems_per_hour": len(records) / wall * 3600, "busy_s": busy,
               "outside_tunes_s": wall * len(devices) - busy, "mean_trials": statistics.mean(trials) if trials else 0,
               "helping_events": campaign.stderr.count(": helping "),
               "results": {key: {"tflops": r["tflops"], "ratio": r["ratio"], "config": r["config_name"],
                                 "kept_cublas": r["family"] == "cublas", "gpu": tunes.get(key, (None, None))[0],
                                 "tune_s": tunes.get(key, (None, None))[1], "trials": r.get("trials")}
                           for key, r in records.items()}}
    (root / f"{label}.json").write_text(json.dumps(summary, indent=1))
    print(f"{label}: rc {campaign.returncode}, {len(records)} problems in {wall:.1f} s = "
          f"{summary['problems_per_hour']:.0f} problems/hour; inside tunes {busy:.0f} of {wall * len(devices):.0f} "
          f"GPU-seconds; {summary['mean_trials']:.1f} trials per problem", flush=True)
    return summary


_EVENT = re.compile(r"^(\d\d):(\d\d):(\d\d) (GPU\d+): (tuning|done) (\S+?):?(?: |$)")


def tune_seconds(log: str) -> dict:
    """problem -> (GPU label, seconds from its "tuning" line to its "done" line) in a campaign's log
    (`autogemm campaign run`'s progress lines, stamped to the second; a run past midnight wraps)."""
    started, out = {}, {}
    for line in log.splitlines():
        event = _EVENT.match(line)
        if event is None:
            continue
        hours, minutes, seconds, gpu, what, key = event.groups()
        stamp = int(hours) * 3600 + int(minutes) * 60 + int(seconds)
        if what == "tuning":
            started[key] = (gpu, stamp)
        elif key in started:
            gpu, began = started.pop(key)
            out[key] = (gpu, (stamp - began) % 86400)
    return out


def report(root: Path, device: str) -> list[str]:
    runs = {label: json.loads((root / f"{label}.json").read_text()) for label in RUNS}
    rate = {label: s["problems_per_hour"] for label, s in runs.items()}
    warm = rate["two-gpus"] / rate["one-gpu"]
    mean = rate["two-gpus"] / ((rate["fill"] + rate["one-gpu"]) / 2)
    slug = device.lower().replace(" ", "-")
    (OUT / f"campaign-scaling-{slug}.json").write_text(json.dumps(
        {"device": device, "against_warm_one_gpu": warm, "against_mean_of_one_gpu_runs": mean, "runs": runs},
        indent=1))
    count = len(runs["one-gpu"]["results"])
    lines = [f"# Campaign scaling on 2 {device} (one host)", "",
             f"`benchmarks/bench_campaign_scaling.py` ({time.strftime('%Y-%m-%d')}): the {count} problems of the "
             f"\"wider evidence\" section of campaigns/shipped.toml, {TIMEOUT_S} s of search each (patience off), "
             f"seed {SEED}. Each run has its own storage ({runs['one-gpu'].get('storage', 'sqlite')}) and caches; the "
             "compiled kernels are shared, filled by the first run.", "",
             f"**2 GPUs against the warm single-GPU run: {warm:.2f}x** problems per hour "
             f"(against the mean of the cold and the warm single-GPU runs: {mean:.2f}x).", "",
             "| run | problems | wall s | problems/hour | GPU-seconds inside tunes | outside tunes, per GPU | "
             "trials per problem | helping events |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, s in runs.items():
        gpus = len(s["devices"])
        inside = f"{s['busy_s']:.0f} of {s['wall_s'] * gpus:.0f}" if s.get("busy_s") is not None else "(log not kept)"
        outside = f"{s['outside_tunes_s'] / gpus:.1f} s" if s.get("outside_tunes_s") is not None else "-"
        lines.append(f"| {TITLES[label]} | {s['done']} | {s['wall_s']:.1f} | {s['problems_per_hour']:.0f} | "
                     f"{inside} | {outside} | {s['mean_trials']:.1f} | {s['helping_events']} |")
    if any(s.get("busy_s") is None for s in runs.values()):
        lines += ["", "(log not kept): that run's campaign log was not kept with its summary, so its time inside "
                  "the tunes is not known."]
    lines += ["", "Per problem: best TFLOP/s, ratio to the baseline (cuBLAS kept where no kernel beat it), trials "
              "measured, seconds from the log's \"tuning\" line to its \"done\" line.", "",
              "| problem | " + " | ".join(TITLES[label] for label in RUNS) + " |",
              "| --- | " + " | ".join("---:" for _ in RUNS) + " |"]
    for key in runs["one-gpu"]["results"]:
        cells = []
        for label in RUNS:
            r = runs[label]["results"].get(key)
            if r is None:
                cells.append("-")
                continue
            t = r.get("trials") or {}
            cells.append(f"{(r.get('tflops') or 0):.1f}, {(r.get('ratio') or 0):.3f}x"
                         + (" (cuBLAS kept)" if r.get("kept_cublas") else "")
                         + f", {t.get('valid', 0) + t.get('rejected', 0) + t.get('failed', 0)}"
                         + (f", {r['tune_s']} s" if r.get("tune_s") is not None else ""))
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    (OUT / f"campaign-scaling-{slug}.md").write_text("\n".join(lines) + "\n")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, help="where the runs keep their storage, caches and summaries "
                        "(default: a new temporary folder); reuse it to make the runs in separate commands")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"the runs to make now, in order, comma-separated (of {', '.join(RUNS)}; "
                             "'fill' comes first)")
    args = parser.parse_args(argv)
    wanted = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {', '.join(unknown)}: choose from {', '.join(RUNS)}")
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
    root = (args.root or Path(tempfile.mkdtemp(prefix="autogemm-scaling-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if any(r != "fill" for r in wanted) and not (root / "fill.json").exists() and "fill" not in wanted:
        parser.error(f"the warm runs need the 'fill' run first (in {root})")
    for label in wanted:
        run(label, root)
    if all((root / f"{label}.json").exists() for label in RUNS):
        OUT.mkdir(parents=True, exist_ok=True)
        print("\n".join(report(root, gpus[0].name)))
    else:
        print(f"runs kept in {root}; the report comes once {', '.join(RUNS)} are all there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
