"""The families and their registry: `check` gives every reason it knows, each for the configuration
that deserves it; names and dict forms round-trip (records of earlier versions included); the
registry finds the family of a dtype, a name and a dict."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.families import REASON_CODES, SimtConfig, TensorCoreConfig, config_from_dict, config_from_name, family_for, get, register
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.kernels.render import render
from samples import REFERENCE_CONFIGS

SM90 = Device.for_arch("sm_90")
SQUARE = Problem(4096, 4096, 4096)
WGMMA_NN = TensorCoreConfig(256, 128, 32, 256, 64, 4, 4, "pad32", instruction="wgmma")

# (code, config, problem, device): each row must produce its code.
REASON_CASES = [
    ("dtype", SimtConfig(), Problem(64, 64, 64, dtype="float64"), SM90),
    ("choice", SimtConfig(bm=96), SQUARE, SM90),
    ("choice", SimtConfig(smem="diagonal"), SQUARE, SM90),
    ("choice", SimtConfig(vec=3), SQUARE, SM90),
    ("warp-tile", SimtConfig(wm=256), SQUARE, SM90),
    ("thread-tile", SimtConfig(wm=32, tm=64), SQUARE, SM90),
    ("warp-lanes", SimtConfig(tm=4), SQUARE, SM90),
    ("frag-vector", SimtConfig(wm=16, wn=32, tm=2, tn=8), SQUARE, SM90),
    ("threads", SimtConfig(), SQUARE, dataclasses.replace(SM90, max_threads_per_block=128)),
    ("tile-load", SimtConfig(bm=16, bn=16, bk=4, wm=16, wn=16, tm=2, tn=4, vec_frag=2), SQUARE, SM90),
    ("shared-memory", SimtConfig(), SQUARE, dataclasses.replace(SM90, smem_per_block_optin=16 * 1024)),
    ("registers", SimtConfig(wm=64, wn=128, tm=16, tn=16), SQUARE, SM90),
    ("occupancy", SimtConfig(bm=256, bn=256, wm=64, wn=64, tm=8, tn=16, min_blocks=5), SQUARE, SM90),
    ("cp-async", SimtConfig(stages=3), SQUARE, Device.for_arch("sm_75")),
    ("cluster", SimtConfig(split_k=2, split_reduce="cluster"), SQUARE, Device.for_arch("sm_80")),
    ("choice", SimtConfig(split_k=16, split_reduce="cluster"), SQUARE, SM90),
    ("choice", SimtConfig(tm=2, wm=16, split_k=4, split_reduce="cluster"), SQUARE, SM90),
    ("split-k", SimtConfig(split_k=8), Problem(256, 256, 16), SM90),
    ("grid", SimtConfig(split_k=2), Problem(64, 64, 64, batch=40000), SM90),
    ("size", SimtConfig(), Problem(2**31, 1, 1), SM90),
    ("fragment", TensorCoreConfig(bk=8), Problem(64, 64, 64, dtype="float16"), SM90),
    ("tensor-core", TensorCoreConfig(), Problem(64, 64, 64, dtype="bfloat16"), Device.for_arch("sm_75")),
    ("layout", WGMMA_NN, Problem(4096, 4096, 4096, dtype="float32", compute="tf32", trans_a=True), SM90),
]


def test_every_reason_code_is_covered_by_a_case():
    assert {case[0] for case in REASON_CASES} == set(REASON_CODES)


@pytest.mark.parametrize("code,config,problem,device", REASON_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(REASON_CASES)])
def test_check_gives_reason(code, config, problem, device):
    reasons = config.check(problem, device)
    codes = {reason.split(":")[0] for reason in reasons}
    assert code in codes, reasons
    assert codes <= set(REASON_CODES), f"undocumented reason code in {reasons}"


def test_reasons_name_the_numbers():
    (reason,) = SimtConfig(split_k=8).check(Problem(256, 256, 16), SM90)
    assert "split_k=8" in reason and "K=16" in reason


@pytest.mark.parametrize("dtype, compute", [("float32", "fp32"), ("float32", "tf32"), ("float16", "fp32"),
                                            ("bfloat16", "fp32"), ("float64", "fp64")])
def test_every_family_default_parses_and_most_run_a_large_problem(dtype, compute):
    problem = Problem(4096, 4096, 4096, dtype=dtype, compute=compute)
    family = family_for(dtype, compute)
    configs = [config_from_name(name) for _, name in family.defaults(problem)]
    assert configs and all(type(c) is family for c in configs)
    assert any(not c.check(problem, SM90) for c in configs)


def test_reference_configs_are_valid():
    for config in (SimtConfig(), *REFERENCE_CONFIGS):
        assert config.check(SQUARE, SM90) == []


def test_registry_tells_families_apart():
    assert family_for("float32") is SimtConfig and family_for("float32", "tf32") is TensorCoreConfig
    assert type(config_from_name("wmma_128x64x32_w64x32_v8_s4_plain_g4_k2_o1")) is TensorCoreConfig
    assert type(config_from_name(SimtConfig().name)) is SimtConfig
    assert config_from_dict({"bm": 64, "wm": 32}) == SimtConfig(bm=64, wm=32)  # no family: SIMT, as records had it
    with pytest.raises(ValueError, match="not a SIMT config name: '128x128'"):
        config_from_name("128x128")
    with pytest.raises(ValueError, match="unknown config family 'nope'"):
        get("nope")
    with pytest.raises(ValueError, match="a family named 'simt' is already registered"):
        register(type("Impostor", (SimtConfig,), {}))


def test_tensor_core_names_and_dicts_round_trip_old_records_included():
    config = TensorCoreConfig(128, 64, 32, 64, 32, 8, 4, "plain", 4, 2, 1)
    assert config.name == "wmma_128x64x32_w64x32_v8_s4_plain_g4_k2_o1"
    for instruction, suffix in (("wmma", ""), ("mma", "_mma"), ("wgmma", "_wgmma")):
        changed = config.replace(instruction=instruction)
        assert changed.name == config.name + suffix
        assert config_from_name(changed.name) == changed
        assert config_from_dict(changed.to_dict()) == changed
        # the dict form of records written before the instruction knob
        old = {k: v for k, v in changed.to_dict().items() if k != "instruction"}
        old.update(mma=instruction == "mma", wgmma=instruction == "wgmma")
        assert config_from_dict(old) == changed


def test_tensor_core_check_reasons():
    half = Problem(256, 256, 256, dtype="float16")
    assert TensorCoreConfig().check(Problem(256, 256, 256), SM90)[0].startswith("dtype")
    assert any(r.startswith("fragment") for r in TensorCoreConfig(wm=24).check(half, SM90) + TensorCoreConfig(bk=8).check(half, SM90))
    bf16 = Problem(256, 256, 256, dtype="bfloat16")
    assert any(r.startswith("tensor-core") for r in TensorCoreConfig().check(bf16, Device.for_arch("sm_75")))
    assert any(r.startswith("shared-memory") for r in TensorCoreConfig(256, 256, 64, 64, 64, 8, 5).check(half, SM90))
    assert any(r.startswith("choice") for r in TensorCoreConfig(vec=8).check(Problem(64, 64, 64, dtype="float64"), SM90))
    assert any(r.startswith("registers") for r in TensorCoreConfig(256, 128, 32, 128, 128).check(half, SM90))


def test_mma_path_check_reasons():
    """mma.sync computes 16x8 blocks and loads B for two at once; its FP64 shape needs sm_90."""
    double = Problem(4096, 4096, 4096, dtype="float64")
    fp64 = TensorCoreConfig(128, 64, 16, 32, 32, 2, 4, "pad32", 8, 1, 1, instruction="mma")
    assert fp64.check(double, SM90) == []
    assert any(r.startswith("tensor-core: float64/fp64 mma.sync needs compute capability 9.0")
               for r in fp64.check(double, Device.for_arch("sm_80")))
    assert fp64.replace(instruction="wmma").check(double, Device.for_arch("sm_80")) == []
    assert any(r.startswith("fragment") for r in fp64.replace(wm=8, bm=64).check(double, SM90))
    half = Problem(4096, 4096, 4096, dtype="float16")
    assert any(r.startswith("fragment") for r in TensorCoreConfig(64, 64, 32, 32, 8, 8, 3, instruction="mma").check(half, SM90))
    # the fitted register model: 64x64 warp tiles fit at BK=64 without tails, not with them
    big = TensorCoreConfig(128, 256, 64, 64, 64, 8, 3, "pad", 8, 1, 1, instruction="mma")
    assert big.check(half, SM90) == []
    assert any(r.startswith("registers") for r in big.check(Problem(4095, 4096, 4096, dtype="float16"), SM90))


def test_wgmma_path_check_reasons():
    """wgmma: TF32, FP16, BF16 on sm_90a only, one operand with K contiguous, 64-row blocks along the
    operand fed from registers (N for NN, where the kernel computes C^T), 3-5 stages."""
    tf32 = {layout: Problem.from_layout(4096, 4096, 4096, layout, dtype="float32", compute="tf32") for layout in LAYOUTS}
    nn = WGMMA_NN
    assert nn.threads == 256  # two warpgroups
    assert nn.check(tf32["nn"], SM90) == []
    assert any(r.startswith("tensor-core: wgmma needs compute capability 9.0")
               for r in nn.check(tf32["nn"], Device.for_arch("sm_80")))
    assert any(r.startswith("layout") for r in nn.check(tf32["tn"], SM90))
    # NT reads B from shared memory: the 64-row blocks run along M there
    assert any(r.startswith("fragment") for r in nn.replace(wm=32, bm=128).check(tf32["nn"], SM90) +
               nn.replace(wn=32, bn=64).check(tf32["nn"], SM90))
    nt = TensorCoreConfig(128, 256, 32, 64, 256, 4, 4, "pad32", 8, 1, 1, instruction="wgmma")
    assert nt.check(tf32["nt"], SM90) == [] and nt.check(tf32["tt"], SM90) == []
    assert any(r.startswith("registers") for r in nt.check(tf32["nn"], SM90))
    assert any(r.startswith("fragment") for r in nn.replace(bk=16).check(tf32["nn"], SM90))
    assert any(r.startswith("choice") for r in nn.replace(stages=2).check(tf32["nn"], SM90))
    double = Problem(4096, 4096, 4096, dtype="float64")
    assert any(r.startswith("tensor-core: the wgmma path computes") for r in nn.check(double, SM90))
    # 16-bit types: m64nNk16, a 128-byte row is 64 elements of K
    half = Problem(4096, 4096, 4096, dtype="float16")
    assert any(r.startswith("fragment") for r in nn.check(half, SM90))
    assert nn.replace(bk=64, vec=8, smem="pad").check(half, SM90) == []
    with pytest.raises(ValueError, match="layout TN"):
        render(nn, tf32["tn"])
    source = render(nn, tf32["nn"])
    assert source.arch_suffix == "a" and source.target("sm_90") == "sm_90a"
    assert "constexpr bool SWAP = true;" in source.code
    assert "constexpr bool SWAP = false;" in render(nt, tf32["nt"]).code


def test_shared_memory_counts_padding_only_for_transposed_stores():
    config = SimtConfig(smem="pad")
    nn = config.smem_bytes(Problem.from_layout(64, 64, 64, "nn"))  # A transposed into shared memory
    tn = config.smem_bytes(Problem.from_layout(64, 64, 64, "tn"))  # no transposed store
    assert nn == tn + 4 * 2 * 8 * 4
