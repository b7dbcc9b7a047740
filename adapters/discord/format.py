"""Markdown from the model to Discord's message markdown, and a plain-text fallback.

Discord renders most of what models write as is: ``**bold**``, ``*italic*``,
``__underline__``, ``~~strike~~``, `` `code` ``, fenced blocks with a language,
``[masked links](url)``, ``#``/``##``/``###`` headings, ``>`` quotes and
bullets.  :func:`to_discord` fixes only what it does not:

* ``####`` and deeper headings (not rendered) become ``**bold**`` lines;
* pipe tables (not rendered) go into a code block so the columns line up;
* images ``![alt](url)`` become a link ``[alt](url)`` (Discord embeds the URL);
* horizontal rules (``---``, ``***``, ``___``), shown literally, become a blank line.

Code blocks pass through untouched.  When Discord still refuses a part
(400 "Invalid Form Body"), the adapter resends it through :func:`to_plain`.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s*(```|~~~)")
_DEEP_HEADING = re.compile(r"^[ \t]*#{4,6}[ \t]+(.+?)[ \t#]*$")
_RULE = re.compile(r"^[ \t]*([-*_])([ \t]*\1){2,}[ \t]*$")
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(\s*([^\s)]+)[^)]*\)")
_TABLE_ROW = re.compile(r"^[ \t]*\|.*\|[ \t]*$")
_TABLE_SEPARATOR = re.compile(r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*$")

# to_plain
_FENCE_LINE = re.compile(r"^[ \t]*(```|~~~)[^\n]*$", re.M)
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]+", re.M)
_LINK = re.compile(r"\[([^\]\n]+)\]\(\s*([^\s)]+)[^)]*\)")
_EMPHASIS = (
    re.compile(r"\*\*(?=\S)([^\n]+?)(?<=\S)\*\*"),
    re.compile(r"(?<!\w)__(?=\S)([^\n]+?)(?<=\S)__(?!\w)"),
    re.compile(r"~~(?=\S)([^\n]+?)(?<=\S)~~"),
    re.compile(r"(?<![\w*])\*(?=[^\s*])([^\n*]+?)(?<=[^\s*])\*(?![\w*])"),
    re.compile(r"(?<![\w_])_(?=[^\s_])([^\n_]+?)(?<=[^\s_])_(?![\w_])"),
    re.compile(r"`([^`\n]+)`"),
)


def to_discord(markdown: str) -> str:
    """Rewrite the few Markdown constructs Discord does not render."""
    out: list[str] = []
    lines = markdown.split("\n")
    in_code = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            in_code = not in_code
            out.append(line)
            i += 1
            continue
        if in_code:
            out.append(line)
            i += 1
            continue
        if _TABLE_ROW.match(line) and i + 1 < len(lines) and _TABLE_SEPARATOR.match(lines[i + 1]):
            j = i
            while j < len(lines) and _TABLE_ROW.match(lines[j]):
                j += 1
            out.append("```")
            out.extend(row.strip() for row in lines[i:j])
            out.append("```")
            i = j
            continue
        if m := _DEEP_HEADING.match(line):
            line = f"**{m.group(1)}**"
        elif _RULE.match(line):
            line = ""
        else:
            line = _IMAGE.sub(lambda m: f"[{m.group(1) or 'image'}]({m.group(2)})", line)
        out.append(line)
        i += 1
    return "\n".join(out)


def to_plain(markdown: str) -> str:
    """The text without Markdown markers (the fallback when Discord refuses a part)."""
    text = _FENCE_LINE.sub("", markdown)
    text = _HEADING.sub("", text)
    text = _IMAGE.sub(lambda m: f"{m.group(1) or 'image'} ({m.group(2)})", text)
    text = _LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", text)
    for pattern in _EMPHASIS:
        text = pattern.sub(r"\1", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()
