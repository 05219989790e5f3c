"""FP8 products on a Hopper GPU (the Hopper family's wgmma k32 path): e4m3 and e5m2, scaled per tensor
and per row, D in BF16 and FP32, with and without a bias, on edge shapes (tails in M and N, K not a
multiple of the 128-wide K slice) and in several kernel structures (one and two consumers, pingpong,
a cluster, swapped operands), each against the float64 reference of the dequantized operands within
`check_epilogue_result`'s bound, every output poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from autogemm import fp8
from autogemm.families.hopper import HopperConfig
from autogemm.measure.bench import check_epilogue_result, poison

pytestmark = pytest.mark.gpu

CONFIGS = {
    "two consumers": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4),
    "one consumer": HopperConfig(bm=64, bn=256, bk=128, wm=64, wn=256, stages=3),
    "pingpong": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, pingpong=True),
    "cluster": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, cluster=2),
    "swap": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, swap=True),
    "tma store": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, tma_store=True),
}
# the quick tier takes the edge shapes (tails in M and N, K not a multiple of 128, one row); the others
# run with --exhaustive
SHAPES = [pytest.param((128, 256, 256), marks=pytest.mark.exhaustive, id="128x256x256"),
          pytest.param((200, 136, 272), id="200x136x272"), pytest.param((1, 16, 16), id="1x16x16"),
          pytest.param((333, 520, 1040), marks=pytest.mark.exhaustive, id="333x520x1040")]


@pytest.fixture(scope="module")
def hopper():
    from autogemm.gpu.launch import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("FP8 wgmma needs an sm_90 GPU")


def _operands(m, n, k, dtype, scaling, seed):
    import cupy

    rng = cupy.random.default_rng(seed)
    a = fp8.quantize(rng.random((m, k)) * 4 - 2, dtype, cupy)
    b = fp8.quantize(rng.random((n, k)) * 4 - 2, dtype, cupy)
    if scaling == "tensor":
        scale_a, scale_b = cupy.array([0.75], dtype=np.float32), cupy.array([2.5], dtype=np.float32)
    elif scaling == "row":
        scale_a = (rng.random((m, 1)) + 0.5).astype(np.float32)
        scale_b = (rng.random((1, n)) + 0.5).astype(np.float32)
    else:  # one per row of A and 128 of K, one per 128 x 128 block of B
        blocks_k, blocks_n = -(-k // 128), -(-n // 128)
        scale_a = (rng.random((m, blocks_k)) + 0.5).astype(np.float32)
        scale_b = (rng.random((blocks_k, blocks_n)) + 0.5).astype(np.float32)
    return a, b, scale_a, scale_b


def _run_and_check(config, m, n, k, dtype, scaling, out_dtype, with_bias, seed=0):
    import cupy

    from autogemm.gpu.runtime import numpy_dtype
    from autogemm.gpu.scaled_launch import bind_scaled, scaled_problem

    a, b, scale_a, scale_b = _operands(m, n, k, dtype, scaling, seed)
    bias = (cupy.random.default_rng(seed + 1).random(n) * 2 - 1).astype(numpy_dtype(out_dtype)) if with_bias else None
    run, d = bind_scaled(config, a, b, scale_a, scale_b, dtype=dtype, out_dtype=out_dtype, bias=bias)
    poison(d)
    run()
    cupy.cuda.get_current_stream().synchronize()
    problem = scaled_problem(m, n, k, dtype, scaling, out_dtype, with_bias)
    # (A and B as stored, M × K and N × K: the problem's layout NT says B is read transposed)
    verdict = check_epilogue_result(d, fp8.to_float64(a, dtype, cupy), fp8.to_float64(b, dtype, cupy), problem,
                                    bias=bias, scale_a=scale_a, scale_b=scale_b)
    assert verdict.ok, f"{config.name} {problem}: {verdict.message}"
    return d


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,scaling,out_dtype,with_bias", [
    ("float8_e4m3fn", "tensor", "bfloat16", False), ("float8_e4m3fn", "row", "float32", True),
    ("float8_e5m2", "tensor", "float32", True), ("float8_e5m2", "row", "bfloat16", False),
    ("float8_e4m3fn", "block", "bfloat16", True), ("float8_e5m2", "block", "float32", False)])
def test_fp8_products_match_the_float64_reference(hopper, shape, dtype, scaling, out_dtype, with_bias):
    _run_and_check(CONFIGS["two consumers"], *shape, dtype, scaling, out_dtype, with_bias)


@pytest.mark.exhaustive
@pytest.mark.parametrize("structure", [s for s in CONFIGS if s != "two consumers"])
def test_every_kernel_structure_computes_fp8(hopper, structure):
    scaling = "tensor" if structure == "swap" else "row"  # (row scales refuse swap)
    _run_and_check(CONFIGS[structure], 333, 520, 1040, "float8_e4m3fn", scaling, "bfloat16", True, seed=3)


@pytest.mark.parametrize("scaling,out_dtype", [("tensor", "bfloat16"), ("row", "float32"), ("block", "float16")])
def test_fp8_products_store_d_through_tma(hopper, scaling, out_dtype):
    """D through the TMA store: chunks of 128 bytes of D's type (64 BF16 or FP16 columns, 32 FP32 ones), clipped
    at M's and N's tails, with a bias (D's pitch is a multiple of 16 bytes here, so TMA can address it)."""
    _run_and_check(CONFIGS["tma store"], 333, 520, 1040, "float8_e4m3fn", scaling, out_dtype, True, seed=7)


@pytest.mark.parametrize("structure", ["pingpong", pytest.param("cluster", marks=pytest.mark.exhaustive)])
def test_block_scales_in_other_kernel_structures(hopper, structure):
    """Block scales' slice-by-slice promotion with consumers taking turns, and across a cluster's pair."""
    _run_and_check(CONFIGS[structure], 333, 520, 1040, "float8_e4m3fn", "block", "bfloat16", True, seed=4)


# block scales on tiles 192 wide: one set of partial sums, and a tile's columns in two of B's blocks (333 x 520:
# tiles at columns 0, 192 and 384 split at their 128th, 64th and 128th column, the last cut by N; 96 x 448: the
# last tile's second block lies past N, its scale a zero the producer's copy fills in). The producer warp copies
# each stage's scales into shared memory (rows past M zero-filled): with a cluster, each block its own rows'.
WIDE_BLOCK_SCALED = {
    "two consumers": HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4),
    "tma store": HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4, tma_store=True),
    "pingpong": HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4, pingpong=True),
    "split 2": HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4, split_k=2),
    "cluster": HopperConfig(bm=128, bn=192, bk=128, wm=64, wn=192, stages=4, tma_store=True, cluster=2),
}


