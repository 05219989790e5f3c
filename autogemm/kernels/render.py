"""Configuration + problem -> CUDA source. Pure: no CuPy, no GPU, the same input gives the same bytes.

The config names its template (`config.template`) and the values it needs (`config.context`);
nothing here knows a family. Templates come from `$AUTOGEMM_TEMPLATE_DIR` (if set), then the
directories of families registered from outside the package, then the shipped templates (also
reachable as ``base/<name>``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jinja2
import jinja2.meta
import jinja2.sandbox

from ..families import GemmConfig, VectorWidths, all_families
from ..paths import template_override_dir, templates_dir
from .. import dtypes
from ..epilogue import Epilogue
from ..problem import Problem


@dataclass(frozen=True)
class Source:
    kernel: str  # name of the GEMM kernel function (extern "C")
    reduce_kernel: str | None  # split-K reduction kernel, when split_k > 1
    code: str
    # "a" when the code uses architecture-specific instructions (wgmma: sm_90a), which the
    # compilers must be asked for by name; such a cubin runs on that exact architecture only
    arch_suffix: str = ""
    repack_kernel: str | None = None  # the kernel copying misaligned operands to aligned pitches

    def target(self, arch: str) -> str:
        """The compiler architecture for `arch` (e.g. sm_90 -> sm_90a for wgmma kernels)."""
        return arch if arch.endswith(self.arch_suffix) else arch + self.arch_suffix

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    @functools.cached_property
    def signatures(self) -> dict[str, tuple[KernelParameter, ...]]:
        """The parameters of every kernel the code defines (`extern "C" __global__`), by kernel name."""
        return kernel_signatures(self.code)

    def parameters(self, kernel: str) -> tuple[str, ...]:
        """The parameter names of kernel `kernel`, in the order it takes them: what a launcher packs
        its arguments by (`gpu.packed_launch`), so that no launcher depends on a template's order."""
        try:
            return tuple(parameter.name for parameter in self.signatures[kernel])
        except KeyError:
            raise ValueError(f"the source of {self.kernel} defines no kernel {kernel!r} (it defines "
                             f"{', '.join(self.signatures) or 'none'})") from None


class KernelParameter(NamedTuple):
    name: str
    type: str  # as declared, without qualifiers (const, __restrict__, __grid_constant__): "T*", "long long"


_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+void\b')
_WORD = re.compile(r"\s*(\w+)(\s*\()?")  # a name, and the parenthesis after it if one follows
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_QUALIFIERS = re.compile(r"\b(?:const|volatile|__restrict__|__grid_constant__)\b")
_PARENTHESIS = re.compile(r"[()]")
_NESTING_OR_COMMA = re.compile(r"[()<>,]")


def _closing(code: str, opening: int) -> int:
    """The index just past the parenthesis that closes the one at `opening`."""
    depth = 0
    for match in _PARENTHESIS.finditer(code, opening):
        depth += 1 if match.group() == "(" else -1
        if depth == 0:
            return match.end()
    raise ValueError(f"unbalanced parentheses after {code[opening:opening + 40]!r}")


def kernel_signatures(code: str) -> dict[str, tuple[KernelParameter, ...]]:
    """Each `extern "C" __global__ void` kernel of `code` with its parameters, read from its
    definition: past the attributes (`__launch_bounds__(...)`, `__cluster_dims__(...)`, ...) the
    first name with a parenthesis is the kernel's, and each top-level comma-separated declaration
    in it ends with a parameter's name."""
    found = {}
    for entry in _ENTRY.finditer(code):
        at = entry.end()
        while (match := _WORD.match(code, at)) is not None:
            name, opened = match.group(1), match.group(2)
            attribute = name.startswith("__") and name.endswith("__")  # CUDA's spelling of them
            end = _closing(code, match.end() - 1) if opened else match.end()
            if not attribute:
                if opened:  # (a name without one is no kernel definition this reads)
                    found[name] = _parameters(code[match.end():end - 1])
                break
            at = end
    return found


