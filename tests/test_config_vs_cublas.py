"""benchmarks/config_vs_cublas.py without a GPU: the problem and the configurations it is given, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
bench = load_script(ROOT / "benchmarks" / "config_vs_cublas.py")


def test_configurations_are_read_by_name():
    name = "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts"
    (config,) = bench.configs_from([name])
    assert config.name == name and (config.bm, config.bn) == (128, 256)


@pytest.mark.parametrize("argv, message", [
    (["bfloat16:nt:64x64x64", "nonsense"], "'nonsense' is not a configuration name"),
    (["bfloat16:xx:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts"], "is not a problem"),
    (["bfloat16:nt:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--rounds", "0"], "--rounds"),
    (["bfloat16:nt:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--between", "-1"], "--between"),
    (["bfloat16:nt:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--between", "nan"], "--between"),
    # a layer is timed as torch.nn.Linear holds it
    (["bfloat16:nn:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--epilogue", "bias"],
     "--epilogue times a layer as torch.nn.Linear holds it"),
    (["bfloat16:nt:2x64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--epilogue", "bias"],
     "no batch"),
    (["float32:nt:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--epilogue", "bias"], "float16 or"),
    (["bfloat16:nt:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--epilogue", "relu"], "--epilogue"),
    # cuBLASLt's runners-up: what they compete with, how many, and only where cuBLASLt computes the epilogue
    (["bfloat16:nt:64x64x64"], "name a configuration to time, or --lt-algorithms N"),
    (["bfloat16:nt:64x64x64", "--lt-algorithms", "65"], "--lt-algorithms must be from 0 to 64"),
    (["bfloat16:nt:64x64x64", "--lt-algorithms", "-1"], "--lt-algorithms must be from 0 to 64"),
    (["bfloat16:nt:64x64x64", "--epilogue", "bias+silu", "--lt-algorithms", "4"],
     "cuBLASLt's epilogues compute no silu"),
])
def test_what_does_not_read_is_refused_by_name(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_profile_once_warms_each_call_then_launches_each_once_between_start_and_stop(monkeypatch):
    """--profile-once: what `ncu --profile-from-start off` profiles is one launch of each competitor, after
    their warm-ups, and the profiler is stopped even where a launch fails."""
    import cupy

    events = []

    class Device:
        def synchronize(self):
            events.append("sync")

    monkeypatch.setattr(cupy.cuda, "Device", Device)
    monkeypatch.setattr(cupy.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(cupy.cuda.profiler, "stop", lambda: events.append("stop"))
    calls = {name: (lambda i, name=name: events.append(name)) for name in ("torch.matmul", "hopper_x")}
    lines = bench.launched_once(calls)
    start, stop = events.index("start"), events.index("stop")
    assert events[:start].count("torch.matmul") == bench.WARM_CALLS == events[:start].count("hopper_x")
    assert [e for e in events[start:stop] if e != "sync"] == ["start", "torch.matmul", "hopper_x"]
    assert stop == len(events) - 1 and "torch.matmul, hopper_x" in lines[0]

    def failing(i):
        if "start" in events:
            raise RuntimeError("launch failed")

    events.clear()
    with pytest.raises(RuntimeError):
        bench.launched_once({"broken": failing})
    assert events[-1] == "stop"


def test_between_follows_every_call_with_the_kernel_and_times_it_alone():
    """--between: each competitor's call is enqueued, then the kernel between, in that order; and the kernel
    between is a competitor of its own, so that its share can be taken out."""
    events = []
    calls = {name: (lambda i, name=name: events.append((name, i))) for name in ("torch.matmul", "hopper_x")}
    timed = bench.with_kernel_between(calls, lambda: events.append("between"))
    assert set(timed) == {"torch.matmul", "hopper_x", bench.BETWEEN_ALONE}
    timed["hopper_x"](3)
    timed["torch.matmul"](4)
    timed[bench.BETWEEN_ALONE](5)
    assert events == [("hopper_x", 3), "between", ("torch.matmul", 4), "between", "between"]


def test_the_share_captured_is_eager_s_epilogue_cost_saved_as_the_unseen_bench_judges_it():
    """--epilogue: (eager - route) / (eager - GEMM alone), the same figure unseen_epilogues_table.ceiling gives."""
    from unseen_epilogues_table import AUTOGEMM, EAGER, GEMM_ALONE, ceiling

    means = {bench.EAGER: 110.0, bench.GEMM_ALONE: 100.0, "fused": 104.0, "slow": 115.0}
    assert [bench.captured(means, name) for name in ("fused", "slow", bench.EAGER, bench.GEMM_ALONE)] == \
        ["60%", "-50%", "0%", "100%"]
    assert ceiling({EAGER: 110.0, GEMM_ALONE: 100.0, AUTOGEMM: 104.0})[1] == pytest.approx(0.6)
    # no share where eager's epilogue costs nothing (or the GEMM alone is not timed)
    assert bench.captured({**means, bench.EAGER: 99.0}, "fused") == "-"
    assert bench.captured({bench.EAGER: 110.0, "fused": 104.0}, "fused") == "-"


def test_no_cublaslt_algorithm_is_looked_up_where_none_is_asked():
    """A SiLU layer has no cuBLASLt epilogue: without --lt-algorithms its configurations are timed, not refused
    (the device's first run of the SiLU rows failed there); asked for, it names what is missing."""
    from autogemm.epilogue import Epilogue
    from autogemm.problem import Problem

    silu = Problem.from_layout(1024, 9216, 2304, "nt", dtype="bfloat16", epilogue=Epilogue("n", "silu"))
    assert bench.lt_algorithm_calls(silu, None, None, None, None, 0) == []
    with pytest.raises(ValueError, match="cuBLASLt has no epilogue computing bias_n\\+silu"):
        bench.lt_algorithm_calls(silu, None, None, None, None, 2)
