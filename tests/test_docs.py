"""The docs describe the present in a size a newcomer reads: each file under docs/ at most 500 lines,
and every citation of a docs section from the code, tests, man pages or README names a file and a
heading that exist."""

from __future__ import annotations

import re

from conftest import ROOT

MAX_LINES = 500
CITATION = re.compile(r'docs/([A-Z]+\.md)[`"]?,?\s*\(?"([^"]+)"')


def headings(name: str) -> set[str]:
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    return {re.sub(r"\s+", " ", m.group(1)).strip() for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def citing_files():
    for folder in ("tdiff", "tests", "bench", "man", "examples"):
        for p in (ROOT / folder).rglob("*"):
            if (p.is_file() and p.suffix in (".py", ".sh", ".1", ".7", ".md", "") and "__pycache__" not in p.parts
                    and p.name != "test_docs.py"):
                yield p
    yield ROOT / "README.md"


def test_every_doc_is_at_most_500_lines():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert {p.name for p in docs} >= {"RESULTS.md", "DESIGN.md"}
    long = {p.name: n for p in docs if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"docs over {MAX_LINES} lines: {long}"


def test_every_cited_docs_section_exists():
    bad = []
    for p in citing_files():
        text = re.sub(r"\s*\n\s*#?\s*", " ", p.read_text(encoding="utf-8", errors="replace"))   # citations wrap lines
        for m in re.finditer(r"docs/([A-Za-z_]+\.md)", text):
            name = m.group(1)
            if not (ROOT / "docs" / name).exists():
                bad.append(f"{p.relative_to(ROOT)}: docs/{name} does not exist")
        for m in CITATION.finditer(text):
            name, section = m.group(1), m.group(2)
            if (ROOT / "docs" / name).exists() and not any(h.startswith(section) for h in headings(name)):
                bad.append(f"{p.relative_to(ROOT)}: docs/{name} has no section {section!r}")
    assert not bad, "\n".join(bad)


def test_the_citation_check_catches_a_missing_section():
    text = 'see docs/RESULTS.md, "No such section here"'
    m = CITATION.search(text)
    assert m and m.group(2) == "No such section here"
    assert not any(h.startswith(m.group(2)) for h in headings("RESULTS.md"))
