"""Compilation without a GPU: nvcc is found where the toolkit puts it (and its absence is said
clearly), and its report and NVRTC's read alike; a fixed, diverse sample of every family compiles for sm_90
and sm_80 without spills (NVRTC, with ptxas's report: the compiler and options that serve kernels): one
test per family and architecture (pytest-xdist spreads them over its workers), each compiling its
distinct sources once, in a pool of its own (80 compiles in all).

sm_90 covers every family and instruction path. SIMT: 16 sampled configs, one per shape and layout,
with every knob value of `samples.COVERAGE` (pipeline depths 1-4 among them); split-K added up by
the tile's last block and by a cluster (fixed configs and sampled ones), each in every layout; repacked
operands in every layout. Tensor cores: per dtype the first sampled config of each instruction path
(WMMA, mma.sync, wgmma), each path in every layout it reads, on even shapes and tails (16-bit wgmma
on even shapes only: on tails it spills, a known failure marked xfail below). GEMV: one
sampled config per problem and B path; swapped operands in every layout. Hopper: one sampled config
per problem, each in a layout of its own, and the fixed cluster, TMA-store, pingpong, swap and TF32
configs. sm_80 proves that the non-Hopper paths compile for Ampere (no wgmma, no clusters; cp.async):
of each family's variants there, a few that together show every value of its features (layout,
pipeline depth, launch kind, transpose, instruction path per dtype, B path, swap, ...). The templates
render the same source for both (nothing depends on __CUDA_ARCH__): the architectures differ in
which configs are valid and in what ptxas makes of them.

CI has nvcc and NVRTC (the CUDA extra's); where either is missing the tests that need it fail (they do not
skip) and say so.
"""

from __future__ import annotations

import contextlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

import autogemm.kernels.compile as compile_module
import autogemm.kernels.ptxas_report as ptxas_report
from autogemm.kernels.compile import CompileError
from autogemm.kernels.ptxas_report import NvccNotFound, find_nvcc, nvcc_resources, nvrtc_resources
from autogemm.families import GemvConfig, HopperConfig, SimtConfig, TensorCoreConfig, config_from_name, wgmma
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from samples import COVERAGE, TENSOR_CORE_KINDS, diverse_sample, tensor_core_sample

ARCHS = ("sm_90", "sm_80")
# Shapes that switch tails on and off and narrow the vector widths (odd leading dimensions).
SIMT_SHAPES = [(4096, 4096, 4096), (127, 129, 65), (255, 257, 1023), (132, 260, 68)]
TENSOR_CORE_SHAPES = [(4096, 4096, 4096), (127, 129, 65), (255, 257, 1023)]
# diverse_sample(8, seed=5): 16 configs (5 reference ones, 8 drawn, the rest topped up to every knob
# value of samples.COVERAGE), each on one of the 16 pairs of SIMT_SHAPES and LAYOUTS
SIMT_SAMPLE = 8
# split-K added up in the kernel, on short M or N: by the tile's last block ("fr"), or over a
# thread-block cluster ("cr", sm_90 only); each way, with the sampled configs, in every layout
IN_KERNEL_SPLITS = (("128x128x16_w32x64_t8x8_v44_s4_pad_g8_k4_o1_r_fr", (127, 4096, 4096), ("tt",)),
                    ("32x128x16_w32x64_t8x8_v44_s2_swizzle_g8_k8_o2_fr", (64, 4096, 4096), ("nt",)),
                    ("128x128x16_w32x64_t8x8_v44_s3_pad_g8_k4_o1_r_cr", (8191, 63, 8191), ("nn", "tt")),
                    ("16x128x16_w16x64_t8x4_v24_s3_pad_g8_k4_o3_r_reg231_cr", (16, 11008, 4096), ("tn",)))
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
    monkeypatch.setattr(ptxas_report, "NVCC_FALLBACKS", ())
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



