"""A memo in C++ of the calls PyTorch's own calls serve: built once per machine and PyTorch, loaded lazily.

Where cuBLAS serves a layer's GEMM and eager's calls compute its epilogue (eager_epilogue.py: F.linear with
the bias, then the activation and residual in place), the Python around those calls is what separates
`autogemm.linear` from eager on short layers: on an H200's host, linear's key and lookup cost 2-4 us a call,
where the whole layer's GEMM may take 20. Python cannot make that up: eager's `F.gelu(F.linear(x, w, b))` is
two calls with nothing between them. The same holds for `matmul`'s 16-bit products handed to torch.matmul.

`native_linear.cpp` holds such calls' keys (the operands' metadata, the activation) in a C++ map and, for a call it
holds, makes the ATen calls itself, one call from Python. Python files a key after its own route served the call
(`route` says which layers, and how the memo serves them); the dispatcher empties the memo whenever it empties
linear's other memos (a tune, a plan retired or replaced). What runs for a key is eager's calls (F.linear with the
bias, then the activation and the residual in place: eager's bits), or the Python route's own (its cuBLASLt call,
the residual read as C or the heuristic's runner-up its tune chose; for a layer with a pass on more than
MAX_OUTPUT_WITH_PASS output elements or on one token, F.linear and then that pass, launched from C++: that route's
bits), on any operands the key admits; or, where a tune with the layer's epilogue kept a generated kernel, that
kernel (its launch, arguments and tensor maps as the Python launcher packs them, launched from C++: from Python,
such a layer of 50 us on the GPU ran 0.876x eager one call at a time on the seed-3954 draw, the host time before
its launch). Where F.linear would run cuBLASLt's BIAS epilogue, the key holds that call prepared (its descriptors
and algorithm made once, with PyTorch's workspace size and alignment, so that the heuristic picks F.linear's
kernel): F.linear builds them and asks the heuristic on every call. A key whose route is the Python route's holds
that route's call prepared, or is not filed. The extension finds cuBLASLt and CUDA's driver in the libraries
PyTorch has loaded and needs no CUDA headers. docs/serving.md ("The C++ memo") and docs/decisions/native-memo.md
have the figures.

It is a PyTorch C++ extension, compiled with the machine's C++ compiler the first time a process needs it
(`torch.utils.cpp_extension`, which needs `ninja`; about half a minute), in a subprocess, in the background:
until it is ready, and where it cannot be built, the Python route serves (a failure is logged once). The build
is kept in `native_dir()` under a name of its source's and PyTorch's digest, so each PyTorch version and each
change of the source builds once; a file lock lets one process build while the others wait.

`AUTOGEMM_NATIVE=0` turns it off; `build(wait=True)` (or `autogemm native`) builds it now.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ..gpu.cublas_gemm import WORKSPACE_BYTES
from ..paths import user_cache_dir
from .eager_epilogue import TorchEagerEpiloguePlan
from .epilogue_step import TorchLtEpiloguePlan
from .fused_epilogue import TorchFusedEpiloguePlan
from .lt_linear import torch_workspace_bytes

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_linear.cpp")
# what SOURCE includes (the headers beside it, named native_*.h): its build, and so the module's name, follows
# them too (a hand-kept list would let a new header change the build without changing the name)
HEADERS = tuple(sorted(SOURCE.parent.glob("native_*.h")))
MAX_ENTRIES = 1024  # keys held (a process's layers times its distinct token counts): emptied when full
# Where a pass follows the GEMM (an activation, a residual), the Python route computes the epilogue faster on the
# GPU than eager's calls: by about 0.3-0.8 us per million output elements on an H200 (F.linear then the pass
# against F.linear then PyTorch's own kernels), where the memo saves 1-3 us of host time a call (journal, session
# 56: 16 layers of a dev draw timed both ways). Up to this many output elements the memo makes eager's calls for
# such a layer; a larger one it serves with the Python route's calls, F.linear and then the pass
# (native_prepared_pass.h).
MAX_OUTPUT_WITH_PASS = 1 << 22
BUILD_TIMEOUT_S = 900.0  # a compilation that takes longer has gone wrong
SWITCH = "AUTOGEMM_NATIVE"
# the subprocess that compiles: torch.utils.cpp_extension, kept out of the serving process (its build lock
# outlives a process killed while it builds; a subprocess finishes its build and removes it)
_BUILD = """
import sys
from torch.utils.cpp_extension import load
load(name=sys.argv[1], sources=[sys.argv[2]], build_directory=sys.argv[3], extra_cflags=["-O2"], verbose=False)
"""

_lock = threading.Lock()
_state = {"status": "idle", "module": None, "thread": None, "why": ""}
_waiting: list[Any] = []  # dispatchers to hand a Memo once the module is loaded


# How the memo takes a layer's calls (`route`)
EAGER_CALLS = "eager's calls"  # F.linear (its cuBLASLt call prepared where it has one), then eager's in place
# the Python route's cuBLASLt call, prepared: the residual read as C, or the heuristic's runner-up a tune chose
LT_CALL = "the Python route's cuBLASLt call"
# the Python route's calls: F.linear (the bias in it but for one token; its cuBLASLt call prepared then), the pass
WITH_PASS = "F.linear and the pass"
KERNEL = "the tuned kernel"  # the generated kernel a tune with the epilogue kept, launched from C++


def route(plan: Any, x: Any, weight: Any, activation: Any, residual: Any) -> str | None:
    """How the memo takes `linear`'s calls like this one, which `plan` served (on tensors, with no out,
    out_dtype or gate); None where it does not. A layer eager_epilogue serves, where F.linear serves it whole or
    its output has at most MAX_OUTPUT_WITH_PASS elements: EAGER_CALLS; a larger one with a pass, one of a
    single token, or one whose tune left the bias to the pass: WITH_PASS. A 16-bit layer that the Python route's
    cuBLASLt plan serves, a residual (and perhaps a bias) read as C, or its tune's runner-up of the heuristic
    (`lt_call`): LT_CALL. A layer whose tune with its epilogue kept a generated kernel the memo can launch
    (TorchFusedEpiloguePlan.native_launch): KERNEL."""
    if lt_call(plan, x, weight, activation, residual):
        return LT_CALL
    if isinstance(plan, TorchFusedEpiloguePlan):
        return KERNEL if plan.native_launch() is not None else None
    if not isinstance(plan, TorchEagerEpiloguePlan):
        return None
    if plan.finish is None:
        return EAGER_CALLS
    rows = x.numel() // max(1, x.shape[-1])
    # (one token: F.linear gives cuBLASLt no bias epilogue, but copies the bias and runs a GEMM, and eager's
    # activation follows, three launches to the Python route's two; a layer whose tune measured the bias in the
    # pass faster: eager's calls would put it back in F.linear)
    return EAGER_CALLS if 1 < rows and rows * weight.shape[0] <= MAX_OUTPUT_WITH_PASS \
        and not plan.finish.bias_left_by_tune else WITH_PASS


def lt_call(plan: Any, x: Any, weight: Any, activation: Any, residual: Any) -> bool:
    """Whether `plan` is the Python route's cuBLASLt plan (epilogue_step.TorchLtEpiloguePlan) on 16-bit tensors,
    without an activation, reading a residual as C or running the heuristic's runner-up, or the GEMM alone's
    algorithm, that the layer's tune timed faster (its `rank`; then the bias is the epilogue): the memo holds that
    call prepared, with the same
    workspace size, alignment and rank, so that cuBLASLt runs the same kernel (or leaves the layer to the
    Python route)."""
    return (isinstance(plan, TorchLtEpiloguePlan) and activation is None and (residual is not None or plan.rank != 0)
            and x.dtype == weight.dtype and (residual is None or residual.dtype == x.dtype) and x.element_size() == 2)


def file_linear(dispatcher: Any, plan: Any, x: Any, weight: Any, bias: Any, activation: Any, residual: Any) -> None:
    """Files `linear`'s call (on tensors, with no out, out_dtype or gate), which `plan` served, in the
    dispatcher's memo where the memo takes it (`route`); as linear_memo.file files its own."""
    memo = dispatcher.native_memo
    if memo is None and dispatcher.native_asked:  # (asked already, none given: off, failed or building)
        return
    taken = route(plan, x, weight, activation, residual)
    if taken is None:
        return
    if memo is None:
        _ask(dispatcher)
    elif taken is WITH_PASS:
        launch = plan.finish.native_launch()
        if launch is not None:
            memo.file(x, weight, bias, activation, residual, pass_launch=launch,
                      bias_in_linear=plan.finish.bias_in_linear)
    elif taken is KERNEL:
        memo.file(x, weight, bias, activation, residual, kernel_launch=plan.native_launch())
    elif taken is LT_CALL:
        memo.file(x, weight, bias, activation, residual, lt_call=True, lt_rank=plan.rank)
    else:
        memo.file(x, weight, bias, activation, residual)


