"""grouped_matmul's checks without a GPU (stand-ins of CuPy arrays): every fault is named (shape, dtype,
device, layout) before anything runs, and a valid call is read right (experts, rows, b's layout)."""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

import numpy as np
import pytest

from autogemm.serving.grouped import check_grouped


@dataclass
class _Device:
    id: int


class FakeArray:
    """What check_grouped reads of a CuPy array: shape, dtype, byte strides and the device."""

    def __init__(self, shape, dtype="float16", strides=None, device=0):
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), _Device(device)
        if strides is None:  # C-contiguous, in elements
            strides, step = [], 1
            for extent in reversed(self.shape):
                strides.append(step)
                step *= extent
            strides = tuple(reversed(strides))
        self.strides = tuple(s * self.dtype.itemsize for s in strides)


E, M, K, N = 4, 100, 64, 96


def _call(a=None, b=None, index=None, masked=False, **keywords):
    a = a if a is not None else FakeArray((E, M, K) if masked else (M, K))
    b = b if b is not None else FakeArray((E, K, N))
    index = index if index is not None else FakeArray((E,) if masked else (E + 1,), "int32")
    return check_grouped(a, b, index, masked=masked, **keywords)


def test_a_valid_call_is_read_right():
    call = _call()
    assert (call.experts, call.rows, call.k, call.n, call.dtype, call.b_k_major, call.masked) == \
        (E, M, K, N, "float16", False, False)
    # b as the transpose of a contiguous (E, N, K) weight: K contiguous
    transposed = _call(b=FakeArray((E, K, N), strides=(N * K, 1, K)), bias=FakeArray((E, N)), activation="silu")
    assert transposed.b_k_major and transposed.bias and transposed.activation == "silu"
    masked = _call(masked=True, out=FakeArray((E, M, N)))
    assert masked.masked and masked.rows == M


@pytest.mark.parametrize("arguments, error, words", [
    (dict(a=FakeArray((M, K), "int8")), TypeError, "a is int8"),
    (dict(b=FakeArray((E, K, N), "float32")), TypeError, "one dtype"),
    (dict(b=FakeArray((K, N))), ValueError, "(E, K, N)"),
    (dict(a=FakeArray((M, K + 1))), ValueError, "K = 65"),
    (dict(a=FakeArray((M, K), strides=(1, M))), ValueError, "a's rows must be contiguous"),
    (dict(b=FakeArray((E, K, N), strides=(K * N, 1, 2 * K))), ValueError, "b must be (E, K, N)"),
    (dict(index=FakeArray((E,), "int32")), ValueError, "E + 1 row offsets"),
    (dict(index=FakeArray((E + 1,), "float32")), ValueError, "integer vector"),
    (dict(bias=FakeArray((N,))), ValueError, "bias must be (E, N)"),
    (dict(activation="tanh"), ValueError, "unknown activation"),
    (dict(b=FakeArray((E, K, N), device=1)), ValueError, "b is on GPU 1"),
    (dict(out=FakeArray((M, N), "float32")), ValueError, "out must be a contiguous"),
    (dict(masked=True, a=FakeArray((E + 1, M, K))), ValueError, "(E, max_M, K)"),
    (dict(masked=True, index=FakeArray((E + 1,), "int64")), ValueError, "one per expert"),
    (dict(b=FakeArray((0, K, N))), ValueError, "no experts"),
])
def test_every_fault_is_named(arguments, error, words):
    with pytest.raises(error) as raised:
        _call(**arguments)
    assert words in str(raised.value), str(raised.value)


def test_operands_of_two_kinds_are_refused():
    class Tensor:  # (a type of torch's module: what is_tensor recognises)
        pass

    Tensor.__module__ = "torch"
    with pytest.raises(TypeError, match="must all be PyTorch tensors or all CuPy arrays"):
        check_grouped(Tensor(), FakeArray((E, K, N)), FakeArray((E + 1,), "int32"), masked=False)


def test_cupy_bfloat16_is_refused_with_the_way_out():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = FakeArray((M, K), ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="PyTorch tensors"):
        _call(a=a, b=FakeArray((E, K, N), ml_dtypes.bfloat16))


