"""Configuration + problem -> CUDA source. Pure: no CuPy, no GPU, same input -> same bytes."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .config import (SimtConfig, VectorWidths, WmmaConfig, packed_vector_widths, transposed_stores,
                     wgmma_swaps_operands, wmma_type, wmma_vector_widths)
from .paths import template_override_dir, templates_dir
from .problem import Problem


@dataclass(frozen=True)
class Source:
    kernel: str  # name of the GEMM kernel function (extern "C")
    reduce_kernel: str | None  # split-K reduction kernel, when split_k > 1
    code: str
    # "a" when the code uses architecture-specific instructions (wgmma: sm_90a), which the
    # compilers must be asked for by name; such a cubin runs on that exact architecture only
    arch_suffix: str = ""

    def target(self, arch: str) -> str:
        """The compiler architecture for `arch` (e.g. sm_90 -> sm_90a for wgmma kernels)."""
        return arch if arch.endswith(self.arch_suffix) else arch + self.arch_suffix

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def _environment(override: Path | None) -> jinja2.Environment:
    base = jinja2.FileSystemLoader(str(templates_dir()))
    loaders = [base, jinja2.PrefixLoader({"base": base})]
    if override is not None:
        loaders.insert(0, jinja2.FileSystemLoader(str(override)))
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=4)
def _template_hash(override: Path | None) -> str:
    digest = hashlib.sha256()
    folders = [templates_dir()] + ([override] if override is not None else [])
    for folder in folders:
        for path in sorted(folder.glob("*.j2")):
            digest.update(f"{folder == override}:{path.name}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def template_hash() -> str:
    """Hash of every template in use: a cached kernel is trusted only while this is unchanged."""
    return _template_hash(template_override_dir())


def _even(config, problem: Problem) -> str:
    return "".join(
        "1" if extent % tile == 0 else "0"
        for extent, tile in ((problem.m, config.bm), (problem.n, config.bn), (problem.k, config.bk))
    )


def kernel_name(config, problem: Problem, widths: VectorWidths) -> str:
    if config.family == "wmma":
        return (f"ag_{config.name}_{problem.dtype}_{problem.compute}_{problem.layout}_e{_even(config, problem)}"
                f"_v{widths.a}x{widths.b}")
    return f"ag_{config.family}_{config.name}_{problem.layout}_e{_even(config, problem)}_v{widths}"


_WMMA_CONVERSIONS = {
    "__half": ("__half2float(x)", "__float2half_rn(x)"),
    "__nv_bfloat16": ("__bfloat162float(x)", "__float2bfloat16_rn(x)"),
    "float": ("x", "x"),
    "double": ("x", "x"),
}


def render_wmma(config: WmmaConfig, problem: Problem, widths: VectorWidths | None = None) -> Source:
    """Renders the tensor-core kernel of `config` for `problem`'s dtype, layout and shape class."""
    kind = wmma_type(problem)
    if kind is None:
        raise ValueError(f"the WMMA template has no kernel for {problem.dtype}/{problem.compute}")
    if widths is None:
        widths = wmma_vector_widths(config, problem)
    for operand, width in (("A", widths.a), ("B", widths.b)):
        if width not in (1, 2, 4, 8) or width > config.vec:
            raise ValueError(f"vector width {width} for {operand} must be 1, 2, 4 or 8 and <= config vec {config.vec}")
    name = kernel_name(config, problem, widths)
    to_acc, from_acc = _WMMA_CONVERSIONS[kind.element]
    cxx_bool = {True: "true", False: "false"}
    fm, fn, fk = config.fragment(problem)
    swap = wgmma_swaps_operands(problem) if config.wgmma else False
    if swap is None:
        raise ValueError(f"the wgmma path cannot read layout {problem.layout.upper()}: K is contiguous in neither operand")
    template = "wgmma_gemm.cu.j2" if config.wgmma else "wmma_gemm.cu.j2"
    code = _environment(template_override_dir()).get_template(template).render(
        kernel=name,
        config_name=config.name,
        dtype=problem.dtype,
        compute=problem.compute,
        layout=problem.layout.upper(),
        element=kind.element,
        accumulator=kind.accumulator,
        precision=kind.precision,
        mma=config.mma,
        mma_shape=f"m{fm}n{fn}k{fk}",
        swap=cxx_bool[swap],
        qw=config.wm if swap else config.wn,  # wgmma's N
        mma_input=kind.mma_input,
        element_bytes=kind.itemsize,
        to_acc=to_acc,
        from_acc=from_acc,
        fm=fm, fn=fn, fk=fk,
        bm=config.bm, bn=config.bn, bk=config.bk,
        wm=config.wm, wn=config.wn,
        va=widths.a, vb=widths.b,
        stages=config.stages,
        buffers=max(1, config.stages),
        group_m=config.group_m,
        split_k=config.split_k,
        min_blocks=config.min_blocks,
        pad=config.smem_pad(problem),
        trans_a=cxx_bool[problem.trans_a],
        trans_b=cxx_bool[problem.trans_b],
        even_m=cxx_bool[problem.m % config.bm == 0],
        even_n=cxx_bool[problem.n % config.bn == 0],
        even_k=cxx_bool[problem.k % config.bk == 0],
    )
    return Source(kernel=name, reduce_kernel=f"{name}_reduce" if config.split_k > 1 else None, code=code,
                  arch_suffix="a" if config.wgmma else "")