def _parameters(declarations: str) -> tuple[KernelParameter, ...]:
    declarations = _COMMENT.sub(" ", declarations)
    pieces, depth, start = [], 0, 0
    for match in _NESTING_OR_COMMA.finditer(declarations):
        char = match.group()
        if char == ",":
            if depth == 0:
                pieces.append(declarations[start:match.start()])
                start = match.end()
        else:
            depth += 1 if char in "(<" else -1
    pieces.append(declarations[start:])
    parameters = []
    for piece in (p.strip() for p in pieces):
        if not piece or piece == "void":
            continue
        match = re.fullmatch(r"(.*?)(\w+)", piece, re.DOTALL)
        if match is None:
            raise ValueError(f"cannot read a kernel parameter's name in {piece!r}")
        declared = " ".join(_QUALIFIERS.sub(" ", match.group(1)).split()).replace(" *", "*")
        parameters.append(KernelParameter(match.group(2), declared))
    return tuple(parameters)


def _template_dirs() -> tuple[Path | None, tuple[Path, ...]]:
    family_dirs = tuple(dict.fromkeys(Path(f.template_dir) for f in all_families()
                                      if getattr(f, "template_dir", None)))
    return template_override_dir(), family_dirs


@functools.lru_cache(maxsize=8)
def _environment(override: Path | None, family_dirs: tuple[Path, ...], stamp: tuple[Any, ...]) -> jinja2.Environment:
    # (`stamp`: a template added, removed or edited makes a new environment, whose template cache
    # cannot hold a version that another folder now overrides)
    base = jinja2.FileSystemLoader(str(templates_dir()))
    loaders = [*(jinja2.FileSystemLoader(str(d)) for d in family_dirs), base, jinja2.PrefixLoader({"base": base})]
    if override is not None:
        loaders.insert(0, jinja2.FileSystemLoader(str(override)))
    # sandboxed: a template from $AUTOGEMM_TEMPLATE_DIR or a family of outside the package can read
    # the values it is given, not reach Python (no dunder attributes, no mutating calls)
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def environment() -> jinja2.Environment:
    dirs = _template_dirs()
    return _environment(*dirs, _stamp(*dirs))


def _stamp(override: Path | None, family_dirs: tuple[Path, ...]) -> tuple[Any, ...]:
    """Name, size and modification time of every template in use: the hashes below are memoized
    on it, so that a template edited while the process runs is hashed anew."""
    folders = [templates_dir(), *family_dirs] + ([override] if override is not None else [])
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for folder in folders for p in sorted(folder.glob("*.j2")))


