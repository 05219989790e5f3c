"""The import rule (issue 38): autogemm's modules import only downward through the layers, with no
circles, and import an autogemm module inside a function only where that keeps CuPy, torch or
Optuna (SQLAlchemy, plotly, nvmath) lazy, with a comment saying so; `import autogemm` and the
command line's parser import none of those packages.

The checks read the source (ast), so they see every import, the ones inside functions included."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import autogemm

PACKAGE = Path(autogemm.__file__).parent

# lowest first, as docs/architecture.md draws them; a module imports from its own layer or below
LAYERS = (
    ("top-level vocabulary", {"dtypes", "epilogue", "problem", "fp8", "routing", "paths", "version", "atomic_write", "interrupts", "host_identity"}),
    ("families", {"families"}),
    ("kernels", {"kernels"}),
    ("gpu, results", {"gpu", "results"}),
    ("measure", {"measure"}),
    ("tuning", {"tuning"}),
    ("serving, campaigns, reports", {"serving", "campaigns", "reports"}),
    ("cli", {"cli"}),
)
# the entry points may import anything (autogemm/__init__.py, autogemm/torch.py, autogemm/__main__.py)
ENTRY_POINTS = {"autogemm", "autogemm.torch", "autogemm.__main__"}
# what `import autogemm` must not import (cuda: cuda-bindings)
HEAVY = ("cupy", "torch", "optuna", "sqlalchemy", "nvmath", "plotly", "cuda")


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, dotted
    target: str  # the autogemm module imported, dotted
    path: Path
    line: int
    in_function: bool
    commented: bool  # a comment on the statement's lines or the line above


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str, package: Path) -> bool:
    location = package.parent.joinpath(*dotted.split("."))
    return location.with_suffix(".py").is_file() or (location / "__init__.py").is_file()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, package: Path) -> list[str]:
    """The modules an import statement imports (`from x import y`: x.y where y is a module, else x)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return list(dict.fromkeys(f"{source}.{alias.name}" if _is_module(f"{source}.{alias.name}", package) else source
                              for alias in node.names))


def _statements(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, with whether it runs inside a function (at any depth)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def autogemm_imports(package: Path = PACKAGE) -> list[Import]:
    """Every import of an autogemm module by a module of `package`."""
    imports = []
    for path in sorted(package.rglob("*.py")):
        module, source = module_name(path, package), path.read_text(encoding="utf-8")
        with path.open(encoding="utf-8") as file:
            comments = {token.start[0] for token in tokenize.generate_tokens(file.readline)
                        if token.type == tokenize.COMMENT}
        for node, in_function in _statements(ast.parse(source, str(path))):
            lines = set(range(node.lineno - 1, (node.end_lineno or node.lineno) + 1))
            for target in _targets(node, module, path.name == "__init__.py", package):
                if target == "autogemm" or target.startswith("autogemm."):
                    imports.append(Import(module, target, path, node.lineno, in_function, bool(lines & comments)))
    return imports


def layer(module: str) -> int | None:
    """The index of `module`'s layer in LAYERS; len(LAYERS) for an entry point; None where unplaced."""
    if module in ENTRY_POINTS:
        return len(LAYERS)
    stage = module.split(".")[1]
    return next((index for index, (_, names) in enumerate(LAYERS) if stage in names), None)


def _layer_name(index: int) -> str:
    return LAYERS[index][0] if index < len(LAYERS) else "entry points"


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """An import of a module of a higher layer (the package's own modules and the entry points aside)."""
    found = []
    for item in autogemm_imports(package):
        if item.importer in ENTRY_POINTS or item.importer.split(".")[:2] == item.target.split(".")[:2]:
            continue
        importer, target = layer(item.importer), layer(item.target)
        if importer is not None and target is not None and target > importer:
            found.append(f"{item.path}:{item.line}: {item.importer} ({_layer_name(importer)}) imports "
                         f"{item.target} ({_layer_name(target)})")
    return found


def uncommented_function_imports(package: Path = PACKAGE) -> list[str]:
    return [f"{item.path}:{item.line}: {item.importer} imports {item.target} inside a function without a comment "
            "saying why (a module-level import, unless it keeps CuPy, torch or Optuna lazy)"
            for item in autogemm_imports(package) if item.in_function and not item.commented]


def module_level_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """Circles of module-level imports (TYPE_CHECKING ones included), each once."""
    edges: dict[str, set[str]] = {}
    for item in autogemm_imports(package):
        if not item.in_function and item.target != item.importer:
            edges.setdefault(item.importer, set()).add(item.target)
    cycles, done = [], set()

    def walk(module: str, trail: list[str]) -> None:
        if module in trail:
            cycle = trail[trail.index(module):]
            turned = cycle[cycle.index(min(cycle)):] + cycle[:cycle.index(min(cycle))]
            if turned not in cycles:
                cycles.append(turned)
            return
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            walk(target, trail + [module])
        done.add(module)

    for module in sorted(edges):
        walk(module, [])
    return cycles


def test_every_module_has_a_layer():
    modules = {module_name(path, PACKAGE) for path in PACKAGE.rglob("*.py")}
    assert [m for m in sorted(modules) if layer(m) is None] == [], "place these in LAYERS (tests/test_imports.py)"


def test_no_module_imports_from_a_higher_layer():
    assert upward_imports() == []


def test_no_circles_of_module_level_imports():
    assert module_level_cycles() == []


def test_a_function_level_import_of_autogemm_says_why():
    assert uncommented_function_imports() == []


def uncommented_lazy_imports(package: Path = PACKAGE) -> list[str]:
    """Function-level imports of anything (CuPy, torch, the standard library...) without a comment on
    their lines or the line above saying why they are not at the top of the module."""
    found = []
    for path in sorted(package.rglob("*.py")):
        with path.open(encoding="utf-8") as file:
            comments = {token.start[0] for token in tokenize.generate_tokens(file.readline)
                        if token.type == tokenize.COMMENT}
        for node, in_function in _statements(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if in_function and not set(range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)) & comments:
                found.append(f"{path}:{node.lineno}: an import inside a function without a comment saying why")
    return found


def test_every_function_level_import_says_why():
    assert uncommented_lazy_imports() == []


def test_the_lazy_import_check_sees_an_uncommented_one(tmp_path):
    package = tmp_path / "autogemm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lazy.py").write_text("def f():\n    import cupy  # (lazy: CuPy)\n\n\ndef g():\n    import os\n")
    assert [line.split(": ", 1)[1] for line in uncommented_lazy_imports(package)] == [
        "an import inside a function without a comment saying why"]


