"""`autogemm report`: a page built from a study recorded on the CPU (trials made with
optuna.trial.create_trial, as a tune on a GPU leaves them) and a cache record. The figures' data
are read back from the page and compared with what was recorded; the page names nothing outside
itself; headless Chromium draws every chart without a console error; the refusals are clear."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autogemm.results.cache import Record, TuningCache
from autogemm.cli import main
from autogemm.families import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.kernels.render import kernel_template_hash
from autogemm.kernels.space import SearchSpace
from autogemm.tuning.study import study_name_for

pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")

DEVICE = Device(name="Test GPU", compute_capability=(9, 0), sm_count=132, smem_per_block_optin=227 * 1024,
                smem_per_sm=228 * 1024)
FP32 = Problem(4096, 4096, 4096)
FP16 = Problem.from_layout(2048, 4096, 1024, "nt", dtype="float16")
HOSTILE = "<img src=x onerror=alert(1)>"  # a failure kind as a hostile storage could hold it
STRANGER = "someone's <script>alert(2)</script> study"  # a study not named as autogemm names them
KNOBS = {"bk": (4, 8, 16, 32), "stages": (1, 2, 3, 4), "global_width": (1, 2, 4)}
CUBLAS_TFLOPS = 40.0


def _complete(number: int, bk: int, stages: int, width: int, **attrs):
    value = 20.0 + bk / 2 + 3 * stages + (number % 3) * 0.25  # bk and stages matter; width does not
    return optuna.trial.create_trial(
        params={"bk": bk, "stages": stages, "global_width": width},
        distributions={k: CategoricalDistribution(v) for k, v in KNOBS.items()}, value=value,
        user_attrs={"config": f"cfg_{bk}_{stages}_{width}", "time_ms": FP32.flops / value / 1e9, **attrs})


def _failed(kind: str, **attrs):
    return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params={"bk": 4, "stages": 1, "global_width": 1},
                                     distributions={k: CategoricalDistribution(v) for k, v in KNOBS.items()},
                                     user_attrs={"failure": kind, "message": "boom", "config": "cfg_bad", **attrs})


def _rejected():
    return optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params={"bk": 32, "stages": 4, "global_width": 4},
                                     distributions={k: CategoricalDistribution(v) for k, v in KNOBS.items()},
                                     user_attrs={"rejected": ["threads: 2048 > 1024"]})


@pytest.fixture(scope="module")
def recorded_storage(tmp_path_factory):
    """An SQLite storage with two problems' studies and a stranger's, written once (a trial is a
    transaction); returns (its path, the FP32 study's measured values in trial order)."""
    path = tmp_path_factory.mktemp("storage") / "studies.db"
    url = f"sqlite:///{path}"
    fp32 = optuna.create_study(study_name=study_name_for(FP32, DEVICE, SearchSpace.load("simt")), storage=url,
                               direction="maximize")
    trials, values = [], []
    combos = [(bk, stages, width) for bk in KNOBS["bk"] for stages in KNOBS["stages"] for width in (1, 4)][:20]
    for bk, stages, width in combos:
        trials.append(_complete(len(trials), bk, stages, width))
        values.append(trials[-1].value)
        if len(trials) == 5:  # a repeated proposal, answered from the study: not a new point
            trials.append(_complete(len(trials), bk, stages, width, duplicate=True))
    trials += [_failed("compile"), _failed("compile"), _failed("wrong"), _failed(HOSTILE),
               _failed("compile", duplicate=True), _rejected(), _rejected(), _rejected()]
    fp32.add_trials(trials)
    fp16 = optuna.create_study(study_name=study_name_for(FP16, DEVICE, SearchSpace.load("wmma_fp16")), storage=url,
                               direction="maximize")
    fp16.add_trials([_complete(0, 8, 2, 1), _complete(1, 16, 3, 4), _rejected()])
    optuna.create_study(study_name=STRANGER, storage=url)
    return path, values


def _store_fp32_record() -> SimtConfig:
    """The FP32 problem's record (SimtConfig's kernel, 1.1x cuBLAS) in the test's cache; its config."""
    config = SimtConfig()
    TuningCache().store(Record(
        problem=FP32.key, family="simt", config={k: v for k, v in config.to_dict().items() if k != "family"},
        config_name=config.name, time_ms=2.5, tflops=FP32.flops / 2.5e-3 / 1e12, cublas_ms=2.75,
        cublas_tflops=CUBLAS_TFLOPS, ratio=1.1, rel_error=2e-7, template_hash=kernel_template_hash(config.template),
        device=DEVICE.name, date="2026-11-30T12:00:00"), DEVICE.slug)
    return config


@pytest.fixture
def recorded(recorded_storage, tmp_path):
    """A copy of the recorded storage in the test's directory, and the FP32 problem's cache record
    in the test's cache; returns (storage URL, the FP32 study's measured values in trial order)."""
    path, values = recorded_storage
    shutil.copy(path, tmp_path / "studies.db")
    _store_fp32_record()
    return f"sqlite:///{tmp_path / 'studies.db'}", values


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def figures(page: str) -> list[tuple[str, str, dict]]:
    """(div id, kind, figure) of every chart of a page, each div checked to be there."""
    found = re.findall(r'<script type="application/json" class="figure" data-for="([\w-]+)" data-chart="(\w+)">(.*?)</script>',
                       page, re.S)
    for ident, kind, _ in found:
        assert f'<div class="chart" id="{ident}" data-chart="{kind}"></div>' in page
    return [(ident, kind, json.loads(data)) for ident, kind, data in found]


def traces(figure: dict) -> dict[str, dict]:
    return {html.unescape(t.get("name", "")): t for t in figure["data"]}


class Links(HTMLParser):
    """Every src and href attribute of a page (script bodies are text to this parser, not tags)."""

    def __init__(self):
        super().__init__()
        self.references, self.script_sources = [], []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href"):
                self.references.append(value or "")
                if tag == "script":
                    self.script_sources.append(value)


def test_the_page_holds_every_chart_with_the_recorded_data(recorded, tmp_path, capsys):
    url, values = recorded
    out = tmp_path / "report.html"
    code, printed, err = run_cli(capsys, "report", "--all", "--storage", url, "-o", str(out))
    assert code == 0, err
    assert "2 problem(s), 2 studies, 1 device(s); 1 studies not named" in printed
    page = out.read_text()
    charts = figures(page)
    kinds = [kind for _, kind, _ in charts]
    # across problems, then per problem (by key: FP16 first) its studies' history, importances (not
    # for FP16's 2 trials) and failures
    assert kinds == ["roofline", "sweep", "history", "failures", "history", "importance", "failures"]
    by_kind = {}
    for _, kind, figure in charts:
        by_kind.setdefault(kind, []).append(figure)

    history = traces(by_kind["history"][1])
    assert history["measured trial"]["y"] == values  # the duplicate left out, the order kept
    assert history["best so far"]["y"] == [max(values[:i + 1]) for i in range(len(values))]
    assert history["cuBLAS (cache record's run)"]["y"] == [CUBLAS_TFLOPS, CUBLAS_TFLOPS]
    assert "cuBLAS (cache record's run)" not in traces(by_kind["history"][0])  # FP16: no record, no cuBLAS figure
    assert "Parameter importances skipped: 2 measured trial(s): too few" in page

    importance = by_kind["importance"][0]["data"][0]
    assert sorted(importance["y"]) == sorted(KNOBS)
    weights = dict(zip(importance["y"], importance["x"]))
    assert weights["global_width"] < min(weights["bk"], weights["stages"])

    failures = by_kind["failures"][1]["data"][0]
    counts = dict(zip((html.unescape(x) for x in failures["x"]), failures["y"]))
    assert counts == {"compile": 2, "wrong": 1, HOSTILE: 1, "rejected": 3}  # the repeated failure counted once
    assert dict(zip(by_kind["failures"][0]["data"][0]["x"], by_kind["failures"][0]["data"][0]["y"])) == {"rejected": 1}

    roofline = traces(by_kind["roofline"][0])
    ours = roofline["autogemm float32/fp32"]
    assert math.isclose(ours["x"][0], 2 * 4096 ** 3 / (4 * 3 * 4096 ** 2))
    assert math.isclose(ours["y"][0], FP32.flops / 2.5e-3 / 1e12)
    assert roofline["cuBLAS float32/fp32"]["y"] == [CUBLAS_TFLOPS]
    assert roofline["autogemm float16/fp32"]["y"] == [20.0 + 8 + 9 + 0.25]  # the FP16 study's best trial
    ceiling = roofline[f"float32/fp32 best measured {FP32.flops / 2.5e-3 / 1e12:.1f}"]
    assert ceiling["y"][0] == pytest.approx(FP32.flops / 2.5e-3 / 1e12)
    assert not any(name.startswith("bandwidth") for name in roofline)  # nothing measured it: no line
    assert "No bandwidth line: no measured bandwidth" in page

    sweep = traces(by_kind["sweep"][0])
    assert sweep["float32/fp32"]["y"] == [1.1] and sweep["float32/fp32"]["x"] == ["4096×4096×4096 NN"]

    # the winner's knobs and figures, and the stranger's study named as skipped
    assert SimtConfig().name in page and "1.100x" in page and "40.00" in page
    # nothing from the storage reaches the page unescaped (the stranger's name is in the text, the
    # failure kind in a figure), and the page names nothing outside itself
    assert STRANGER not in page and html.escape(STRANGER) in page
    assert HOSTILE not in page and html.escape(HOSTILE) in page
    links = Links()
    links.feed(page)
    assert links.script_sources == []
    assert not [r for r in links.references if re.match(r"\s*(https?:)?//", r, re.I)]
    assert "<script src=" not in page.lower()


def test_benchmark_results_give_the_sweep_and_a_measured_bandwidth(recorded, tmp_path, capsys):
    url, _ = recorded
    bench = tmp_path / "shapes.json"
    rows = [{"problem": FP32.key, "dtype": "float32", "compute": "fp32", "ratio": 1.02, "tflops": 60.0, "cupy_ms": 3.3},
            {"problem": "float16/fp32/nn/b1/1024x1024x1024", "ratio": 0.98, "tflops": 300.0},
            {"problem": "not a key", "ratio": 5.0}]
    bench.write_text(json.dumps({"mode": "shipped", "device": DEVICE.name, "bandwidth": 3.0e12, "rows": rows}))
    out = tmp_path / "report.html"
    code, _, err = run_cli(capsys, "report", "--M", "4096", "--storage", url, "--bench", str(bench), "-o", str(out))
    assert code == 0, err
    page = out.read_text()
    by_kind = {kind: figure for _, kind, figure in figures(page)}
    sweep = traces(by_kind["sweep"])
    assert sweep["float32/fp32"]["y"] == [1.02] and sweep["float16/fp32"]["y"] == [0.98]
    roofline = traces(by_kind["roofline"])
    assert roofline["bandwidth 3000 GB/s"]["y"][0] == pytest.approx(3000 * roofline["bandwidth 3000 GB/s"]["x"][0] / 1000)
    assert "float32/fp32 best measured 60.0" in roofline  # the results file's figure beats the record's (55)
    assert roofline["float32/fp32 best measured 60.0"]["x"][0] == pytest.approx(20.0)  # the roof starts at the ridge
    assert "shapes.json" in page and "1 GiB device-to-device copy" in page
    # --bandwidth wins over a measured one, and says so
    code, _, err = run_cli(capsys, "report", "--M", "4096", "--storage", url, "--bandwidth", "2500", "-o", str(out))
    assert code == 0, err
    assert "bandwidth 2500 GB/s" in traces({k: f for _, k, f in figures(out.read_text())}["roofline"])
    assert "given with --bandwidth" in out.read_text()


@pytest.mark.parametrize("argv, message", [
    (["--storage", "sqlite:///{tmp}/missing.db", "--all"], "the study storage sqlite:///{tmp}/missing.db does not exist"),
    (["--storage", "journal:///{tmp}/missing.log", "--all"], "does not exist"),
    (["--storage", "sqlite:///{tmp}/studies.db", "--M", "64"], "no study of float32/fp32/nn/b1/64x64x64 in"),
    (["--storage", "sqlite:///{tmp}/studies.db"], "name the problem (--m"),
    (["--storage", "sqlite:///{tmp}/studies.db", "--all", "--dtype", "float16"], "it takes no problem options (got --dtype)"),
    (["--storage", "sqlite:///{tmp}/studies.db", "--all", "--bench", "{tmp}/none.json"], "--bench {tmp}/none.json: no such file"),
])
def test_what_does_not_exist_is_named(recorded, tmp_path, capsys, argv, message):
    out = tmp_path / "report.html"
    code, _, err = run_cli(capsys, "report", *[a.format(tmp=tmp_path) for a in argv], "-o", str(out))
    assert code == 2 and message.format(tmp=tmp_path) in err
    assert not out.exists() and not (tmp_path / "missing.db").exists()  # nothing created where nothing was


def test_an_empty_default_storage_says_to_tune_first(tmp_path, capsys):
    code, _, err = run_cli(capsys, "report", "--all", "-o", str(tmp_path / "r.html"))
    assert code == 3 and "no studies yet: the default study storage" in err and "tune a problem first" in err


def test_a_record_that_kept_cublas_shows_the_best_generated_kernel_it_beat(recorded, tmp_path, capsys):
    from autogemm.results.cache import cublas_record

    url, _ = recorded
    cache = TuningCache()
    generated, _ = cache.lookup(FP32, DEVICE.slug)
    cache.store(cublas_record(dataclasses.replace(generated, ratio=0.97, tflops=38.8)), DEVICE.slug, keep_better=False)
    out = tmp_path / "report.html"
    assert run_cli(capsys, "report", "--M", "4096", "--storage", url, "-o", str(out))[0] == 0
    page = out.read_text()
    by_kind = {kind: figure for _, kind, figure in figures(page)}
    roofline = traces(by_kind["roofline"])
    assert roofline["autogemm float32/fp32"]["y"] == [38.8] and roofline["cuBLAS float32/fp32"]["y"] == [CUBLAS_TFLOPS]
    assert traces(by_kind["sweep"])["float32/fp32"]["y"] == [0.97]
    assert "cuBLAS (no generated kernel beat it" in page and SimtConfig().name in page


def test_a_database_that_is_not_a_study_storage_is_refused_unaltered(tmp_path, capsys):
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text)")
    before = path.read_bytes()
    code, _, err = run_cli(capsys, "report", "--all", "--storage", f"sqlite:///{path}", "-o", str(tmp_path / "r.html"))
    assert code == 2 and "holds no Optuna studies" in err
    assert path.read_bytes() == before