def file_matmul(dispatcher: Any, a: Any, b: Any) -> None:
    """Files `matmul`'s call on tensors (no keywords) that torch.matmul served, in the dispatcher's memo."""
    memo = dispatcher.native_memo
    if memo is not None:
        memo.file_matmul(a, b)
    else:
        _ask(dispatcher)


def _ask(dispatcher: Any) -> None:
    """The first call the memo could take asks for it (built in the background, once; `attach`)."""
    if not dispatcher.native_asked:
        dispatcher.native_asked = True
        attach(dispatcher)


def enabled() -> bool:
    """Whether `AUTOGEMM_NATIVE` allows the C++ memo ("1" or unset; "0" turns it off; anything else is an
    error, logged once, and counts as off)."""
    value = os.environ.get(SWITCH, "1")
    if value in ("0", "1"):
        return value == "1"
    if _state["status"] != "refused":
        log.error("%s=%r: expected 0 or 1; the C++ memo of linear stays off", SWITCH, value)
        _state["status"] = "refused"
    return False


def native_dir() -> Path:
    """Where the extension is built: ``$AUTOGEMM_NATIVE_DIR`` if set, else ``native/`` in the user cache
    directory (beside, not inside, a tune's results)."""
    override = os.environ.get("AUTOGEMM_NATIVE_DIR")
    return Path(override).expanduser() if override else user_cache_dir() / "native"


