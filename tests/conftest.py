"""Test setup: GPU tests (marked `gpu`) are skipped automatically where no CUDA GPU is usable; the
exhaustive GPU samples (marked `exhaustive`) run only with `--exhaustive`; the long tests (marked
`long`) are started first. Every test keeps tuned results and studies in a cache directory of its own;
compiled kernels, which are keyed by their source digest, are shared by the whole run, all pytest-xdist
workers (so that kernels compiled ahead in parallel serve every test)."""

from __future__ import annotations

import functools
import os
import shutil

import pytest


def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true",
                     help="also run the exhaustive GPU samples (tests marked exhaustive; minutes on an H100)")


def pytest_configure(config):
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("quick", max_examples=20, derandomize=True)
    settings.register_profile("exhaustive", max_examples=80)
    settings.load_profile("exhaustive" if config.getoption("--exhaustive") else "quick")


@functools.lru_cache(maxsize=1)
def gpu_available() -> tuple[bool, str]:
    """Whether a CUDA GPU is usable, and where not, why: in the words the command line uses."""
    from autogemm.gpu.runtime import GpuUnavailable, require_gpu

    try:
        require_gpu()
    except GpuUnavailable as exc:  # no CuPy, no driver, no device, an insufficient driver
        return False, str(exc)
    return True, ""