@pytest.mark.parametrize("structure", [pytest.param(s, marks=() if s == "two consumers" else pytest.mark.exhaustive)
                                       for s in WIDE_BLOCK_SCALED])
def test_block_scales_on_tiles_wider_than_a_block_of_b(hopper, structure):
    config = WIDE_BLOCK_SCALED[structure]
    assert config.block_scaled_sets() == 1
    _run_and_check(config, 333, 520, 1040, "float8_e4m3fn", "block", "bfloat16", True, seed=5)
    _run_and_check(config, 200, 136, 272, "float8_e5m2", "block", "float32", False, seed=6)
    _run_and_check(config, 96, 448, 384, "float8_e4m3fn", "block", "bfloat16", False, seed=7)


@pytest.mark.parametrize("config", [pytest.param(CONFIGS["two consumers"], id="two sets, scales loaded"),
                                    pytest.param(WIDE_BLOCK_SCALED["two consumers"], id="one set, scales staged"),
                                    pytest.param(WIDE_BLOCK_SCALED["split 2"], id="one set, split 2")])
def test_block_scales_in_torchs_layout_give_the_row_major_result(hopper, config):
    """Block scales in torch's outer-dimension-major layout (the transposes of row-major arrays, as
    torch._scaled_mm takes them) are read as they lie, told so at each launch: bit for bit the result of the
    same scales row-major, with tails in M, N and K (rows past M and a block past N zero-filled either way).
    A pair that lies neither way is refused by name."""
    import cupy

    from autogemm.gpu.scaled_launch import bind_scaled

    for (m, n, k), seed in (((333, 520, 1040), 21), ((96, 448, 384), 22)):
        a, b, scale_a, scale_b = _operands(m, n, k, "float8_e4m3fn", "block", seed)
        outer_a, outer_b = cupy.ascontiguousarray(scale_a.T).T, cupy.ascontiguousarray(scale_b.T).T
        assert not outer_a.flags.c_contiguous and not outer_b.flags.c_contiguous
        row_major = _run_and_check(config, m, n, k, "float8_e4m3fn", "block", "bfloat16", False, seed=seed)
        run, d = bind_scaled(config, a, b, outer_a, outer_b, dtype="float8_e4m3fn", out_dtype="bfloat16")
        poison(d)
        run()
        assert bool((d.view(np.uint16) == row_major.view(np.uint16)).all()), f"{config.name} {m}x{n}x{k}"
    with pytest.raises(ValueError, match="both in torch's outer-dimension-major layout"):
        bind_scaled(config, a, b, outer_a, scale_b, dtype="float8_e4m3fn")


