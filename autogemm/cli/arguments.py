"""Arguments the `autogemm` commands share: the problem, a configuration given as JSON or by name,
the architecture to check against, and the error type that prints as one line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import dtypes, families
from ..families import config_from_dict, config_from_name, family_for
from ..kernels.space import SearchSpace, SpaceError
from ..paths import search_spaces_dir
from ..epilogue import ACTIVATIONS, SCALES, Epilogue
from ..problem import LAYOUTS, Device, Problem
from ..routing import ROUTINGS

COMPUTES = tuple(dict.fromkeys(row.compute for row in dtypes.ROWS))


EXIT_FAILURES = 1  # the command ran and found failures (kernels that spill, cached kernels that are wrong)
EXIT_USAGE = 2  # the command line, or a file it names, is wrong
EXIT_CANNOT_RUN = 3  # the command could not run: no GPU or CuPy, nothing cached, the tune failed


class CliError(Exception):
    """A usage error (arguments, a config, a file given): printed as one line, exit status 2."""


class CliFailure(Exception):
    """The command could not do its work (no GPU, nothing cached, the tune failed): exit status 3."""


def add_output_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """-o/--output OUT, the file a command writes: the one spelling, required, of every command that
    writes a file (report, cache export and merge, campaign export)."""
    parser.add_argument("-o", "--output", metavar="OUT", required=True, help=f"{what} (required)")


def _whole_number(text: str, least: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0, "a whole number >= 0")


def positive_float(text: str, unit: str = "") -> float:
    """A finite number > 0 (`unit`, e.g. "seconds", named in the message)."""
    what = f"a number of {unit}" if unit else "a number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive {what.removeprefix('a ')}, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    return positive_float(text, "seconds")


def compute_mode(text: str) -> str:
    if text and text not in COMPUTES:
        raise argparse.ArgumentTypeError(f"invalid compute mode {text!r} (choose from {', '.join(COMPUTES)})")
    return text


def add_problem_arguments(parser: argparse.ArgumentParser, m_required: bool, default_size: int | None = None, *,
                          timed: bool = False, dtype_note: str = "") -> None:
    """The problem's options, each command's help saying only what holds for it: `timed` (tune, bench)
    adds what each kind of product is timed against; `dtype_note` says where the dtype's default
    comes from where that is not float32 (check --space: the space's own)."""
    group = parser.add_argument_group("problem")
    # lower case as options are spelled (pip, git, pytest); --M/--N/--K stay as the older spelling
    group.add_argument("--m", "--M", "-M", dest="m", metavar="M", type=positive_int, required=m_required,
                       default=default_size, help="rows of C and op(A)" + ("" if m_required or default_size is None
                                                                           else f" (default {default_size})"))
    group.add_argument("--n", "--N", "-N", dest="n", metavar="N", type=positive_int, help="columns of C and op(B) (default: M)")
    group.add_argument("--k", "--K", "-K", dest="k", metavar="K", type=positive_int, help="inner dimension (default: M)")
    group.add_argument("--batch", type=positive_int, default=1, help="matrices in the strided batch (default 1)")
    group.add_argument("--layout", choices=LAYOUTS, help="storage of A and B: n = as is, t = transposed (default nn)")
    group.add_argument("--trans-a", action="store_true", help="A is stored K×M (layouts tn, tt)")
    group.add_argument("--trans-b", action="store_true", help="B is stored N×K (layouts nt, tt)")
    group.add_argument("--dtype", choices=dtypes.DTYPES, help=f"element type (default {dtype_note or 'float32'})")
    group.add_argument("--compute", default="", type=compute_mode, metavar="{" + ",".join(COMPUTES) + "}",
                       help="compute mode (default: the dtype's exact mode, fp32 for float32; tf32 for float32 "
                            "on tensor cores)")
    epilogue = parser.add_argument_group(
        "epilogue", "what the kernel does to its accumulators before the store, D = act(alpha * A @ B + bias) + residual"
        + (": timed with the epilogue in the kernel, against cuBLAS followed by the epilogue's pass (or cuBLASLt's own "
           "epilogue where it has this one)" if timed else ""))
    epilogue.add_argument("--bias", action="store_true", help="add a bias of N values (one per column of C)")
    epilogue.add_argument("--activation", choices=ACTIVATIONS, help="apply an activation after the bias")
    epilogue.add_argument("--residual", action="store_true", help="add a residual of C's shape after the activation")
    scaled = parser.add_argument_group(
        "FP8", "an FP8 product (--dtype float8_e4m3fn or float8_e5m2) as autogemm.scaled_matmul serves it: D = "
        "scale_a * scale_b * A @ B^T, A stored M x K and B N x K (layout nt, the default for FP8)"
        + (", timed against torch._scaled_mm" if timed else ""))
    scaled.add_argument("--scale", choices=SCALES, help="the scales: one each (tensor, the default for FP8), one "
                        "per row of A and per column of B (row), or one per row of A and 128 of K and one per 128 x "
                        "128 block of B (block)")
    scaled.add_argument("--out-dtype", choices=dtypes.FP8_OUTPUTS, help="D's dtype (default bfloat16 for FP8)")
    grouped = parser.add_argument_group(
        "grouped", "a grouped product (a mixture-of-experts layer) as autogemm.grouped_matmul serves it: M rows of A "
        "split into --groups groups by offsets on the GPU, each times its own K x N matrix of B (layout nn: B is "
        "(E, K, N); nt: the transpose of (E, N, K) weights, as torch's Linear stores them)"
        + (", timed against torch._grouped_mm and a loop of torch.matmul" if timed else ""))
    grouped.add_argument("--groups", type=positive_int, help="the number of groups (experts); M is their rows in all")
    grouped.add_argument("--routing", choices=ROUTINGS, help="how the M rows fall to the groups: every group the "
                         "same count (uniform, the default) or counts falling as 1/rank^1.2 (skewed)")


def problem_from_args(args: argparse.Namespace) -> Problem:
    trans_a, trans_b = args.trans_a, args.trans_b
    fp8 = dtypes.lookup(args.dtype).scaled if args.dtype else False
    if args.layout:
        if trans_a or trans_b:
            raise CliError("give either --layout or --trans-a/--trans-b, not both")
        trans_a, trans_b = args.layout[0] == "t", args.layout[1] == "t"
    elif fp8 and not (trans_a or trans_b):
        trans_b = True  # (FP8's layout: both operands K-major)
    scale, out_dtype = getattr(args, "scale", None), getattr(args, "out_dtype", None)
    if not fp8 and (scale or out_dtype):
        raise CliError(f"--scale and --out-dtype are for FP8 products (--dtype float8_e4m3fn or float8_e5m2), not "
                       f"{args.dtype or 'float32'}")
    groups, routing = getattr(args, "groups", None), getattr(args, "routing", None)
    if routing and not groups:
        raise CliError("--routing is for grouped products: give --groups too")
    if groups and args.batch != 1:
        raise CliError("give either --groups (a grouped product) or --batch (a strided batch), not both")
    try:
        epilogue = Epilogue("n" if args.bias else "", args.activation or "", args.residual,
                            (out_dtype or "bfloat16") if fp8 else "", scale=(scale or "tensor") if fp8 else "")
        return Problem(args.m, args.n or args.m, args.k or args.m, batch=groups or args.batch,
                       dtype=args.dtype or "float32", compute=args.compute, trans_a=trans_a, trans_b=trans_b,
                       epilogue=epilogue, grouped=bool(groups), routing=routing or "")
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def parse_config(text: str, problem: Problem, ranges: bool = True) -> GemmConfig:
    """A config as a JSON object of knobs (missing knobs take their defaults; the family is the one
    that computes the problem's dtype unless the object names one) or a config name. Every knob
    must have its exact type and (unless `ranges` is false) a value of its range."""
    family = family_for(problem.dtype, problem.compute)
    text = text.strip()
    if not text.startswith("{"):
        try:
            return config_from_name(text, ranges)
        except ValueError as exc:
            raise CliError(f"--config: {exc}; give a JSON object of knobs or a config name such as "
                           f"{family().name}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CliError("--config must be a JSON object of knobs")
    data = {"family": family.family, **data}
    try:
        return config_from_dict(data, ranges)
    except (TypeError, ValueError) as exc:
        raise CliError(f"--config: {exc}{_knobs_hint(data)}") from None


def _knobs_hint(data: dict) -> str:
    """Where `data` has knobs its family does not know: "; the <family> knobs are ..." (else "")."""
    try:
        config_class = families.get(data["family"])
        given = config_class.upgrade_dict({k: v for k, v in data.items() if k != "family"})
    except (TypeError, ValueError):  # no such family (the error names the known ones) or no knobs to read
        return ""
    known = [knob.name for knob in config_class.knobs]
    if set(given) <= set(known):
        return ""
    return f"; the {config_class.label} knobs are {', '.join(known)}"


def load_space(text: str) -> SearchSpace:
    """The search space --space names (a TOML file or a shipped name); CliError naming the shipped
    spaces where it is neither."""
    try:
        return SearchSpace.load(text)
    except SpaceError as exc:
        message = str(exc)
        shipped = sorted(path.stem for path in search_spaces_dir().glob("*.toml"))
        if not Path(text).exists() and text not in shipped:  # not a broken file: a name nobody ships
            message = (f"--space {text}: no such file, nor a shipped space; the shipped spaces are "
                       f"{', '.join(shipped)} (or give a TOML file)")
        raise CliError(message) from None


def device_for(arch: str | None) -> Device:
    if arch:
        try:
            return Device.for_arch(arch)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    return Device.for_arch("sm_90")
