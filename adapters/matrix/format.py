"""Markdown from the model to a Matrix ``m.text``: ``body`` and ``formatted_body`` from the one parse.

A walk over :func:`gateway.markdown.parse`'s tree writes the HTML subset the spec recommends
(``org.matrix.custom.html``): ``<strong> <em> <del> <code>``, ``<pre><code class="language-x">``,
``<a href>`` (http, https, mailto, matrix.to only: any other address follows its text),
``<blockquote>``, ``<ul>/<ol start>``/``<li>``, headings as ``<h1>``..``<h6>``, a table as ``<pre>``
and a rule as ``<hr>``.  Tags nest freely (Matrix clients sanitise, they do not refuse).  Text is
escaped, so nothing the model writes is read as a tag.  ``body`` is :func:`gateway.markdown.plain`
of the same tree: what a client without HTML shows, and what a search indexes.

``__x__`` stays as written (``__init__``), as on the other platforms.
"""

from __future__ import annotations

import html
import json

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
    parse,
    plain,
    words,
)

_LINK_SCHEMES = ("http://", "https://", "mailto:", "matrix:")
_TAG = {"strong": "strong", "em": "em", "strike": "del"}
#: the spec's limit on a whole event, in bytes of its JSON; a part is kept below it with room for
#: the envelope the homeserver adds (sender, ids, timestamps, unsigned)
EVENT_LIMIT = 65_536
CONTENT_BUDGET = 60_000


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def markdown_to_html(markdown: str) -> str:
    return "".join(_block(b) for b in parse(markdown))


def message_content(markdown: str) -> dict:
    """The ``m.text`` content for ``markdown``: plain ``body`` and HTML ``formatted_body``."""
    blocks = parse(markdown)
    body = plain(blocks) or markdown
    formatted = "".join(_block(b) for b in blocks)
    content = {"msgtype": "m.text", "body": body}
    if formatted and formatted != _esc(body):
        content.update(format="org.matrix.custom.html", formatted_body=formatted)
    return content


def content_size(content: dict) -> int:
    """The bytes ``content`` takes in an event (JSON as homeservers write it: UTF-8, non-ASCII escaped)."""
    return len(json.dumps(content, ensure_ascii=True).encode())


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_inline(block.children)}</p>"
    if isinstance(block, Heading):
        level = min(max(block.level, 1), 6)
        return f"<h{level}>{_inline(block.children)}</h{level}>"
    if isinstance(block, CodeBlock):
        attr = f' class="language-{html.escape(block.lang, quote=True)}"' if block.lang else ""
        return f"<pre><code{attr}>{_esc(block.text)}</code></pre>"
    if isinstance(block, Table):
        return f"<pre>{_esc(block.source)}</pre>"
    if isinstance(block, Quote):
        return f"<blockquote>{''.join(_block(b) for b in block.blocks)}</blockquote>"
    if isinstance(block, ListBlock):
        tag = "ol" if block.ordered else "ul"
        start = f' start="{block.start}"' if block.ordered and block.start != 1 else ""
        items = "".join(f"<li>{_item(item)}</li>" for item in block.items)
        return f"<{tag}{start}>{items}</{tag}>"
    assert isinstance(block, Rule)
    return "<hr>"


def _item(blocks: tuple[Block, ...]) -> str:
    # a tight item's one paragraph without its <p>: clients would show a gap under every bullet
    if len(blocks) == 1 and isinstance(blocks[0], Paragraph):
        return _inline(blocks[0].children)
    return "".join(_block(b) for b in blocks)


def _inline(nodes: tuple[Inline, ...], *, in_link: bool = False) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(_esc(node.text))
        elif isinstance(node, Code):
            out.append(f"<code>{_esc(node.text)}</code>")
        elif isinstance(node, Break):
            out.append("<br>")
        elif isinstance(node, Styled):
            inner = _inline(node.children, in_link=in_link)
            if node.markup == "__":  # see the module docstring
                out.append(f"__{inner}__")
            else:
                tag = _TAG[node.kind]
                out.append(f"<{tag}>{inner}</{tag}>")
        elif isinstance(node, Link):
            label = node.children if words(node.children).strip() else (Text(address(node.href)),)
            if in_link:
                out.append(_inline(label, in_link=True))
            elif node.href.lower().startswith(_LINK_SCHEMES) or node.href.startswith("https://matrix.to/"):
                out.append(f'<a href="{html.escape(node.href, quote=True)}">{_inline(label, in_link=True)}</a>')
            else:
                out.append(_inline(label))
                if words(node.children).strip() and not node.autolink:
                    out.append(_esc(f" ({address(node.href)})"))
        elif isinstance(node, Image):
            label = node.alt or address(node.src)
            if not in_link and node.src.lower().startswith(_LINK_SCHEMES):
                out.append(f'<a href="{html.escape(node.src, quote=True)}">{_esc(label)}</a>')
            else:
                out.append(_esc(label))
    return "".join(out)