# The first chunk of the queue pytest-xdist sends each worker, by its scheduling (`--dist`):
# - load (its default): this many consecutive tests each (xdist.scheduler.load.LoadScheduling.schedule), then
#   the rest as workers free up;
# - worksteal (what CI runs): the whole queue, split into one run of consecutive tests per worker
#   (xdist.scheduler.worksteal.WorkStealingScheduling.check_schedule), an idle worker then taking half of the
#   longest queue's tail.
def _first_chunks(tests: int, workers: int, dist: str = "load") -> list[int]:
    if dist != "worksteal":
        return [max(tests // workers // 4, 2)] * workers
    chunks = []
    for worker in range(workers):
        chunks.append(tests // (workers - worker))
        tests -= chunks[-1]
    return chunks


def _long_first(items: list, workers: int, dist: str = "load") -> list:
    """`items` reordered so that each worker's first chunk begins with its share of the long tests (marked
    `long`, their seconds given), the longest first to the least loaded (so that no worker ends the run on
    several), the other tests in their order after them; as they are where one process runs them all."""
    seconds = {id(item): marker.kwargs.get("seconds", 0) for item in items
               if (marker := item.get_closest_marker("long")) is not None}
    if workers < 2 or not seconds:
        return items
    lanes: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in sorted((item for item in items if id(item) in seconds), key=lambda item: -seconds[id(item)]):
        lane = loads.index(min(loads))
        lanes[lane].append(item)
        loads[lane] += seconds[id(item)]
    rest = [item for item in items if id(item) not in seconds]
    ordered: list = []
    for lane, chunk in zip(lanes, _first_chunks(len(items), workers, dist)):
        fill = max(chunk - len(lane), 0)
        ordered += lane + rest[:fill]
        rest = rest[fill:]
    return ordered + rest


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(pytest-xdist, on the controller) Tells each worker the run's scheduling, which a worker's own options
    do not keep (xdist sets its `dist` to "no"), so that it orders its collection for it."""
    node.workerinput["dist"] = node.config.getoption("dist")


@pytest.hookimpl(trylast=True)  # (after `-m` has deselected: the chunks are of the tests that run)
def pytest_collection_modifyitems(config, items):
    workerinput = getattr(config, "workerinput", {})  # (each worker orders its own collection)
    items[:] = _long_first(items, workerinput.get("workercount", 1), workerinput.get("dist", "load"))
    if not config.getoption("--exhaustive"):
        skip = pytest.mark.skip(reason="an exhaustive sample: run with --exhaustive")
        for item in items:
            if "exhaustive" in item.keywords:
                item.add_marker(skip)
    ok, why = gpu_available()
    if not ok:
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def _run_directory(tmp_path_factory, name: str):
    """A directory `name` of the whole run, shared by pytest-xdist's workers too (the parent of a worker's
    base temporary directory is the run's)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # (not under pytest-xdist)
        return tmp_path_factory.mktemp(name)
    shared = tmp_path_factory.getbasetemp().parent / name
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session", autouse=True)
def _short_sustained_warm_up():
    """The GPU tier's tunes check what a tune does, not its figures: their sustained comparisons warm up for
    300 ms, not the 2.5 s decisions take (timing.WARMUP_ENV; 37 s of the quick tier otherwise), unless the run
    sets it."""
    from autogemm.measure.timing import WARMUP_ENV

    before = os.environ.get(WARMUP_ENV)
    os.environ.setdefault(WARMUP_ENV, "300")
    yield
    if before is None:
        os.environ.pop(WARMUP_ENV, None)


@pytest.fixture(scope="session", autouse=True)
def _shared_cubins(tmp_path_factory):
    """One cubin directory for the run (`_run_directory`): a kernel one worker compiled is found by the
    others. Cubins are stored atomically with their digests (kernels/compile.py), so concurrent compilers
    are safe."""
    before = os.environ.get("AUTOGEMM_CUBIN_DIR")
    os.environ["AUTOGEMM_CUBIN_DIR"] = str(_run_directory(tmp_path_factory, "cubin"))
    yield
    if before is None:
        os.environ.pop("AUTOGEMM_CUBIN_DIR", None)
    else:
        os.environ["AUTOGEMM_CUBIN_DIR"] = before


@pytest.fixture(scope="session", autouse=True)
def _shared_native_build(tmp_path_factory, request):
    """One build directory of linear's C++ memo for the run (serving/native_linear.py; `_run_directory`),
    unless AUTOGEMM_NATIVE_DIR names one (a build kept between runs): the tests never build into the
    user's cache. Where a test of the run needs the memo, its build starts now, in the background
    (`_start_native_build`)."""
    before = os.environ.get("AUTOGEMM_NATIVE_DIR")
    if before is None:
        os.environ["AUTOGEMM_NATIVE_DIR"] = str(_run_directory(tmp_path_factory, "native"))
    _start_native_build(request.session.items)
    yield
    if before is None:
        os.environ.pop("AUTOGEMM_NATIVE_DIR", None)


@pytest.fixture(scope="session", autouse=True)
def _compile_ahead_in_background(_shared_cubins, request):
    """Where a test that will run uses a module's `compiled_ahead` and the module can start it early
    (`start_compiling_ahead`, test_gpu_kernels.py), it starts now, in the background, into the run's
    shared cubin directory, so that its compilation overlaps the tests before the module's."""
    started = set()
    for item in request.session.items:
        module = getattr(item, "module", None)
        if (module is None or module in started or "compiled_ahead" not in getattr(item, "fixturenames", ())
                or item.get_closest_marker("skip") is not None):
            continue
        start = getattr(module, "start_compiling_ahead", None)
        if start is not None:
            start()
            started.add(module)


@pytest.fixture(scope="module")
def memo_type():
    """linear's memo in C++ as serving makes it (tests/test_native_linear*.py): `memo_type(max_entries,
    prepare=True)`, native_linear.new_memo's; the test is skipped where it cannot be built here."""
    why = native_unbuildable()
    if why:
        pytest.skip(f"linear's C++ memo cannot be built here: {why}")
    from autogemm.serving import native_linear

    return functools.partial(native_linear.new_memo, native_linear.load())


def native_unbuildable() -> str:
    """Why linear's C++ memo cannot be built here ("": it can): it needs PyTorch, ninja and a C++ compiler."""
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except ImportError:
        return "no PyTorch"
    if not is_ninja_available():
        return "no ninja"
    if shutil.which("c++") is None:
        return "no C++ compiler"
    return ""


def _start_native_build(items: list) -> bool:
    """Starts building linear's C++ memo in the background where a test that will run is marked `native`
    and the build can run here (`native_unbuildable`): its half a minute of one core then overlaps the tests
    before the first that needs it, which otherwise waits for the whole build. pytest-xdist's workers each
    start it; the build's file lock lets one compile while the others wait. It only builds and loads the
    module (`native_linear.load`), leaving native_linear's state to the tests that set it; a failure is
    theirs to report. Whether it started."""
    if not any(item.get_closest_marker("native") is not None and item.get_closest_marker("skip") is None
               for item in items):
        return False
    if native_unbuildable():  # (the memo's tests skip, saying why)
        return False
    import threading

    from autogemm.serving import native_linear

    def build() -> None:
        try:
            native_linear.load()
        except Exception:  # (the tests that need the memo build it again and say why it failed)
            pass

    threading.Thread(target=build, name="autogemm-test-native-build", daemon=True).start()
    return True


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch, request):
    """Every test reads and writes tuned results and studies in a cache directory of its own,
    never the user's; and sees no shipped results (cache/ holds records for the GPUs the GPU tests
    run on, which would answer problems a test means to be untuned) unless it is marked
    `shipped_results`."""
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    if "native" not in request.keywords:  # (no test but those marked builds linear's C++ memo or meets it)
        monkeypatch.setenv("AUTOGEMM_NATIVE", "0")
    if "shipped_results" not in request.keywords:
        monkeypatch.setattr("autogemm.results.cache.shipped_cache_dir", lambda: None)
