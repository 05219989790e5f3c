"""FP8 without a GPU: the values of the bit patterns and quantization (against ml_dtypes), FP8 problems
and their keys, what the Hopper family asks of an FP8 product, the float64 check of a scaled result
(which a wrong scale fails), and an FP8 kernel rendered and compiled for sm_90a (NVRTC, ptxas's report)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from autogemm import dtypes, fp8
from autogemm.epilogue import Epilogue
from autogemm.families.hopper import SPLIT_FLAGS_BYTES, HopperConfig
from autogemm.gpu.scaled_launch import scaled_problem, scaling_of
from autogemm.measure.bench import check_epilogue_result
from autogemm.problem import Device, Problem

SM90 = Device.for_arch("sm_90")
TWO_CONSUMERS = HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4)


@pytest.mark.parametrize("dtype", fp8.FP8_DTYPES)
def test_fp8_values_and_quantization_are_ml_dtypes(dtype):
    kind = getattr(ml_dtypes, dtype)
    largest = float(ml_dtypes.finfo(kind).max)
    x = np.random.default_rng(0).uniform(-1.5 * largest, 1.5 * largest, 20000)
    bits = fp8.quantize(x, dtype)
    assert bits.dtype == np.uint8
    assert np.array_equal(bits, np.clip(x, -largest, largest).astype(kind).view(np.uint8))
    assert np.array_equal(fp8.to_float64(bits, dtype), bits.view(kind).astype(np.float64))
    every = np.arange(256, dtype=np.uint8)
    finite = np.isfinite(fp8.values(dtype))
    assert np.array_equal(fp8.to_float64(every, dtype)[finite], every.view(kind).astype(np.float64)[finite])


def test_fp8_problems_name_their_scaling_and_output():
    problem = Problem.from_key("float8_e4m3fn/fp32/nt/b1/4096x4096x4096/scale_row+bias_n>bfloat16")
    assert problem.epilogue == Epilogue(bias="n", out_dtype="bfloat16", scale="row")
    assert Problem.from_key(problem.key) == problem
    with pytest.raises(ValueError, match="scaled: the epilogue must name a scaling"):
        Problem(64, 64, 64, dtype="float8_e5m2", trans_b=True)
    with pytest.raises(ValueError, match="written as bfloat16, float16, float32: name one"):
        Problem(64, 64, 64, dtype="float8_e5m2", trans_b=True, epilogue=Epilogue(scale="tensor"))
    with pytest.raises(ValueError, match="not written for float8_e5m2"):
        Problem(64, 64, 64, dtype="float8_e5m2", epilogue=Epilogue(scale="tensor", out_dtype="float64"))
    with pytest.raises(ValueError, match="only FP8 products are scaled"):
        Problem(64, 64, 64, dtype="float16", epilogue=Epilogue(scale="tensor"))
    with pytest.raises(ValueError, match="not computed swapped"):
        problem.swapped()


def test_scales_are_per_tensor_per_row_or_per_block_by_their_shapes():
    one, rows, columns = np.ones(1), np.ones((5, 1)), np.ones((1, 7))
    assert scaling_of(5, 7, 64, one, one.reshape(())) == "tensor"
    assert scaling_of(5, 7, 64, rows, columns) == "row"
    assert scaling_of(5, 300, 272, np.ones((5, 3)), np.ones((3, 3))) == "block"  # (ceil(272/128), ceil(300/128))
    with pytest.raises(ValueError, match=r"got shapes \(1, 7\) and \(5, 1\)"):
        scaling_of(5, 7, 64, columns, rows)
    with pytest.raises(ValueError, match=r"\(5, 3\) for A's rows by 128 of K and \(3, 3\)"):
        scaling_of(5, 300, 272, np.ones((5, 2)), np.ones((3, 3)))


def test_the_hopper_family_names_what_an_fp8_product_needs():
    row_scaled = scaled_problem(333, 520, 1040, "float8_e4m3fn", "row", "bfloat16", True)
    assert TWO_CONSUMERS.check(row_scaled, SM90) == []
    assert HopperConfig.space_for(row_scaled) == "hopper_fp8"
    reasons = lambda config, problem: " ".join(config.check(problem, SM90))  # noqa: E731
    swapped = HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, swap=True)
    assert "row scales would change roles" in reasons(swapped, row_scaled)
    assert swapped.check(scaled_problem(333, 520, 1040, "float8_e4m3fn", "tensor", "bfloat16", True), SM90) == []
    stored = HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, tma_store=True)
    assert stored.check(row_scaled, SM90) == []
    assert "not transposed" in reasons(stored.replace(swap=True), scaled_problem(333, 520, 1040, "float8_e4m3fn",
                                                                                 "tensor", "bfloat16", True))
    assert "K a multiple of 16" in reasons(TWO_CONSUMERS, scaled_problem(64, 64, 24, "float8_e4m3fn", "tensor",
                                                                         "float32", False))
    tn = Problem.from_key("float8_e4m3fn/fp32/tn/b1/64x64x64/scale_tensor>float32")
    assert "FP8 needs A stored M x K and B N x K (NT)" in reasons(TWO_CONSUMERS, tn)
    assert "bk=64 a multiple of 128" in reasons(HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4),
                                                row_scaled)
    # the other families do not scale products
    from autogemm.families import TensorCoreConfig

    assert "does not scale FP8 products" in TensorCoreConfig().epilogue_refusal(row_scaled.epilogue)


def _scaled_result(scale_a, scale_b, m=48, n=40, k=256, dtype="float8_e4m3fn"):
    """A result as a correct kernel writes it (float64 product of the operands' values, scaled, rounded
    to bfloat16), with the operands' values and the scales."""
    rng = np.random.default_rng(1)
    a = fp8.to_float64(fp8.quantize(rng.uniform(-2, 2, (m, k)), dtype), dtype)
    b = fp8.to_float64(fp8.quantize(rng.uniform(-2, 2, (n, k)), dtype), dtype)
    d = ((a @ b.T) * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)).astype(ml_dtypes.bfloat16)
    return d.astype(np.float64), a, b


