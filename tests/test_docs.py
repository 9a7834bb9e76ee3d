"""The example output in README.md and docs/ is generated from saved results, and cannot drift from the code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_generated_examples_are_current():
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(["bash", str(ROOT / "docs" / "examples" / "make.sh"), "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


# A relative link [text](path#anchor) in a page, outside code: its path and anchor must resolve.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation dropped (letters, digits, spaces,
    hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text, not its target
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def unfenced(text: str) -> str:
    """A page without its fenced blocks, where neither a heading nor a link is one."""
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.DOTALL | re.MULTILINE)


def prose(text: str) -> str:
    """A page without its fenced blocks and inline code, where a link is not a link."""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))


def anchors(page: Path) -> set[str]:
    """The anchors a page has: each heading's slug (a repeated one numbered -1, -2, as GitHub does) and every
    explicit <a id=...>."""
    text = page.read_text(encoding="utf-8")
    found: set[str] = set(EXPLICIT_ID.findall(text))
    seen: dict[str, int] = {}
    for line in unfenced(text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(pages: list[Path]) -> list[str]:
    """Every relative link of these pages whose file, or whose anchor in a Markdown file, does not exist."""
    out = []
    for page in pages:
        name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check offline
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                out.append(f"{name}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                out.append(f"{name}: {target}: no such anchor in {file.name}")
    return out


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(pages) > 15
    assert broken_links(pages) == []


def test_the_link_check_finds_a_missing_file_or_anchor(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## torch 2.11\n\n## A `flag`, *emphasised*\n\n"
                                       "## Twice\n\n## Twice\n\n<a id=\"kept\"></a>\ntext\n")
    page.write_text("[a](other.md#torch-211) [b](other.md#a-flag-emphasised) [c](other.md#twice-1) "
                    "[d](other.md#kept) [e](#here) ![f](other.md) [g](https://example.com/x#y)\n\n## Here\n\n"
                    "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n")
    assert broken_links([page]) == []
    page.write_text("[a](other.md#torch-2.11) [b](missing.md) [c](#nowhere) [d](other.md#twice-2)\n")
    assert broken_links([page]) == [f"page.md: {t}" for t in (
        "other.md#torch-2.11: no such anchor in other.md", "missing.md: no such file",
        "#nowhere: no such anchor in page.md", "other.md#twice-2: no such anchor in other.md")]


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


def test_a_file_shown_in_the_docs_is_the_file_itself():
    """A fenced block after `<!-- file: PATH -->` is PATH's whole content (docs/rungs.md shows the rung file the
    tests run)."""
    import re

    shown = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for path, block in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.DOTALL):
            assert block == (ROOT / path).read_text(encoding="utf-8"), f"{page.name} shows {path} as it was"
            shown += 1
    assert shown >= 1


def test_follow_one_rung_points_at_the_lines_it_names():
    """docs/architecture.md's walk through one rung gives `file:line` `name` for each hop: the line must still hold
    that name (its def, its class, or the call that declares it), or the walk has drifted from the code."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index('<a id="follow-one-rung"></a>'):text.index("## One seam between models and rungs")]
    refs = re.findall(r"`(src/[\w/]+\.py):(\d+)` `(\w+)`", section)
    assert len(refs) >= 20
    hops = {path.split("/")[2].removesuffix(".py") for path, _, _ in refs}
    assert {"cli", "step", "data", "models", "rungs", "ladder", "measure", "verify", "records", "report"} <= hops
    for path, line, name in refs:
        held = (ROOT / path).read_text().splitlines()[int(line) - 1]
        assert re.search(rf"\b(def|class) {name}\b|^{name}\(", held), f"{path}:{line} does not hold {name}: {held!r}"
