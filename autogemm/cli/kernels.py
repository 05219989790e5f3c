"""`autogemm render` and `autogemm check`: a configuration's CUDA source, and ptxas's resource report
of a sample of a search space, compiled with NVRTC or else nvcc (neither needs a GPU)."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

from .. import dtypes
from ..kernels import ptxas_report
from ..kernels.compile import CompileError
from ..kernels.render import render
from ..kernels.space import SearchSpace, SpaceError, default_space_name
from .arguments import EXIT_FAILURES, CliError, CliFailure, device_for, load_space, parse_config, problem_from_args
from .output import print_json


def cmd_render(args: argparse.Namespace) -> int:
    problem = problem_from_args(args)
    config = parse_config(args.config, problem, ranges=not args.force)
    reasons = config.check(problem, device_for(args.arch))
    if reasons and not args.force:
        raise CliError(f"config {config.name} cannot run {problem}:\n  " + "\n  ".join(reasons)
                       + _dtype_hint(config, problem, args) + "\n(--force renders it anyway)")
    try:
        code = render(config, problem, force=args.force).code
    except ValueError as exc:  # (e.g. a string knob not one of its choices: refused even with --force)
        raise CliError(str(exc)) from None
    sys.stdout.write(code)
    return 0


def _dtype_hint(config, problem, args: argparse.Namespace) -> str:
    """Where the problem's dtype was left to its default and the config's family cannot compute it
    (Hopper, WMMA: no float32/fp32), the flags that give it one it computes."""
    if args.dtype or args.compute or not config.dtype_reasons(problem):
        return ""
    flags = [f"--dtype {row.name}" + ("" if dtypes.lookup(row.name, "").compute == row.compute
                                      else f" --compute {row.compute}") for row in config.computes()]
    flags.sort(key=lambda flag: "--compute" in flag)  # a dtype's own mode first: the plainest call
    return f"\n(give the dtype: {', '.join(flags[:-1])} or {flags[-1]})" if len(flags) > 1 \
        else f"\n(give the dtype: {flags[0]})"


def cmd_check(args: argparse.Namespace) -> int:
    space = None
    if args.space:
        space = load_space(args.space)
        if args.dtype is None and not args.compute:  # the space says what it is for
            args.dtype, args.compute = space.dtypes[0]
    problem = problem_from_args(args)
    if space is not None and (problem.dtype, problem.compute) not in space.dtypes:
        raise CliError(f"--space {args.space} is for {', '.join('/'.join(p) for p in space.dtypes)}, not "
                       f"{problem.dtype}/{problem.compute}; leave out --dtype and --compute to check it with its own")
    try:
        compiler = ptxas_report.report_compiler()  # (through the module, so that tests can stand in for it)
    except ptxas_report.CompilerNotFound as exc:
        raise CliFailure(str(exc)) from None
    device = device_for(args.arch)
    if space is None:
        try:
            space = SearchSpace.load(default_space_name(problem, device))
        except SpaceError as exc:
            raise CliError(str(exc)) from None
    configs = space.sample(args.count, problem, device, seed=args.seed)
    if not configs:
        raise CliError(f"no configuration of {space.path} is valid for {problem} on {device.arch}")
    print(f"compiling {len(configs)} variants of {space.path.name} for {problem} with {compiler.name}, "
          f"-arch={device.arch}",
          file=sys.stderr)

    def compile_one(config):
        source = render(config, problem)
        try:
            return config, compiler.resources(source, device.arch)[source.kernel], None
        except CompileError as exc:
            return config, None, str(exc).splitlines()[0]

    failures = refused = 0
    width = max(len("config"), *(len(config.name) for config in configs))  # the column fits every name
    header = f"{'config':<{width}} {'regs':>5} {'spill B':>8} {'stack B':>8} {'smem B':>8}"
    if not args.json:
        print(header)
        print("-" * len(header))
    rows = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for config, usage, error in pool.map(compile_one, configs):
            if error:
                failures += 1
                rows.append({"config": config.name, "error": error})
                if not args.json:
                    print(f"{config.name:<{width}} compile error: {error}")
                continue
            smem = config.smem_bytes(problem)
            spills = bool(usage.spills or usage.stack_bytes)
            capped = bool(config.register_cap)
            # under an explicit max_registers a spill is a possible outcome, and the loader refuses such a
            # kernel (gpu/launch.py), as a tune does: an expected refusal (a failure only with --strict).
            # A spill without a cap is check()'s register model wrong: a failure.
            flag = ("  <- spills: refused when loaded (max_registers)" if capped else "  <- spills") if spills else ""
            refused += spills and capped
            failures += spills and (not capped or args.strict)
            rows.append({"config": config.name, "registers": usage.registers, "spill_bytes": usage.spills,
                         "stack_bytes": usage.stack_bytes, "shared_bytes": smem, "spills": spills,
                         "register_cap": config.register_cap or None, "refused": spills and capped})
            if not args.json:
                print(f"{config.name:<{width}} {usage.registers:>5} {usage.spills:>8} {usage.stack_bytes:>8} {smem:>8}{flag}")
    if args.json:
        print_json({"space": space.path.name, "problem": problem.key, "arch": device.arch, "variants": rows,
                    "failures": failures, "refused": refused})
    errors = sum("error" in row for row in rows)
    spilled = sum(bool(row.get("spills")) for row in rows)
    detail = ", ".join(part for part in (f"{spilled - refused} spill" if spilled > refused else "",
                                         f"{refused} spill under max_registers and are refused when loaded, as a "
                                         "tune refuses them" if refused else "",
                                         f"{errors} failed to compile" if errors else "") if part)
    print(f"\n{len(configs) - spilled - errors}/{len(configs)} variants compiled without spills"
          + (f" ({detail})" if detail else "") + (" (--strict: refused variants count as failures)"
                                                  if args.strict and refused else ""), file=sys.stderr)
    return EXIT_FAILURES if failures else 0
