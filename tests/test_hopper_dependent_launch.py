"""The Hopper family's `dependent_launch` knob (programmatic dependent launch): the kernel waits for the grid
before it (`griddepcontrol.wait`) after its barriers' setup, before any global memory access, and lets the next
grid launch; the launcher asks the driver for programmatic stream serialization (gpu/dependent_launch.py). What
the config allows, that only it renders the two instructions, the launch structs' layout, and that a dependent
kernel is never handed to a launcher that cannot launch it so. CPU only; tests/test_gpu_kernels.py runs it."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.gpu import dependent_launch, packed_launch
from autogemm.kernels.render import render
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

DEPENDENT = "hopper_128x160x64_w64x160_s5_g8_k1_o1_p_ts_hd_dl"
ONE_WAVE = Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16")


def test_the_knob_renders_the_wait_after_the_barriers_and_nothing_without_it():
    config = config_from_name(DEPENDENT)
    assert config.dependent_launch and config.name == DEPENDENT and config.check(ONE_WAVE, H200) == []
    code = render(config, ONE_WAVE).code
    wait = code.index('asm volatile("griddepcontrol.wait;\\n" ::: "memory");')
    assert code.index("fence.mbarrier_init.release.cluster") < wait < code.index("const unsigned rank = cluster_rank();")
    assert "griddepcontrol.launch_dependents" in code
    assert "griddepcontrol" not in render(config_from_name(DEPENDENT.removesuffix("_dl")), ONE_WAVE).code


def test_a_scaled_product_which_reads_its_scales_at_entry_is_refused():
    fp8 = Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn", epilogue=Epilogue(scale="tensor", out_dtype="bfloat16"))
    refuses_with("hopper_128x128x128_w64x128_s4_g8_k1_o1_p_dl", fp8, "choice: dependent_launch waits after")


def test_dependent_kernels_compile_without_spills():
    compiles_without_spills(DEPENDENT, ONE_WAVE)
    compiles_without_spills("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_c2_ts_hd_dl",
                            Problem.from_layout(4096, 4096, 4096, "nn", dtype="float16"))


def test_the_launch_structs_are_laid_out_as_cuda_h_declares_them():
    assert ctypes.sizeof(dependent_launch._Attribute) == 72  # id, padding, a union of 64 bytes
    assert dependent_launch._Attribute.value.offset == 8
    assert ctypes.sizeof(dependent_launch._LaunchConfig) == 56  # 7 unsigned, the stream at 32, the attributes at 40
    assert dependent_launch._LaunchConfig.stream.offset == 32 and dependent_launch._LaunchConfig.attributes.offset == 40


class _Function:
    ptr = 1234


def test_a_dependent_kernel_launches_through_cuLaunchKernelEx_with_its_attribute(monkeypatch):
    seen = []

    def launch_ex(config, function, parameters, extra):
        c = config._obj
        seen.append((function, (c.grid_x, c.grid_y, c.grid_z), (c.block_x, c.block_y, c.block_z), c.shared_bytes,
                     c.stream, c.attribute_count, c.attributes[0].id, c.attributes[0].value.allowed, parameters, extra))
        return 0

    monkeypatch.setattr(dependent_launch, "_launch_kernel_ex", lambda: launch_ex)
    kernel = packed_launch.PackedKernel(_Function(), (130, 1, 1), (384, 1, 1), 200000, ["M"], {"M": np.int32(7)},
                                        dependent=True)
    kernel.launch(77)
    kernel.launch(78)
    assert [s[4] for s in seen] == [77, 78]  # (the stream of each call)
    function, grid, block, smem, _, count, attribute, allowed, parameters, extra = seen[0]
    assert (function, grid, block, smem, count, attribute, allowed) == \
        (1234, (130, 1, 1), (384, 1, 1), 200000, 1, dependent_launch.PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    assert parameters == kernel._address and extra is None
    # linear's C++ memo launches with cuLaunchKernel, which cannot ask for the early start: it gets no description
    assert kernel.description() is None


def test_a_refused_launch_names_the_drivers_error(monkeypatch):
    monkeypatch.setattr(dependent_launch, "_launch_kernel_ex", lambda: lambda *arguments: 1)
    kernel = packed_launch.PackedKernel(_Function(), (1, 1, 1), (128, 1, 1), 0, ["M"], {"M": np.int32(7)}, dependent=True)
    with pytest.raises(dependent_launch.DependentLaunchError, match="CUresult 1"):
        kernel.launch(0)
