"""Markdown (what the model writes) as Teams renders it (``textFormat: markdown``).

Teams renders a subset of Markdown in messages: bold, italic, strikethrough, inline code, code
blocks, links, bulleted and numbered lists, block quotes, and line breaks.  :func:`to_teams` walks
:func:`gateway.markdown.parse`'s tree and keeps what Teams shows, rewriting the rest:

    **bold**, *italic*, ~~strike~~, `code`   -> the same
    [text](url)                              -> the same for http(s)/mailto, else text (url)
    ![alt](src)                              -> [alt](src)  (a message cannot inline an image)
    # Heading (any level)                    -> **Heading**
    - item / 1. item                         -> - item / 1. item (nested ones indented)
    > quote                                  -> > quote (one level)
    ```lang ... ```                          -> the same fence
    | table |                                -> a code block of its rows (Teams' Markdown has no tables)
    < > &                                    -> &lt; &gt; &amp; outside code (Teams reads tags in a message)

A streamed message goes as it is written (plain) and is formatted by its final edit, like every
other platform.
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
    Rule,
    Styled,
    Table,
    Text,
    address,
    indent,
    join_blocks,
    parse,
    plain,
    render_list,
    words,
    wrap,
)

_MARK = {"strong": "**", "em": "*", "strike": "~~"}
_LINKABLE = ("http://", "https://", "mailto:")


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _inline(nodes: tuple[Inline, ...]) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(escape(node.text))
        elif isinstance(node, Code):
            tick = "``" if "`" in node.text else "`"
            out.append(f"{tick}{node.text}{tick}")
        elif isinstance(node, Styled):
            out.append(wrap(_inline(node.children), _MARK.get(node.kind, "")))
        elif isinstance(node, Link):
            label = _inline(node.children) if words(node.children).strip() else escape(address(node.href))
            if node.href.startswith(_LINKABLE):
                out.append(f"[{label}]({node.href.replace(')', '%29')})")
            else:
                out.append(f"{label} ({escape(address(node.href))})")
        elif isinstance(node, Image):
            out.append(f"[{escape(node.alt or address(node.src))}]({node.src.replace(')', '%29')})"
                       if node.src.startswith(_LINKABLE) else escape(node.alt or node.src))
        elif isinstance(node, Break):
            out.append("\n")
        else:
            out.append(escape(words((node,))))
    return "".join(out)


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return _inline(block.children)
    if isinstance(block, Heading):
        return wrap(_inline(block.children), "**")
    if isinstance(block, CodeBlock):
        fence = "````" if "```" in block.text else "```"
        return f"{fence}{block.lang}\n{block.text.rstrip(chr(10))}\n{fence}"
    if isinstance(block, Table):
        return f"```\n{block.source.rstrip(chr(10))}\n```"
    if isinstance(block, Quote):
        inner = join_blocks([(b, _block(b)) for b in block.blocks if not isinstance(b, Quote)]
                            + [(b, plain((b,))) for b in block.blocks if isinstance(b, Quote)])
        return indent(inner, "> ")
    if isinstance(block, ListBlock):
        return render_list(block, _block, own_line=(CodeBlock, Quote)).replace("•", "-")
    if isinstance(block, Rule):
        return "———"
    return ""


def to_teams(markdown: str) -> str:
    """``markdown`` as Teams shows it (see the module docstring)."""
    if not markdown.strip():
        return ""
    return join_blocks([(b, _block(b)) for b in parse(markdown)]).strip("\n")
