"""The benchmark scripts name autogemm's modules' attributes that exist: a move inside the package (a helper to a
module of its own) must take the scripts along, although most of them run only on a GPU. A static check of each
script's `module.attribute` where the module is one of autogemm's, imported by name (`from autogemm.serving import
dispatch`, `import autogemm.results.cache`)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """name in the script -> the autogemm module it names (imports anywhere in the script, functions too)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("autogemm"):
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autogemm") and not node.level:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                try:
                    importlib.import_module(candidate)
                except ImportError:
                    continue  # (a function or a class, not a module)
                aliases[alias.asname or alias.name] = candidate
    return aliases


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _references(path: Path) -> list[tuple[str, str, int]]:
    """(module, attribute, line) of each `alias.attribute` in the script, alias an autogemm module."""
    tree = ast.parse(path.read_text())
    aliases = _module_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            if dotted in aliases:
                found.append((aliases[dotted], node.attr, node.lineno))
            elif dotted.startswith("autogemm") and "autogemm" in aliases:  # import autogemm.results.cache
                found.append((dotted, node.attr, node.lineno))
    return found


def _missing(script: Path) -> list[str]:
    missing = []
    for module_name, attribute, line in _references(script):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # (an attribute of a module's attribute: a class, a function)
        if not hasattr(module, attribute):
            missing.append(f"{script.name}:{line}: {module_name}.{attribute}")
    return missing


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_autogemm_attribute_a_script_names_exists(script):
    assert not _missing(script)


def test_the_check_finds_a_name_that_is_not_there(tmp_path):
    script = tmp_path / "moved.py"
    script.write_text("import autogemm.results.cache\n\ndef f():\n    from autogemm.serving import dispatch as d\n"
                      "    return d._device_of, d.linear, autogemm.results.cache.shipped_cache_dir\n")
    assert {(module, attribute) for module, attribute, _ in _references(script)} >= {
        ("autogemm.serving.dispatch", "_device_of"), ("autogemm.serving.dispatch", "linear"),
        ("autogemm.results.cache", "shipped_cache_dir")}
    assert _missing(script) == ["moved.py:5: autogemm.serving.dispatch._device_of"]