def test_nvcc_and_nvrtc_report_the_same_kernels_alike():
    """Both compilers' ptxas reports read into the same figures: the same kernels (a GEMM and its operand
    repacking), registers, no spill; a serialized wgmma read from either (ptxas's C7514 note). Their
    registers may differ where the toolkit and NVRTC are of different releases (by up to 57 over the sample)."""
    config = config_from_name("64x64x16_w32x32_t4x8_v44_s3_pad_g8_k2_o2_fr_pk")
    source = render(config, Problem.from_layout(1000, 3000, 200, "nt"))
    by_nvcc, by_nvrtc = nvcc_resources(source, "sm_90"), nvrtc_resources(source, "sm_90")
    assert set(by_nvcc) == set(by_nvrtc) and source.kernel in by_nvrtc and len(by_nvrtc) == 2, (by_nvcc, by_nvrtc)
    for usage in (*by_nvcc.values(), *by_nvrtc.values()):
        assert 0 < usage.registers <= 255 and not usage.spills and not usage.stack_bytes, (by_nvcc, by_nvrtc)
    note = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "insufficient register resources for the wgmma pipeline in the function 'k'")
    used = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Used 168 registers\n"
    assert ptxas_report._usage(used + note, SimpleNamespace(kernel="k"))["k"].wgmma_serialized
    assert not ptxas_report._usage(used, SimpleNamespace(kernel="k"))["k"].wgmma_serialized


def test_the_check_command_compiles_with_nvrtc_else_nvcc_else_says_why_neither(tmp_path, monkeypatch):
    from autogemm.kernels import nvrtc

    assert ptxas_report.report_compiler().resources is nvrtc_resources  # (NVRTC is installed here)
    assert ptxas_report.report_compiler().name.startswith("NVRTC ")

    def missing():
        raise nvrtc.NvrtcError("NVRTC (libnvrtc) cannot be found or loaded")

    monkeypatch.setattr(nvrtc, "version", missing)
    monkeypatch.setenv("PATH", str(_fake_nvcc(tmp_path / "cuda").parent))
    compiler = ptxas_report.report_compiler()
    assert (compiler.name, compiler.resources) == ("nvcc", nvcc_resources)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(ptxas_report, "NVCC_FALLBACKS", ())
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(ptxas_report.CompilerNotFound, match="libnvrtc.*; and nvcc was not found"):
        ptxas_report.report_compiler()


def test_an_nvrtc_compile_with_an_empty_log_leaves_pythons_one_byte_objects_alone():
    """NVRTC writes its log (one NUL byte where it has nothing to say) into the buffer it is given.
    `b" " * 1` is Python's shared one-byte object for the space: filled that way, every b" " of the
    process became b"\\0", and so did the " " of each module compiled after (PyTorch's operator
    schemas, NumPy's .npy header padding): a measuring process could not import PyTorch. Run in a
    process of its own, which such a compile could not spoil for the tests after it."""
    import subprocess
    import sys

    script = ("from autogemm.kernels.nvrtc import compile_cubin_with_log; "
              "cubin, log = compile_cubin_with_log('extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }', "
              "'k.cu', 'sm_90', ()); "
              "assert cubin[:4] == b'\\x7fELF' and log == '', (cubin[:4], log); "
              "print(bytes([32])[0], len(cubin), sep='\\n')")  # (a space written alone would come out as NUL)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    space, cubin_bytes = map(int, done.stdout.split())
    assert space == 32 and cubin_bytes > 1000, done.stdout


def _covering(variants, features) -> list:
    """A few of the variants that together show every value of every feature (a function of config
    and problem) that the whole list shows: repeatedly the one that shows the most values not shown
    yet (the first of equals), kept in the list's order."""
    values = [{(i, feature(c, p)) for i, feature in enumerate(features)} for c, p in variants]
    shown, kept = set(), []
    while any(v - shown for v in values):
        best = max(range(len(variants)), key=lambda j: (len(values[j] - shown), -j))
        shown |= values[best]
        kept.append(best)
    return [variants[j] for j in sorted(kept)]