def test_a_scaled_result_is_checked_against_the_scales_it_was_given():
    scale_a, scale_b = np.linspace(0.5, 2, 48).astype(np.float32), np.linspace(3, 1, 40).astype(np.float32)
    d, a, b = _scaled_result(scale_a, scale_b)
    problem = scaled_problem(48, 40, 256, "float8_e4m3fn", "row", "bfloat16", False)
    assert check_epilogue_result(d, a, b, problem, scale_a=scale_a.reshape(-1, 1), scale_b=scale_b.reshape(1, -1)).ok
    wrong = scale_b.copy()
    wrong[7] *= 1.5  # one column's scale off
    verdict = check_epilogue_result(d, a, b, problem, scale_a=scale_a.reshape(-1, 1), scale_b=wrong.reshape(1, -1))
    assert not verdict.ok
    tensor = scaled_problem(48, 40, 256, "float8_e4m3fn", "tensor", "bfloat16", False)
    d, a, b = _scaled_result(np.float32([0.5]), np.float32([4.0]))
    assert check_epilogue_result(d, a, b, tensor, scale_a=np.float32([0.5]), scale_b=np.float32([4.0])).ok
    assert not check_epilogue_result(d, a, b, tensor, scale_a=np.float32([0.5]), scale_b=np.float32([2.0])).ok


