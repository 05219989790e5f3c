"""docs/api.md is what docs/api_page.py writes from the public names' docstrings: a docstring, a
signature or an `__all__` changed without `python docs/api_page.py` fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    return load_script(ROOT / "docs" / "api_page.py")


def test_the_api_page_is_current():
    generator = _generator()
    assert (ROOT / "docs" / "api.md").read_text() == generator.page(), \
        "docs/api.md is stale: run python docs/api_page.py"


def test_the_api_page_has_every_public_name_with_its_docstring():
    page = (ROOT / "docs" / "api.md").read_text()
    for module, path in (("autogemm", ROOT / "autogemm" / "__init__.py"), ("autogemm.torch", ROOT / "autogemm" / "torch.py")):
        names = _generator()._all(ast.parse(path.read_text()))
        for name in names:
            if not name.startswith("__"):
                assert f"### `{module}.{name}`" in page, name
    assert "Tunes one problem on the current GPU and caches the winner" in page


def test_a_changed_docstring_makes_the_page_stale(tmp_path, monkeypatch):
    generator = _generator()
    copy = tmp_path / "autogemm"
    copy.mkdir()
    for name in ("__init__.py", "torch.py"):
        (copy / name).write_text((ROOT / "autogemm" / name).read_text())
    (copy / "__init__.py").write_text((copy / "__init__.py").read_text().replace(
        "Tunes one problem on the current GPU and caches the winner", "Tunes one problem (edited)"))
    real = generator._source
    monkeypatch.setattr(generator, "_source", lambda module: copy / real(module).relative_to(ROOT / "autogemm")
                        if real(module).name in ("__init__.py", "torch.py") and real(module).parent == ROOT / "autogemm"
                        else real(module))
    assert generator.page() != (ROOT / "docs" / "api.md").read_text()
