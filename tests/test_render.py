"""Rendering: a pairwise-covering sample of every shipped space renders, with its knobs in the code;
sources are the same bytes in any process and match the recorded snapshot; template hashes follow
the templates; the shape enters only through tile multiples."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autogemm.families import SimtConfig, TensorCoreConfig, VectorWidths, config_from_name
from autogemm.paths import templates_dir
from autogemm.problem import Device, Problem
from autogemm.kernels.render import kernel_template_hash, render, template_hash
from autogemm.kernels.space import SearchSpace
from samples import KINDS, covering_sample

SM90 = Device.for_arch("sm_90")
HERE = Path(__file__).parent
SNAPSHOT = HERE / "data" / "render_snapshot.json"


@pytest.mark.parametrize("dtype, compute, space", KINDS, ids=[k[2] for k in KINDS])
def test_a_pairwise_covering_sample_renders(dtype, compute, space):
    loaded = SearchSpace.load(space)
    sample = covering_sample(loaded, dtype, compute, SM90, seed=11)
    assert len(sample) >= 40
    assert {p.layout for _, p in sample} == {"nn", "nt", "tn", "tt"}
    draws = loaded.sample(300, Problem(4096, 4096, 4096, dtype=dtype, compute=compute), SM90, seed=11)
    for field in loaded.fields:  # every value the space gives a knob is rendered at least once
        values = {getattr(c, field) for c, _ in sample}
        drawn = {getattr(c, field) for c in draws}
        assert drawn <= values, (field, drawn - values)
    kernels = set()
    for config, problem in sample:
        source = render(config, problem)
        code = source.code
        assert f"{source.kernel}(" in code
        assert f"constexpr int BM = {config.bm}, BN = {config.bn}, BK = {config.bk};" in code
        assert f"constexpr int STAGES = {config.stages};" in code
        second_pass = config.split_k > 1 and getattr(config, "split_reduce", "kernel") == "kernel"
        assert (source.reduce_kernel is not None) == second_pass
        assert (f"{source.reduce_kernel}(" in code) == second_pass
        assert ("__cluster_dims__(1, SPLIT_K, 1)" in code) == getattr(config, "cluster_reduce", False)
        if isinstance(config, SimtConfig):
            assert ("cp.async" in code) == (config.stages >= 3)
        else:
            assert f"__launch_bounds__(THREADS, {config.min_blocks})" in code
            assert ("wgmma.mma_async" in code) == (config.instruction == "wgmma")
            assert ("mma.sync.aligned" in code) == (config.instruction == "mma")
        kernels.add(source.kernel)
    assert len(kernels) == len(sample)  # one distinct kernel per (config, problem class)


@functools.lru_cache(maxsize=1)
def _snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


def _snapshot_render(key: str):
    name, problem_key, widths = key.split("|")
    return render(config_from_name(name), Problem.from_key(problem_key),
                  None if widths == "packed" else VectorWidths(*map(int, widths)))


def test_rendered_sources_match_the_snapshot():
    """The digests of ~1800 rendered kernels (every shipped space, several layouts and tails,
    packed and narrowest widths) are recorded in tests/data/render_snapshot.json; a template
    change that alters one shows here, by family. After checking that such a change is meant
    (for a refactor: the cubins' SASS unchanged), record it with `python tests/render_snapshot.py`."""
    changed = [key for key, digest in _snapshot().items() if _snapshot_render(key).digest != digest]
    assert len(_snapshot()) > 1000
    assert not changed, f"{len(changed)} kernels render differently, e.g. {changed[:3]}"


def test_rendering_is_deterministic_across_processes():
    keys = sorted(_snapshot())[::97]
    script = ("import sys, json; sys.path.insert(0, sys.argv[1]); from test_render import _snapshot_render; "
              "print(json.dumps([_snapshot_render(k).digest for k in json.loads(sys.argv[2])]))")
    other = subprocess.run([sys.executable, "-c", script, str(HERE), json.dumps(keys)], capture_output=True, text=True,
                           check=True)
    assert json.loads(other.stdout) == [_snapshot_render(k).digest for k in keys]


def test_shape_enters_only_through_tile_multiples():
    config = SimtConfig()
    assert render(config, Problem(4096, 4096, 4096)).code == render(config, Problem(2048, 1024, 512)).code
    assert render(config, Problem(4096, 4096, 4096)).code != render(config, Problem(4095, 4096, 4096)).code


def test_vector_widths_follow_alignment_of_packed_operands():
    config = SimtConfig(vec=4)
    assert config.packed_widths(Problem(128, 128, 128)) == VectorWidths(4, 4, 4)
    assert config.packed_widths(Problem(128, 130, 1023)) == VectorWidths(1, 2, 2)
    assert config.packed_widths(Problem.from_layout(126, 128, 1023, "tn")) == VectorWidths(2, 4, 4)
    with pytest.raises(ValueError, match="vector width 4 for A"):
        render(SimtConfig(vec=2), Problem(64, 64, 64), VectorWidths(4, 2, 2))
    assert TensorCoreConfig().packed_widths(Problem(64, 64, 60, dtype="float16")) == VectorWidths(4, 8, 1)


def _override(tmp_path: Path, monkeypatch, name: str, extra: str) -> None:
    """An override directory in which template `name` differs from the shipped one by `extra`."""
    folder = tmp_path / "override"
    folder.mkdir(exist_ok=True)
    shutil.copy(templates_dir() / name, folder / name)
    with open(folder / name, "a") as out:
        out.write(extra)
    monkeypatch.setenv("AUTOGEMM_TEMPLATE_DIR", str(folder))


def test_template_hashes_follow_the_templates(tmp_path, monkeypatch):
    before = template_hash()
    simt = kernel_template_hash("simt_gemm.cu.j2")
    wgmma = kernel_template_hash("wgmma_gemm.cu.j2")
    assert len({simt, wgmma}) == 2 and len(before) == 16
    _override(tmp_path, monkeypatch, "wgmma_gemm.cu.j2", "// changed\n")
    assert template_hash() != before
    assert kernel_template_hash("wgmma_gemm.cu.j2") != wgmma
    assert kernel_template_hash("simt_gemm.cu.j2") == simt  # the SIMT kernel does not include it
    _override(tmp_path, monkeypatch, "common.cuh.j2", "{# changed #}\n")  # included by every skeleton
    assert kernel_template_hash("simt_gemm.cu.j2") != simt


@pytest.mark.parametrize("group_m", [3, 5, 6, 7, 9])
def test_fault_injecting_test_template_still_finds_its_marker(monkeypatch, group_m):
    """The GPU isolation tests inject faults through tests/broken_templates, which splices them in
    front of the shipped template's epilogue marker; if the marker moves, the faults vanish."""
    monkeypatch.setenv("AUTOGEMM_TEMPLATE_DIR", str(HERE / "broken_templates"))
    config = SimtConfig(64, 64, 8, 32, 32, 4, 8, 4, 4, 2, "pad", group_m, 1)
    assert "// FAULT" in render(config, Problem(512, 512, 512)).code


@pytest.mark.parametrize("knobs, message", [
    ({"group_m": 2**32}, "group_m=4294967296 must be 1 to 1024"),  # nvcc: GROUP_M = 0, then a division by zero
    ({"split_k": 2**31}, "split_k=2147483648 must be 1 to 65535"),  # INT_MIN in the kernel
    ({"stream_k": 1}, "stream_k=1 must be true or false"),
    ({"bk": 1.5}, "bk=1.5 must be an int"),
])
def test_knobs_of_the_wrong_type_or_range_never_reach_the_source(knobs, message):
    config = SimtConfig().replace(**knobs)
    with pytest.raises(ValueError, match=re.escape(message)):
        render(config, Problem(256, 256, 256))


def test_experiments_may_render_out_of_range_knobs_but_not_wrong_types():
    source = render(SimtConfig(group_m=3000), Problem(256, 256, 256), force=True)
    assert "constexpr int GROUP_M = 3000;" in source.code
    with pytest.raises(ValueError, match="group_m=True must be an int"):
        render(SimtConfig(group_m=True), Problem(256, 256, 256), force=True)


def test_split_k_adds_up_in_one_launch_for_gemv_and_the_simt_fused_and_cluster_splits():
    """GEMV's split-K and the SIMT fused and cluster splits have no second kernel: the blocks leave
    partial sums in a workspace and the last one of a tile adds them up, or a cluster's blocks add
    up in shared memory. The plain SIMT split keeps its reduction kernel."""
    for layout in ("nn", "nt"):
        problem = Problem.from_layout(1, 4096, 4096, layout)
        gemv = config_from_name("gemv_m1_n32_k256_w4_v4_u8_s4_o2")
        source = render(gemv, problem)
        assert gemv.launch_kind == "split_k_fused" and source.reduce_kernel is None
        assert "_reduce(" not in source.code and "int* __restrict__ counters" in source.code
        assert "finish_split(out, tile_slots" in source.code
        plain = config_from_name("gemv_m1_n32_k256_w4_v4_u8_s1_o2")
        assert plain.launch_kind == "tiles" and "counters" not in render(plain, problem).code
    problem = Problem(127, 4096, 4096)
    cluster = config_from_name("128x128x16_w32x64_t8x8_v44_s3_pad_g8_k4_o1_r_cr")
    source = render(cluster, problem)
    assert cluster.launch_kind == "split_k_cluster" and source.reduce_kernel is None
    assert "__cluster_dims__(1, SPLIT_K, 1)" in source.code and "reduce_in_cluster(acc" in source.code
    assert cluster.smem_bytes(problem) == 128 * 128 * 4  # the partial sums outgrow the pipeline
    fused = cluster.replace(split_reduce="fused")
    source = render(fused, problem)
    assert fused.launch_kind == "split_k_fused" and source.reduce_kernel is None and "_reduce(" not in source.code
    assert "int* __restrict__ counters" in source.code and "__cluster_dims__" not in source.code
    workspace = cluster.replace(split_reduce="kernel")
    assert workspace.launch_kind == "tiles" and render(workspace, problem).reduce_kernel
    assert not cluster.replace(split_k=1).cluster_reduce  # nothing to add up: a plain kernel