def test_a_block_scaled_result_is_checked_against_the_dequantized_operands():
    """Block scales multiply each 128 of K's partial sums: the reference is the product of the operands
    dequantized block by block, and a result made with one block's scale off fails the check."""
    from autogemm.epilogue import dequantized

    rng = np.random.default_rng(2)
    m, n, k = 40, 200, 300  # (3 blocks of K, 2 of N, both with tails)
    a = fp8.to_float64(fp8.quantize(rng.uniform(-2, 2, (m, k)), "float8_e4m3fn"), "float8_e4m3fn")
    b = fp8.to_float64(fp8.quantize(rng.uniform(-2, 2, (n, k)), "float8_e4m3fn"), "float8_e4m3fn")
    scale_a, scale_b = rng.uniform(0.5, 1.5, (m, 3)).astype(np.float32), rng.uniform(0.5, 1.5, (3, 2)).astype(np.float32)
    blockwise = sum((a[:, kb * 128:(kb + 1) * 128] @ b[:, kb * 128:(kb + 1) * 128].T)
                    * scale_a[:, kb:kb + 1] * np.repeat(scale_b[kb], 128)[:n] for kb in range(3))
    scaled_a, scaled_b = dequantized(a, b, scale_a, scale_b)
    assert np.allclose(scaled_a @ scaled_b.T, blockwise, rtol=1e-12, atol=1e-9)
    problem = scaled_problem(m, n, k, "float8_e4m3fn", "block", "float32", False)
    d = blockwise.astype(np.float32).astype(np.float64)
    assert check_epilogue_result(d, a, b, problem, scale_a=scale_a, scale_b=scale_b).ok
    wrong = scale_b.copy()
    wrong[1, 1] *= 1.25  # the second block of K of B's second block of columns
    assert not check_epilogue_result(d, a, b, problem, scale_a=scale_a, scale_b=wrong).ok


def test_block_scales_ask_a_slice_of_one_block_and_the_registers_for_partial_sums():
    block = scaled_problem(333, 520, 1040, "float8_e4m3fn", "block", "bfloat16", True)
    assert TWO_CONSUMERS.check(block, SM90) == []
    assert TWO_CONSUMERS.block_scaled_sets() == 2  # (3 x 64 values)
    wider = HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4)
    assert wider.check(block, SM90) == [] and wider.block_scaled_sets() == 1  # (2 x 96 values)
    # (one set's scales are staged in shared memory, a stage's 128 rows and two columns rounded to 16 bytes)
    per_tensor = scaled_problem(333, 520, 1040, "float8_e4m3fn", "tensor", "bfloat16", True)
    assert wider.smem_bytes(block) - wider.smem_bytes(per_tensor) == 4 * (128 + 4) * 4
    assert TWO_CONSUMERS.smem_bytes(block) == TWO_CONSUMERS.smem_bytes(per_tensor)
    wide = HopperConfig(bm=128, bn=256, bk=128, wm=64, wn=256, stages=4)
    assert any("bn of at most 192 (a tile's columns in two blocks of B at most)" in r for r in wide.check(block, SM90))
    tall = HopperConfig(bm=256, bn=128, bk=128, wm=128, wn=128, stages=4)
    assert tall.block_scaled_sets() == 0
    assert any("a slice's partial sums beside the accumulators: 2 x 128" in r for r in tall.check(block, SM90))
    deep = HopperConfig(bm=128, bn=128, bk=256, wm=64, wn=128, stages=3)
    assert any("bk=128 (one block of K a slice)" in r for r in deep.check(block, SM90))
    swapped = HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, swap=True)
    assert any("block scales would change roles" in r for r in swapped.check(block, SM90))


def test_an_fp8_kernel_compiles_for_sm90a_without_spills():
    from autogemm.kernels.ptxas_report import nvrtc_resources
    from autogemm.kernels.render import render

    problem = scaled_problem(333, 520, 1040, "float8_e5m2", "row", "float32", True)
    source = render(TWO_CONSUMERS, problem)  # (compiled on the GPU by its tests; here its PTX and scales are read)
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2" in source.code
    assert "y *= ep.scale_a[m] * ep.scale_b[n];" in source.code
    block = render(TWO_CONSUMERS, scaled_problem(333, 520, 1040, "float8_e4m3fn", "block", "bfloat16", True))
    assert "wgmma_fresh(partial[set][i], desc_a, desc_b)" in block.code and "y *= ep.scale" not in block.code
    # a tile 192 wide: one set of partial sums, and two scales of B a slice (its columns in two blocks of B)
    wider = render(HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4),
                   scaled_problem(333, 520, 1040, "float8_e4m3fn", "block", "bfloat16", True))
    assert "wgmma_fresh(partial[i], desc_a, desc_b)" in wider.code and "partial[set]" not in wider.code
    # the one set's scales come through shared memory, copied by the producer warpgroup's second warp while
    # its first thread loads the operands (with two sets, where the next slice's wgmmas run under a
    # promotion, the consumers read them from global memory)
    assert "if (threadIdx.x >= 32)\n                        copy_block_scales<decltype(layout)::outer" in wider.code
    assert "copy_block_scales" not in block.code
    assert "scale_a[(long long)m * steps.a_row + (long long)kt * steps.a_k]" in block.code
    assert "scale_a[(long long)m" not in wider.code
    # both read block scales row-major or in torch's layout, as each launch says (`scales_outer`): the two
    # sets' consumers by steps read at run time, the one set's producer by a copy compiled for each layout
    assert "int scales_outer" in block.code and "const ScaleSteps steps(scales_outer, M, " in block.code
    assert "int scales_outer" in wider.code and "else if (scales_outer) produce(ScaleLayout<true>{});" in wider.code
    # (in torch's layout, A's scales four at a time where M and their address allow 16-byte copies)
    assert "M % 4 == 0 && reinterpret_cast<unsigned long long>(scale_a) % 16 == 0)\n" in wider.code
    assert "scales_outer" not in render(TWO_CONSUMERS, problem).code  # (per-row scales: no layout to choose)
    for source in (block, wider):
        usage = nvrtc_resources(source, "sm_90")[source.kernel]
        assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0, source.kernel
        assert not usage.wgmma_serialized, source.kernel