def test_profile_without_ncu_is_refused_before_any_work(recorded, tmp_path, capsys, monkeypatch):
    url, _ = recorded
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = tmp_path / "report.html"
    code, _, err = run_cli(capsys, "report", "--all", "--storage", url, "--profile", "-o", str(out))
    assert code == 3
    assert "--profile needs Nsight Compute's 'ncu' on PATH" in err
    assert not out.exists()


def test_profile_with_ncu_but_no_gpu_is_refused(recorded, tmp_path, capsys, monkeypatch):
    from conftest import gpu_available

    if gpu_available()[0]:
        pytest.skip("a GPU is present: the refusal for its absence cannot be seen")
    url, _ = recorded
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ncu").write_text("#!/bin/sh\nexit 0\n")
    (fake / "ncu").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    code, _, err = run_cli(capsys, "report", "--all", "--storage", url, "--profile", "-o", str(tmp_path / "r.html"))
    assert code == 3 and "--profile" in err and ("CUDA GPU" in err or "CuPy" in err)


def test_nsight_compute_csv_is_read_kernel_by_kernel():
    from autogemm.measure.profile import parse_csv

    text = "\n".join([
        "==PROF== Connected to process 4242",
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name","Metric Name",'
        '"Metric Unit","Metric Value"',
        '"0","4242","python","host","ag_gemm_128x128","1","7","Command line profiler metrics","gpu__time_duration.sum",'
        '"nsecond","2,766,975"',
        '"0","4242","python","host","ag_gemm_128x128","1","7","Command line profiler metrics",'
        '"launch__registers_per_thread","register/thread","168"',
        '"1","4242","python","host","ag_reduce","1","7","Command line profiler metrics","gpu__time_duration.sum",'
        '"nsecond","12,000"',
        "==PROF== Disconnected from process 4242",
    ])
    kernels = parse_csv(text, "autogemm.matmul")
    assert [k.kernel for k in kernels] == ["ag_gemm_128x128", "ag_reduce"]
    assert kernels[0].shown("gpu__time_duration.sum") == "2,766,975 nsecond"
    assert kernels[0].shown("launch__registers_per_thread") == "168 register/thread"
    assert kernels[1].shown("launch__registers_per_thread") == "n/a"


