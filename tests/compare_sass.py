"""Checks that a template refactor changed no kernel: renders the kernels of the render snapshot
(tests/data/render_snapshot.json) with this checkout and with another one (e.g. a `git worktree`
of the revision before the change), and where the sources differ compiles both with nvcc and
compares their SASS (`cuobjdump -sass`). Needs nvcc, no GPU.

    git worktree add /tmp/before HEAD~1
    python tests/compare_sass.py /tmp/before [--every 12] [--jobs 2] [--match wmma_64x64x16]

Prints how many sources were identical, how many differed with identical SASS, and lists any whose
SASS differs (exit status 1 then).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent

# Renders keys (name|problem key|widths) with whichever autogemm is first on sys.path; prints
# {key: [kernel, target suffix, code]}. Works with the package before families became data too.
RENDER = r"""
import json, sys
from autogemm.problem import Problem
try:
    from autogemm.kernels.render import render
except ImportError:  # (before the package's stages became packages)
    from autogemm.render import render
try:
    from autogemm.families import VectorWidths, config_from_name
except ImportError:
    from autogemm.config import VectorWidths, config_from_name
out = {}
for key in json.loads(sys.stdin.read()):
    name, problem, widths = key.split("|")
    w = None if widths == "packed" else VectorWidths(*map(int, widths))
    s = render(config_from_name(name), Problem.from_key(problem), w)
    out[key] = [s.kernel, s.arch_suffix, s.code]
print(json.dumps(out))
"""


def render_all(root: Path, keys: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", RENDER], input=json.dumps(keys), capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir(), check=True)
    return json.loads(proc.stdout)


def sass(code: str, kernel: str, arch: str, folder: Path) -> str | None:
    """The kernel's SASS, or None when it does not compile for `arch` (e.g. FP64 mma.sync on sm_80)."""
    source = folder / f"{kernel}.cu"
    cubin = source.with_suffix(".cubin")
    source.write_text(code)
    built = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-std=c++17", "-o", str(cubin), str(source)],
                           capture_output=True, text=True)
    if built.returncode:
        return None
    return subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="root of the other checkout (the package and templates/)")
    parser.add_argument("--every", type=int, default=12, help="compile every n-th kernel whose source differs")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--match", action="append", default=[],
                        help="only kernels whose key contains this text (repeatable)")
    args = parser.parse_args(argv)
    keys = sorted(json.loads((HERE / "data" / "render_snapshot.json").read_text()))
    if args.match:
        keys = [k for k in keys if any(text in k for text in args.match)]
    before, after = render_all(args.before, keys), render_all(ROOT, keys)
    if args.arch != "sm_90":  # architecture-specific kernels (wgmma: sm_90a) exist for sm_90 only
        keys = [k for k in keys if not after[k][1]]
    same = [k for k in keys if before[k][2] == after[k][2]]
    differ = [k for k in keys if k not in same]
    # every n-th, and at least one of each (skeleton, dtype) whose sources differ
    chosen = set(differ[::args.every])
    for key in differ:
        group = (key.split("_")[0] if key.startswith("wmma_") else "simt", key.split("|")[1].split("/")[0],
                 key.split("|")[0].rsplit("_", 1)[-1])
        if not any((k.split("_")[0] if k.startswith("wmma_") else "simt", k.split("|")[1].split("/")[0],
                    k.split("|")[0].rsplit("_", 1)[-1]) == group for k in chosen):
            chosen.add(key)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)

        def compare(key):
            (old_dir := folder / "before" / str(abs(hash(key)))).mkdir(parents=True)
            (new_dir := folder / "after" / str(abs(hash(key)))).mkdir(parents=True)
            kernel, suffix, _ = after[key]
            arch = args.arch + suffix
            old_sass, new_sass = sass(before[key][2], before[key][0], arch, old_dir), sass(after[key][2], kernel, arch, new_dir)
            return key, ("skipped" if old_sass is None and new_sass is None else old_sass == new_sass)

        with ThreadPoolExecutor(args.jobs) as pool:
            results = dict(pool.map(compare, sorted(chosen)))
    skipped = [k for k, outcome in results.items() if outcome == "skipped"]
    changed = [k for k, outcome in results.items() if outcome is False]
    compiled = len(results) - len(skipped)
    print(f"{len(keys)} kernels: {len(same)} sources identical, {len(differ)} differ; {compiled} of those compiled "
          f"({args.arch}; {len(skipped)} exist for neither version there): {compiled - len(changed)} with identical "
          f"SASS, {len(changed)} with different SASS")
    for key in changed:
        print("  SASS differs:", key)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
