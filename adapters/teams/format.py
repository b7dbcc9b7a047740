"""Markdown (what the model writes) as Teams renders it (``textFormat: markdown``).

Teams renders a subset of Markdown in messages: bold, italic, strikethrough, inline code, code
blocks, links, bulleted and numbered lists, block quotes and line breaks.  Feishu/Lark cards render
the same subset, so the walk over :func:`gateway.markdown.parse`'s tree that keeps it is shared:
:func:`gateway.markdown.common_markdown` (its section there lists what becomes what: headings bold
lines, tables code blocks, images links, ``< > &`` entities outside code).

A streamed message goes as it is written (plain) and is formatted by its final edit, like every
other platform.
"""

from __future__ import annotations

from gateway.markdown import common_markdown


def to_teams(markdown: str) -> str:
    """``markdown`` as Teams shows it."""
    return common_markdown(markdown)