def test_a_tuned_block_record_takes_torchs_layout_as_it_lies(hopper):
    """A block-scaled record serves its kernel on scales in torch's layout (the layout a torch user holds for
    torch._scaled_mm) without copying them: the same bits as with row-major scales, on the fast path too."""
    import autogemm
    from autogemm.gpu.launch import current_device
    from autogemm.gpu.scaled_launch import scaled_problem
    from autogemm.results.cache import TuningCache
    from autogemm.serving.scaled import check_call, explain_scaled
    from test_gpu_capture import _record

    torch = pytest.importorskip("torch")
    m, n, k = 256, 384, 512
    config = WIDE_BLOCK_SCALED["two consumers"]
    TuningCache().store(_record(scaled_problem(m, n, k, "float8_e4m3fn", "block", "bfloat16", False), config),
                        current_device().slug)
    autogemm.reset()
    a, b, scale_a, scale_b = _torch_operands(m, n, k, "float8_e4m3fn", "block", 23)
    outer_a, outer_b = scale_a.t().contiguous().t(), scale_b.t().contiguous().t()
    call = check_call(a, b, outer_a, outer_b, None, torch.bfloat16)
    assert call.outer_scales and explain_scaled(call) == f"cache: {config.name}"
    row_major = autogemm.scaled_matmul(a, b, scale_a, scale_b)
    copies = []
    original = torch.Tensor.contiguous
    torch.Tensor.contiguous = lambda self, *args, **kwargs: copies.append(self) or original(self, *args, **kwargs)
    try:
        first, again = (autogemm.scaled_matmul(a, b, outer_a, outer_b) for _ in range(2))  # (the second: fast path)
    finally:
        torch.Tensor.contiguous = original
    assert not copies
    assert torch.equal(first, row_major) and torch.equal(again, row_major)


# split-K: K's slices dealt out to several work units per tile, the last to count adding them up
SPLITS = {
    "one consumer, split 4": HopperConfig(bm=64, bn=128, bk=128, wm=64, wn=128, stages=6, split_k=4),
    "two consumers, split 3": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, split_k=3),
    "pingpong, split 2": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, pingpong=True, split_k=2),
    "cluster, split 2": HopperConfig(bm=128, bn=128, bk=128, wm=64, wn=128, stages=4, cluster=2, split_k=2),
}
QUICK_SPLITS = {("one consumer, split 4", "tensor"), ("one consumer, split 4", "block"),
                ("two consumers, split 3", "row"), ("pingpong, split 2", "block")}


@pytest.mark.parametrize("structure,scaling", [
    pytest.param(structure, scaling, id=f"{structure}-{scaling}",
                 marks=() if (structure, scaling) in QUICK_SPLITS else pytest.mark.exhaustive)
    for structure in SPLITS for scaling in ("tensor", "row", "block")])
