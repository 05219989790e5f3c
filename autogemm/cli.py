"""The `autogemm` command: a thin argparse layer over the library."""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from .config import SimtConfig, WmmaConfig, config_from_dict, config_from_name
from .problem import LAYOUTS, Device, Problem


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_problem_arguments(parser: argparse.ArgumentParser, m_required: bool, default_size: int | None = None) -> None:
    group = parser.add_argument_group("problem")
    group.add_argument("--M", "-M", dest="m", type=positive_int, required=m_required, default=default_size,
                       help="rows of C and op(A)" + ("" if m_required else f" (default {default_size})"))
    group.add_argument("--N", "-N", dest="n", type=positive_int, help="columns of C and op(B) (default: M)")
    group.add_argument("--K", "-K", dest="k", type=positive_int, help="inner dimension (default: M)")
    group.add_argument("--batch", type=positive_int, default=1, help="matrices in the strided batch (default 1)")
    group.add_argument("--layout", choices=LAYOUTS, help="storage of A and B: n = as is, t = transposed (default nn)")
    group.add_argument("--trans-a", action="store_true", help="A is stored K×M (layouts tn, tt)")
    group.add_argument("--trans-b", action="store_true", help="B is stored N×K (layouts nt, tt)")
    group.add_argument("--dtype", default="float32", help="element type (default float32)")
    group.add_argument("--compute", default="", help="compute mode (default: the dtype's exact mode, fp32 for float32)")