def _simt_variants(device: Device):
    variants = []
    for i, config in enumerate(diverse_sample(SIMT_SAMPLE, seed=5)):
        m, n, k = SIMT_SHAPES[i % len(SIMT_SHAPES)]
        problem = Problem.from_layout(m, n, k, LAYOUTS[(i // len(SIMT_SHAPES)) % 4])
        if config.check(problem, device):
            problem = Problem.from_layout(4096, 4096, 4096, problem.layout)
        reasons = config.check(problem, device)
        assert not reasons or (config.cluster_reduce and device.compute_capability < (9, 0)), (config.name, reasons)
        if not reasons:  # (the sample's cluster split: sm_90 only)
            variants.append((config, problem))
    for name, (m, n, k), layouts in IN_KERNEL_SPLITS:
        for layout in layouts:
            problem = Problem.from_layout(m, n, k, layout)
            config = SimtConfig.from_name(name)
            reasons = config.check(problem, device)
            below_sm_90 = device.compute_capability < (9, 0)
            assert not reasons or (config.cluster_reduce and below_sm_90), (name, layout, reasons)
            if not reasons:
                variants.append((config, problem))
    for name, layouts in REPACKING:
        for layout in layouts:
            problem = Problem.from_layout(4095, 4097, 1023, layout)
            config = SimtConfig.from_name(name)
            assert not config.check(problem, device), (name, layout)
            variants.append((config, problem))
    return variants


SIMT_FEATURES = (lambda c, p: p.layout, lambda c, p: c.stages, lambda c, p: c.launch_kind,
                 lambda c, p: (c.split_k > 1, c.split_reduce), lambda c, p: c.transpose, lambda c, p: c.smem,
                 lambda c, p: c.repacks_operands, lambda c, p: bool(c.register_cap), lambda c, p: c.even(p) == "111")


def _tensor_core_variants(device: Device):
    """Per dtype, the first sampled config of each instruction path the device has, then (across
    dtypes) the first that single-buffers and the first that splits K where none chosen does. Each
    path takes the shapes in turn and the layouts in turn (skipping one it cannot read: wgmma and
    TN); a config refused on a tail shape takes the even one. 16-bit wgmma kernels spill on tails
    (see test_16bit_wgmma_kernels_on_tails_do_not_spill): until they don't, they take even shapes."""
    chosen, samples = [], []
    for dtype, compute, space in TENSOR_CORE_KINDS:
        sample = tensor_core_sample(dtype, compute, space, 4, seed=11, device=device)
        firsts = {}
        for config in sample:
            firsts.setdefault(config.instruction, config)
        chosen += [(config, dtype, compute) for config in firsts.values()]
        samples.append((sample, dtype, compute))
    for need in (lambda c: c.stages == 1, lambda c: c.split_k > 1):
        if not any(need(c) for c, *_ in chosen):
            chosen.append(next((c, dtype, compute) for sample, dtype, compute in samples for c in sample if need(c)))
    variants, turns = [], {}
    for config, dtype, compute in chosen:
        shape_turn, layout_turn = turns.get(config.instruction, (0, 0))
        m, n, k = TENSOR_CORE_SHAPES[shape_turn % len(TENSOR_CORE_SHAPES)]
        if config.instruction == "wgmma" and dtype in ("float16", "bfloat16"):
            m, n, k = TENSOR_CORE_SHAPES[0]
        for t in range(layout_turn, layout_turn + 4):
            problem = Problem.from_layout(m, n, k, LAYOUTS[t % 4], dtype=dtype, compute=compute)
            if config.check(problem, device):
                problem = Problem.from_layout(4096, 4096, 4096, problem.layout, dtype=dtype, compute=compute)
            if not config.check(problem, device):
                variants.append((config, problem))
                turns[config.instruction] = (shape_turn + 1, t + 1)
                break
        else:
            raise AssertionError(f"{config.name} ({dtype}) is valid in no layout")
    return variants


TENSOR_CORE_FEATURES = (lambda c, p: (c.instruction, p.dtype, p.compute), lambda c, p: p.layout,
                        lambda c, p: c.stages == 1, lambda c, p: c.split_k > 1)


# GEMV: every dtype it computes, both B paths (N-contiguous, K-contiguous), tails on and off
GEMV_PROBLEMS = [("float32", 16, 4096, 4096), ("float16", 1, 11008, 4096), ("bfloat16", 7, 1000, 999),
                 ("float64", 16, 4096, 4096), ("float32", 3, 333, 1025), ("float16", 16, 4096, 11008)]


# a short N with the operands swapped (C written transposed), each in two complementary layouts
# (the kernel's B path either way), together every layout
SWAPPED_GEMV = [("gemv_m1_n64_k1024_w4_v4_u1_s4_o1_sw", ("float32", 4096, 1, 4096)),
                ("gemv_m16_n32_k512_w8_v4_u1_s8_o1_sw", ("bfloat16", 999, 7, 8000))]


def _gemv_variants(device: Device):
    space = SearchSpace.load("gemv")
    variants = []
    for i, (dtype, m, n, k) in enumerate(GEMV_PROBLEMS):
        for j, layout in enumerate(("nn", "nt")):
            problem = Problem.from_layout(m, n, k, LAYOUTS[(i + 2 * j) % 4][0] + layout[1], dtype=dtype)
            configs = space.sample(1, problem, device, seed=i)
            assert len(configs) == 1, (str(problem), configs)
            variants.append((configs[0], problem))
    for i, (name, (dtype, m, n, k)) in enumerate(SWAPPED_GEMV):
        for layout in (("nn", "tt"), ("nt", "tn"))[i % 2]:
            variants.append((GemvConfig.from_name(name), Problem.from_layout(m, n, k, layout, dtype=dtype)))
    return variants


GEMV_FEATURES = (lambda c, p: p.dtype, lambda c, p: p.trans_b, lambda c, p: c.swaps_operands, lambda c, p: p.layout)


# Hopper (sm_90a only): a sample of its space, each problem in a layout of its own, on even shapes and on tails
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


def _hopper_fixed():
    for name, layout in zip(HOPPER_FIXED, ("nt", "tn", "tt")):
        yield config_from_name(name), Problem.from_layout(1000, 3000, 200, layout, dtype="float16")
    for name, dtype, layout in HOPPER_SWAP_TF32:
        compute = "tf32" if dtype == "float32" else "fp32"
        yield config_from_name(name), Problem.from_layout(1000, 3001, 200, layout, dtype=dtype, compute=compute)


def _hopper_variants(device: Device):
    space = SearchSpace.load("hopper")
    variants = []
    for i, (dtype, m, n, k) in enumerate(HOPPER_PROBLEMS):
        problem = Problem.from_layout(m, n, k, LAYOUTS[i % 4], dtype=dtype)
        configs = space.sample(1, problem, device, seed=i)
        assert len(configs) == 1, (str(problem), configs)
        variants.append((configs[0], problem))
    for config, problem in _hopper_fixed():
        assert not config.check(problem, device), (config.name, str(problem))
        variants.append((config, problem))
    return variants


def _variants(family: str, arch: str) -> list:
    device = Device.for_arch(arch)
    if family == "simt":
        variants = _simt_variants(device)
        return variants if arch == "sm_90" else _covering(variants, SIMT_FEATURES)
    if family == "tensor_core":
        variants = _tensor_core_variants(device)
        return variants if arch == "sm_90" else _covering(variants, TENSOR_CORE_FEATURES)
    if family == "gemv":
        variants = _gemv_variants(device)
        return variants if arch == "sm_90" else _covering(variants, GEMV_FEATURES)
    assert family == "hopper" and arch == "sm_90", (family, arch)
    return _hopper_variants(device)


def _compile(arch: str, variants) -> list:
    """[(config, problem, resource report or None, error or None)], each distinct source compiled once."""
    sources = {render(c, p).digest: render(c, p) for c, p in variants}

    def compile_one(digest):
        try:
            return digest, nvrtc_resources(sources[digest], arch), None
        except CompileError as exc:
            return digest, None, str(exc)

    with ThreadPoolExecutor(min(len(sources), os.cpu_count() or 2)) as pool:
        done = {digest: (report, error) for digest, report, error in pool.map(compile_one, sources)}
    return [(c, p, *done[render(c, p).digest]) for c, p in variants]


def _check_simt(results, arch):
    # sm_90: 16 sampled, 5 split in the kernel, 4 repacking
    assert len(results) == 25 if arch == "sm_90" else len(results) >= 4, [(c.name, str(p)) for c, p, *_ in results]
    assert {c.stages for c, *_ in results} == {1, 2, 3, 4}, "the SIMT sample lacks pipeline depths"
    assert {p.layout for _, p, *_ in results} == set(LAYOUTS)
    assert {c.launch_kind for c, *_ in results} >= {"tiles", "stream_k", "split_k_fused"}
    assert any(c.split_k > 1 and c.split_reduce == "kernel" for c, *_ in results), "split-K by a second kernel"
    assert {c.transpose for c, *_ in results} == {"async", "registers"}
    assert {c.smem for c, *_ in results} == {"plain", "pad", "swizzle"}
    clusters = {p.layout for c, p, *_ in results if c.cluster_reduce}
    fused = {p.layout for c, p, *_ in results if c.launch_kind == "split_k_fused"}
    repacked = {p.layout for c, p, *_ in results if c.repacks_operands}
    if arch == "sm_90":  # every layout; and every knob value that diverse_sample covers
        assert clusters == fused == repacked == set(LAYOUTS), (clusters, fused, repacked)
        for knob, values in COVERAGE.items():
            assert {getattr(c, knob) for c, *_ in results} >= set(values), knob
    else:  # no clusters below sm_90; the rest at least once
        assert not clusters and fused and repacked, (clusters, fused, repacked)


def _check_tensor_core(results, arch):
    paths = {c.instruction for c, *_ in results}
    assert paths == ({"wmma", "mma", "wgmma"} if arch == "sm_90" else {"wmma", "mma"}), paths
    kinds = {(p.dtype, p.compute) for _, p, *_ in results}
    assert kinds == {(dtype, compute) for dtype, compute, _ in TENSOR_CORE_KINDS}, kinds
    # mma.sync for every dtype but FP64 (which the sm_80 sample takes through WMMA)
    assert {p.dtype for c, p, *_ in results if c.instruction == "mma"} >= {"float16", "bfloat16", "float32"}
    assert {c.stages == 1 for c, *_ in results} == {False, True}, "single-buffered and pipelined"
    assert {c.split_k > 1 for c, *_ in results} == {False, True}, "split-K and not"
    if arch == "sm_90":  # each path in every layout it reads; wgmma with the operands swapped (NN) and not
        for path in ("wmma", "mma"):
            assert {p.layout for c, p, *_ in results if c.instruction == path} == set(LAYOUTS), path
        assert {p.layout for c, p, *_ in results if c.instruction == "wgmma"} == {"nn", "nt", "tt"}
        assert {wgmma.swaps_operands(p) for c, p, *_ in results if c.instruction == "wgmma"} == {False, True}
        for path in ("wmma", "mma", "wgmma"):  # (wgmma on tails: TF32 only, see _tensor_core_variants)
            assert {c.even(p) == "111" for c, p, *_ in results if c.instruction == path} == {False, True}, path
        assert len(results) >= 11, len(results)  # 3 wgmma, 4 mma.sync, 4 WMMA
    else:
        assert {p.layout for _, p, *_ in results} == set(LAYOUTS)


def _check_gemv(results, arch):
    problems = [(c.name, str(p)) for c, p, *_ in results]
    # sm_90: one config per problem and B path, and the swapped ones; sm_80: each dtype (and so layout) once
    assert len(results) == (2 * len(GEMV_PROBLEMS) + 2 * len(SWAPPED_GEMV) if arch == "sm_90" else 4), problems
    assert {p.trans_b for _, p, *_ in results} == {False, True}, problems
    assert {p.dtype for _, p, *_ in results} == {dtype for dtype, *_ in GEMV_PROBLEMS}, problems
    swapped = {p.layout for c, p, *_ in results if c.swaps_operands}
    assert swapped == set(LAYOUTS) if arch == "sm_90" else swapped, swapped
    assert {p.layout for _, p, *_ in results} == set(LAYOUTS)


def _check_hopper(results, arch):
    hopper_layouts = {p.layout for _, p, *_ in results}
    assert hopper_layouts == set(LAYOUTS), hopper_layouts
    # one config per problem, several of them different, and the fixed ones
    assert len(results) == len(HOPPER_PROBLEMS) + len(HOPPER_FIXED) + len(HOPPER_SWAP_TF32), len(results)
    assert len({c.name for c, *_ in results}) >= 4
    assert {c.cluster for c, *_ in results} == {1, 2} and {c.tma_store for c, *_ in results} == {False, True}
    assert {c.pingpong for c, *_ in results} == {False, True} and {c.swap for c, *_ in results} == {False, True}
    assert {p.layout for _, p, *_ in results if p.compute == "tf32"} == {"nn", "nt", "tt"}


FAMILY_CONFIGS = {"simt": SimtConfig, "tensor_core": TensorCoreConfig, "gemv": GemvConfig, "hopper": HopperConfig}
CHECKS = {"simt": _check_simt, "tensor_core": _check_tensor_core, "gemv": _check_gemv, "hopper": _check_hopper}
# Hopper's sample is sm_90a only (no Hopper config is valid on sm_80: the test below says so without
# sampling, which spent ~35 s finding none)
CASES = [(family, arch) for arch in ARCHS for family in CHECKS if family != "hopper" or arch == "sm_90"]


@pytest.mark.parametrize("family, arch", CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_sample_compiles_without_spills(family, arch):
    results = _compile(arch, _variants(family, arch))
    assert results and all(isinstance(c, FAMILY_CONFIGS[family]) for c, *_ in results), family
    assert len({c.even(p) for c, p, *_ in results}) > 1, "tails on and off"
    errors = [f"{c.name} {p}: {e}" for c, p, _, e in results if e]
    assert not errors, "\n".join(errors)
    spilling = [f"{c.name} {p}: {u.kernel} spills {u.spills} bytes ({u.registers} registers)"
                for c, p, report, _ in results if not c.register_cap  # under an explicit cap: refused when loaded
                for u in report.values() if u.spills or u.stack_bytes]
    assert not spilling, "\n".join(spilling)
    CHECKS[family](results, arch)


def test_no_hopper_config_is_valid_below_sm_90():
    device = Device.for_arch("sm_80")
    refused = [config.check(problem, device) for config, problem in _hopper_fixed()]
    assert all(refused), [(c.name, str(p)) for (c, p), r in zip(_hopper_fixed(), refused) if not r]


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="16-bit wgmma kernels spill on tails (8-176 bytes at 255 registers: every tile and layout "
                          "tried, e.g. 128x128x64 and 64x128x64 in NN/NT/TT) while check() accepts them")
def test_16bit_wgmma_kernels_on_tails_do_not_spill():
    """The sample compiles 16-bit wgmma kernels on even shapes only because of this; once it passes
    (the kernels fit, or check() refuses them), move them back onto tails there and drop the mark."""
    config = TensorCoreConfig.from_name("wmma_128x128x64_w128x64_v8_s5_pad_g8_k1_o1_wgmma")
    problem = Problem.from_layout(127, 129, 65, "nt", dtype="bfloat16")
    if config.check(problem, Device.for_arch("sm_90")):
        return  # refused: no spilling kernel is accepted
    report = nvrtc_resources(render(config, problem), "sm_90")
    assert not [u for u in report.values() if u.spills or u.stack_bytes], report


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
        nvrtc_resources(render(config, problem), "sm_90")


def test_cubins_are_stored_whole_shared_and_leave_nothing_behind(tmp_path, monkeypatch):
    import errno

    from autogemm.kernels.compile import store_cubin

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

    from autogemm.kernels import nvrtc
    from autogemm.kernels.compile import UnstoredCubin, compile_to_cubin

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
    from autogemm.kernels import nvrtc
    from autogemm.kernels.compile import compile_to_cubin

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


def test_compile_many_starts_no_pool_for_kernels_already_stored(tmp_path, monkeypatch):
    """A batch whose cubins are all stored (another pytest-xdist worker, an earlier tune) is answered from
    the disk without starting the pool's processes; a batch with one missing compiles only that one."""
    from autogemm.kernels import nvrtc
    from autogemm.kernels.compile import compile_many, compile_to_cubin

    calls = []
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda code, name, arch, options: calls.append(name) or b"\x7fELF")
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path / "cubins"))
    # (two kernel names: a batch is keyed by name)
    stored, missing = render(SimtConfig(), Problem(80, 128, 128)), render(SimtConfig(), Problem(128, 128, 128, trans_b=True))
    assert stored.kernel != missing.kernel
    path = compile_to_cubin(stored, "sm_80")
    pools = []

    @contextlib.contextmanager
    def inline_pool(jobs):
        pools.append(jobs)
        with ThreadPoolExecutor(1) as pool:
            yield pool

    monkeypatch.setattr(compile_module, "compile_pool", inline_pool)
    assert compile_many([stored, stored], "sm_80", jobs=4) == {stored.kernel: path} and pools == []
    both = compile_many([stored, missing], "sm_80", jobs=4)
    assert both[stored.kernel] == path and both[missing.kernel].read_bytes() == b"\x7fELF" and pools == [4]
    assert calls == [f"{stored.kernel}.cu", f"{missing.kernel}.cu"]


def test_nvrtc_compiles_through_the_public_bindings_with_cupys_options(monkeypatch):
    """The cubin comes from cuda.bindings' NVRTC with the options CuPy passed (the arch and
    --device-as-default-execution-space after ours), and a refused program's log reaches the error."""
    import types

    from autogemm.kernels import nvrtc

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
        assert seen["filled"] == ["log", "cubin", "log"]  # the log of each, the refused program's in the error
    finally:
        nvrtc.version.cache_clear()


def test_nvrtc_missing_is_named_with_what_to_install(monkeypatch):
    import sys

    from autogemm.kernels import nvrtc

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # as where cuda-bindings is not installed
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    nvrtc.version.cache_clear()
    try:
        with pytest.raises(nvrtc.NvrtcError, match=r"cuda-bindings.*autogemm\[cuda13\]"):
            nvrtc.compile_cubin("x", "k.cu", "sm_90", ())
    finally:
        nvrtc.version.cache_clear()
