"""docs/performance.md and the README's figures are generated from benchmarks/results/ by
benchmarks/performance_page.py: they must be what it writes now (else a results file changed and the
page, or the README, no longer says what it does), and the generator must quote what the files say."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "performance_page.py"
page = load_script(SCRIPT)


def test_the_page_and_the_readme_say_what_the_results_files_say():
    try:
        stale = page.stale(ROOT)
    except page.HistoryUnavailable as exc:
        pytest.skip(f"the dates of the results files need their git history: {exc}")
    assert not stale, f"{', '.join(map(str, stale))} out of date: run python benchmarks/performance_page.py"


def _copy(tmp_path: Path) -> Path:
    """The results files, the README and the page in a folder of their own."""
    for relative in [page.README, page.PAGE, *(path.relative_to(ROOT) for path in (ROOT / page.RESULTS).glob("*.md"))]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / relative, tmp_path / relative)
    return tmp_path


def _dated(path: Path) -> str:
    return "2026-01-02"


def _write(root: Path) -> None:
    for relative, text in page.generated(root, _dated).items():
        (root / relative).write_text(text, encoding="utf-8")


def test_a_changed_figure_makes_the_page_and_the_readme_stale(tmp_path):
    root = _copy(tmp_path)
    _write(root)
    assert page.stale(root, _dated) == []
    shipped = root / page.RESULTS / "shapes-nvidia-h100-80gb-hbm3-sm90-shipped.md"
    text = shipped.read_text(encoding="utf-8")
    all_row = next(line for line in text.splitlines() if line.startswith("| all |"))
    shipped.chmod(0o644)
    shipped.write_text(text.replace(all_row, all_row.replace("| 26 |", "| 27 |")), encoding="utf-8")
    assert page.stale(root, _dated) == [page.PAGE, page.README]
    _write(root)
    assert "shapes 27" in (root / page.README).read_text(encoding="utf-8")
    assert page.stale(root, _dated) == []


def test_a_page_edited_by_hand_is_stale(tmp_path):
    root = _copy(tmp_path)
    _write(root)
    with open(root / page.PAGE, "a", encoding="utf-8") as edited:
        edited.write("FP32 geomean 1.2x\n")
    assert page.stale(root, _dated) == [page.PAGE]


def test_the_readme_quotes_the_all_rows_with_file_and_date(tmp_path):
    block = page.generated(_copy(tmp_path), _dated)[page.README]
    unseen = next(line for line in block.splitlines() if "unseen-nvidia-h100-80gb-hbm3-sm90.md" in line)
    results = (ROOT / page.RESULTS / "unseen-nvidia-h100-80gb-hbm3-sm90.md").read_text(encoding="utf-8")
    all_row = next(line for line in results.splitlines() if line.startswith("| all |"))
    for figure in page.table_cells(all_row)[1:]:
        assert f" {figure}" in unseen
    assert unseen.endswith("2026-01-02 |")


def test_the_readme_quotes_a_named_row_where_a_headline_names_one(tmp_path):
    block = page.generated(_copy(tmp_path), _dated)[page.README]
    results = (ROOT / page.RESULTS / "unseen-nvidia-h200-sm90.md").read_text(encoding="utf-8")
    labels = {headline.row: headline.label for headline in page.HEADLINES if headline.row != "all"}
    assert set(labels) == {"CuPy arrays", "PyTorch tensors"}
    for name, label in labels.items():
        row = page.table_cells(next(line for line in results.splitlines() if line.startswith(f"| {name} |")))
        quoted = next(line for line in block.splitlines() if line.startswith(f"| {label} |"))
        assert f"problems {row[1]}, geomean {row[2]}, min {row[3]}" in quoted


def test_a_results_file_the_readme_quotes_must_exist(tmp_path):
    root = _copy(tmp_path)
    (root / page.RESULTS / "unseen-nvidia-h100-80gb-hbm3-sm90.md").unlink()
    with pytest.raises(ValueError, match="unseen-nvidia-h100-80gb-hbm3-sm90.md, which does not exist"):
        page.generated(root, _dated)


def test_summaries_are_quoted_and_long_per_problem_tables_left_in_the_file():
    rows = [f"| float32/fp32/nn/b1/{n}x{n}x{n} | 1.0 |" for n in range(1, 22)]
    text = "\n".join([
        "# A suite", "", "What was run.", "", "<!-- begin bench_x -->", "## A section", "",
        "| problem | ratio |", "| --- | ---: |", *rows, "",
        "| problem | ratio |", "| --- | ---: |", *rows[:3], "",
        "| dtype | geomean |", "| --- | ---: |", "| all | 1.047 |", "", "Geomean 1.047.", "<!-- end bench_x -->",
    ])
    written = page.performance_page([("2026-01-02", page.parse("x.md", text))])
    assert "2026-01-02: **A suite**" in written and "What was run." in written and "Geomean 1.047." in written
    assert "### A section" in written and "<!--" not in written
    assert "*A table of 21 problems, one row each (columns: problem, ratio): in the file.*" in written
    assert rows[0] in written and rows[3] not in written  # the short table whole, the long one left out
    assert "| all | 1.047 |" in written


def _git(root: Path, *args: str, date: str | None = None) -> None:
    environment = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                       GIT_COMMITTER_EMAIL="t@t")
    if date:
        environment.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=environment)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_file_is_dated_by_its_last_commit_and_a_changed_one_by_today(tmp_path):
    results = tmp_path / page.RESULTS
    results.mkdir(parents=True)
    (results / "a.md").write_text("# A\n", encoding="utf-8")
    (results / "b.md").write_text("# B\n", encoding="utf-8")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "results", date="2026-03-04T12:00:00+00:00")
    (results / "b.md").write_text("# B, run again\n", encoding="utf-8")
    (results / "c.md").write_text("# C\n", encoding="utf-8")
    date_of = page.git_dates(tmp_path)
    today = datetime.date.today().isoformat()
    assert date_of(results / "a.md") == "2026-03-04"
    assert date_of(results / "b.md") == today
    assert date_of(results / "c.md") == today