def test_a_grouped_problem_has_its_own_key_flops_and_kernel():
    from autogemm.families.hopper import HopperConfig
    from autogemm.kernels.render import render
    from autogemm.problem import Device, Problem

    grouped = Problem(1000, 256, 128, batch=8, dtype="bfloat16", trans_b=True, grouped=True)
    assert grouped.key == "bfloat16/fp32/nt/g8-uniform/1000x256x128" and Problem.from_key(grouped.key) == grouped
    skewed = Problem(1000, 256, 128, batch=8, dtype="bfloat16", trans_b=True, grouped=True, routing="skewed")
    assert skewed.key == "bfloat16/fp32/nt/g8-skewed/1000x256x128" and Problem.from_key(skewed.key) == skewed
    for bad in (dict(grouped=True, routing="zipf"), dict(routing="skewed")):
        with pytest.raises(ValueError, match="routing"):
            Problem(1000, 256, 128, batch=8, dtype="bfloat16", **bad)
    for key in ("bfloat16/fp32/nt/g8/1000x256x128", "bfloat16/fp32/nt/g8-zipf/1000x256x128"):
        with pytest.raises(ValueError):
            Problem.from_key(key)
    assert grouped.flops == 2 * 1000 * 256 * 128  # (the groups share the M rows)
    plain = Problem(1000, 256, 128, batch=8, dtype="bfloat16", trans_b=True)
    assert plain.key != grouped.key and plain.flops == 8 * grouped.flops
    config = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4)
    source = render(config, grouped)
    assert source.kernel.endswith("_grouped") and "group_origin(" in source.code
    # M = 1024 is a multiple of the tile, but a group's rows end anywhere: masked, and so named (e0..)
    tiled = Problem(1024, 256, 128, batch=8, dtype="bfloat16", trans_b=True, grouped=True)
    assert "_e011_" in render(config, tiled).kernel and "EVEN_M = false" in render(config, tiled).code
    with pytest.raises(ValueError, match="no swapped form"):
        render(HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4, swap=True), tiled)
    assert "group_origin(" not in render(config, plain).code
    device = Device.for_arch("sm_90")
    assert config.check(grouped, device) == []
    for knobs in (dict(tma_store=True), dict(cluster=2), dict(split_k=2), dict(swap=True)):
        reasons = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4, **knobs).check(grouped, device)
        assert any(reason.startswith("grouped:") for reason in reasons), (knobs, reasons)
    from autogemm.families import SimtConfig

    assert any(r.startswith("grouped:") for r in SimtConfig().check(grouped, device))
    assert any("groups exceed" in r for r in config.check(Problem(1000, 256, 128, batch=300, dtype="bfloat16",
                                                                    grouped=True), device))


def test_routing_buckets_are_deterministic_and_cover_the_rows():
    from autogemm.routing import ROUTINGS, counts_for, offsets_for

    for routing in ROUTINGS:
        for groups, rows in ((8, 4096), (128, 4096), (128, 65536), (8, 3), (1, 0)):
            counts = counts_for(groups, rows, routing)
            assert len(counts) == groups and sum(counts) == rows and min(counts) >= 0
            assert counts == counts_for(groups, rows, routing)  # (the same counts every call)
            assert offsets_for(groups, rows, routing)[-1] == rows
    uniform, skewed = counts_for(128, 4096, "uniform"), counts_for(128, 4096, "skewed")
    assert max(uniform) - min(uniform) <= 1
    assert max(skewed) > 10 * 4096 / 128 and min(skewed) < 4096 / 128 / 8  # (a heavy expert, many light ones)
    assert min(counts_for(128, 512, "skewed")) == 0  # (few rows: some experts get none)
    with pytest.raises(ValueError, match="routing must be one of"):
        counts_for(8, 64, "zipf")


def test_a_grouped_tune_searches_only_the_spaces_whose_kernels_take_groups():
    from autogemm.kernels.space import candidate_space_names
    from autogemm.problem import Device, Problem

    h100 = Device.for_arch("sm_90")
    grouped = Problem(4096, 768, 2048, batch=128, dtype="bfloat16", trans_b=True, grouped=True, routing="skewed")
    assert candidate_space_names(grouped, h100) == ("hopper",)
    assert "hopper" in candidate_space_names(Problem(4096, 768, 2048, dtype="bfloat16", trans_b=True), h100)
    # the same product ungrouped where another family competes (16-bit on sm_90 is Hopper's alone: supersedes)
    tf32 = Problem(4096, 768, 2048, dtype="float32", compute="tf32", trans_b=True)
    assert len(candidate_space_names(tf32, h100)) > 1
    assert candidate_space_names(dataclasses.replace(tf32, batch=128, grouped=True, routing="skewed"), h100) == ("hopper",)