def test_split_k_adds_the_splits_up_launch_after_launch(hopper, structure, scaling):
    """333 x 520 x 1040: nine slices of K, so the splits differ in length, and M's tail leaves warps
    whose rows lie past M (their partial sums neither written nor read). A second launch must be right
    too (the unit that counts last leaves its counter zero), and give the same bits (the splits are
    added up in split order, whichever unit counts last)."""
    import cupy

    from autogemm.gpu.scaled_launch import bind_scaled, scaled_problem

    m, n, k = 333, 520, 1040
    a, b, scale_a, scale_b = _operands(m, n, k, "float8_e4m3fn", scaling, 6)
    run, d = bind_scaled(SPLITS[structure], a, b, scale_a, scale_b, dtype="float8_e4m3fn", out_dtype="float32")
    problem = scaled_problem(m, n, k, "float8_e4m3fn", scaling, "float32", False)
    a64, b64 = fp8.to_float64(a, "float8_e4m3fn", cupy), fp8.to_float64(b, "float8_e4m3fn", cupy)
    results = []
    for launch in range(2):
        poison(d)
        run()
        cupy.cuda.get_current_stream().synchronize()
        verdict = check_epilogue_result(d, a64, b64, problem, scale_a=scale_a, scale_b=scale_b)
        assert verdict.ok, f"launch {launch}: {SPLITS[structure].name} {problem}: {verdict.message}"
        results.append(d.copy())
    assert bool((results[0] == results[1]).all()), "two launches of the same split-K product differ"


def test_fp8_matches_torch_scaled_mm(hopper):
    """The same bits through torch._scaled_mm (cuBLASLt's FP8) give the same product: the two agree to
    within the accumulation's differences (Hopper's FP8 wgmma keeps about 14 bits while it sums, and cuBLAS
    adds its partial sums up in FP32 more often: 3e-3 of the largest value at K = 4096), far below what a
    transposed operand or a misapplied scale would give."""
    torch = pytest.importorskip("torch")
    import cupy

    m, n, k = 256, 384, 4096
    d = _run_and_check(CONFIGS["two consumers"], m, n, k, "float8_e4m3fn", "tensor", "float32", False, seed=5)
    a, b, scale_a, scale_b = _operands(m, n, k, "float8_e4m3fn", "tensor", 5)
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(b).view(torch.float8_e4m3fn).t()
    expected = torch._scaled_mm(ta, tb, torch.from_dlpack(scale_a).reshape(()), torch.from_dlpack(scale_b).reshape(()),
                                out_dtype=torch.float32)
    difference = cupy.abs(d - cupy.from_dlpack(expected)).max()
    assert float(difference) <= 1e-2 * float(cupy.abs(d).max()), float(difference)


def test_refusals_name_the_fault(hopper):
    import cupy

    from autogemm.gpu.scaled_launch import bind_scaled

    a, b, scale_a, scale_b = _operands(64, 64, 64, "float8_e4m3fn", "tensor", 0)
    with pytest.raises(ValueError, match="K must match"):
        bind_scaled(CONFIGS["two consumers"], a, _operands(64, 64, 48, "float8_e4m3fn", "tensor", 0)[1], scale_a, scale_b,
                    dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="per row"):
        bind_scaled(CONFIGS["two consumers"], a, b, cupy.ones((3, 1), dtype=np.float32), scale_b, dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="multiple of 16"):
        a24, b24, _, _ = _operands(64, 64, 24, "float8_e4m3fn", "tensor", 0)
        bind_scaled(CONFIGS["two consumers"], a24, b24, scale_a, scale_b, dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="rows contiguous"):
        bind_scaled(CONFIGS["two consumers"], a.T, b, scale_a, scale_b, dtype="float8_e4m3fn")


# ---- autogemm.scaled_matmul --------------------------------------------------------------------------

def _torch_operands(m, n, k, dtype, scaling, seed):
    """Tensors as torch._scaled_mm takes them: a row-major, b = w.t() of an N × K weight, FP32 scales."""
    torch = pytest.importorskip("torch")
    a, b, scale_a, scale_b = _operands(m, n, k, dtype, scaling, seed)
    fp8_type = getattr(torch, dtype)
    return (torch.from_dlpack(a).view(fp8_type), torch.from_dlpack(b).view(fp8_type).t(),
            torch.from_dlpack(scale_a), torch.from_dlpack(scale_b))


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_an_untuned_fp8_product_is_torchs_scaled_mm(hopper, scaling):
    """Nothing tuned: scaled_matmul serves torch._scaled_mm itself (bit for bit), so it never loses to it."""
    import autogemm
    from autogemm.serving.scaled import check_call, explain_scaled

    torch = pytest.importorskip("torch")
    a, b, scale_a, scale_b = _torch_operands(200, 144, 272, "float8_e4m3fn", scaling, 7)
    autogemm.reset()
    d = autogemm.scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    expected = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    assert d.dtype == torch.bfloat16 and torch.equal(d, expected)
    assert explain_scaled(check_call(a, b, scale_a, scale_b, None, torch.bfloat16)) == "torch._scaled_mm"