def render(config: SimtConfig, problem: Problem, widths: VectorWidths | None = None) -> Source:
    """Renders the kernel of `config` for `problem`'s layout and shape class.

    The shape enters only through which of M, N, K are multiples of the block tile (tails need
    bounds checks, multiples do not); M, N, K themselves are kernel arguments.
    """
    if config.family == "wmma":
        return render_wmma(config, problem, widths)
    if widths is None:
        widths = packed_vector_widths(config, problem)
    for operand, width in (("A", widths.a), ("B", widths.b), ("C", widths.c)):
        if width not in (1, 2, 4) or width > config.vec:
            raise ValueError(f"vector width {width} for {operand} must be 1, 2 or 4 and <= config vec {config.vec}")
    name = kernel_name(config, problem, widths)
    pad_a, pad_b = config.smem_pad(problem)
    a_transposed, b_transposed = transposed_stores(problem)
    staged_a, staged_b = config.registers_staged(problem)
    cxx_bool = {True: "true", False: "false"}
    code = _environment(template_override_dir()).get_template("simt_gemm.cu.j2").render(
        kernel=name,
        config_name=config.name,
        layout=problem.layout.upper(),
        trans_a=problem.trans_a,
        trans_b=problem.trans_b,
        bm=config.bm,
        bn=config.bn,
        bk=config.bk,
        wm=config.wm,
        wn=config.wn,
        tm=config.tm,
        tn=config.tn,
        vec_frag=config.vec_frag,
        va=widths.a,
        vb=widths.b,
        vc=widths.c,
        stages=config.stages,
        buffers=config.smem_buffers,
        use_cp_async=config.stages >= 3,
        group_m=config.group_m,
        split_k=config.split_k,
        stream_k=config.stream_k,
        max_registers=config.max_registers,
        min_blocks=config.min_blocks,
        even_m=cxx_bool[problem.m % config.bm == 0],
        even_n=cxx_bool[problem.n % config.bn == 0],
        even_k=cxx_bool[problem.k % config.bk == 0],
        pad_a=pad_a,
        pad_b=pad_b,
        swizzle_a=cxx_bool[config.smem == "swizzle" and a_transposed],
        swizzle_b=cxx_bool[config.smem == "swizzle" and b_transposed],
        staged_a=staged_a,
        staged_b=staged_b,
    )
    return Source(kernel=name, reduce_kernel=f"{name}_reduce" if config.split_k > 1 else None, code=code)
