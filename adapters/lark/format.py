"""Markdown (what the model writes) as a Feishu / Lark message.

Replies are interactive cards whose body is one ``markdown`` element: a card can be updated in
place (a streamed reply) and carries buttons (approvals), and its Markdown renders what the model
writes: bold, italic, strikethrough, inline code, code blocks, links, lists and quotes.  What it
does not: headings become bold lines, tables a code block, images links.  A card's text keeps
``<`` and ``>`` as entities (the card Markdown reads tags such as ``<at>``).  The walk is
:func:`gateway.markdown.common_markdown`, shared with Teams, which renders the same subset.
"""

from __future__ import annotations

import json

from gateway.markdown import common_markdown
from gateway.types import Button

from .events import SUBMIT_KEY


def to_lark_md(markdown: str) -> str:
    """``markdown`` as a card's ``markdown`` element shows it (the subset Teams renders too)."""
    return common_markdown(markdown)


def card(text: str, *, markdown: bool = True, buttons: tuple[Button, ...] = (), rendered: bool = False) -> str:
    """The ``content`` of an ``interactive`` message: the text (as card Markdown, or plain while it is
    still being written; ``rendered``: already card Markdown) and a button per :class:`Button`."""
    if rendered:
        body = text
    else:
        body = to_lark_md(text) if markdown else text.replace("<", "&lt;").replace(">", "&gt;")
    elements: list[dict] = [{"tag": "markdown", "content": body}]
    if buttons:
        elements.append({"tag": "action", "actions": [
            {"tag": "button", "text": {"tag": "plain_text", "content": b.label[:40]},
             "type": "danger" if b.style == "danger" else "primary", "value": {SUBMIT_KEY: b.command}}
            for b in buttons]})
    return json.dumps({"config": {"wide_screen_mode": True, "update_multi": True}, "elements": elements},
                      ensure_ascii=False)