def test_fp8_rows_are_one_byte_scaled_and_written_wider():
    for name in fp8.FP8_DTYPES:
        row = dtypes.lookup(name)
        assert (row.itemsize, row.scaled, row.output_dtypes) == (1, True, dtypes.FP8_OUTPUTS)
        assert row.accumulator_roundoff == dtypes.FP8_ACCUMULATION_ROUNDOFF
    assert dtypes.from_bits_storage("uint8") is None  # (uint8 bits are FP8 only where the caller names which)


def test_a_split_k_kernel_sizes_its_workspace_and_compiles_for_sm90a_without_spills():
    from autogemm.kernels.ptxas_report import nvrtc_resources
    from autogemm.kernels.render import render

    decode = scaled_problem(16, 4096, 14336, "float8_e4m3fn", "tensor", "bfloat16", False)
    split = HopperConfig(bm=64, bn=128, bk=128, wm=64, wn=128, stages=6, split_k=4)
    assert split.check(decode, SM90) == []
    # 32 tiles of 64 x 128, a slot of FP32 partial sums per split; one consumer: a counter per tile
    assert split.split_workspace(decode) == (32 * 4 * 64 * 128 * 4, 32 * 4)
    assert split.work_units(decode) == 128 and split.replace(persistent=False).grid_blocks(decode, SM90) == 128
    assert split.replace(split_k=1).split_workspace(decode) == (0, 0)
    # a cluster's pair of 128-row tiles (333 rows: three tiles, rounded up to two pairs), two consumers' counters
    paired = HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, cluster=2, split_k=3)
    rows = scaled_problem(333, 520, 1040, "float8_e4m3fn", "row", "float32", False)
    assert paired.split_workspace(rows) == (4 * 5 * 3 * 128 * 128 * 4, 4 * 5 * 2 * 4)
    assert any(r.startswith("split-k:") for r in split.replace(split_k=9).check(
        scaled_problem(16, 4096, 1024, "float8_e4m3fn", "tensor", "bfloat16", False), SM90))  # 8 slices of K
    source = render(split, decode)
    assert "atomicAdd(&counters[share], 1) == SPLIT_K - 1" in source.code
    assert "atomicAdd" not in render(split.replace(split_k=1), decode).code
    usage = nvrtc_resources(source, "sm_90")[source.kernel]
    assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0
    assert usage.shared_bytes == SPLIT_FLAGS_BYTES  # (what check() adds to the dynamic shared memory)


def test_a_tune_table_names_the_baseline_its_records_carry():
    from autogemm.cli.tuning import _baseline
    from autogemm.measure.scaled_measuring import BUILT_IN, SCALED_MM

    assert _baseline(scaled_problem(64, 256, 512, "float8_e4m3fn", "tensor", "bfloat16", False))[0] == SCALED_MM
    assert _baseline(scaled_problem(64, 256, 512, "float8_e4m3fn", "block", "bfloat16", False))[0] == SCALED_MM
    # block scales with a tail in K: torch._scaled_mm is wrong there, the built-in kernel is the baseline
    assert _baseline(scaled_problem(64, 256, 272, "float8_e4m3fn", "block", "bfloat16", False))[0] == BUILT_IN
    assert _baseline(Problem(64, 64, 64))[0] == "cuBLAS"


