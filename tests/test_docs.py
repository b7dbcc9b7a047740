"""The README and the guides in docs/ link to files and headings that exist, and the README's quick
start works when pasted: every shell line of it, in a throw-away home, with the fake model, no network.

A guide moved or a heading renamed breaks the links that pointed at it; this finds them. Links are
read with markdown-it-py (so a `[x](y)` inside code is not a link), and a `#anchor` is matched
against the target's headings as GitHub turns them into anchors.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
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


def quick_start_lines() -> list[str]:
    """The shell lines of the README's first sh block under "## Quick start", without their comments."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has no sh block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


async def test_every_shell_line_of_the_quick_start_works_in_a_throw_away_home(tmp_path):
    from tests.fakes.model_server import FakeModel

    lines = quick_start_lines()
    assert lines == ["make setup", "make run"]
    user = tmp_path / "user"
    user.mkdir()
    async with FakeModel() as model:
        model.max_model_len = 32768  # reported, as vLLM does: setup writes it, so the daemon warns of nothing
        # a newcomer's shell: their model server's address as they copied it (no /v1), nothing else set;
        # no terminal, so setup asks nothing; the API on any free port (the quick start's is 8642)
        env = {"PATH": os.environ["PATH"], "HOME": str(user), "LANG": "C.UTF-8",
               "SWITCHBOARD_MODEL_URL": model.base_url.removesuffix("/v1"), "SWITCHBOARD_API_PORT": "0"}
        setup = await asyncio.create_subprocess_shell(lines[0], cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                      stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out = (await asyncio.wait_for(setup.communicate(), 300))[0].decode()
        assert setup.returncode == 0, out
        assert "answers at /v1" in out and "All checks passed." in out
        assert (user / ".switchboard" / "config.yaml").is_file()
        run = await asyncio.create_subprocess_shell(lines[1], cwd=ROOT, env=env, start_new_session=True,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        seen: list[str] = []
        try:
            async def serving() -> str:
                assert run.stdout is not None
                while True:
                    line = (await run.stdout.readline()).decode()
                    assert line, "make run ended:\n" + "".join(seen)
                    seen.append(line)
                    if "switchboard is serving" in line:
                        return line

            line = await asyncio.wait_for(serving(), 120)
        finally:
            if run.returncode is None:
                os.killpg(run.pid, signal.SIGTERM)
                await asyncio.wait_for(run.wait(), 60)
    assert str(user / ".switchboard" / "config.yaml") in "".join(seen)  # make run took what setup wrote
    assert "local API on http://127.0.0.1:" in line and "WARNING" not in "".join(seen)
