"""A kernel family defined outside the package, for the test that adding a family needs no change
to autogemm: one module (this knob table and config class), one template (toy_gemm.cu.j2) and
one search space (toy.toml). The kernel is naive on purpose: one thread per output element, the
K loop unrolled by BK."""

from __future__ import annotations

from pathlib import Path

from autogemm import dtypes
from autogemm.families import GemmConfig, register
from autogemm.families.knobs import Knob

KNOBS = (
    Knob("bm", int, 8, join="", power_of_two=True, low=1, high=32),
    Knob("bn", int, 32, join="x", power_of_two=True, low=1, high=32),
    Knob("bk", int, 4, join="x", choices=(1, 2, 4, 8)),  # K-loop unrolling
    Knob("split_k", int, 1, choices=(1,), omitted=1),
    Knob("min_blocks", int, 1, choices=(1,), omitted=1),
    Knob("fma", bool, True, omitted=True, words={False: "mul"}),  # fused multiply-add, or multiply then add
)


@register
class ToyConfig(GemmConfig):
    family = "toy"
    label = "toy"
    name_prefix = "toy_"
    knobs = KNOBS
    template = "toy_gemm.cu.j2"
    template_dir = str(Path(__file__).parent)
    space_constants = {"WARP": 32}

    @classmethod
    def computes(cls):
        return (dtypes.lookup("float32", "fp32"),)

    @property
    def threads(self) -> int:
        return self.bm * self.bn

    def check(self, problem, device) -> list[str]:
        reasons, bad = self.reason_collector()
        reasons += self.dtype_reasons(problem)
        reasons += self.knob_reasons()
        if reasons:
            return reasons
        if self.threads > device.max_threads_per_block:
            bad("threads", f"{self.threads} threads per block exceed the device limit {device.max_threads_per_block}")
        self.launch_reasons(problem, device, self.smem_bytes(problem), bad)
        return reasons

    def context(self, problem, widths) -> dict:
        return dict(bm=self.bm, bn=self.bn, bk=self.bk, fma=self.fma,
                    trans_a=str(problem.trans_a).lower(), trans_b=str(problem.trans_b).lower())