def problem_from_args(args: argparse.Namespace) -> Problem:
    trans_a, trans_b = args.trans_a, args.trans_b
    if args.layout:
        if trans_a or trans_b:
            raise CliError("give either --layout or --trans-a/--trans-b, not both")
        trans_a, trans_b = args.layout[0] == "t", args.layout[1] == "t"
    try:
        return Problem(args.m, args.n or args.m, args.k or args.m, batch=args.batch, dtype=args.dtype,
                       compute=args.compute, trans_a=trans_a, trans_b=trans_b)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def parse_config(text: str, family: str = "simt"):
    """A config as a JSON object of knobs (missing knobs take their defaults; the template family is
    `family` unless the object names one, "simt" or "wmma") or a config name."""
    text = text.strip()
    if not text.startswith("{"):
        try:
            return config_from_name(text)
        except ValueError as exc:
            raise CliError(f"--config: {exc}; give a JSON object of knobs or a name like {SimtConfig().name} "
                           f"or {WmmaConfig().name}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CliError("--config must be a JSON object of knobs")
    try:
        return config_from_dict({"family": family, **data})
    except (TypeError, ValueError) as exc:
        raise CliError(f"--config: {exc}") from None


def device_for(arch: str | None) -> Device:
    if arch:
        try:
            return Device.for_arch(arch)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    return Device.for_arch("sm_90")


# ---- render ---------------------------------------------------------------------------------------
def cmd_render(args: argparse.Namespace) -> int:
    from .render import render
    from .space import SearchSpace, default_space_name

    problem = problem_from_args(args)
    # a JSON config without a family takes the one that computes the problem's dtype
    family = SearchSpace.load(default_space_name(problem)).family
    config = parse_config(args.config, family)
    reasons = config.check(problem, device_for(args.arch))
    if reasons and not args.force:
        raise CliError(f"config {config.name} cannot run {problem}:\n  " + "\n  ".join(reasons)
                       + "\n(--force renders it anyway)")
    sys.stdout.write(render(config, problem).code)
    return 0


# ---- check ----------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    from .compile import CompileError, NvccNotFound, find_nvcc, nvcc_resources
    from .render import render
    from .space import SearchSpace, SpaceError, default_space_name

    problem = problem_from_args(args)
    try:
        find_nvcc()
        space = SearchSpace.load(args.space or default_space_name(problem))
    except (NvccNotFound, SpaceError) as exc:
        raise CliError(str(exc)) from None
    device = device_for(args.arch)
    configs = space.sample(args.count, problem, device, seed=args.seed)
    if not configs:
        raise CliError(f"no configuration of {space.path} is valid for {problem} on {device.arch}")
    print(f"compiling {len(configs)} variants of {space.path.name} for {problem} with nvcc -arch={device.arch}",
          file=sys.stderr)

    def compile_one(config):
        source = render(config, problem)
        try:
            return config, nvcc_resources(source, device.arch)[source.kernel], None
        except CompileError as exc:
            return config, None, str(exc).splitlines()[0]

    failures = 0
    header = f"{'config':<48} {'regs':>5} {'spill B':>8} {'stack B':>8} {'smem B':>8}"
    print(header)
    print("-" * len(header))
    with ThreadPoolExecutor(args.jobs) as pool:
        for config, usage, error in pool.map(compile_one, configs):
            if error:
                failures += 1
                print(f"{config.name:<48} compile error: {error}")
                continue
            smem = config.smem_bytes(problem)
            spills = bool(usage.spills or usage.stack_bytes)
            capped = bool(getattr(config, "max_registers", 0))
            # under an explicit max_registers a spill is a possible outcome, refused when loaded
            flag = ("  <- spills (refused when loaded: max_registers)" if capped else "  <- spills") if spills else ""
            failures += spills and not capped
            print(f"{config.name:<48} {usage.registers:>5} {usage.spills:>8} {usage.stack_bytes:>8} {smem:>8}{flag}")
    print(f"\n{len(configs) - failures}/{len(configs)} variants compiled without spills", file=sys.stderr)
    return 1 if failures else 0


# ---- tune -----------------------------------------------------------------------------------------
def _format_result(result) -> str:
    config = result.config
    knobs = " ".join(f"{k}={v}" for k, v in config.to_dict().items() if k != "family")
    failures = ", ".join(f"{n} {k}" for k, n in sorted(result.failures.items())) or "none"
    rows = [
        ("problem", str(result.problem)),
        ("device", f"{result.device.name} ({result.device.arch}, {result.device.sm_count} SMs)"),
        ("best config", config.name),
        ("knobs", knobs),
        ("TFLOP/s", f"{result.tflops:.2f}"),
        ("cuBLAS TFLOP/s", f"{result.cublas_tflops:.2f}  (cupy.matmul, same run)"),
        ("ratio", f"{result.ratio:.3f}x cuBLAS"),
        ("rel. error", f"{result.rel_error:.2e}" if result.rel_error == result.rel_error else "n/a"),
        ("trials", f"{result.valid} valid, {result.rejected} rejected, {result.failed} failed ({failures}), "
                   f"{result.duplicates} repeats; {result.study_trials} measured in the study"),
        ("wall time", f"{result.wall_s:.1f} s" + (f"  ({result.restarts} measuring-process restarts, "
                                                  f"{result.restart_s:.1f} s)" if result.restarts else "")),
        *([("stopped", f"{result.stopped}: best verified result so far kept, not re-timed")] if result.stopped else []),
        ("cached in", result.cache_path or "-"),
        ("study", f"{result.study_name} @ {result.storage or 'memory'}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def cmd_tune(args: argparse.Namespace) -> int:
    from .evaluate import FatalEvaluationError
    from .space import SearchSpace, SpaceError, default_space_name
    from .tuner import TuneError, tune

    problem = problem_from_args(args)
    try:
        space = SearchSpace.load(args.space or default_space_name(problem))
    except SpaceError as exc:
        raise CliError(str(exc)) from None
    if space.family != SearchSpace.load(default_space_name(problem)).family:
        raise CliError(f"--space {args.space}: a {space.family} space cannot compute {problem.dtype}/{problem.compute}")
    _require_gpu()
    try:
        result = tune(problem, trials=args.trials, timeout=args.timeout, seed=args.seed, sampler=args.sampler,
                      space=space, storage=args.storage, study_name=args.study_name, jobs=args.jobs,
                      progress=not args.json, isolate=not args.no_isolation,
                      candidate_timeout=args.candidate_timeout)
    except (TuneError, FatalEvaluationError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(_format_result(result))
    return 0


def _require_gpu() -> None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as exc:
        raise CliError(f"a CUDA GPU is needed for this command ({type(exc).__name__}: {exc})") from None


# ---- bench ----------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    from .cache import TuningCache
    from .evaluate import GpuEvaluator
    from .launch import current_device
    from .tuner import default_jobs

    problem = problem_from_args(args)
    _require_gpu()
    device = current_device()
    found = TuningCache().lookup(problem, device.slug)
    if found is None:
        raise CliError(f"no tuned kernel for {problem} on {device.name}; run: autogemm tune {_problem_flags(problem)}")
    record, source = found
    evaluator = GpuEvaluator(problem, device, jobs=min(2, default_jobs()), seed=args.seed)
    try:
        (measured,), cublas_ms = evaluator.retime([record.config_object], rounds=args.rounds)
    finally:
        evaluator.close()
    if not measured.ok:
        raise CliError(f"cached kernel {record.config_name} failed: {measured.kind}: {measured.message}")
    ratio = cublas_ms / measured.time_ms
    out = {
        "problem": problem.key, "device": device.name, "config": record.config_name, "source": source,
        "time_ms": measured.time_ms, "tflops": measured.tflops, "cublas_ms": cublas_ms,
        "cublas_tflops": problem.flops / cublas_ms / 1e9, "ratio": ratio, "rel_error": measured.rel_error,
        "tuned_ratio": record.ratio,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{problem} on {device.name}: {record.config_name} ({source} cache)\n"
              f"  {measured.tflops:.2f} TFLOP/s vs cuBLAS {out['cublas_tflops']:.2f} TFLOP/s: {ratio:.3f}x "
              f"(tuned at {record.ratio:.3f}x); rel. error {measured.rel_error:.1e}")
    return 0


def _problem_flags(problem: Problem) -> str:
    flags = f"--M {problem.m} --N {problem.n} --K {problem.k}"
    if problem.batch > 1:
        flags += f" --batch {problem.batch}"
    if problem.layout != "nn":
        flags += f" --layout {problem.layout}"
    return flags


# ---- cache ----------------------------------------------------------------------------------------
def cmd_cache(args: argparse.Namespace) -> int:
    from .cache import TuningCache

    cache = TuningCache()
    if args.action == "list":
        rows = []
        for slug in cache.devices():
            for source, record in cache.records(slug):
                status = "stale (templates changed)" if record.stale else "ok"
                rows.append((slug, source, record.problem, record.config_name, f"{record.tflops:.1f}",
                             f"{record.ratio:.3f}", record.date[:10], status))
        if not rows:
            print(f"no tuned kernels in {cache.directory}" + (f" or {cache.shipped}" if cache.shipped else ""))
            return 0
        header = ("device", "source", "problem", "config", "TFLOP/s", "vs cuBLAS", "date", "status")
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        for row in [header] + rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
        return 0
    if args.action == "show":
        if not args.key:
            raise CliError("cache show needs a problem key, e.g. float32/fp32/nn/b1/4096x4096x4096")
        matches = [{"device": slug, "source": source, **record.to_json()}
                   for slug in cache.devices() for source, record in cache.records(slug) if record.problem == args.key]
        if not matches:
            raise CliError(f"no cached entry for {args.key}")
        print(json.dumps(matches, indent=2))
        return 0
    if args.action == "export":
        if not args.key:
            raise CliError("cache export needs a destination file")
        count = cache.export(args.key)
        print(f"exported {count} records to {args.key}")
        return 0
    if args.action == "import":
        if not args.key:
            raise CliError("cache import needs a file written by cache export")
        try:
            count = cache.import_bundle(args.key)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        print(f"merged {count} records from {args.key} into {cache.directory}")
        return 0
    if args.action == "verify":
        return _cache_verify(cache, include_shipped=args.all)
    if args.action == "clear":
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError("cache clear deletes every tuned result in " f"{cache.directory}; add --yes to confirm")
            answer = input(f"delete every tuned result in {cache.directory}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        removed = cache.clear()
        print(f"removed {len(removed)} cache files from {cache.directory}")
        return 0
    raise CliError(f"unknown cache action {args.action!r}")


def _cache_verify(cache, include_shipped: bool) -> int:
    """Re-verifies every current record of this GPU; drops the user's that fail."""
    from .evaluate import FatalEvaluationError, IsolatedEvaluator
    from .launch import current_device

    _require_gpu()
    device = current_device()
    records = [(source, r) for source, r in cache.records(device.slug, include_shipped=include_shipped) if not r.stale]
    if not records:
        print(f"nothing to verify for {device.name} in {cache.directory}")
        return 0
    bad = 0
    for source, record in records:
        problem = record.problem_object
        try:
            evaluator = IsolatedEvaluator(problem, device, jobs=1)
        except FatalEvaluationError as exc:
            raise CliError(str(exc)) from None
        try:
            result = evaluator.verify(record.config_object)
        finally:
            evaluator.close()
        if result.ok:
            print(f"ok      {record.problem:<40} {record.config_name}  rel. error {result.rel_error:.1e}, "
                  f"{result.tflops:.1f} TFLOP/s (cached {record.tflops:.1f})")
            continue
        bad += 1
        if source == "user":
            cache.remove(device.slug, record.problem)
            action = "dropped"
        else:
            action = "shipped, kept"
        print(f"FAILED  {record.problem:<40} {record.config_name}  {result.kind}: {result.message[:120]} ({action})")
    print(f"{len(records) - bad}/{len(records)} cached kernels verified on {device.name}")
    return 1 if bad else 0


# ---- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autogemm",
        description="Generate, tune and serve CUDA GEMM kernels. Kernels are rendered from Jinja2 "
        "templates, compiled with NVRTC (or nvcc without a GPU), searched with Optuna per problem "
        "and device, verified against a float64 reference, and cached.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render_p = sub.add_parser("render", help="print the CUDA source of one configuration",
                              description="Print the CUDA source that a configuration renders to. The "
                              "problem only decides the layout and which tails need bounds checks.")
    render_p.add_argument("--config", required=True,
                          help=f"JSON object of knobs (missing ones default), e.g. '{{\"bm\": 64}}', or a name like {SimtConfig().name}")
    render_p.add_argument("--arch", help="validate against this architecture's limits (default sm_90)")
    render_p.add_argument("--force", action="store_true", help="render even if check() rejects the config")
    add_problem_arguments(render_p, m_required=False, default_size=4096)
    render_p.set_defaults(handler=cmd_render)

    check_p = sub.add_parser("check", help="compile a sample of a search space with nvcc and report resources",
                             description="Render and compile a sample of a search space with nvcc (no GPU "
                             "needed) and print registers, spills and shared memory per variant. Exits 1 "
                             "if any variant fails to compile or spills registers.")
    check_p.add_argument("--space", help="search-space TOML file or shipped name (default: the one for the dtype: simt, "
                         "wmma_tf32, wmma_fp16, wmma_bf16, wmma_fp64)")
    check_p.add_argument("--arch", default="sm_90", help="target architecture (default sm_90)")
    check_p.add_argument("--count", type=positive_int, default=12, help="variants to compile (default 12)")
    check_p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    check_p.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    add_problem_arguments(check_p, m_required=False, default_size=4096)
    check_p.set_defaults(handler=cmd_check)

    from .tuner import DEFAULT_TIMEOUT_S, DEFAULT_TRIALS, SAMPLERS, default_jobs

    tune_p = sub.add_parser(
        "tune", help="search the best kernel for a problem on this GPU and cache it",
        description="Search kernel configurations for one GEMM problem on the current GPU with Optuna. "
        "Every candidate is verified against a float64 reference before it is timed; cuBLAS "
        "(cupy.matmul) is timed on the same inputs in the same run. The best few are re-timed "
        "together at the end, and the winner is cached for autogemm.matmul. The study is kept, so "
        "running the same command again resumes and adds --trials more. Ctrl-C stops and keeps the "
        "best verified result so far.")
    add_problem_arguments(tune_p, m_required=True)
    search = tune_p.add_argument_group("search")
    search.add_argument("--trials", type=positive_int, default=DEFAULT_TRIALS,
                        help=f"measured (valid) candidates to try in this run (default {DEFAULT_TRIALS})")
    search.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds of search before the final re-timing (default {DEFAULT_TIMEOUT_S:g})")
    search.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    search.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="Optuna sampler (default tpe)")
    search.add_argument("--space", help="search-space TOML file or shipped name (default: the one for the dtype and compute mode)")
    search.add_argument("--storage", help="Optuna storage URL (default: SQLite in the cache directory; "
                                          "':memory:' keeps nothing)")
    search.add_argument("--study-name", help="study name (default: device, problem, space and template version)")
    search.add_argument("--jobs", type=positive_int, default=default_jobs(),
                        help=f"parallel compile workers (default {default_jobs()})")
    safety = tune_p.add_argument_group("fault isolation")
    safety.add_argument("--candidate-timeout", type=float, metavar="SECONDS",
                        help="time one candidate may take before it counts as hung and its measuring process "
                             "is killed and restarted (default: from the problem's flops and the GPU's peak)")
    safety.add_argument("--no-isolation", action="store_true",
                        help="measure in this process: a little less overhead, but a faulting or hanging "
                             "kernel ends the tune")
    tune_p.add_argument("--json", action="store_true", help="print the result as JSON (no progress bar)")
    tune_p.set_defaults(handler=cmd_tune)

    bench_p = sub.add_parser("bench", help="re-time the cached kernel of a problem against cuBLAS",
                             description="Verify and re-time the cached kernel of a problem on this GPU, "
                             "interleaved with cuBLAS (cupy.matmul) on the same inputs, and print the ratio.")
    add_problem_arguments(bench_p, m_required=True)
    bench_p.add_argument("--rounds", type=positive_int, default=5, help="interleaved timing rounds (default 5)")
    bench_p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    bench_p.add_argument("--json", action="store_true", help="print the result as JSON")
    bench_p.set_defaults(handler=cmd_bench)

    cache_p = sub.add_parser("cache", help="list, show, export, import or clear tuned results",
                             description="Manage tuned results: list (every record, stale ones marked), "
                             "show KEY (records of a problem key), verify [--all] (re-verify this GPU's cached "
                             "kernels on fresh inputs, each in an isolated process, and drop the wrong ones), "
                             "export FILE, import FILE, clear [--yes]. "
                             "User results live in $AUTOGEMM_CACHE_DIR or the user cache directory; results "
                             "shipped with autogemm are listed too and read after the user's.")
    cache_p.add_argument("action", choices=("list", "show", "verify", "export", "import", "clear"))
    cache_p.add_argument("key", nargs="?", help="problem key (show) or file (export, import)")
    cache_p.add_argument("--yes", action="store_true", help="clear without asking")
    cache_p.add_argument("--all", action="store_true",
                         help="verify: also the shipped results for this GPU (reported, not dropped)")
    cache_p.set_defaults(handler=cmd_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except CliError as exc:
        print(f"autogemm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autogemm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