def test_the_fp8_campaigns_tune_the_problems_bench_fp8_measures():
    """FP8 records come from campaigns/fp8.toml (per-tensor scales), fp8_row.toml (per-row scales) and
    fp8_block.toml (block scales): each holds bench_fp8's problems, e4m3 in layout NT with D in BF16, so that the bench's served
    column reads records of the very problems it measures."""
    from pathlib import Path

    from script_modules import load_script

    from autogemm.campaigns.file import load_campaign

    root = Path(__file__).resolve().parent.parent
    bench = load_script(root / "benchmarks" / "bench_fp8.py")
    measured = {(m, n, k) for _, m, n, k in bench.problems(None)}
    for name, scale in (("fp8.toml", "tensor"), ("fp8_row.toml", "row"), ("fp8_block.toml", "block")):
        problems = load_campaign(root / "campaigns" / name).problems
        assert {(p.m, p.n, p.k) for p in problems} == measured and len(problems) == len(measured), name
        assert {(p.dtype, p.layout, p.epilogue.scale, p.epilogue.out_dtype) for p in problems} == \
            {("float8_e4m3fn", "nt", scale, "bfloat16")}, name


def test_bench_fp8_names_a_negative_round_count(capsys):
    from pathlib import Path

    from script_modules import load_script

    bench = load_script(Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fp8.py")
    with pytest.raises(SystemExit) as exited:
        bench.main(["--alternate-rounds", "-1"])
    assert exited.value.code == 2
    assert "--alternate-rounds takes a count of 0 or more, got -1" in capsys.readouterr().err


def test_block_scales_are_read_row_major_or_in_torchs_layout_and_a_mixed_pair_is_named():
    import numpy as np

    from autogemm.gpu.packed_launch import epilogue_arguments
    from autogemm.gpu.scaled_launch import block_scales_layout

    scale_a, scale_b = np.ones((300, 5), np.float32), np.ones((5, 3), np.float32)
    outer_a, outer_b = np.ascontiguousarray(scale_a.T).T, np.ascontiguousarray(scale_b.T).T  # (torch's layout)
    assert block_scales_layout(scale_a, scale_b, tensors=False) == "row"
    assert block_scales_layout(outer_a, outer_b, tensors=False) == "outer"
    assert block_scales_layout(outer_a, scale_b, tensors=False) is None  # (one flag a launch: both lie alike)
    assert block_scales_layout(scale_a[:, ::2], scale_b[:, :2], tensors=False) is None
    # N within one block: B's (K/128, 1) scales lie the same both ways and go with A's layout
    narrow = np.ones((5, 1), np.float32)
    assert block_scales_layout(outer_a, narrow, tensors=False) == "outer"
    assert block_scales_layout(scale_a, narrow, tensors=False) == "row"
    # one check for bind_scaled and scaled_matmul: the flag, or the fault named with both scales' strides
    from autogemm.gpu.scaled_launch import scales_outer

    assert scales_outer(outer_a, outer_b, "block", tensors=False) is True
    assert scales_outer(scale_a, scale_b, "block", tensors=False) is False
    with pytest.raises(ValueError, match=r"both in torch's outer-dimension-major layout .*; got strides \(4, 1200\)"):
        scales_outer(outer_a, scale_b, "block", tensors=False)
    rows = np.ones((300, 2), np.float32)[:, :1]
    with pytest.raises(ValueError, match=r"must be contiguous; got strides \(8, 4\)"):
        scales_outer(rows, np.ones((1, 3), np.float32), "row", tensors=False)
    # the kernel's argument, set at each launch
    block = scaled_problem(333, 520, 1040, "float8_e4m3fn", "block", "bfloat16", False)
    row = scaled_problem(333, 520, 1040, "float8_e4m3fn", "row", "bfloat16", False)
    assert epilogue_arguments(block, None)["scales_outer"] == 0 and "scales_outer" not in epilogue_arguments(row, None)
