"""Markdown (what the model writes) to Slack ``mrkdwn``, and Slack text back to plain text.

Outbound, :func:`to_mrkdwn` walks :func:`gateway.markdown.parse`'s tree:

    **bold** / __bold__     -> *bold*
    *italic* / _italic_     -> _italic_
    ~~strike~~              -> ~strike~
    [text](url), ![alt](u)  -> <url|text>     (other than http(s)/mailto: text (url))
    # Heading (any level)   -> *Heading*
    - item / 1. item        -> • item / 1. item (nested ones indented)
    > quote                 -> > quote        (one level: Slack does not nest quotes)
    ```python               -> ```            (Slack shows an info string as code)
    | table |               -> a code block of its rows
    & < >                   -> &amp; &lt; &gt; (everywhere, code included: Slack's control characters)

Emphasis nests (``*_both_*``), and code stays code wherever it sits (a quote, a
list).  Slack has no escape for ``*`` ``_`` ``~``; text holding them is sent as it is.

Inbound, :func:`to_plain` turns Slack's markup in a user's message into what
a person would type: ``<https://x|label>`` -> ``label (https://x)``,
``<#C1|general>`` -> ``#general``, ``<!here>`` -> ``@here``, entities decoded.
"""

from __future__ import annotations

import re

from gateway.markdown import (
    Block,
    Break,
    Code,
    CodeBlock,
    Heading,
    Image,
    Inline,
    Link,
    ListBlock,
    Paragraph,
    Quote,
    Rule,
    Styled,
    Table,
    Text,
    address,
    indent,
    join_blocks,
    parse,
    render_list,
    words,
    wrap,
)

_MARK = {"strong": "*", "em": "_", "strike": "~"}
_LINKABLE = ("http://", "https://", "mailto:")
_FENCE_IN_CODE = "``\u200b`"  # a zero-width space keeps ``` inside a block from closing it
RULE = "———"


def escape(text: str) -> str:
    """Escape Slack's three control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(markdown: str) -> str:
    """Convert the model's Markdown to Slack mrkdwn (see the module docstring)."""
    return _blocks(parse(markdown))


def _blocks(blocks: tuple[Block, ...], *, quoted: bool = False) -> str:
    return join_blocks([(b, _block(b, quoted=quoted)) for b in blocks])


def _block(block: Block, *, quoted: bool = False) -> str:
    if isinstance(block, Paragraph):
        return _inline(block.children)
    if isinstance(block, Heading):
        inner = _inline(block.children, active=frozenset({"strong"})).strip()
        return f"*{inner}*" if inner else ""
    if isinstance(block, (CodeBlock, Table)):
        text = block.text if isinstance(block, CodeBlock) else block.source
        return f"```\n{escape(text).replace('```', _FENCE_IN_CODE)}\n```"
    if isinstance(block, Quote):  # one level: a quote inside a quote joins it
        inner = _blocks(block.blocks, quoted=True)
        return inner if quoted else indent(inner, "> ") if inner else ""
    if isinstance(block, ListBlock):
        return render_list(block, lambda b: _block(b, quoted=quoted), own_line=(Quote, CodeBlock, Table))
    assert isinstance(block, Rule)
    return RULE


def _inline(nodes: tuple[Inline, ...], *, active: frozenset[str] = frozenset(), in_link: bool = False) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(escape(node.text))
        elif isinstance(node, Code):
            out.append(f"`{escape(node.text)}`")
        elif isinstance(node, Break):
            out.append(" " if in_link else "\n")  # a link's label is one line
        elif isinstance(node, Styled):
            inner = _inline(node.children, active=active | {node.kind}, in_link=in_link)
            out.append(inner if node.kind in active else wrap(inner, _MARK[node.kind]))
        elif isinstance(node, Link):
            has_label = bool(words(node.children).strip())
            label = _inline(node.children, active=active, in_link=True) if has_label else escape(address(node.href))
            if in_link:
                out.append(label)
            elif node.href.lower().startswith(_LINKABLE):
                out.append(f"<{_href(node.href)}|{label}>")
            else:  # an address Slack would not link: the text, then the address
                out.append(f"{label} ({escape(address(node.href))})" if has_label and not node.autolink else label)
        elif isinstance(node, Image):
            label = escape(" ".join((node.alt or address(node.src)).split("\n")))
            if in_link:
                out.append(label)
            elif node.src.lower().startswith(_LINKABLE):
                out.append(f"<{_href(node.src)}|{label}>")
            else:
                out.append(f"{label} ({escape(address(node.src))})" if node.alt else label)
    return "".join(out)


def _href(url: str) -> str:
    return escape(url.replace("|", "%7C"))


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