@functools.lru_cache(maxsize=8)
def _template_hash(override: Path | None, family_dirs: tuple[Path, ...], stamp: tuple[Any, ...]) -> str:
    digest = hashlib.sha256()
    folders = [templates_dir(), *family_dirs] + ([override] if override is not None else [])
    for folder in folders:
        for path in sorted(folder.glob("*.j2")):
            digest.update(f"{folder == override}:{path.name}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def template_hash() -> str:
    """Hash of every template in use (study names carry it: timings of other templates do not carry over)."""
    dirs = _template_dirs()
    return _template_hash(*dirs, _stamp(*dirs))


@functools.lru_cache(maxsize=64)
def _kernel_template_hash(name: str, override: Path | None, family_dirs: tuple[Path, ...], stamp: tuple[Any, ...]) -> str:
    env = _environment(override, family_dirs, stamp)
    digest = hashlib.sha256()
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        source, _, _ = env.loader.get_source(env, current)
        digest.update(f"{current}\0".encode() + source.encode())
        pending += [t for t in jinja2.meta.find_referenced_templates(env.parse(source)) if t]
    return digest.hexdigest()[:16]


def kernel_template_hash(template: str) -> str:
    """Hash of one kernel template and every template it imports or includes: a cached kernel is
    trusted while this is unchanged, so that editing one family's skeleton leaves the others' alone."""
    dirs = _template_dirs()
    return _kernel_template_hash(template, *dirs, _stamp(*dirs))


def render(config: GemmConfig, problem: Problem, widths: VectorWidths | None = None, *, force: bool = False) -> Source:
    """Renders the kernel of `config` for `problem`'s dtype, layout and shape class.

    The shape enters only through which of M, N, K are multiples of the block tile (tails need
    bounds checks, multiples do not); M, N, K themselves are kernel arguments. `widths` are the
    operands' vector widths (default: those of densely packed operands). A knob of the wrong type,
    a string knob that is not one of its choices, or (unless `force`, for experiments) a number out
    of its range never reaches the source: ValueError.
    """
    refusal = config.epilogue_refusal(problem.epilogue)
    if refusal:
        raise ValueError(f"config {config.name} is not rendered with the epilogue {problem.epilogue}: {refusal}")
    reasons = config.render_reasons(force)
    if reasons:
        raise ValueError(f"config {config.name} is not rendered: " + "; ".join(r.removeprefix("choice: ") for r in reasons))
    problem = config.kernel_problem(problem)  # a config that swaps the operands renders C^T = B^T A^T
    if widths is None:
        widths = config.packed_widths(problem)
    config.check_widths(widths)
    name = config.kernel_name(problem, widths)
    if not problem.epilogue.is_identity:  # (one kernel name per source: the epilogue changes the code)
        name += "_" + problem.epilogue.identifier
    if problem.grouped:
        name += "_grouped"
    template = environment().get_template(config.template)
    try:
        code = template.render(kernel=name, config_name=config.name,
                               epilogue=problem.epilogue.template_context(problem.dtype), **config.context(problem, widths))
    except jinja2.exceptions.SecurityError as exc:
        raise ValueError(f"template {config.template} ({template.filename}) is refused: {exc} (templates "
                         "render in a sandbox: they may read the values given to them, not Python's "
                         "internals)") from None
    return Source(kernel=name, reduce_kernel=config.reduce_kernel(name), code=code, arch_suffix=config.arch_suffix,
                  repack_kernel=config.repack_kernel(name))


def render_epilogue(dtype: str, epilogue: Epilogue, vector: int = 1) -> Source:
    """The unfused epilogue kernel (templates/epilogue.cu.j2) for products of `dtype`: what follows a
    GEMM that cannot apply `epilogue` itself (cuBLAS), in one pass over the output, each thread taking
    `vector` neighbouring columns (1, or a power of two up to 16 bytes of the product's and D's wider
    type). ValueError for the identity epilogue (there is nothing to apply), for an output dtype the
    kernels do not write and for a vector width the types do not allow."""
    if epilogue.is_identity:
        raise ValueError("the identity epilogue has no kernel: the GEMM's output is D")
    row = dtypes.lookup(dtype)
    context = epilogue.template_context(dtype)  # (validates the output dtype)
    widest = max(row.itemsize, dtypes.lookup(epilogue.output_dtype(dtype)).itemsize)
    if vector not in (1, 2, 4, 8) or vector * widest > 16:
        raise ValueError(f"an epilogue kernel of {dtype} products writing {epilogue.output_dtype(dtype)} takes 1 to "
                         f"{16 // widest} columns a thread (a power of two), not {vector!r}")
    name = f"autogemm_epilogue_{dtype}_{epilogue.identifier}" + (f"_v{vector}" if vector > 1 else "")
    code = environment().get_template("epilogue.cu.j2").render(
        kernel=name, dtype=dtype, element=row.element, accumulator=row.accumulator, element_bytes=row.itemsize,
        to_acc=row.to_acc, epilogue=context, vector=vector)
    return Source(kernel=name, reduce_kernel=None, code=code)


@functools.lru_cache(maxsize=4096)
def _kernel_digest(config, problem: Problem, stamp: tuple[Any, ...]) -> str:
    return render(config, problem).digest


def kernel_digest(config: GemmConfig, problem: Problem) -> str:
    """Digest of the source `config` renders to for `problem` (operands densely packed): a cached
    kernel is current while this is unchanged, whatever else changes in the templates."""
    return _kernel_digest(config, problem, _stamp(*_template_dirs()))
