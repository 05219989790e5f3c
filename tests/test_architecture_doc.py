"""docs/architecture.md against the package it describes, so that the page cannot fall behind the code:

- every module of autogemm/ (but __init__.py and __main__.py) has its line in the table of its package;
- every module the page names exists, and so does every path of its "to change X, open Y" table (and a
  name that table places "in" a file is in that file), every link, every package and top-level module of
  the layer picture;
- the module paths of README.md and docs/ (`autogemm/x/y.py`, `x/y.py` for a package x, and dotted
  references such as `autogemm.gpu.capture.CaptureError`) resolve to a module and a name it defines.

The page is read as people write it (headings, Markdown tables, backticks, links), never in a format of
its own. The last tests break a copy of the page or of the README and check that each fault is named."""

from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = Path("docs/architecture.md")
TO_CHANGE = "To change X, open Y"
# a path in a code span: a file of these kinds, or a folder (written with its trailing slash)
FILE_KINDS = (".py", ".toml", ".j2", ".md", ".json")
# the README and docs/ name modules as `autogemm/x/y.py` and `autogemm.x.y` (text, code and examples)
AUTOGEMM_PATH = re.compile(r"(?<![\w./-])autogemm/[\w/]+\.py\b")
DOTTED = re.compile(r"(?<![\w./-])autogemm(?:\.[A-Za-z_]\w*)+")


# ---- the code ---------------------------------------------------------------------------------------
def subpackages(root: Path) -> list[str]:
    return sorted(p.parent.name for p in (root / "autogemm").glob("*/__init__.py"))


def modules(root: Path) -> set[str]:
    """Every module of the package as the page writes it in its tables: `dtypes.py`, `serving/plan.py`."""
    package = root / "autogemm"
    return {p.relative_to(package).as_posix() for p in package.rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts}