def test_the_checks_see_what_they_look_for(tmp_path):
    """A package with an upward import, an uncommented function-level import and a circle fails each
    check; the commented lazy import and the package's own import pass."""
    package = tmp_path / "autogemm"
    for folder in ("serving", "tuning", "kernels"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from .serving.api import call\n")
    (package / "serving" / "api.py").write_text(
        "from . import helper\n\n\ndef call():\n    from ..tuning import tuner  # (lazy: Optuna)\n\n"
        "    from ..kernels import space\n")
    (package / "serving" / "helper.py").write_text("from .api import call\n")
    (package / "tuning" / "tuner.py").write_text("")
    (package / "kernels" / "space.py").write_text("from ..serving.helper import call\n")

    assert [line.split(": ", 1)[1] for line in upward_imports(package)] == [
        "autogemm.kernels.space (kernels) imports autogemm.serving.helper (serving, campaigns, reports)"]
    assert [line.split(": ", 1)[1] for line in uncommented_function_imports(package)] == [
        "autogemm.serving.api imports autogemm.kernels.space inside a function without a comment saying why "
        "(a module-level import, unless it keeps CuPy, torch or Optuna lazy)"]
    assert module_level_cycles(package) == [["autogemm.serving.api", "autogemm.serving.helper"]]


def test_importing_autogemm_and_its_command_line_imports_no_heavy_package():
    """CuPy, torch, Optuna, SQLAlchemy, nvmath-python, plotly and cuda-bindings load where they are
    used: neither `import autogemm` nor building the CLI's parser (`autogemm --help`) imports them."""
    script = ("import json, sys\n"
              "def loaded(): return sorted({name.split('.')[0] for name in sys.modules} & set(sys.argv[1:]))\n"
              "import autogemm\n"
              "after_import = loaded()\n"
              "import autogemm.cli\n"
              "autogemm.cli.build_parser()\n"
              "print(json.dumps({'import autogemm': after_import, 'the CLI parser': loaded()}))\n")
    done = subprocess.run([sys.executable, "-c", script, *HEAVY], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"import autogemm": [], "the CLI parser": []}


def test_every_public_name_of_the_package_is_exported():
    """Type checkers (pyright, mypy --strict) take a py.typed package's names from `__all__` only:
    a function `import autogemm` makes public but leaves out of it is an error in the user's script
    (`linear` and the grouped products were, once)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    public = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            public |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            public.add(node.name)
    public = {name for name in public if not name.startswith("_") and name not in ("annotations", "TYPE_CHECKING", "Any")}
    public -= {"importlib"}
    # only the names a user calls or names in a type: the typing-only imports stay out
    public -= {"TuneOptions", "TuneResult"}
    assert public - set(autogemm.__all__) == set(), "public but not in __all__"
    assert all(hasattr(autogemm, name) for name in autogemm.__all__)
    assert {"matmul", "linear", "grouped_matmul", "grouped_matmul_masked", "scaled_matmul"} <= set(autogemm.__all__)
