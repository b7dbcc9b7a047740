"""Markdown (what the model writes) to WhatsApp's own markup, walking :func:`gateway.markdown.parse`:

    **bold**            -> *bold*
    *italic*            -> _italic_
    ~~strike~~          -> ~strike~
    `code`              -> `code`          ```block``` -> ```block```
    [text](url)         -> text (url)      (WhatsApp links bare addresses itself)
    # Heading           -> *Heading*
    - item / 1. item    -> - item / 1. item
    > quote             -> > quote

WhatsApp has no escapes: text holding ``*`` or ``_`` is sent as it is (the worst case is a word shown
bold).  The result is plain text with marks; no entity can be refused, so there is no fallback.
"""

from __future__ import annotations

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


def to_whatsapp(markdown: str) -> str:
    return _blocks(parse(markdown))


def _blocks(blocks: tuple[Block, ...]) -> str:
    return join_blocks([(b, _block(b)) for b in blocks])


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return _inline(block.children)
    if isinstance(block, Heading):
        inner = _inline(block.children, active=frozenset({"strong"})).strip()
        return f"*{inner}*" if inner else ""
    if isinstance(block, (CodeBlock, Table)):
        text = block.text if isinstance(block, CodeBlock) else block.source
        return f"```{text}```"
    if isinstance(block, Quote):
        inner = _blocks(block.blocks)
        return indent(inner, "> ") if inner else ""
    if isinstance(block, ListBlock):
        return render_list(block, _block, own_line=(Quote, CodeBlock, Table))
    return "———"


def _inline(nodes: tuple[Inline, ...], *, active: frozenset[str] = frozenset()) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(node.text)
        elif isinstance(node, Code):
            out.append(f"`{node.text}`")
        elif isinstance(node, Break):
            out.append("\n")
        elif isinstance(node, Styled):
            inner = _inline(node.children, active=active | {node.kind})
            out.append(inner if node.kind in active else wrap(inner, _MARK[node.kind]))
        elif isinstance(node, Link):
            label = _inline(node.children, active=active) if words(node.children).strip() else ""
            href = address(node.href)
            out.append(f"{label} ({href})" if label and label != href and not node.autolink else label or href)
        elif isinstance(node, Image):
            alt = " ".join((node.alt or "").split())
            out.append(f"{alt} ({address(node.src)})" if alt else address(node.src))
    return "".join(out)