def _grouped_record(problem, config, ratio=1.2):
    from autogemm.kernels.render import kernel_template_hash
    from autogemm.results.record import PROTOCOL, Record

    time_ms = problem.flops / 500e12 * 1e3
    return Record(problem=problem.key, family=config.family,
                  config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
                  time_ms=time_ms, tflops=500.0, cublas_ms=time_ms * ratio, cublas_tflops=500.0 / ratio, ratio=ratio,
                  rel_error=1e-3, template_hash=kernel_template_hash(config.template), device="x", protocol=PROTOCOL)


def test_the_tuned_grouped_kernel_serves_where_the_routing_buckets_records_kept_it():
    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import grouped_problem
    from autogemm.problem import Device
    from autogemm.results.record import cublas_record
    from autogemm.serving.grouped_plan import GroupedCall, tuned_grouped_config

    h100 = Device.for_arch("sm_90")
    call = GroupedCall(experts=128, rows=4096, k=2048, n=768, dtype="bfloat16", b_k_major=True, bias=False,
                       activation="", masked=False, device=0)
    wide = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=5)
    narrow = HopperConfig(bm=64, bn=128, bk=64, wm=64, wn=128, stages=6)
    problems = {r: grouped_problem(4096, 768, 2048, 128, "bfloat16", True, r) for r in ("uniform", "skewed")}

    def serving(records: dict, routing=None):
        found = tuned_grouped_config(lambda p: (records[p.key], "user") if p.key in records else None, call, routing,
                                     h100)
        return found[0].name if found else None

    assert serving({}) is None  # untuned: torch serves
    uniform_only = {problems["uniform"].key: _grouped_record(problems["uniform"], wide)}
    assert serving(uniform_only) is None  # (the call's routing is not known: the skewed bucket has no record)
    assert serving(uniform_only, "uniform") == wide.name and serving(uniform_only, "skewed") is None
    both = {**uniform_only, problems["skewed"].key: _grouped_record(problems["skewed"], wide)}
    assert serving(both) == wide.name
    differ = {**uniform_only, problems["skewed"].key: _grouped_record(problems["skewed"], narrow)}
    assert serving(differ) is None and serving(differ, "skewed") == narrow.name
    kept = {**uniform_only, problems["skewed"].key: cublas_record(_grouped_record(problems["skewed"], wide, 0.9))}
    assert serving(kept) is None and serving(kept, "uniform") == wide.name
    masked = GroupedCall(experts=128, rows=32, k=2048, n=768, dtype="bfloat16", b_k_major=True, bias=False,
                         activation="", masked=True, device=0)
    assert tuned_grouped_config(lambda p: (both[problems["uniform"].key], "user"), masked, None, h100) is None


def test_where_the_records_kept_the_baseline_the_faster_one_they_measured_serves():
    """A tune that kept the baseline measured both: grouped_matmul serves the faster (the loop beat
    torch._grouped_mm by 6% on Mixtral's skewed 4096 rows on an H100, where the heuristic picks torch)."""
    import dataclasses

    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import grouped_problem
    from autogemm.measure.grouped_measuring import LOOP, TORCH_GROUPED
    from autogemm.results.record import cublas_record
    from autogemm.serving.grouped_plan import GroupedCall, recorded_baseline

    call = GroupedCall(experts=8, rows=4096, k=4096, n=14336, dtype="bfloat16", b_k_major=True, bias=False,
                       activation="", masked=False, device=0)
    config = HopperConfig(bm=128, bn=256, bk=64, wm=64, wn=256, stages=3)
    problems = {r: grouped_problem(4096, 14336, 4096, 8, "bfloat16", True, r) for r in ("uniform", "skewed")}

    def kept(routing, loop_ms, torch_ms):
        record = cublas_record(_grouped_record(problems[routing], config, 0.95))
        return dataclasses.replace(record, baselines={LOOP: loop_ms, TORCH_GROUPED: torch_ms})

    def serving(records: dict, routing=None):
        return recorded_baseline(lambda p: (records[p.key], "user") if p.key in records else None, call, routing)

    loop_wins = {problems["skewed"].key: kept("skewed", 0.743, 0.785)}
    assert serving(loop_wins, "skewed") == LOOP
    assert serving(loop_wins) is None and serving(loop_wins, "uniform") is None  # (no record of that bucket)
    both = {**loop_wins, problems["uniform"].key: kept("uniform", 0.691, 0.683)}
    assert serving(both, "uniform") == TORCH_GROUPED
    assert serving(both) is None  # the buckets disagree: the heuristic decides
    agree = {**loop_wins, problems["uniform"].key: kept("uniform", 10.29, 11.81)}
    assert serving(agree) == LOOP
    kernel = {**loop_wins, problems["uniform"].key: _grouped_record(problems["uniform"], config)}
    assert serving(kernel) is None and serving(kernel, "uniform") is None  # a kernel kept: not a baseline's record