@functools.cache
def defined_names(module: Path) -> frozenset[str]:
    """What a module defines or imports at its top level (inside `if` and `try` too), read without
    importing it: `autogemm.torch` would import torch, the GPU modules CuPy."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ())),
                              getattr(node, "finalbody", ())):
                    visit(block)

    visit(ast.parse(module.read_text(encoding="utf-8")).body)
    return frozenset(names)


def resolve_dotted(reference: str, root: Path) -> str | None:
    """Why `autogemm.x.y.Name` does not resolve (None where it does): packages and modules as far as
    they go, then the first remaining part must be a name the module defines."""
    module, rest = root / "autogemm" / "__init__.py", reference.split(".")[1:]
    while rest and module.name == "__init__.py":
        folder = module.parent
        if (folder / rest[0] / "__init__.py").is_file():
            module = folder / rest[0] / "__init__.py"
        elif (folder / f"{rest[0]}.py").is_file():
            module = folder / f"{rest[0]}.py"
        else:
            break
        rest = rest[1:]
    if not rest or rest[0] in defined_names(module):
        return None
    return f"{module.relative_to(root).as_posix()} has no module or name {rest[0]!r}"


def exists(path: str, bases: list[Path]) -> bool:
    """Whether `path` names something under one of `bases`; `<name>` and `*` stand for any name."""
    pattern = re.sub(r"<[^>]*>", "*", path.rstrip("/"))
    for base in bases:
        found = list(base.glob(pattern)) if "*" in pattern else [base / pattern]
        if any(p.is_dir() if path.endswith("/") else p.exists() for p in found):
            return True
    return False


# ---- the page as it is written -------------------------------------------------------------------
def sections(text: str) -> list[tuple[str, list[tuple[int, str]]]]:
    """(heading, [(line number, line)]) for each heading of a Markdown page (none inside code blocks)."""
    found: list[tuple[str, list[tuple[int, str]]]] = [("", [])]
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            found.append((line.lstrip("#").strip(), []))
        else:
            found[-1][1].append((number, line))
    return found


def cells(line: str) -> list[str]:
    """A table row's cells, a `|` inside backticks kept in its cell."""
    parts, current, in_code = [], "", False
    for char in line.strip().strip("|"):
        in_code ^= char == "`"
        if char == "|" and not in_code:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def table_rows(lines: list[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    """The body rows of the tables in `lines` (header and separator rows left out)."""
    rows, header_seen = [], False
    for number, line in lines:
        if not line.startswith("|"):
            header_seen = False
        elif set(line) <= set("|-: "):
            continue
        elif not header_seen:
            header_seen = True
        else:
            rows.append((number, cells(line)))
    return rows


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def path_words(span: str) -> list[str]:
    """The paths in a code span: words that end as a file of FILE_KINDS or a folder (`cli/`)."""
    words = (word.strip("(),;") for word in span.split())
    return [w for w in words if w.endswith(FILE_KINDS) or (w.endswith("/") and len(w) > 1)]


def package_of(heading: str) -> str | None:
    """The package a module table is about: "Top level" is the package root, "`gpu/`: ..." gpu."""
    if heading == "Top level":
        return ""
    match = re.fullmatch(r"`(\w+)/`(?::.*)?", heading)
    return match.group(1) if match else None


def documented_modules(text: str) -> dict[str, int]:
    """The modules the package tables list (first column), with the line of each."""
    found = {}
    for heading, lines in sections(text):
        package = package_of(heading)
        if package is None:
            continue
        for number, row in table_rows(lines):
            for span in code_spans(row[0]):
                if span.endswith(".py"):
                    found[f"{package}/{span}" if package else span] = number
    return found


def no_line(module: str) -> str:
    return f"autogemm/{module} has no line in {PAGE}: add it to the table of its package"


def missing_modules(text: str, root: Path) -> list[str]:
    return [no_line(module) for module in sorted(modules(root) - set(documented_modules(text)))]


def named_modules_that_do_not_exist(text: str, root: Path) -> list[str]:
    """Every module of the package tables, and every `.py` path anywhere on the page, must exist: a bare
    name in its package (or the folder of its row outside the package), a path in autogemm/ or the
    repository."""
    problems = [f"{PAGE}:{line}: autogemm/{module} does not exist"
                for module, line in documented_modules(text).items() if not (root / "autogemm" / module).is_file()]
    for heading, lines in sections(text):
        package = package_of(heading)
        for number, line in lines:
            bases, text_checked = [root / "autogemm", root], line
            if package is not None:
                bases.insert(0, root / "autogemm" / package)
                if line.startswith("|"):
                    text_checked = " | ".join(cells(line)[1:])  # (the modules of the row: checked above)
            elif line.startswith("|"):  # a row outside the package: its names are in the folder it is about
                bases[:0] = [root / word for word in path_words(" ".join(code_spans(cells(line)[0])))]
            problems += [f"{PAGE}:{number}: {word} does not exist" for span in code_spans(text_checked)
                         for word in path_words(span) if word.endswith(".py") and not exists(word, bases)]
    return problems


def layer_problems(text: str, root: Path) -> list[str]:
    """The layer picture (the code block under "The layers") names every package once and the
    top-level vocabulary; with the top-level entry points, that is every top-level module."""
    lines = dict(sections(text))["The layers"]
    start = next(i for i, (_, line) in enumerate(lines) if line.startswith("```"))
    block = []
    for _, line in lines[start + 1:]:
        if line.startswith("```"):
            break
        block.append(re.split(r"\s{2,}", line.strip(), maxsplit=1))
    pictured = [name for layer, *_ in block for name in re.findall(r"(\w+)/", layer)]
    vocabulary = next(words for layer, words in block if layer == "top-level vocabulary").split(", ")
    paragraphs = "\n".join(line for _, line in lines).split("\n\n")
    entry_points = next(p for p in paragraphs if p.startswith("Top-level entry points"))
    entry_points = [Path(span).stem for span in code_spans(entry_points) if span.endswith(".py")]
    problems = [f"package {name}/ is not in the layer picture" for name in subpackages(root) if name not in pictured]
    problems += [f"the layer picture names {name}/, which is not a package" for name in pictured
                 if name not in subpackages(root) or pictured.count(name) > 1]
    top_level = {p.stem for p in (root / "autogemm").glob("*.py")}
    problems += [f"autogemm/{name}.py is neither top-level vocabulary nor an entry point in the layer picture"
                 for name in sorted(top_level - set(vocabulary) - set(entry_points))]
    problems += [f"the layer picture names {name}, which is not a top-level module"
                 for name in vocabulary + entry_points if name not in top_level]
    return problems


def to_change_problems(text: str, root: Path) -> list[str]:
    """Every path of the "to change X, open Y" table exists (in autogemm/ or the repository); a name the
    table places in a file ("`candidate_space_names` in `kernels/space.py`") is in that file."""
    problems, bases = [], [root / "autogemm", root]
    rows = table_rows(dict(sections(text))[TO_CHANGE])
    assert rows, f'{PAGE} has no table under "{TO_CHANGE}"'
    for number, row in rows:
        line = " | ".join(row)
        problems += [f"{PAGE}:{number}: {word} does not exist" for span in code_spans(line)
                     for word in path_words(span) if not exists(word, bases)]
        for name, path in re.findall(r"`(\w+)`(?: \([^)]*\))? in `([^`\s]+)`", line):
            where = next((base / path for base in bases if (base / path).is_file()), None)
            if where and not re.search(rf"\b{name}\b", where.read_text(encoding="utf-8")):
                problems.append(f"{PAGE}:{number}: {path} has no {name}")
    return problems


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def link_problems(text: str, root: Path) -> list[str]:
    """Every relative link of the page leads to a file, and to a heading where it names one."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        path = (root / PAGE).parent / file if file else root / PAGE
        if not path.exists():
            problems.append(f"{PAGE} links to {target}, which does not exist")
        elif anchor and anchor not in {heading_anchor(h) for h, _ in sections(path.read_text(encoding="utf-8"))}:
            problems.append(f"{PAGE} links to {target}, a heading {file or PAGE} does not have")
    return problems


@functools.lru_cache(maxsize=1)
def recorded_lines(root: Path) -> frozenset[str]:
    return frozenset(line.strip() for path in (root / "benchmarks" / "results").glob("*.md")
                     for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def module_reference_problems(name: str, text: str, root: Path) -> list[str]:
    """The module paths and dotted references of a README or docs page that do not resolve. A line that
    a benchmark results file holds word for word is a quote of a recorded run (docs/performance.md
    quotes them as they were written, with the date of the run), not the page's own word."""
    relative = re.compile(rf"(?<![\w./-])(?:{'|'.join(subpackages(root))})/\w+\.py\b")
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() in recorded_lines(root):
            continue
        for path in AUTOGEMM_PATH.findall(line):
            if not (root / path).is_file():
                problems.append(f"{name}:{number}: {path} does not exist")
        for path in relative.findall(line):
            if not (root / "autogemm" / path).is_file():
                problems.append(f"{name}:{number}: {path} is not a module of autogemm/")
        for reference in DOTTED.findall(line):
            why = resolve_dotted(reference, root)
            if why:
                problems.append(f"{name}:{number}: {reference}: {why}")
    return problems


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


# ---- the page and the docs as they are ------------------------------------------------------------
def page_text(root: Path = ROOT) -> str:
    return (root / PAGE).read_text(encoding="utf-8")


def test_every_module_has_its_line_in_the_table_of_its_package():
    assert not missing_modules(page_text(), ROOT)


def test_every_module_the_page_names_exists():
    assert not named_modules_that_do_not_exist(page_text(), ROOT)


def test_the_layer_picture_names_every_package_and_top_level_module():
    assert not layer_problems(page_text(), ROOT)


def test_the_paths_of_the_to_change_table_exist():
    assert not to_change_problems(page_text(), ROOT)


def test_the_links_of_the_page_lead_somewhere():
    assert not link_problems(page_text(), ROOT)


@pytest.mark.parametrize("path", pages(ROOT), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_module_references_of_the_readme_and_docs_resolve(path):
    name = path.relative_to(ROOT).as_posix()
    assert not module_reference_problems(name, path.read_text(encoding="utf-8"), ROOT)


# ---- the checks can fail: each fault of a broken copy is named ------------------------------------
def test_the_page_is_read_whole():
    """Every package has its table and the tables list at least the modules there are: a page the
    parser no longer reads would otherwise pass every check above."""
    documented = documented_modules(page_text())
    assert {module.split("/")[0] for module in documented if "/" in module} == set(subpackages(ROOT))
    assert len(documented) >= len(modules(ROOT))
    assert len(table_rows(dict(sections(page_text()))[TO_CHANGE])) >= 10


def test_a_module_without_its_line_is_named():
    text = "\n".join(line for line in page_text().splitlines() if not line.startswith("| `guard.py` |"))
    assert missing_modules(text, ROOT) == [no_line("serving/guard.py")]


def test_a_module_that_is_gone_is_named():
    text = page_text().replace("| `race.py` |", "| `racing.py` |")
    problems = named_modules_that_do_not_exist(text, ROOT)
    assert any("autogemm/serving/racing.py does not exist" in p for p in problems)
    assert missing_modules(text, ROOT) == [no_line("serving/race.py")]
    text = page_text().replace("`gpu/kind_launch.py` knows", "`gpu/launcher.py` knows")
    assert any(p.endswith("gpu/launcher.py does not exist") for p in named_modules_that_do_not_exist(text, ROOT))


def test_a_package_left_out_of_the_layer_picture_is_named():
    text = page_text().replace("measure/    ", "measuring/  ", 1)
    assert layer_problems(text, ROOT) == ["package measure/ is not in the layer picture",
                                          "the layer picture names measuring/, which is not a package"]


def test_a_stale_path_or_name_of_the_to_change_table_is_named():
    text = page_text().replace("`measure/timing.py` |", "`measure/clock.py` |")
    text = text.replace("`candidate_space_names` in", "`space_names_for` in")
    problems = to_change_problems(text, ROOT)
    assert any(p.endswith("measure/clock.py does not exist") for p in problems)
    assert any(p.endswith("kernels/space.py has no space_names_for") for p in problems)


def test_a_broken_link_is_named():
    text = page_text().replace("kernels.md#adding-a-kernel-family", "kernels.md#adding-a-family")
    assert link_problems(text, ROOT) == [
        f"{PAGE} links to kernels.md#adding-a-family, a heading kernels.md does not have"]


def test_module_references_that_do_not_resolve_are_named():
    text = ("`autogemm/serving/dispatcher.py` and `serving/chooser.py`; autogemm.gpu.capture.CaptureFault;\n"
            "import autogemm.tourch; torch.ops.autogemm.matmul and autogemm.gpu.capture.CaptureError resolve")
    assert module_reference_problems("README.md", text, ROOT) == [
        "README.md:1: autogemm/serving/dispatcher.py does not exist",
        "README.md:1: serving/chooser.py is not a module of autogemm/",
        "README.md:1: autogemm.gpu.capture.CaptureFault: autogemm/gpu/capture.py has no module or name 'CaptureFault'",
        "README.md:2: autogemm.tourch: autogemm/__init__.py has no module or name 'tourch'",
    ]


def test_a_new_module_without_its_line_is_named(tmp_path):
    """A module added to a copy of the package, its page unchanged."""
    shutil.copytree(ROOT / "autogemm", tmp_path / "autogemm", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "autogemm" / "tuning" / "schedule.py").write_text('"""A new module."""\n')
    assert missing_modules(page_text(), tmp_path) == [no_line("tuning/schedule.py")]
