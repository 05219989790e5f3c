"""`autogemm native`: build linear's C++ memo now (serving/native_linear.py), where a process would otherwise
build it in the background the first time it needs it."""

from __future__ import annotations

import argparse
import importlib.util
import os

from .arguments import CliFailure
from .output import print_json


def add_native_parser(sub) -> None:
    native_p = sub.add_parser(
        "native", help="build autogemm.linear's C++ memo now (else built on first use, in the background)",
        description="Compile the C++ memo that serves, from C++, the layers and products PyTorch's own calls "
        "serve (docs/serving.md, 'The C++ memo'), and say where it is kept. A process builds it the first time it "
        "needs it, in the background, while the Python route serves; building it once ahead (a deployment's "
        "image, a job's first step) spares that. It needs PyTorch, a C++ compiler and ninja (extra 'native'), "
        "takes about half a minute, and is kept per PyTorch version in $AUTOGEMM_NATIVE_DIR (default: native/ in "
        "the user cache directory). AUTOGEMM_NATIVE=0 turns it off. Exits 3 where it cannot be built, saying why.")
    native_p.add_argument("--json", action="store_true", help="print the status and the directory as JSON")
    native_p.set_defaults(handler=cmd_native)


def cmd_native(args: argparse.Namespace) -> int:
    from ..serving import native_linear  # (lazy: it reads PyTorch's version)

    if not native_linear.enabled():
        raise CliFailure(f"the C++ memo is turned off ({native_linear.SWITCH}="
                         f"{os.environ.get(native_linear.SWITCH)!r}; 1 or unset turns it on)")
    if importlib.util.find_spec("torch") is None:
        raise CliFailure("the C++ memo is a PyTorch extension: install PyTorch first")
    ready = native_linear.build(wait=True, timeout=native_linear.BUILD_TIMEOUT_S)
    directory = native_linear.native_dir() / native_linear.module_name()
    if not ready:
        raise CliFailure(f"the C++ memo could not be built in {directory}: {native_linear.failure() or 'timed out'}")
    if args.json:
        print_json({"status": "ready", "directory": str(directory)}, indent=None)
    else:
        print(f"autogemm.linear's C++ memo is ready: {directory}")
    return 0

