"""What a campaign's own machinery (storage, claims, workers, the end of the run) costs, without a GPU:
measurements are replayed from a recorded table (tests/data/simt_small_4096.jsonl, each answer after a
fixed delay, as a GPU would take to measure), so that only the CPU side remains. The same campaign runs
with 1 worker and with 2, on each storage; with a fixed search time per problem (patience off), 2
workers should take half the time of 1, and what they take beyond that is the machinery's.

    python benchmarks/bench_campaign_overhead.py                       # sqlite and journal, 8 problems
    python benchmarks/bench_campaign_overhead.py --storages journal --problems 12 --timeout 5

Writes benchmarks/results/campaign-overhead-cpu.md (and .json). A result of this host's CPU: the
table says how many cores it has.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the replayed evaluator of the campaign tests

STORAGES = ("sqlite", "journal")


def run(storage_kind: str, workers: int, problems: int, timeout: float, delay: float) -> dict:
    from campaign_helpers import SPACE_PATH, ReplayFactory

    from autogemm.campaigns.campaign import run_campaign
    from autogemm.campaigns.file import parse_campaign
    from autogemm.campaigns.worker import WorkerSpec

    root = Path(tempfile.mkdtemp(prefix="autogemm-overhead-"))
    os.environ["AUTOGEMM_CACHE_DIR"] = str(root / "user")
    storage = f"sqlite:///{root}/studies.db" if storage_kind == "sqlite" else f"journal:///{root}/studies.log"
    shapes = [[4096, 4096, 512 * (i + 1)] for i in range(problems)]
    campaign = parse_campaign({"campaign": {"name": "overhead", "storage": storage, "trials": 400, "timeout": timeout,
                                            "patience": 0, "seed": 1, "cache_dir": str(root / "cache")},
                               "problems": [{"shapes": shapes}]})
    specs = [WorkerSpec(campaign, storage, f"W{i}", None, 1, ReplayFactory(delay), str(SPACE_PATH), share_compiles=True)
             for i in range(workers)]
    started = time.perf_counter()
    codes = run_campaign(campaign, specs)
    wall = time.perf_counter() - started
    beyond = wall * workers / problems - timeout
    print(f"{storage_kind:8s} {workers} worker(s): {problems} problems in {wall:.1f} s, "
          f"{beyond:+.2f} s a problem beyond its {timeout:g} s of search", flush=True)
    return {"storage": storage_kind, "workers": workers, "wall_s": wall, "beyond_s": beyond,
            "ok": all(code == 0 for code in codes.values())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storages", default=",".join(STORAGES), help="comma-separated, of sqlite and journal")
    parser.add_argument("--problems", type=int, default=8, help="problems in the campaign (default 8)")
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds of search per problem (default 4)")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds each replayed measurement takes (0.02)")
    args = parser.parse_args(argv)
    storages = [s.strip() for s in args.storages.split(",") if s.strip()]
    if not storages or any(s not in STORAGES for s in storages):
        parser.error(f"--storages takes {' and '.join(STORAGES)}")
    rows = []
    for kind in storages:
        one, two = (run(kind, workers, args.problems, args.timeout, args.delay) for workers in (1, 2))
        rows.append({"storage": kind, "one": one, "two": two, "speedup": one["wall_s"] / two["wall_s"]})
    lines = [f"# Campaign machinery without a GPU ({os.cpu_count()} cores)", "",
             f"`benchmarks/bench_campaign_overhead.py` ({time.strftime('%Y-%m-%d')}): {args.problems} problems, "
             f"{args.timeout:g} s of search each (patience off), measurements replayed from a recorded table "
             f"after {args.delay * 1e3:g} ms each; 1 worker, then 2.", "",
             "| storage | 1 worker: wall s | beyond the search, a problem | 2 workers: wall s | beyond, a problem a worker "
             "| 2 workers against 1 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['storage']} | {r['one']['wall_s']:.1f} | {r['one']['beyond_s']:+.2f} s | "
                     f"{r['two']['wall_s']:.1f} | {r['two']['beyond_s']:+.2f} s | {r['speedup']:.2f}x |")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "campaign-overhead-cpu.json").write_text(json.dumps({"cores": os.cpu_count(), "args": vars(args),
                                                                "rows": rows}, indent=1))
    (out / "campaign-overhead-cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["one"]["ok"] and r["two"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