@pytest.mark.parametrize("scaling,with_bias", [("tensor", False), ("row", True)])
def test_a_tuned_fp8_record_serves_its_kernel(hopper, scaling, with_bias):
    """A record of the FP8 problem in the cache: scaled_matmul launches that kernel (explain names it),
    on tensors and on CuPy arrays, within the float64 reference's bound."""
    import cupy

    import autogemm
    from autogemm.gpu.launch import current_device
    from autogemm.gpu.scaled_launch import scaled_problem
    from autogemm.results.cache import TuningCache
    from autogemm.serving.scaled import check_call, explain_scaled
    from test_gpu_capture import _record

    torch = pytest.importorskip("torch")
    m, n, k = 200, 144, 272
    config = CONFIGS["two consumers"]
    problem = scaled_problem(m, n, k, "float8_e5m2", scaling, "float32", with_bias)
    TuningCache().store(_record(problem, config), current_device().slug)
    autogemm.reset()
    a, b, scale_a, scale_b = _torch_operands(m, n, k, "float8_e5m2", scaling, 9)
    bias = torch.randn(n, device="cuda", dtype=torch.float32) if with_bias else None
    call = check_call(a, b, scale_a, scale_b, bias, torch.float32)
    assert explain_scaled(call) == f"cache: {config.name}"
    d = autogemm.scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.float32, bias=bias)
    bits_a, bits_b = cupy.from_dlpack(a.view(torch.uint8)), cupy.from_dlpack(b.t().view(torch.uint8))
    verdict = check_epilogue_result(cupy.from_dlpack(d), fp8.to_float64(bits_a, "float8_e5m2", cupy),
                                    fp8.to_float64(bits_b, "float8_e5m2", cupy), problem,
                                    bias=cupy.from_dlpack(bias) if with_bias else None,
                                    scale_a=cupy.from_dlpack(scale_a), scale_b=cupy.from_dlpack(scale_b))
    assert verdict.ok, verdict.message
    # the same kernel on CuPy arrays of the bits (b as the column-major view of the N × K weight)
    on_cupy = autogemm.scaled_matmul(bits_a, bits_b.T, cupy.from_dlpack(scale_a), cupy.from_dlpack(scale_b),
                                     out_dtype="float32", bias=cupy.from_dlpack(bias) if with_bias else None,
                                     dtype="float8_e5m2")
    assert bool((on_cupy == cupy.from_dlpack(d)).all())


