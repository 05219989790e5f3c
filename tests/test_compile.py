"""Compilation without a GPU: nvcc is found where the toolkit puts it (and its absence is said
clearly); a fixed, diverse sample of every family compiles with nvcc for sm_90 and sm_80 without
spills. The variants of both architectures compile in one parallel pool, each distinct source once.

CI has nvcc; if it is missing the compile tests fail (they do not skip) and say so.
"""

from __future__ import annotations

import functools
import os
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

import autogemm.compile as compile_module
from autogemm.compile import CompileError, NvccNotFound, find_nvcc, nvcc_resources
from autogemm.families import GemvConfig, HopperConfig, SimtConfig, TensorCoreConfig, config_from_name
from autogemm.space import SearchSpace
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.render import render
from samples import TENSOR_CORE_KINDS, diverse_sample, tensor_core_sample

ARCHS = ("sm_90", "sm_80")
# Shapes that switch tails on and off and narrow the vector widths (odd leading dimensions).
SIMT_SHAPES = [(4096, 4096, 4096), (127, 129, 65), (255, 257, 1023), (132, 260, 68)]
TENSOR_CORE_SHAPES = [(4096, 4096, 4096), (127, 129, 65), (255, 257, 1023)]
IN_KERNEL_SPLITS = ("128x128x16_w32x64_t8x8_v44_s4_pad_g8_k4_o1_r_fr", "32x128x16_w32x64_t8x8_v44_s2_swizzle_g8_k8_o2_fr",
                    "128x128x16_w32x64_t8x8_v44_s3_pad_g8_k4_o1_r_cr", "16x128x16_w16x64_t8x4_v24_s3_pad_g8_k4_o3_r_reg231_cr")
# operands repacked to aligned pitches: the kernels load at full width on odd shapes
REPACKING = (("128x256x16_w32x128_t8x16_v44_s3_plain_g1_k1_o1_r_sk_pk", ("nn",)),
             ("128x256x16_w64x64_t8x16_v44_s3_pad_g8_k1_o1_pk", ("tt",)),
             ("64x64x16_w32x32_t4x8_v44_s3_pad_g8_k2_o2_fr_pk", ("nt", "tn")))


