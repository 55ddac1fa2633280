"""docs/design.md stays true: its layout names every module, and each "where is X decided" row is one file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "docs" / "design.md").read_text()
PACKAGE = ROOT / "localspec"


def _section(title: str) -> str:
    start = DESIGN.index(f"## {title}\n")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start:end if end >= 0 else None]


def _layout_by_package() -> dict[str, str]:
    """The layout's code block, cut into the text of each top-level package ("" for localspec/ itself)."""
    block = _section("Layout").split("```")[1]
    parts: dict[str, str] = {"": ""}
    current = ""
    for line in block.splitlines():
        m = re.match(r"^  (\w+)/", line)
        if m:
            current = m.group(1)
            parts[current] = ""
        parts[current] += line + "\n"
    return parts


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_layout_names_every_module_in_its_package(path: Path):
    rel = path.relative_to(PACKAGE)
    package = rel.parts[0] if len(rel.parts) > 1 else ""
    text = _layout_by_package().get(package)
    assert text is not None, f"docs/design.md's layout has no section for localspec/{package}/"
    assert re.search(rf"\b{re.escape(path.name)}\b", text), f"docs/design.md's layout does not name {rel}"


def test_every_module_the_layout_names_exists():
    for package, text in _layout_by_package().items():
        for name in re.findall(r"\b(\w+\.py)\b", text):
            found = list((PACKAGE / package).rglob(name)) if package else [PACKAGE / name]
            assert found and found[0].exists(), f"docs/design.md names {name} under localspec/{package}, not there"


def _decisions() -> list[tuple[str, str, str]]:
    rows = []
    for line in _section("Where each decision lives").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`localspec/"):
            rows.append((cells[0], cells[1].strip("`"), cells[2].strip("`")))
    return rows


def test_the_decision_table_has_its_rows():
    assert len(_decisions()) >= 14


@pytest.mark.parametrize("question,owner,pattern", _decisions(), ids=[q for q, _, _ in _decisions()])
def test_each_decision_lives_in_the_one_file_the_design_names(question: str, owner: str, pattern: str):
    rx = re.compile(pattern.replace("\\\\", "\\"), re.M)
    where = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if rx.search(p.read_text()))
    assert where == [owner], f"{question!r}: /{pattern}/ is found in {where}, the design says only in {owner}"


# -- pointers into docs/bench -----------------------------------------------------------------------------------

BENCH = ROOT / "docs" / "bench"
_POINTER = re.compile(r"docs/bench/([\w.-]+\.md)#([\w-]+)")
_RELATIVE = {ROOT / "docs": re.compile(r"\]\(bench/([\w.-]+\.md)#([\w-]+)\)"),
             BENCH: re.compile(r"\]\(([\w.-]+\.md)#([\w-]+)\)")}
_QUOTED = re.compile(r"docs/bench/[\w.-]+\.md\)?,\s+[\"'][A-Z]|\]\((?:bench/)?[\w.-]+\.md\),\s+\"")


def _texts() -> list[Path]:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for top in ("localspec", "scripts", "tests"):
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".sh", ".md") and p.is_file()]
    return sorted(p for p in files if p != Path(__file__).resolve())  # this file's messages name the pattern


def _anchors(doc: Path) -> set[str]:
    """Explicit `<a id="...">` anchors, and the GitHub slug of every heading."""
    text = doc.read_text()
    ids = set(re.findall(r"<a id=\"([\w-]+)\"", text))
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def _pointers() -> list[tuple[str, str, str]]:
    """(where, bench file, anchor) for every link into docs/bench that names an anchor."""
    found = []
    for path in _texts():
        text = path.read_text(errors="replace")
        rx = [_POINTER] + [r for folder, r in _RELATIVE.items() if path.parent == folder]
        for r in rx:
            for m in r.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return found


def test_code_and_docs_point_into_docs_bench_by_anchor():
    assert len(_pointers()) >= 20


@pytest.mark.parametrize("where,doc,anchor", _pointers(), ids=[w for w, _, _ in _pointers()])
def test_every_docs_bench_anchor_exists(where: str, doc: str, anchor: str):
    path = BENCH / doc
    assert path.exists(), f"{where} points to docs/bench/{doc}, which does not exist"
    assert anchor in _anchors(path), f"{where} points to docs/bench/{doc}#{anchor}, which has no such anchor"


def test_no_pointer_into_docs_bench_quotes_a_heading():
    quoted = [f"{p.relative_to(ROOT)}:{p.read_text(errors='replace').count(chr(10), 0, m.start()) + 1}"
              for p in _texts() for m in _QUOTED.finditer(p.read_text(errors="replace"))]
    assert quoted == [], f"quoted headings move; point to an anchor (docs/bench/X.md#id) instead: {quoted}"
