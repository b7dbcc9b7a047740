"""Markdown (what the model writes) to Slack ``mrkdwn``, and Slack text back to plain text.

Outbound, :func:`to_mrkdwn`:

    **bold** / __bold__     -> *bold*
    *italic* / _italic_     -> _italic_
    ~~strike~~              -> ~strike~
    [text](url), ![alt](u)  -> <url|text>
    # Heading (any level)   -> *Heading*
    - item / * item / + item -> • item
    ```python               -> ```            (Slack shows an info string as code)
    & < >                   -> &amp; &lt; &gt; (everywhere, code included: Slack's control characters)

Text inside inline code and fenced blocks is only escaped, never reformatted.
A ``>`` that starts a quote line is kept as Slack's quote marker.

Inbound, :func:`to_plain` turns Slack's markup in a user's message into what
a person would type: ``<https://x|label>`` -> ``label (https://x)``,
``<#C1|general>`` -> ``#general``, ``<!here>`` -> ``@here``, entities decoded.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_QUOTE = re.compile(r"^(\s{0,3}(?:>\s?)+)")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(?=\S)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_IMAGE_OR_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_ITALIC_STAR = re.compile(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_BOLD_MARK = "\x00B\x00"  # placeholder so bold's "*" is not read as italic afterwards


def escape(text: str) -> str:
    """Escape Slack's three control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(markdown: str) -> str:
    """Convert the model's Markdown to Slack mrkdwn (see the module docstring)."""
    out: list[str] = []
    fence = ""  # the open fence marker (``` or ~~~) while inside a block
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(2) == fence and not m.group(3).strip():
                out.append(m.group(1) + "```")
                fence = ""
            else:
                out.append(escape(line))
            continue
        if m:
            fence = m.group(2)
            out.append(m.group(1) + "```")
            continue
        out.append(_convert_line(line))
    return "\n".join(out)


def _convert_line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading:
        inner = _BOLD.sub(r"\2", heading.group(1)).strip()
        return f"*{_inline(inner)}*" if inner else ""
    prefix = ""
    quote = _QUOTE.match(line)
    if quote:
        prefix = ">" * quote.group(1).count(">") + " "
        line = line[quote.end():]
    bullet = _BULLET.match(line)
    if bullet:
        prefix += bullet.group(1) + "• "
        line = line[bullet.end():]
    return prefix + _inline(line)


def _inline(text: str) -> str:
    """Convert one line's inline Markdown, leaving code spans alone (escaped only)."""
    parts: list[str] = []
    last = 0
    for m in _INLINE_CODE.finditer(text):
        parts.append(_inline_prose(text[last:m.start()]))
        parts.append("`" + escape(m.group(2)) + "`")
        last = m.end()
    parts.append(_inline_prose(text[last:]))
    return "".join(parts)


def _inline_prose(text: str) -> str:
    if not text:
        return text
    links: list[str] = []

    def stash_link(m: re.Match) -> str:
        label = _emphasis(escape(m.group(1).strip())) or escape(m.group(2))
        links.append(f"<{escape(m.group(2))}|{label}>")
        return f"\x00L{len(links) - 1}\x00"

    text = _IMAGE_OR_LINK.sub(stash_link, text)
    text = _emphasis(escape(text))
    return re.sub(r"\x00L(\d+)\x00", lambda m: links[int(m.group(1))], text)


def _emphasis(text: str) -> str:
    text = _BOLD.sub(lambda m: _BOLD_MARK + m.group(2) + _BOLD_MARK, text)
    text = _ITALIC_STAR.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    return text.replace(_BOLD_MARK, "*")


# --------------------------------------------------------------------------- inbound

_SLACK_LINK = re.compile(r"<([^<>|]+)(?:\|([^<>]*))?>")


def to_plain(text: str) -> str:
    """Slack's markup in a user's message, as plain text (mentions other than the bot's stay as ids)."""

    def link(m: re.Match) -> str:
        target, label = m.group(1), m.group(2)
        if target.startswith("#"):  # channel: <#C123|general>
            return "#" + (label or target[1:])
        if target.startswith("@"):  # user: <@U123> or <@U123|name>
            return "@" + (label or target[1:])
        if target.startswith("!"):  # <!here>, <!channel>, <!subteam^S1|@team>, <!date^...|fallback>
            if label:
                return label
            return "@" + target[1:].split("^")[0]
        if label and label != target:
            return f"{label} ({target})"
        return target.removeprefix("mailto:") if target.startswith("mailto:") else target

    text = _SLACK_LINK.sub(link, text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