def _fake_nvcc(folder):
    path = folder / "bin" / "nvcc"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_find_nvcc_looks_where_the_toolkit_is(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_module, "NVCC_FALLBACKS", ())
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(NvccNotFound, match=r"nvcc was not found \(looked on PATH, in \$CUDA_HOME/bin"):
        find_nvcc()
    toolkit = _fake_nvcc(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_nvcc() == str(toolkit)
    on_path = _fake_nvcc(tmp_path / "elsewhere")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_nvcc() == str(on_path)  # PATH first


def _simt_variants(device: Device):
    variants = []
    for i, config in enumerate(diverse_sample(24, seed=5)):
        m, n, k = SIMT_SHAPES[i % len(SIMT_SHAPES)]
        problem = Problem.from_layout(m, n, k, LAYOUTS[(i // len(SIMT_SHAPES)) % 4])
        if config.check(problem, device):
            problem = Problem.from_layout(4096, 4096, 4096, problem.layout)
        if not config.check(problem, device):
            variants.append((config, problem))
    # split-K added up in the kernel: by the tile's last block, or over a thread-block cluster (sm_90
    # only); each in every layout, on short M or N
    for i, name in enumerate(IN_KERNEL_SPLITS):
        m, n, k = ((127, 4096, 4096), (64, 4096, 4096), (8191, 63, 8191), (16, 11008, 4096))[i % 4]
        for layout in LAYOUTS:
            problem = Problem.from_layout(m, n, k, layout)
            config = SimtConfig.from_name(name)
            if not config.check(problem, device):
                variants.append((config, problem))
    for name, layouts in REPACKING:
        for layout in layouts:
            problem = Problem.from_layout(4095, 4097, 1023, layout)
            config = SimtConfig.from_name(name)
            assert not config.check(problem, device), (name, layout)
            variants.append((config, problem))
    return variants


def _tensor_core_variants(device: Device):
    variants = []
    for dtype, compute, space in TENSOR_CORE_KINDS:
        sample = tensor_core_sample(dtype, compute, space, 4, seed=11, device=device)
        # six of the sample, the mma.sync path among them where the device has it, and three wgmma ones
        chosen = sample[:4] + [c for c in sample[4:] if c.instruction == "mma"][:2]
        chosen += sample[4: 4 + 6 - len(chosen)]
        chosen += [c for c in sample if c.instruction == "wgmma" and c not in chosen][:3]
        for i, config in enumerate(chosen):
            m, n, k = TENSOR_CORE_SHAPES[i % len(TENSOR_CORE_SHAPES)]
            problem = Problem.from_layout(m, n, k, LAYOUTS[i % 4], dtype=dtype, compute=compute)
            if config.check(problem, device):
                problem = Problem.from_layout(4096, 4096, 4096, problem.layout, dtype=dtype, compute=compute)
            if not config.check(problem, device):
                variants.append((config, problem))
    return variants


# GEMV: every dtype it computes, both B paths (N-contiguous, K-contiguous), tails on and off
GEMV_PROBLEMS = [("float32", 16, 4096, 4096), ("float16", 1, 11008, 4096), ("bfloat16", 7, 1000, 999),
                 ("float64", 16, 4096, 4096), ("float32", 3, 333, 1025), ("float16", 16, 4096, 11008)]


SWAPPED_GEMV = [("gemv_m1_n64_k1024_w4_v4_u1_s4_o1_sw", ("float32", 4096, 1, 4096)),
                ("gemv_m16_n32_k512_w8_v4_u1_s8_o1_sw", ("bfloat16", 999, 7, 8000))]


def _gemv_variants(device: Device):
    space = SearchSpace.load("gemv")
    variants = []
    for i, (dtype, m, n, k) in enumerate(GEMV_PROBLEMS):
        for j, layout in enumerate(("nn", "nt")):
            problem = Problem.from_layout(m, n, k, LAYOUTS[(i + 2 * j) % 4][0] + layout[1], dtype=dtype)
            variants += [(config, problem) for config in space.sample(2, problem, device, seed=i)]
    # a short N with the operands swapped (C written transposed), in every layout, with and without a split
    for name, (dtype, m, n, k) in SWAPPED_GEMV:
        for layout in LAYOUTS:
            variants.append((GemvConfig.from_name(name), Problem.from_layout(m, n, k, layout, dtype=dtype)))
    return variants


# Hopper (sm_90a only): a sample of its space in every layout, on even shapes and on tails
HOPPER_PROBLEMS = [("float16", 4096, 4096, 4096), ("bfloat16", 127, 129, 65), ("float16", 255, 257, 1023),
                   ("bfloat16", 1000, 3000, 200)]


# and, whatever the sample draws, clusters sharing B by multicast with the TMA store epilogue,
# neither, and consumers taking turns (pingpong)
HOPPER_FIXED = ["hopper_128x256x64_w64x256_s3_g8_k1_o1_p_c2_ts", "hopper_256x128x64_w128x128_s3_g1_k1_o1",
                "hopper_256x128x64_w128x128_s4_g16_k1_o1_p_ts_pp"]
# TF32 (TMA rounding through TFLOAT32 maps): NN swapped with A's fragments from registers and C stored
# transposed through TMA, NT with both operands from shared memory stored through TMA, TT with A from registers
# in clusters; and a 16-bit swap (TN), on tails
HOPPER_SWAP_TF32 = [("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_ts_sw", "float32", "nn"),
                    ("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_ts", "float32", "nt"),
                    ("hopper_128x128x32_w64x128_s6_g8_k1_o1_p_c2", "float32", "tt"),
                    ("hopper_128x256x64_w64x256_s4_g16_k1_o1_p_sw", "float16", "tn")]


def _hopper_variants(device: Device):
    if device.compute_capability < (9, 0):
        return []  # (no Hopper config is valid there: sampling for one spent ~35 s finding none)
    space = SearchSpace.load("hopper")
    variants = []
    for i, (dtype, m, n, k) in enumerate(HOPPER_PROBLEMS):
        for layout in LAYOUTS:
            problem = Problem.from_layout(m, n, k, layout, dtype=dtype)
            variants += [(config, problem) for config in space.sample(1, problem, device, seed=i)]
    for name, layout in zip(HOPPER_FIXED, ("nt", "tn", "tt")):
        config, problem = config_from_name(name), Problem.from_layout(1000, 3000, 200, layout, dtype="float16")
        if not config.check(problem, device):
            variants.append((config, problem))
    for name, dtype, layout in HOPPER_SWAP_TF32:
        config = config_from_name(name)
        problem = Problem.from_layout(1000, 3001, 200, layout, dtype=dtype, compute="tf32" if dtype == "float32" else "fp32")
        if not config.check(problem, device):
            variants.append((config, problem))
    return variants


@functools.lru_cache(maxsize=1)
def _compiled() -> dict:
    """{arch: [(config, problem, resource report or None, error or None)]}, compiled in one pool."""
    jobs = []
    for arch in ARCHS:
        device = Device.for_arch(arch)
        jobs += [(arch, config, problem) for config, problem in
                 _simt_variants(device) + _tensor_core_variants(device) + _gemv_variants(device)
                 + _hopper_variants(device)]
    sources = {(arch, render(c, p).digest): render(c, p) for arch, c, p in jobs}

    def compile_one(key):
        arch, _ = key
        try:
            return key, nvcc_resources(sources[key], arch), None
        except CompileError as exc:
            return key, None, str(exc)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        done = {key: (report, error) for key, report, error in pool.map(compile_one, sources)}
    out: dict = {arch: [] for arch in ARCHS}
    for arch, config, problem in jobs:
        report, error = done[(arch, render(config, problem).digest)]
        out[arch].append((config, problem, report, error))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_sample_compiles_without_spills(arch):
    assert find_nvcc(), "nvcc is required for the compile tests: install the CUDA toolkit"
    results = _compiled()[arch]
    simt = [r for r in results if isinstance(r[0], SimtConfig)]
    gemv = [r for r in results if isinstance(r[0], GemvConfig)]
    tensor_core = [r for r in results if isinstance(r[0], TensorCoreConfig)]
    hopper = [r for r in results if isinstance(r[0], HopperConfig)]
    assert len(simt) >= 24 and len(tensor_core) >= 20, f"{len(simt)} SIMT, {len(tensor_core)} tensor-core variants"
    assert len(gemv) == 32 and {p.trans_b for _, p, *_ in gemv} == {False, True}, [(c.name, str(p)) for c, p, *_ in gemv]
    assert {p.layout for c, p, *_ in gemv if c.swaps_operands} == {"nn", "nt", "tn", "tt"}
    errors = [f"{c.name} {p}: {e}" for c, p, _, e in results if e]
    assert not errors, "\n".join(errors)
    spilling = [f"{c.name} {p}: {u.kernel} spills {u.spills} bytes ({u.registers} registers)"
                for c, p, report, _ in results if not c.register_cap  # under an explicit cap: refused when loaded
                for u in report.values() if u.spills or u.stack_bytes]
    assert not spilling, "\n".join(spilling)
    assert {c.stages for c, *_ in simt} == {1, 2, 3, 4}, "the SIMT sample lacks pipeline depths"
    clusters = {p.layout for c, p, *_ in simt if c.cluster_reduce}
    assert clusters == ({"nn", "nt", "tn", "tt"} if arch == "sm_90" else set()), clusters
    assert {p.layout for c, p, *_ in simt if c.launch_kind == "split_k_fused"} == {"nn", "nt", "tn", "tt"}
    assert {p.layout for c, p, *_ in simt if c.repacks_operands} == {"nn", "nt", "tn", "tt"}
    hopper_layouts = {p.layout for _, p, *_ in hopper}
    assert hopper_layouts == ({"nn", "nt", "tn", "tt"} if arch == "sm_90" else set()), hopper_layouts
    if arch == "sm_90":  # one config per problem and layout, several of them different, and the fixed ones
        assert len(hopper) == 4 * len(HOPPER_PROBLEMS) + len(HOPPER_FIXED) + len(HOPPER_SWAP_TF32), len(hopper)
        assert len({c.name for c, *_ in hopper}) >= 4
        assert {c.cluster for c, *_ in hopper} == {1, 2} and {c.tma_store for c, *_ in hopper} == {False, True}
        assert {c.pingpong for c, *_ in hopper} == {False, True} and {c.swap for c, *_ in hopper} == {False, True}
        assert {p.layout for _, p, *_ in hopper if p.compute == "tf32"} == {"nn", "nt", "tt"}
    paths = {c.instruction for c, *_ in tensor_core}
    assert paths == ({"wmma", "mma", "wgmma"} if arch == "sm_90" else {"wmma", "mma"}), paths


# one of each shared-memory formula: SIMT (padded transposed A), WMMA with the epilogue's staging
# larger than the pipeline, mma.sync, and wgmma (P's tile rounded up to the swizzle period)
SMEM_CASES = [
    ("64x128x16_w32x64_t8x8_v44_s3_pad_g8_k1_o1", Problem(256, 256, 256)),
    ("64x128x16_w32x64_t8x8_v44_s2_pad_g8_k2_o1_cr", Problem(256, 256, 256)),  # the partial sums outgrow the pipeline
    ("wmma_128x64x32_w32x16_v4_s1_plain_g1_k4_o1", Problem(256, 256, 256, dtype="float16")),
    ("wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1_mma", Problem.from_layout(256, 256, 256, "tn", dtype="float16")),
    ("wmma_128x128x64_w128x64_v8_s4_pad_g8_k1_o1_wgmma", Problem(256, 256, 256, dtype="bfloat16")),
    # stages, store chunks and barriers
    ("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_c2_ts", Problem(256, 256, 256, dtype="float16")),
]


@pytest.mark.parametrize("name, problem", SMEM_CASES, ids=[n for n, _ in SMEM_CASES])
def test_the_kernel_refuses_a_shared_memory_figure_other_than_its_own(name, problem, monkeypatch):
    """The launch reserves `smem_bytes` (computed once, in Python); each skeleton asserts at compile
    time that its layout fills exactly that. The compiled samples above agree; a figure off by 16
    bytes does not compile."""
    config = config_from_name(name)
    right = config.smem_bytes(problem)
    assert f"SMEM_BYTES = {right};" in render(config, problem).code
    monkeypatch.setattr(type(config), "smem_bytes", lambda self, p: right + 16)
    with pytest.raises(CompileError, match="fills exactly the shared memory the launch reserves"):
        nvcc_resources(render(config, problem), "sm_90")


def test_cubins_are_stored_whole_shared_and_leave_nothing_behind(tmp_path, monkeypatch):
    import errno

    from autogemm.compile import store_cubin

    path = tmp_path / "kernel.cubin"
    store_cubin(path, b"\x7fELF cubin")
    assert path.read_bytes() == b"\x7fELF cubin" and path.stat().st_mode & 0o777 == 0o644

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        store_cubin(tmp_path / "other.cubin", b"\x7fELF other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernel.cubin", "kernel.cubin.sha256"]  # no .tmp left


def test_a_kernel_the_disk_will_not_take_comes_back_in_memory(tmp_path, monkeypatch):
    """On a full disk a compiled kernel failed its candidate (and with every candidate failing, the
    tune); it is returned as bytes, kept, and not compiled again while the disk stays full."""
    import errno

    from autogemm import nvrtc
    from autogemm.compile import UnstoredCubin, compile_to_cubin

    calls = []
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda code, name, arch, options: calls.append(arch) or b"\x7fELF")
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path / "cubins"))

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compile_module, "store_cubin", full)
    source = render(SimtConfig(), Problem(128, 128, 128))
    first = compile_to_cubin(source, "sm_80")
    assert isinstance(first, UnstoredCubin) and first.data == b"\x7fELF" and "No space left on device" in first.reason
    assert compile_to_cubin(source, "sm_80") == first and calls == ["sm_80"]  # from memory, not compiled again
    assert not (tmp_path / "cubins").exists() or not any((tmp_path / "cubins").iterdir())