def test_scaled_matmul_refuses_what_torch_refuses(hopper):
    import autogemm

    torch = pytest.importorskip("torch")
    a, b, scale_a, scale_b = _torch_operands(64, 64, 64, "float8_e4m3fn", "tensor", 0)
    with pytest.raises(ValueError, match="column-major"):
        autogemm.scaled_matmul(a, b.contiguous(), scale_a, scale_b)
    with pytest.raises(ValueError, match="row-major"):
        autogemm.scaled_matmul(a.t().contiguous().t(), b, scale_a, scale_b)
    with pytest.raises(TypeError, match="one FP8 type"):
        autogemm.scaled_matmul(a, b.view(torch.float8_e5m2), scale_a, scale_b)
    with pytest.raises(TypeError, match="float32"):
        autogemm.scaled_matmul(a, b, scale_a.double(), scale_b)
    with pytest.raises(TypeError, match="no FP8 output"):
        autogemm.scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.float8_e4m3fn)
    a24, b24, _, _ = _torch_operands(64, 64, 24, "float8_e4m3fn", "tensor", 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        autogemm.scaled_matmul(a24, b24, scale_a, scale_b)
    with pytest.raises(TypeError, match="dtype="):
        import cupy
        autogemm.scaled_matmul(cupy.from_dlpack(a.view(torch.uint8)), cupy.from_dlpack(b.t().view(torch.uint8)).T,
                               cupy.from_dlpack(scale_a), cupy.from_dlpack(scale_b))


@pytest.mark.long(seconds=24)
def test_an_fp8_problem_tunes_against_torch_and_its_record_serves(hopper):
    """`autogemm tune --dtype float8_e4m3fn --scale row`: candidates verified against the float64 product of
    the operands' values and timed against torch._scaled_mm; the record, filed under the FP8 key, is what
    scaled_matmul serves (its kernel, or torch._scaled_mm where the tune kept it), and `cache verify`
    verifies it again."""
    import subprocess
    import sys

    import autogemm
    from autogemm.gpu.launch import current_device
    from autogemm.gpu.scaled_launch import scaled_problem
    from autogemm.measure.timing import PROTOCOL
    from autogemm.results.cache import TuningCache
    from autogemm.serving.scaled import check_call, explain_scaled
    from test_gpu_tuner import _tune

    pytest.importorskip("torch")  # (the baseline)
    out = _tune("--M", "256", "--N", "512", "--K", "512", "--dtype", "float8_e4m3fn", "--scale", "row",
                "--trials", "2", "--timeout", "30")
    problem = scaled_problem(256, 512, 512, "float8_e4m3fn", "row", "bfloat16", False)
    assert out["problem"] == problem.key and out["trials"]["valid"] >= 1
    record, _ = TuningCache().lookup(problem, current_device().slug)
    assert record.protocol == PROTOCOL and set(record.baselines) == {"torch._scaled_mm"}
    autogemm.reset()
    a, b, scale_a, scale_b = _torch_operands(256, 512, 512, "float8_e4m3fn", "row", 11)
    served = explain_scaled(check_call(a, b, scale_a, scale_b, None, None))
    assert served == ("torch._scaled_mm" if record.is_cublas else f"cache: {record.config_name}")
    verified = subprocess.run([sys.executable, "-m", "autogemm.cli", "cache", "verify"], capture_output=True,
                              text=True, timeout=300)
    assert verified.returncode == 0 and problem.key in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.parametrize("k", [512, 272])
def test_an_untuned_block_scaled_product_is_served_and_correct(hopper, k):
    """Block scales without a record: torch._scaled_mm where it takes them (given in its outer-major layout,
    bit for bit the same as calling it so), the built-in kernel where K or N is not a multiple of 128 (torch
    is wrong there without a word: 35% off at 256 x 384 x 272); either way within the float64 reference's
    bound, on tensors and on CuPy arrays."""
    import cupy

    import autogemm
    from autogemm.gpu.scaled_launch import scaled_problem

    torch = pytest.importorskip("torch")
    m, n = 256, 384
    a, b, scale_a, scale_b = _torch_operands(m, n, k, "float8_e4m3fn", "block", 13)
    autogemm.reset()
    d = autogemm.scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.float32)
    bits_a, bits_b = cupy.from_dlpack(a.view(torch.uint8)), cupy.from_dlpack(b.t().view(torch.uint8))
    problem = scaled_problem(m, n, k, "float8_e4m3fn", "block", "float32", False)
    verdict = check_epilogue_result(cupy.from_dlpack(d), fp8.to_float64(bits_a, "float8_e4m3fn", cupy),
                                    fp8.to_float64(bits_b, "float8_e4m3fn", cupy), problem,
                                    scale_a=cupy.from_dlpack(scale_a), scale_b=cupy.from_dlpack(scale_b))
    assert verdict.ok, verdict.message
    if k % 128 == 0:
        expected = torch._scaled_mm(a, b, scale_a.t().contiguous().t(), scale_b.t().contiguous().t(),
                                    out_dtype=torch.float32)
        assert torch.equal(d, expected)
    # the block scales in torch's own layout (outer-dimension-major) are taken too, to the same result
    outer = autogemm.scaled_matmul(a, b, scale_a.t().contiguous().t(), scale_b.t().contiguous().t(),
                                   out_dtype=torch.float32)
    assert torch.equal(outer, d) if k % 128 else torch.equal(outer, expected)
    on_cupy = autogemm.scaled_matmul(bits_a, bits_b.T, cupy.from_dlpack(scale_a), cupy.from_dlpack(scale_b),
                                     out_dtype="float32", dtype="float8_e4m3fn")
    # (the same route; cuBLASLt may pick another algorithm for other addresses, so checked, not compared bitwise)
    verdict = check_epilogue_result(on_cupy, fp8.to_float64(bits_a, "float8_e4m3fn", cupy),
                                    fp8.to_float64(bits_b, "float8_e4m3fn", cupy), problem,
                                    scale_a=cupy.from_dlpack(scale_a), scale_b=cupy.from_dlpack(scale_b))
    assert verdict.ok, verdict.message


