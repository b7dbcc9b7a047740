"""The README and the guides in docs/ link to files and headings that exist.

A guide moved or a heading renamed breaks the links that pointed at it; this finds them. Links are
read with markdown-it-py (so a `[x](y)` inside code is not a link), and a `#anchor` is matched
against the target's headings as GitHub turns them into anchors.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_md = MarkdownIt("commonmark").enable("table")


def _tokens(path: Path):
    for token in _md.parse(path.read_text(encoding="utf-8")):
        yield token
        yield from token.children or ()


def _slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    tokens = list(_md.parse(path.read_text(encoding="utf-8")))
    for heading, inline in zip(tokens, tokens[1:], strict=False):
        if heading.type != "heading_open":
            continue
        text = "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))
        slug = _slug(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file, or heading, does not exist, as ``file: target (why)``."""
    broken = []
    for token in _tokens(path):
        target = token.attrs.get("href") if token.type == "link_open" else (
            token.attrs.get("src") if token.type == "image" else None)
        if not isinstance(target, str):
            continue
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # http(s), mailto: not ours to check here
        file = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        if not file.exists():
            broken.append(f"{name}: {target} (no such file)")
        elif parts.fragment and (file.suffix != ".md" or unquote(parts.fragment) not in anchors(file)):
            broken.append(f"{name}: {target} (no such heading)")
    return broken


def test_every_relative_link_in_the_readme_and_guides_points_at_a_file_and_heading_that_exist():
    assert len(DOCS) >= 3, DOCS
    assert [b for path in DOCS for b in broken_links(path)] == []


def test_the_readme_links_to_every_guide():
    readme = ROOT / "README.md"
    linked = {(readme.parent / token.attrs["href"]).resolve() for token in _tokens(readme)
              if token.type == "link_open" and isinstance(token.attrs.get("href"), str)}
    assert [p.name for p in DOCS[1:] if p not in linked] == []


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path):
    (tmp_path / "guide.md").write_text("# A guide\n\n## Which session answers (an API request)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](guide.md) [ok](guide.md#which-session-answers-an-api-request) [ok](#here) [web](https://x.example/y)\n"
        "`[code](nowhere.md)`\n\n"
        "# Here\n\n"
        "| a | b |\n|---|---|\n| [gone](gone.md) | [old](guide.md#which-session) |\n\n"
        "[self](#there)\n",
        encoding="utf-8")
    assert broken_links(page) == [
        "page.md: gone.md (no such file)",
        "page.md: guide.md#which-session (no such heading)",
        "page.md: #there (no such heading)",
    ]


def test_anchors_follow_githubs_rules(tmp_path):
    assert _slug("After a crash: nothing acknowledged is left unanswered, nothing is sent twice") == (
        "after-a-crash-nothing-acknowledged-is-left-unanswered-nothing-is-sent-twice")
    assert _slug("Several processes, one database") == "several-processes-one-database"
    page = tmp_path / "page.md"
    page.write_text("# Slash commands (same on every platform and in `switchboard chat`)\n\n## Notes\n\n## Notes\n",
                    encoding="utf-8")
    assert anchors(page) == {"slash-commands-same-on-every-platform-and-in-switchboard-chat", "notes", "notes-1"}
