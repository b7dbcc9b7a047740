"""Markdown from the model to Telegram's HTML parse mode.

A walk over :func:`gateway.markdown.parse`'s tree.  Telegram knows a handful of tags
and nests them by rules of its own, so the walk writes only:

* ``<b> <i> <s>`` for bold, italic and strike, nested freely (headings are bold);
* ``<code>`` and ``<pre><code class="language-x">``, never inside another tag but a
  quote: Telegram lets no entity hold code, so bold around a code span is closed
  before it and reopened after;
* ``<a href>`` for http(s), tg and mailto links, holding only bold/italic/strike (a
  code span in a link's text shows as its text); any other address follows its text
  in brackets;
* ``<blockquote>``, one level (a quote in a quote joins its parent);
* bullets as ``•``, numbered items as the model numbered them, a table as a code block,
  a rule as ``———``.

What Telegram shows is never longer than the Markdown it came from, so the adapter
splits the Markdown by its length (:func:`gateway.formatting.split_message`) and
renders each part on its own: no entity is ever cut in two.

Text is escaped (``& < >``), so nothing the model writes is read as a tag.  When
Telegram still answers 400 "can't parse entities" (:func:`is_parse_error`), the
adapter resends that part as plain text and counts it.

``__x__`` stays as written: models write ``__init__`` unquoted far more often than
they mean bold (Discord shows it underlined, Slack bold: each platform's habit).
"""

from __future__ import annotations

import html

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
    join_blocks,
    parse,
    render_list,
    words,
)

_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")
_TAG = {"strong": "b", "em": "i", "strike": "s"}
RULE = "———"

# A run of text and the tags around it, outermost first: ("b",), ("a", href), ...
_Run = tuple[str, tuple[tuple[str, ...], ...], bool]  # (text, tags, is code)


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def markdown_to_html(markdown: str) -> str:
    """Telegram HTML for ``markdown`` (escaped, tags nested the way Telegram accepts)."""
    return _blocks(parse(markdown), quoted=False)


def _blocks(blocks: tuple[Block, ...], *, quoted: bool) -> str:
    return join_blocks([(b, _block(b, quoted=quoted)) for b in blocks])


def _block(block: Block, *, quoted: bool) -> str:
    if isinstance(block, Paragraph):
        return _inline(block.children)
    if isinstance(block, Heading):
        return _inline(block.children, bold=True)
    if isinstance(block, CodeBlock):
        attr = f' class="language-{html.escape(block.lang, quote=True)}"' if block.lang else ""
        return f"<pre><code{attr}>{_esc(block.text)}</code></pre>"
    if isinstance(block, Table):
        return f"<pre>{_esc(block.source)}</pre>"
    if isinstance(block, Quote):
        inner = _blocks(block.blocks, quoted=True)
        return inner if quoted else f"<blockquote>{inner}</blockquote>"
    if isinstance(block, ListBlock):
        return render_list(block, lambda b: _block(b, quoted=quoted), flush=(CodeBlock,))
    assert isinstance(block, Rule)
    return RULE


def _inline(nodes: tuple[Inline, ...], *, bold: bool = False) -> str:
    runs: list[_Run] = []
    _flatten(nodes, (("b",),) if bold else (), runs)
    out: list[str] = []
    open_tags: tuple[tuple[str, ...], ...] = ()
    for text, tags, is_code in runs:
        wanted = () if is_code else tags
        keep = 0
        while keep < min(len(open_tags), len(wanted)) and open_tags[keep] == wanted[keep]:
            keep += 1
        out.extend(f"</{tag[0]}>" for tag in reversed(open_tags[keep:]))
        for tag in wanted[keep:]:
            out.append(f'<a href="{html.escape(tag[1], quote=True)}">' if tag[0] == "a" else f"<{tag[0]}>")
        open_tags = wanted
        out.append(f"<code>{_esc(text)}</code>" if is_code else _esc(text))
    out.extend(f"</{tag[0]}>" for tag in reversed(open_tags))
    return "".join(out)


def _flatten(nodes: tuple[Inline, ...], tags: tuple[tuple[str, ...], ...], runs: list[_Run]) -> None:
    """Text runs with the tags each stands in (a tag already open is not opened twice)."""
    in_link = any(tag[0] == "a" for tag in tags)
    for node in nodes:
        if isinstance(node, Text):
            runs.append((node.text, tags, False))
        elif isinstance(node, Code):
            runs.append((node.text, tags, not in_link))
        elif isinstance(node, Break):
            runs.append(("\n", tags, False))
        elif isinstance(node, Styled):
            if node.markup == "__":  # see the module docstring
                runs.append(("__", tags, False))
                _flatten(node.children, tags, runs)
                runs.append(("__", tags, False))
            else:
                _flatten(node.children, _with(tags, (_TAG[node.kind],)), runs)
        elif isinstance(node, Link):
            label = node.children if words(node.children).strip() else (Text(address(node.href)),)
            if in_link:
                _flatten(label, tags, runs)
            elif node.href.lower().startswith(_LINK_SCHEMES):
                _flatten(label, _with(tags, ("a", node.href)), runs)
            else:  # an address Telegram would not link: the text, then the address
                _flatten(label, tags, runs)
                if words(node.children).strip() and not node.autolink:
                    runs.append((f" ({address(node.href)})", tags, False))
        elif isinstance(node, Image):
            label = node.alt or address(node.src)
            if in_link:
                runs.append((label, tags, False))
            elif node.src.lower().startswith(_LINK_SCHEMES):
                runs.append((label, _with(tags, ("a", node.src)), False))
            else:
                runs.append((f"{node.alt} ({address(node.src)})" if node.alt else label, tags, False))


def _with(tags: tuple[tuple[str, ...], ...], tag: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return tags if tag in tags else (*tags, tag)


def is_parse_error(error: BaseException) -> bool:
    """True for Telegram's 400 "can't parse entities" (the formatting was rejected)."""
    text = str(error).lower()
    return "can't parse entities" in text or "can't find end of" in text or "unsupported start tag" in text