def test_a_repeated_call_on_tensors_takes_the_fast_path(hopper, monkeypatch):
    """The second call with the same tensors' metadata skips the checks (its runner is found by the tensors'
    own shapes, strides, dtypes and devices) and gives the same result; another shape goes the checks again."""
    import autogemm
    from autogemm.serving import scaled

    torch = pytest.importorskip("torch")
    a, b, scale_a, scale_b = _torch_operands(64, 128, 256, "float8_e4m3fn", "row", 17)
    autogemm.reset()
    first = autogemm.scaled_matmul(a, b, scale_a, scale_b)
    checked = []
    original = scaled.check_call
    monkeypatch.setattr(scaled, "check_call", lambda *args: checked.append(args) or original(*args))
    assert torch.equal(autogemm.scaled_matmul(a, b, scale_a, scale_b), first) and not checked
    a2, b2, scale_a2, scale_b2 = _torch_operands(64, 128, 512, "float8_e4m3fn", "row", 17)
    autogemm.scaled_matmul(a2, b2, scale_a2, scale_b2)
    assert len(checked) == 1


@pytest.mark.parametrize("tuned,scaling", [(True, "tensor"), (False, "tensor"), (True, "block"), (False, "block")],
                         ids=["kernel-tensor", "torch-tensor", "kernel-block", "torch-block"])
def test_scaled_matmul_is_captured_in_a_cuda_graph(hopper, tuned, scaling):
    """After a first call outside the capture, scaled_matmul is captured into a CUDA graph on both routes (a
    record's kernel launched on PyTorch's capturing stream; torch._scaled_mm), and the replay recomputes D
    from the operands' current values: with block scales in torch's layout, the scales' current values too."""
    import autogemm
    from autogemm.gpu.launch import current_device
    from autogemm.gpu.scaled_launch import scaled_problem
    from autogemm.results.cache import TuningCache
    from autogemm.serving.scaled import check_call, explain_scaled
    from test_gpu_capture import _record

    torch = pytest.importorskip("torch")
    m, n, k = (128, 256, 384) if scaling == "tensor" else (256, 384, 512)
    if tuned:
        config = CONFIGS["two consumers"] if scaling == "tensor" else WIDE_BLOCK_SCALED["two consumers"]
        problem = scaled_problem(m, n, k, "float8_e4m3fn", scaling, "bfloat16", False)
        TuningCache().store(_record(problem, config), current_device().slug)
    autogemm.reset()
    a, b, scale_a, scale_b = _torch_operands(m, n, k, "float8_e4m3fn", scaling, 19)
    new_a, _, new_scale_a, new_scale_b = _torch_operands(m, n, k, "float8_e4m3fn", scaling, 23)
    if scaling == "block":  # (torch's layout, as a torch user holds block scales; copy_ keeps the strides)
        scale_a, scale_b = scale_a.t().contiguous().t(), scale_b.t().contiguous().t()
    served = explain_scaled(check_call(a, b, scale_a, scale_b, None, None))
    assert (served != "torch._scaled_mm") == tuned
    autogemm.scaled_matmul(a, b, scale_a, scale_b)  # (outside the capture: plans the call)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = autogemm.scaled_matmul(a, b, scale_a, scale_b)
    a.copy_(new_a)
    old_scales = (scale_a.clone(), scale_b.clone())   # (clone keeps torch's layout)
    if scaling == "block":
        scale_a.copy_(new_scale_a)
        scale_b.copy_(new_scale_b)
    graph.replay()
    torch.cuda.synchronize()
    expected = autogemm.scaled_matmul(a, b, scale_a, scale_b)
    assert torch.equal(d, expected)
    if scaling == "block":  # (the replay read the new scales: with the old ones D differs)
        assert not torch.equal(d, autogemm.scaled_matmul(a, b, *old_scales))