def module_name() -> str:
    """The extension's name: its source's and headers' digest with PyTorch's version and the interpreter's (a
    build of another source, or for another PyTorch, is another module)."""
    import torch  # (lazy: autogemm imports without PyTorch)

    digest = hashlib.sha256(SOURCE.read_bytes())
    for header in HEADERS:
        digest.update(header.read_bytes())
    digest.update(f"{torch.__version__} {sys.implementation.cache_tag} {torch._C._GLIBCXX_USE_CXX11_ABI}".encode())
    return f"autogemm_native_{digest.hexdigest()[:16]}"


def status() -> str:
    """'idle' (not asked for yet), 'building', 'ready', 'failed' or 'off' (AUTOGEMM_NATIVE=0)."""
    return _state["status"] if enabled() else "off"


def failure() -> str:
    """Why the build failed ('' where it did not)."""
    return _state["why"] if _state["status"] == "failed" else ""


def attach(dispatcher: Any) -> None:
    """Gives `dispatcher` a Memo (its `native_memo`) now if the module is loaded, else once it is, starting
    the build if nobody has. Called where the Python route has served a layer the memo could take."""
    if not enabled():  # (also where an earlier build in this process is loaded: the switch is read each time)
        return
    with _lock:
        if _state["status"] == "ready":
            _give_memo(dispatcher)
            return
        if _state["status"] == "failed":
            return
        if dispatcher not in _waiting:
            _waiting.append(dispatcher)
        _start_locked()


def build(wait: bool = True, timeout: float | None = None) -> bool:
    """Starts the build (unless it is done or running) and, with `wait`, waits for it: whether the module is
    loaded."""
    with _lock:
        if enabled() and _state["status"] not in ("ready", "failed"):
            _start_locked()
        thread = _state["thread"]
    if wait and thread is not None:
        thread.join(timeout)
    return _state["status"] == "ready"


def _start_locked() -> None:
    if _state["status"] == "building":
        return
    _state["status"] = "building"
    thread = threading.Thread(target=_build_and_load, name="autogemm-native-build", daemon=True)
    _state["thread"] = thread
    thread.start()


def new_memo(module: Any, max_entries: int = MAX_ENTRIES, prepare: bool = True) -> Any:
    """A Memo of the loaded extension `module`, with the cuBLASLt workspace each route's calls get (cuBLASLt's
    heuristic picks by its size: F.linear's calls get PyTorch's, the Python route's cuBLASLt plans autogemm's).
    `prepare`: whether keys get their cuBLASLt call prepared (False: at::linear serves every key)."""
    return module.Memo(max_entries, torch_workspace_bytes(), WORKSPACE_BYTES, prepare)


def _give_memo(dispatcher: Any) -> None:
    if getattr(dispatcher, "native_memo", None) is None:
        dispatcher.native_memo = new_memo(_state["module"])


def _build_and_load() -> None:
    try:
        module = load()
    except Exception as exc:  # (a missing compiler or ninja, a failed compilation: the Python route serves)
        log.warning("autogemm.linear's C++ memo could not be built, the Python route serves instead: %s", exc)
        with _lock:
            _state.update(status="failed", why=str(exc))
            _waiting.clear()
        return
    with _lock:
        _state.update(status="ready", module=module)
        for dispatcher in _waiting:
            _give_memo(dispatcher)
        _waiting.clear()


def load() -> Any:
    """The extension module, compiled first where no build of this name is kept (under a file lock)."""
    from filelock import FileLock  # (lazy: only a build takes the lock)

    name = module_name()
    directory = native_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"{name}.so"
    with FileLock(str(directory) + ".lock", timeout=BUILD_TIMEOUT_S):
        if not library.is_file():
            log.info("compiling autogemm.linear's C++ memo into %s (once per PyTorch version)", directory)
            done = subprocess.run([sys.executable, "-c", _BUILD, name, str(SOURCE), str(directory)],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if done.returncode != 0 or not library.is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
                raise RuntimeError(f"the compilation exited with {done.returncode}: " + " | ".join(tail))
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