def test_grouped_matmul_names_an_unknown_routing():
    from autogemm import grouped_matmul

    with pytest.raises(ValueError, match="routing must be one of"):
        grouped_matmul(FakeArray((M, K)), FakeArray((E, K, N)), FakeArray((E + 1,), "int32"), routing="zipf")


def test_a_grouped_record_is_no_evidence_for_a_plain_product_and_the_cli_names_groups():
    import argparse
    import dataclasses

    from autogemm.cli.arguments import CliError, add_problem_arguments, problem_from_args
    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import grouped_problem
    from autogemm.problem import Device, Problem
    from autogemm.results.predict import candidates

    h100 = dataclasses.replace(Device.for_arch("sm_90"), sm_count=132, memory_bandwidth=3.35e12)
    config = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=5)
    grouped = grouped_problem(4096, 768, 2048, 8, "bfloat16", True)
    record = _grouped_record(grouped, config, ratio=1.5)
    plain = Problem(4096, 768, 2048, batch=8, dtype="bfloat16", trans_b=True)
    assert candidates(plain, h100, [record]) == []
    assert [c.config.name for c in candidates(grouped_problem(4000, 768, 2048, 8, "bfloat16", True), h100, [record])] \
        == [config.name]

    parser = argparse.ArgumentParser()
    add_problem_arguments(parser, m_required=True)
    args = parser.parse_args("--M 4096 --N 768 --K 2048 --groups 128 --routing skewed --dtype bfloat16 --layout nt".split())
    assert problem_from_args(args).key == "bfloat16/fp32/nt/g128-skewed/4096x768x2048"
    for wrong, words in (("--M 64 --routing skewed", "give --groups too"), ("--M 64 --groups 4 --batch 2", "not both")):
        with pytest.raises(CliError, match=words):
            problem_from_args(parser.parse_args(wrong.split()))


def test_a_loop_of_launches_is_timed_within_cudas_launch_queue():
    """A loop baseline of 128 launches a call once ran a tune past its 10 s: its gated batches outgrew CUDA's
    queue of pending launches, so every sample waited for its gate and was discarded. The batches are cut to
    the queue; calls of one launch keep the protocol as it was."""
    from autogemm.measure.timing import MAX_BATCH, MAX_LAUNCHES_IN_FLIGHT, SAMPLES_IN_FLIGHT, launch_limits

    assert launch_limits(1) == (8, MAX_BATCH, SAMPLES_IN_FLIGHT)
    for launches in (2, 8, 128, 256, 300, MAX_LAUNCHES_IN_FLIGHT):
        first, batch, in_flight = launch_limits(launches)
        assert first >= 1 and batch >= 1 and first <= batch
        assert first * launches <= MAX_LAUNCHES_IN_FLIGHT and batch * launches * (in_flight + 1) <= MAX_LAUNCHES_IN_FLIGHT
    with pytest.raises(ValueError, match="cannot be timed behind the gate"):
        launch_limits(MAX_LAUNCHES_IN_FLIGHT + 1)


def test_a_grouped_record_is_stored_and_found_under_its_routing_bucket(tmp_path):
    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import grouped_problem
    from autogemm.results.cache import TuningCache

    cache = TuningCache(tmp_path, shipped=False)
    config = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=5)
    skewed = grouped_problem(4096, 768, 2048, 128, "bfloat16", True, "skewed")
    cache.store(_grouped_record(skewed, config), "nvidia-h100-80gb-hbm3-sm90")
    found = TuningCache(tmp_path, shipped=False).lookup(skewed, "nvidia-h100-80gb-hbm3-sm90")
    assert found is not None and found[0].config_name == config.name and found[0].problem_object == skewed
    uniform = grouped_problem(4096, 768, 2048, 128, "bfloat16", True, "uniform")
    assert cache.lookup(uniform, "nvidia-h100-80gb-hbm3-sm90") is None


def test_a_grouped_kernel_refuses_misaligned_addresses_before_it_compiles():
    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import bind_grouped, grouped_problem

    problem = grouped_problem(1000, 256, 128, 8, "bfloat16", True)
    with pytest.raises(ValueError, match="16-byte aligned"):
        bind_grouped(HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4), problem, 1024 + 2, 2048, 4096, 8192)
