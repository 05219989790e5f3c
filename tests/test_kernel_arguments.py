"""The launchers against the kernels' own parameter lists, without a GPU: every shipped space's seeds
(and split-K, repacking and misaligned variants) are rendered, each launch kind's launcher is built
on the rendered source (its kernels never loaded: `PackedKernel.launch` is recorded, not run) and
called once. A launcher that names a parameter the kernel does not have, misses one, gives one a
value of the wrong type, or writes a call's pointers and scalars anywhere but the named slots fails
here; a template that moves a parameter takes its value with it."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from autogemm import dtypes
from autogemm.epilogue import Epilogue
from autogemm.families import LaunchKind, all_families
from autogemm.gpu import packed_launch, tensor_maps
from autogemm.gpu.kind_launch import LAUNCHES
from autogemm.gpu.launch import PreparedGemm, launcher
from autogemm.gpu.operands import KernelOperand
from autogemm.gpu.packed_launch import KernelArgumentError, PackedKernel
from autogemm.gpu.repack import stored_extent
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.paths import search_spaces_dir, templates_dir
from autogemm.problem import Device, Problem

H100 = Device.for_arch("sm_90")
PA, PB, PC = 0x1000000, 0x2000000, 0x3000000  # the call's operands (fake, never dereferenced)
ALPHA, BETA = 2.0, 0.5
WORKSPACE = {"split_k": 0xA0000, "split_k_partials": 0xB0000, "split_k_counters": 0xC0000,
             "stream_k_partials": 0xD0000, "stream_k_counters": 0xE0000, "repack_a": 0xF0000, "repack_b": 0xF8000}


class FakeFunction:
    """A kernel that is never loaded: its name tells the recorded launches apart."""

    def __init__(self, name: str):
        self.name, self.ptr = name, 0


def _variants(config):
    """The seed itself, and where the family has the knobs, split-K through the reduction kernel
    (a workspace for C) and operand repacking."""
    yield config
    knobs = {knob.name for knob in type(config).knobs}
    if "split_k" in knobs and config.launch_kind == LaunchKind.TILES and "swap" not in knobs:
        yield dataclasses.replace(config, split_k=2)
    if "repack" in knobs and config.vec > 1:
        yield dataclasses.replace(config, repack=True)


def _cases():
    """(config, problem, misaligned operands) for every variant of every seed that runs a problem of
    each dtype and layout its space is for (misaligned operands where the config repacks them)."""
    cases = {}
    for path in sorted(search_spaces_dir().glob("*.toml")):
        space = SearchSpace.load(path)
        for seed in space.seeds:
            for config in _variants(seed):
                for (dtype, compute), layout in itertools.product(space.dtypes, ("nn", "nt", "tn", "tt")):
                    # (an FP8 product is scaled and written as another dtype: its scales are arguments too)
                    scaled = Epilogue(scale="tensor", out_dtype="bfloat16") if dtypes.lookup(dtype, compute).scaled \
                        else Epilogue()
                    problem = Problem.from_layout(512, 384, 1024, layout, batch=2, dtype=dtype, compute=compute,
                                                  epilogue=scaled)
                    if not config.check(problem, H100):
                        for misaligned in (False, True)[:1 + config.repacks_operands]:
                            cases.setdefault((config.name, problem.key, misaligned), (config, problem, misaligned))
    return list(cases.values())


CASES = _cases()


def test_the_cases_cover_every_family_launch_kind_and_kernel():
    configs = [config for config, _, _ in CASES]
    assert {type(config).family for config in configs} >= {family.family for family in all_families()
                                                            if family.template_dir is None}
    assert {config.launch_kind for config in configs} == set(LaunchKind) == set(LAUNCHES)
    assert any(config.split_k > 1 and config.launch_kind == LaunchKind.TILES for config in configs)
    assert any(config.repacks_operands and misaligned for config, _, misaligned in CASES)
    assert any(config.swaps_operands for config in configs)


def _operand(rows: int, length: int, transposed: bool, misaligned: bool, batch_stride: bool) -> KernelOperand:
    """A stored operand of `rows` rows of `length` elements, its pitch one element over where
    `misaligned` (what repacking copies)."""
    ld = length + (1 if misaligned else 0)
    return KernelOperand(transposed, ld, rows * ld if batch_stride else 0, 0)


def _call_operands(problem: Problem, misaligned: bool) -> tuple[KernelOperand, KernelOperand, KernelOperand]:
    """A, B and C of a call: A a matrix per batch, B shared by the batch, both one element over their
    rows where `misaligned`; C densely packed."""
    a = _operand(*stored_extent(problem, "A"), problem.trans_a, misaligned, batch_stride=True)
    b = _operand(*stored_extent(problem, "B"), problem.trans_b, misaligned, batch_stride=False)
    return a, b, KernelOperand(False, problem.n, problem.m * problem.n, 0)


def _record_launches(monkeypatch) -> list:
    launched = []
    monkeypatch.setattr(packed_launch, "driver_launch", lambda: None)  # no CuPy, no driver
    monkeypatch.setattr(PackedKernel, "launch", lambda self, stream: launched.append(self))
    monkeypatch.setattr(packed_launch.WORKSPACES, "get",
                        lambda device, stream, purpose, nbytes, zeroed=False: WORKSPACE[purpose])
    monkeypatch.setattr(tensor_maps, "encode", lambda layout, address, operand="": np.full(16, address, np.uint64))
    return launched


def _prepared(config, problem: Problem, source) -> PreparedGemm:
    kernel_problem = config.kernel_problem(problem)
    compiled = SimpleNamespace(source=source, gemm=FakeFunction(source.kernel),
                               reduce=FakeFunction(source.reduce_kernel) if source.reduce_kernel else None,
                               repack=FakeFunction(source.repack_kernel) if source.repack_kernel else None)
    grid = (132, 1, 1) if config.launch_kind in (LaunchKind.STREAM_K, LaunchKind.TMA) else config.grid(kernel_problem)
    return PreparedGemm(config=config, problem=kernel_problem, kernel=compiled, grid=grid, block=(config.threads, 1, 1),
                        smem=config.smem_bytes(kernel_problem), tiles_per_split=config.tiles_per_split(kernel_problem))


def _declared_type(declared: str, row: dtypes.DType) -> np.dtype:
    """The NumPy type of an argument the kernel declares as `declared` (without qualifiers)."""
    if declared.endswith("*"):
        return np.dtype(np.uintp)
    named = {"int": np.int32, "long long": np.int64, "float": np.float32, "double": np.float64,
             "Acc": row.accumulator_storage, "TensorMap": tensor_maps.MAP_DTYPE}
    assert declared in named, f"a kernel parameter of type {declared!r}: add it here"
    return np.dtype(named[declared])


@pytest.mark.parametrize("config, problem, misaligned", CASES,
                         ids=[f"{c.name}-{p.key}{'-misaligned' * m}" for c, p, m in CASES])
def test_every_launcher_passes_each_argument_by_the_kernels_own_parameter_names(config, problem, misaligned,
                                                                                monkeypatch):
    launched = _record_launches(monkeypatch)
    row = dtypes.lookup(problem.dtype, problem.compute)
    a, b, c = _call_operands(problem, misaligned)
    source = render(config, problem, config.vector_widths(a, b, c, row.itemsize))
    launch = launcher(_prepared(config, problem, source), a, b, c, ordinal=0)
    launch(PA, PB, PC, ALPHA, BETA, SimpleNamespace(ptr=0))

    for kernel in launched:
        declared = source.signatures[kernel.function.name]
        assert kernel.parameters == tuple(parameter.name for parameter in declared)
        for parameter in declared:
            assert kernel.argument_dtypes[parameter.name] == _declared_type(parameter.type, row), \
                (kernel.function.name, parameter)
    # the call's pointers and scalars went to the slots of those names: through the repacking copies
    # (each from the operand to its buffer) to the GEMM, whose C (or the reduction's) is the call's
    arguments = [kernel.arguments() for kernel in launched]
    fed = {"A": PB, "B": PA} if config.swaps_operands else {"A": PA, "B": PB}
    *copies, gemm = [args for kernel, args in zip(launched, arguments) if kernel.function.name != source.reduce_kernel]
    for copy in copies:
        role = next(role for role, pointer in fed.items() if pointer == copy["src"])
        fed[role] = copy["dst"]
        assert copy["dst"] == WORKSPACE["repack_" + role.lower()]
    assert len(copies) == (2 * misaligned if config.repacks_operands else 0)
    if config.launch_kind == LaunchKind.TMA:
        assert [gemm["map_a"], gemm["map_b"]] == [np.full(16, fed[r], np.uint64).tobytes() for r in "AB"]
    else:
        assert (gemm["A"], gemm["B"]) == (fed["A"], fed["B"])
    final = arguments[-1]
    assert (final["C"], final["alpha"], final["beta"]) == (PC, ALPHA, BETA)
    if source.reduce_kernel:
        assert gemm["C"] == final["W"] == WORKSPACE["split_k"] and gemm["ldc"] == final["ldw"]
    if "partials" in gemm:
        kind = "stream_k" if config.launch_kind == LaunchKind.STREAM_K else "split_k"
        assert (gemm["partials"], gemm["counters"]) == (WORKSPACE[f"{kind}_partials"], WORKSPACE[f"{kind}_counters"])


def _edited_template(tmp_path, monkeypatch, old: str, new: str):
    """The SIMT template with `old` replaced by `new` in its kernel's signature, in a template
    override folder."""
    text = (templates_dir() / "simt_gemm.cu.j2").read_text()
    assert text.count(old) == 1
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "simt_gemm.cu.j2").write_text(text.replace(old, new))
    monkeypatch.setenv("AUTOGEMM_TEMPLATE_DIR", str(folder))


def test_a_template_that_moves_a_parameter_moves_its_value_with_it(tmp_path, monkeypatch):
    from autogemm.families import SimtConfig

    _edited_template(tmp_path, monkeypatch, "int M, int N, int K, int lda, int ldb, int ldc,",
                     "int ldc, int ldb, int lda, int K, int N, int M,")
    launched = _record_launches(monkeypatch)
    config, problem = SimtConfig(), Problem(128, 256, 64)
    source = render(config, problem)
    assert source.parameters(source.kernel)[3:9] == ("ldc", "ldb", "lda", "K", "N", "M")
    a, b, c = KernelOperand(False, 72, 0, 0), KernelOperand(False, 264, 0, 0), KernelOperand(False, 260, 0, 0)
    launcher(_prepared(config, problem, source), a, b, c, ordinal=0)(PA, PB, PC, ALPHA, BETA, SimpleNamespace(ptr=0))
    values = list(launched[0].arguments().values())
    assert values[:12] == [PA, PB, PC, 260, 264, 72, 64, 256, 128, 0, 0, 0]


def test_a_template_that_renames_a_parameter_fails_when_its_launcher_is_built(tmp_path, monkeypatch):
    from autogemm.families import SimtConfig

    _edited_template(tmp_path, monkeypatch, "int tiles_per_split", "int k_tiles_per_split")
    _record_launches(monkeypatch)
    config, problem = SimtConfig(), Problem(128, 256, 64)
    source = render(config, problem)
    operand = KernelOperand(False, 256, 0, 0)
    with pytest.raises(KernelArgumentError, match="missing k_tiles_per_split; not parameters of the kernel "
                                                  "tiles_per_split"):
        launcher(_prepared(config, problem, source), operand, operand, operand, ordinal=0)


def test_a_signature_is_read_past_attributes_comments_and_qualifiers():
    from autogemm.kernels.render import KernelParameter, kernel_signatures

    code = '''
    __device__ void helper(int x) {}
    extern "C" __global__ void __launch_bounds__(THREADS, min(2, 4))
    __cluster_dims__(1, 2, 1)
    ag_kernel(const __grid_constant__ TensorMap map_a, /* the output */ float* __restrict__ C,
              const long long stride_c,  // per batch
              Pair<int, int> pair) { helper(1); }
    extern "C" __global__ void ag_kernel_reduce(void) {}
    '''
    assert kernel_signatures(code) == {
        "ag_kernel": (KernelParameter("map_a", "TensorMap"), KernelParameter("C", "float*"),
                      KernelParameter("stride_c", "long long"), KernelParameter("pair", "Pair<int, int>")),
        "ag_kernel_reduce": ()}


# ---- epilogues: every kernel that writes D itself takes the bias, the residual and its layout ------------

PBIAS, PRESIDUAL, PSCALE_A, PSCALE_B = 0x4000000, 0x5000000, 0x6000000, 0x7000000


def _epilogue_variants(config):
    yield config
    if config.family == "gemv":
        yield dataclasses.replace(config, split_k=2)  # (split-K adds its slots up)
        yield dataclasses.replace(config, swap=True)  # (C written transposed)


# (an FP8 problem keeps its scaling and output dtype, and takes bias, activation and residual besides)
EPILOGUE_CASES = [(variant, dataclasses.replace(problem, epilogue=dataclasses.replace(
                   problem.epilogue, bias="n", activation="gelu", residual=True)), misaligned)
                  for config, problem, misaligned in CASES for variant in _epilogue_variants(config)
                  if variant.applies_epilogue and not variant.check(problem, H100)]


def test_the_epilogue_cases_cover_every_kind_but_stream_k_and_swaps_and_repacking():
    configs = [config for config, _, _ in EPILOGUE_CASES]
    # (stream-K's fix-up and a split-K's reduction kernel write partial sums: no epilogue, test below)
    assert {config.launch_kind for config in configs} == set(LaunchKind) - {LaunchKind.STREAM_K}
    assert {config.family for config in configs} == {family.family for family in all_families()
                                                     if family.template_dir is None}
    assert any(config.swaps_operands for config in configs) and any(not c.swaps_operands for c in configs)
    assert any(config.repacks_operands and misaligned for config, _, misaligned in EPILOGUE_CASES)


@pytest.mark.parametrize("config, problem, misaligned", EPILOGUE_CASES,
                         ids=[f"{c.name}-{p.key}{'-misaligned' * m}" for c, p, m in EPILOGUE_CASES])
def test_an_epilogues_pointers_and_residual_layout_reach_the_slots_of_their_names(config, problem, misaligned,
                                                                                  monkeypatch):
    launched = _record_launches(monkeypatch)
    row = dtypes.lookup(problem.dtype, problem.compute)
    a, b, c = _call_operands(problem, misaligned)
    residual = KernelOperand(False, problem.n + 8, problem.m * (problem.n + 8), 0)  # a pitch of its own
    source = render(config, problem, config.vector_widths(a, b, c, row.itemsize))
    launch = launcher(_prepared(config, problem, source), a, b, c, ordinal=0, residual=residual)
    scales = (PSCALE_A, PSCALE_B) if problem.epilogue.scale else ()  # (an FP8 product's scales)
    launch(PA, PB, PC, ALPHA, BETA, SimpleNamespace(ptr=0), PBIAS, PRESIDUAL, *scales)
    gemm = [kernel for kernel in launched if kernel.function.name == source.kernel]
    assert len(gemm) == 1
    declared = source.signatures[source.kernel]
    for parameter in declared:
        assert gemm[0].argument_dtypes[parameter.name] == _declared_type(parameter.type, row), parameter
    values = gemm[0].arguments()
    assert (values["bias"], values["residual"]) == (PBIAS, PRESIDUAL)
    assert (values["ldr"], values["stride_r"]) == (problem.n + 8, problem.m * (problem.n + 8))
    assert (values["C"], values["alpha"], values["beta"]) == (PC, ALPHA, BETA)
    assert (values.get("scale_a"), values.get("scale_b")) == (scales or (None, None))


def test_a_kind_that_passes_no_epilogue_refuses_a_problem_with_one(monkeypatch):
    _record_launches(monkeypatch)
    config, problem, _ = next((c, p, m) for c, p, m in CASES if c.launch_kind == LaunchKind.STREAM_K)
    fused = dataclasses.replace(problem, epilogue=Epilogue(activation="relu"))
    prepared = dataclasses.replace(_prepared(config, problem, render(config, problem)), problem=fused)
    operand = KernelOperand(False, 1024, 0, 0)
    with pytest.raises(ValueError, match="not launched with the epilogue relu: its kernel writes partial sums \\(stream_k"):
        launcher(prepared, operand, operand, operand, ordinal=0)


# ---- linear's C++ memo: a launch as native_description describes it ----------------------------------------------


def _needs_more(config, problem: Problem, misaligned: bool) -> bool:
    """Whether a launch needs more than one cuLaunchKernel and the arguments the memo writes: a scaled product's
    scales, a workspace (split-K's partial sums, or its reduction after the kernel), a dependent grid, or copies
    of misaligned operands first. (A split-K cluster adds its splits up itself: one launch.)"""
    one_launch = {LaunchKind.TMA: not getattr(config, "reduces_partial_sums", False),
                  LaunchKind.TILES: getattr(config, "split_k", 1) == 1, LaunchKind.SPLIT_K_CLUSTER: True}
    return bool(problem.epilogue.scale or getattr(config, "dependent_launch", False)
                or not one_launch.get(config.launch_kind, False) or (config.repacks_operands and misaligned))


def test_the_epilogue_cases_have_described_launches_of_each_kind_and_some_that_are_not():
    described = {config.launch_kind for config, problem, misaligned in EPILOGUE_CASES
                 if not _needs_more(config, problem, misaligned)}
    assert described == {LaunchKind.TMA, LaunchKind.TILES, LaunchKind.SPLIT_K_CLUSTER}
    assert any(_needs_more(*case) for case in EPILOGUE_CASES)
    assert any(config.swaps_operands and not _needs_more(config, problem, misaligned)
               for config, problem, misaligned in EPILOGUE_CASES)


@pytest.mark.parametrize("writer", ["python", pytest.param("memo", marks=pytest.mark.native)])
@pytest.mark.parametrize("config, problem, misaligned", EPILOGUE_CASES,
                         ids=[f"{c.name}-{p.key}{'-misaligned' * m}" for c, p, m in EPILOGUE_CASES])
def test_a_described_launch_written_as_linears_memo_writes_it_is_the_python_launchs(config, problem, misaligned,
                                                                                    writer, monkeypatch, request):
    """What linear's C++ memo writes into a launcher's `native_description` bytes per call
    (serving/native_prepared_kernel.h): A and B (each as a tensor map or a pointer), C's map where it has one
    and the C-mapped flag, C's pointer, the bias's and the residual's, alpha 1 and beta 0, at the offsets the
    description names; written by the memo itself (`kernel_arguments`: no launch, no GPU), and in Python, which
    says what is meant. Every argument then holds the bytes the Python launch gives the kernel. None where a
    launch needs more than those (`_needs_more`)."""
    import struct

    launched = _record_launches(monkeypatch)
    row = dtypes.lookup(problem.dtype, problem.compute)
    a, b, c = _call_operands(problem, misaligned)
    residual = KernelOperand(False, problem.n + 8, problem.m * (problem.n + 8), 0)
    source = render(config, problem, config.vector_widths(a, b, c, row.itemsize))
    launch = launcher(_prepared(config, problem, source), a, b, c, ordinal=0, residual=residual)
    describe = getattr(launch, "native_description", None)
    described = describe() if describe is not None else None
    if _needs_more(config, problem, misaligned):
        assert described is None
        return
    function, grid, block, smem, raw, offsets, maps, pointers, at_c, at_bias, at_residual, at_c_mapped, at_alpha, \
        at_beta, scalar_bytes, order, encode, keep = described
    launch(PA, PB, PC, 1.0, 0.0, SimpleNamespace(ptr=0), PBIAS, PRESIDUAL)
    kernel = launched[-1]
    prepared = _prepared(config, problem, source)
    assert (function, grid, block, smem) == (0, prepared.grid, prepared.block, prepared.smem)
    assert keep is launch or getattr(keep, "native_description", None) is not None
    if writer == "memo":
        request.getfixturevalue("memo_type")  # (skips where the memo cannot be built here)
        from autogemm.serving import native_linear

        # (a kernel that was never loaded, at a made-up address; TorchFusedEpiloguePlan adds the output's shape, the
        # alignment the kernel assumes and the device)
        memory = native_linear.load().kernel_arguments((0x1234, *described[1:], (problem.m, problem.n), (0, 0), 0),
                                                       PA, PB, PC, PBIAS, PRESIDUAL)
    else:
        memory = bytearray(raw)
        by_role = {order[0]: PA, order[1]: PB}
        for role in (0, 1):
            if maps[role] is not None:
                memory[maps[role]:maps[role] + 128] = encode(role, by_role[role])
            else:
                struct.pack_into("<Q", memory, pointers[role], by_role[role])
        if maps[2] is not None:
            memory[maps[2]:maps[2] + 128] = encode(2, PC)
        if at_c_mapped is not None:
            struct.pack_into("<i", memory, at_c_mapped, int(maps[2] is not None))
        for at, pointer in ((at_c, PC), (at_bias, PBIAS), (at_residual, PRESIDUAL)):
            struct.pack_into("<Q", memory, at, pointer)
        scalar = {4: "<f", 8: "<d"}[scalar_bytes]
        struct.pack_into(scalar, memory, at_alpha, 1.0)
        struct.pack_into(scalar, memory, at_beta, 0.0)
    given = kernel.arguments()
    assert len(offsets) == len(kernel.parameters)
    for name, offset in zip(kernel.parameters, offsets):
        dtype = kernel.argument_dtypes[name]
        value = given[name]
        want = value if isinstance(value, bytes) else np.array(value, dtype).tobytes()
        assert bytes(memory[offset:offset + dtype.itemsize]) == want, name
