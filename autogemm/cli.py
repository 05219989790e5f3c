"""The `autogemm` command: a thin argparse layer over the library."""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from .config import SimtConfig
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


def parse_config(text: str) -> SimtConfig:
    """A config as a JSON object of knobs (missing knobs take their defaults) or a config name."""
    text = text.strip()
    if not text.startswith("{"):
        try:
            return SimtConfig.from_name(text)
        except ValueError as exc:
            raise CliError(f"--config: {exc}; give a JSON object of knobs or a name like {SimtConfig().name}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CliError("--config must be a JSON object of knobs")
    try:
        return SimtConfig.from_dict(data)
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

    config = parse_config(args.config)
    problem = problem_from_args(args)
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
    from .space import SearchSpace, SpaceError

    try:
        find_nvcc()
        space = SearchSpace.load(args.space)
    except (NvccNotFound, SpaceError) as exc:
        raise CliError(str(exc)) from None
    device = device_for(args.arch)
    problem = problem_from_args(args)
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
            flag = "  <- spills" if usage.spills else ""
            failures += bool(usage.spills)
            print(f"{config.name:<48} {usage.registers:>5} {usage.spills:>8} {usage.stack_bytes:>8} {smem:>8}{flag}")
    print(f"\n{len(configs) - failures}/{len(configs)} variants compiled without spills", file=sys.stderr)
    return 1 if failures else 0


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
    check_p.add_argument("--space", help="search-space TOML file or shipped name (default: simt)")
    check_p.add_argument("--arch", default="sm_90", help="target architecture (default sm_90)")
    check_p.add_argument("--count", type=positive_int, default=12, help="variants to compile (default 12)")
    check_p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    check_p.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    add_problem_arguments(check_p, m_required=False, default_size=4096)
    check_p.set_defaults(handler=cmd_check)
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