def test_a_cubin_on_disk_that_is_not_what_was_compiled_is_compiled_again(tmp_path, monkeypatch):
    """A cubin is trusted only while it matches the digest kept beside it: one truncated, swapped or
    written without a digest (by a killed compiler, a careless tool, an attacker) is compiled again."""
    from autogemm import nvrtc
    from autogemm.compile import compile_to_cubin

    calls = []
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda code, name, arch, options: calls.append(arch) or b"\x7fELF good")
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path / "cubins"))
    source = render(SimtConfig(), Problem(96, 128, 128))  # (one no other test keeps in memory)
    path = compile_to_cubin(source, "sm_80")
    assert path.read_bytes() == b"\x7fELF good" and compile_to_cubin(source, "sm_80") == path and len(calls) == 1
    for tampering in (b"\x7fELF evil", b"\x7fEL", None):
        if tampering is None:  # the digest itself lost
            next(p for p in path.parent.iterdir() if p != path).unlink()
        else:
            path.write_bytes(tampering)
        before = len(calls)
        assert compile_to_cubin(source, "sm_80") == path
        assert len(calls) == before + 1 and path.read_bytes() == b"\x7fELF good"
    assert not [p.name for p in path.parent.iterdir() if ".tmp" in p.name]


def test_nvrtc_compiles_through_the_public_bindings_with_cupys_options(monkeypatch):
    """The cubin comes from cuda.bindings' NVRTC with the options CuPy passed (the arch and
    --device-as-default-execution-space after ours), and a refused program's log reaches the error."""
    import types

    from autogemm import nvrtc

    class Result:
        NVRTC_SUCCESS = "ok"
        NVRTC_ERROR_COMPILATION = types.SimpleNamespace(name="NVRTC_ERROR_COMPILATION")

    seen = {}

    def compile_program(program, count, options):
        seen["options"] = options
        return (Result.NVRTC_SUCCESS if b"good" in seen["code"] else Result.NVRTC_ERROR_COMPILATION,)

    def create(code, name, *rest):
        seen["code"] = code
        return (Result.NVRTC_SUCCESS, "program")

    def fill(text):
        def get(program, buffer):
            seen.setdefault("filled", []).append(text)
            return (Result.NVRTC_SUCCESS,)
        return get

    fake = types.SimpleNamespace(
        nvrtcResult=Result, nvrtcVersion=lambda: (Result.NVRTC_SUCCESS, 13, 0), nvrtcCreateProgram=create,
        nvrtcCompileProgram=compile_program, nvrtcDestroyProgram=lambda program: (Result.NVRTC_SUCCESS,),
        nvrtcGetCUBINSize=lambda program: (Result.NVRTC_SUCCESS, 4), nvrtcGetCUBIN=fill("cubin"),
        nvrtcGetProgramLogSize=lambda program: (Result.NVRTC_SUCCESS, 3), nvrtcGetProgramLog=fill("log"))
    monkeypatch.setattr(nvrtc, "_bindings", lambda: fake)
    nvrtc.version.cache_clear()
    try:
        assert len(nvrtc.compile_cubin("good kernel", "k.cu", "sm_90a", ("-std=c++17",))) == 4
        assert seen["options"] == [b"-std=c++17", b"-arch=sm_90a", b"--device-as-default-execution-space"]
        with pytest.raises(nvrtc.NvrtcError, match="NVRTC_ERROR_COMPILATION"):
            nvrtc.compile_cubin("bad kernel", "k.cu", "sm_90", ())
        assert seen["filled"] == ["cubin", "log"]  # the refused program's log was read
    finally:
        nvrtc.version.cache_clear()


def test_nvrtc_missing_is_named_with_what_to_install(monkeypatch):
    import sys

    from autogemm import nvrtc

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # as where cuda-bindings is not installed
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    nvrtc.version.cache_clear()
    try:
        with pytest.raises(nvrtc.NvrtcError, match=r"cuda-bindings.*autogemm\[cuda13\]"):
            nvrtc.compile_cubin("x", "k.cu", "sm_90", ())
    finally:
        nvrtc.version.cache_clear()