def test_only_the_pipes_the_gpu_lists_are_asked_for(tmp_path):
    """ncu refuses a run that names a metric the GPU lacks; the pipe metrics differ by architecture."""
    import ast

    from autogemm.measure.profile import DRIVER, METRICS, available_metrics

    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\necho 'Metric Name   Metric Description'\n"
                   "echo 'sm__pipe_fma_cycles_active   # of cycles where the FMA pipe was active'\n"
                   "echo 'sm__throughput   SM throughput'\n")
    ncu.chmod(0o755)
    asked = available_metrics(str(ncu))
    assert "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active" in asked
    assert not [m for m in asked if m.startswith("sm__pipe_tensor")]
    assert "launch__registers_per_thread" in asked and "gpu__time_duration.sum" in asked
    assert available_metrics(str(tmp_path / "missing-ncu")) == METRICS  # no listing: ask for every one
    ast.parse(DRIVER)  # the driver script, which only a GPU runs, is at least Python


def test_without_plotly_the_message_names_the_extra(recorded, tmp_path, capsys, monkeypatch):
    import sys

    url, _ = recorded
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly now raises ImportError
    code, _, err = run_cli(capsys, "report", "--all", "--storage", url, "-o", str(tmp_path / "r.html"))
    assert code == 3 and "pip install 'autogemm[report]'" in err


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="no chromium or chromium-browser on PATH (CI installs Debian's chromium)")
def test_headless_chromium_draws_every_chart_without_console_errors(recorded, tmp_path, capsys):
    url, _ = recorded
    out = tmp_path / "report.html"
    assert run_cli(capsys, "report", "--all", "--storage", url, "-o", str(out))[0] == 0
    charts = [ident for ident, _, _ in figures(out.read_text())]
    shot = tmp_path / "report.png"
    # a profile of its own: a parallel run's Chromium does not share this one's lock files; one run
    # draws the page, dumps its DOM and takes the screenshot (a browser start costs seconds)
    flags = [chromium(), "--headless=new", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=1", "--virtual-time-budget=10000"]
    done = subprocess.run([*flags, "--window-size=1280,2400", f"--screenshot={shot}", "--dump-dom", out.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for index, ident in enumerate(charts):
        start = dom.index(f'id="{ident}"')
        end = dom.index(f'id="{charts[index + 1]}"') if index + 1 < len(charts) else len(dom)
        assert "main-svg" in dom[start:end], f"{ident} was not drawn"
    errors = [line for line in done.stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]
    assert errors == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    if os.environ.get("AUTOGEMM_KEEP_SCREENSHOT"):  # for a person to look at
        shutil.copy(shot, os.environ["AUTOGEMM_KEEP_SCREENSHOT"])


def test_the_page_shows_the_figures_the_tune_table_and_explain_show(recorded, tmp_path, capsys):
    """A record of the current timing protocol: its GPU times and single-call latencies of the
    kernel and the baseline, each baseline's time and the protocol, as `tune` printed them."""
    url, _ = recorded
    cache = TuningCache()
    record, _ = cache.lookup(FP32, DEVICE.slug)
    cache.store(dataclasses.replace(record, protocol=2, latency_us=2512.5, baseline_latency_us=2771.25,
                                    baselines={"cublaslt": 2.75, "cupy.matmul": 2.8}), DEVICE.slug, keep_better=False)
    out = tmp_path / "report.html"
    assert run_cli(capsys, "report", "--M", "4096", "--storage", url, "-o", str(out))[0] == 0
    page = out.read_text()
    for text in ("timing protocol</th><td>2<", "2500.0 us / 2750.0 us", "2512.5 us / 2771.2 us", "1.103x",
                 "cublaslt 2750.0 us, cupy.matmul 2800.0 us"):
        assert text in page, text
    assert "older protocol" not in page


# ---- the records of a cache, without studies ----------------------------------------------------------
def test_a_cache_record_without_a_study_is_reported_from_the_record(tmp_path, capsys):
    """No study storage at all (nothing tuned on this machine): the cache's records are the report."""
    config = _store_fp32_record()
    for argv in (["--all"], ["--m", "4096"]):
        out = tmp_path / "r.html"
        code, printed, err = run_cli(capsys, "report", *argv, "-o", str(out))
        assert code == 0, err
        page = out.read_text()
        assert FP32.key in page and config.name in page and "1.100x" in page
        assert not {"history", "importance", "failures"} & {kind for _, kind, _ in figures(page)}  # no study: no trials
        assert "1 problem(s), 0 studies" in printed
    code, _, err = run_cli(capsys, "report", "--m", "64", "-o", str(tmp_path / "x.html"))
    assert code == 2 and "no study of float32/fp32/nn/b1/64x64x64" in err and "no cache record of it" in err


@pytest.mark.shipped_results
def test_a_fresh_install_reports_the_shipped_results(tmp_path, capsys):
    out = tmp_path / "shipped.html"
    code, printed, err = run_cli(capsys, "report", "--all", "-o", str(out))
    assert code == 0, err
    shipped = sum(len(TuningCache().records(slug)) for slug in TuningCache().devices())
    assert shipped > 100 and f"{shipped} problem(s), 0 studies" in printed
