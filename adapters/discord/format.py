"""Markdown from the model to Discord's message markdown, and a plain-text fallback.

A walk over :func:`gateway.markdown.parse`'s tree that writes the Markdown Discord
renders: ``**bold**``, ``*italic*``, ``__underline__`` (what ``__x__`` shows there),
``~~strike~~``, code spans and fenced blocks with a language, ``[masked links](url)``,
``#``-``###`` headings, ``>`` quotes (one level: Discord does not nest them) and lists.
What Discord does not render is rewritten:

* ``####`` and deeper headings become ``**bold**`` lines;
* pipe tables go into a code block so the columns line up;
* images ``![alt](url)`` become a link ``[alt](url)`` (Discord embeds the URL);
* horizontal rules, shown literally, are left out.

Text is escaped where Discord would read it as markup (``2*3*4``, a line starting
``- `` that was not a list), so what the model wrote as text stays text.  When
Discord still refuses a part (400 "Invalid Form Body"), the adapter resends it
through :func:`to_plain` and counts it.
"""

from __future__ import annotations

import re
from dataclasses import replace

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
    marker,
    parse,
    plain,
    words,
    wrap,
)

_ESCAPE = re.compile(r"[\\*`]|~~|\|\||\](?=\()|(?<![^\W_])_|_(?![^\W_])"  # `_` inside a word is no markup
                     r"|<(?=[A-Za-z][\w+.-]{1,31}:|[^\s<>@]+@|$)")  # nor <https://...> (a mention <@1> is)
_IN_LINK = re.compile(_ESCAPE.pattern + r"|[\[\]]")  # a link's text: no bracket may end it early
_LINE_START = re.compile(r"^([ \t]*(?:\d+)?)(#|>|(?<!\d)[-+](?=[ \t]|#|$)|(?<=\d)[.)](?=[ \t]|$)"
                         r"|(?<!\d)-(?=[- \t]*$)|(?<!\d)=(?=[= \t]*$))", re.M)  # and --- or === under a line
_LINKABLE = ("http://", "https://")
_RULE = re.compile(r"^[ \t]*([-*_])([ \t]*\1){2,}[ \t]*$")
_FENCE_IN_CODE = "``\u200b`"  # a zero-width space keeps ``` inside a block from closing it


def to_discord(markdown: str) -> str:
    """The Markdown Discord renders for ``markdown``."""
    return _blocks(parse(markdown))


def to_plain(markdown: str) -> str:
    """The text without Markdown markers (the fallback when Discord refuses a part)."""
    return plain(parse(markdown))


def _blocks(blocks: tuple[Block, ...], *, quoted: bool = False) -> str:
    shown: list[Block] = []
    for n, b in enumerate(blocks):
        if not isinstance(b, Rule):  # a rule is left out, and leaves a blank line
            shown.append(replace(b, blank_before=True) if n and isinstance(blocks[n - 1], Rule) else b)
    return join_blocks([(b, _block(b, quoted=quoted)) for b in shown])


def _block(block: Block, *, quoted: bool = False) -> str:
    if isinstance(block, Paragraph):
        return _line_starts(_inline(block.children))
    if isinstance(block, Heading):
        children = _one_line(block.children)
        if block.level <= 3:  # a "#" run at the end would read as the heading's closing sequence
            return "#" * block.level + " " + re.sub(r"(?:^|(?<=[ \t]))(#+[ \t]*)$", r"\\\1", _inline(children))
        return f"**{_inline(children, active=frozenset({'strong'}))}**"
    if isinstance(block, CodeBlock):
        return f"```{block.lang}\n{_code(block.text)}\n```"
    if isinstance(block, Table):
        return f"```\n{_code(block.source)}\n```"
    if isinstance(block, Quote):  # one level: a quote inside a quote joins it
        inner = _blocks(block.blocks, quoted=True)
        return inner if quoted else indent(inner, "> ") if inner else ""
    assert isinstance(block, ListBlock)
    items = []
    for n, item in enumerate(block.items):
        mark = (marker(block, n) if block.ordered else "-") + " "  # the number the model wrote
        body = "\n".join(_block(b, quoted=quoted) for b in item if not isinstance(b, Rule))
        if _RULE.match(mark + body.split("\n")[0]):  # "- - -" (empty items in items) would be a rule
            mark = "+ "
        items.append(indent(body, " " * len(mark), mark).rstrip(" "))
    return "\n".join(items)


def _one_line(nodes: tuple[Inline, ...]) -> tuple[Inline, ...]:
    """A heading is one line: a line break in it (a setext heading's, even inside bold) becomes a space."""
    return tuple(Text(" ") if isinstance(node, Break)
                 else replace(node, children=_one_line(node.children)) if isinstance(node, (Styled, Link))
                 else node for node in nodes)


def _code(text: str) -> str:
    return text.replace("```", _FENCE_IN_CODE)


def _line_starts(text: str) -> str:
    r"""``\`` before what would start a heading, quote or list at a line's start."""
    return _LINE_START.sub(lambda m: f"{m.group(1)}\\{m.group(2)}", text)


def _inline(nodes: tuple[Inline, ...], *, active: frozenset[str] = frozenset(), in_link: bool = False) -> str:
    out: list[str] = []
    for n, node in enumerate(nodes):
        if isinstance(node, Text):
            out.append((_IN_LINK if in_link else _ESCAPE).sub(lambda m: "".join("\\" + c for c in m.group()), node.text))
        elif isinstance(node, Code):
            out.append(_code_span(node.text))
        elif isinstance(node, Break) and not (n and isinstance(nodes[n - 1], Break)):
            out.append("\n")  # one line break: two would end the paragraph (and any bold across it)
        elif isinstance(node, Styled):
            inner = _inline(node.children, active=active | {node.kind}, in_link=in_link)
            beside = nodes[n - 1 : n] + nodes[n + 1 : n + 2]
            out.append(inner if node.kind in active else wrap(inner, _mark(node, beside)))
        elif isinstance(node, Link):
            out.append(_link(node, active, in_link))
        elif isinstance(node, Image):
            label = _inline((Text(node.alt or address(node.src)),), active=active, in_link=True)
            if in_link:
                out.append(label)
            elif not node.alt and node.src.lower().startswith(_LINKABLE):
                out.append(f"<{node.src}>")
            elif not node.alt:
                out.append(label)
            elif node.src.lower().startswith(_LINKABLE):
                out.append(f"[{label}]({_href(node.src)})")
            else:
                out.append(f"{label} ({_inline((Text(address(node.src)),), active=active)})")
    return "".join(out)


def _mark(node: Styled, beside: tuple[Inline, ...]) -> str:
    if node.kind == "strong":
        return "__" if node.markup == "__" else "**"
    if node.kind == "strike":
        return "~~"
    # ``*`` for italics, ``_`` where a ``*`` would run into a bold's (``**a***b*`` reads otherwise)
    touching = node.children[:1] + node.children[-1:] + beside
    stars = any(isinstance(c, Styled) and c.kind == "strong" and c.markup != "__" for c in touching)
    return "_" if stars else "*"


def _link(node: Link, active: frozenset[str], in_link: bool) -> str:
    shown = _inline((Text(address(node.href)),), active=active, in_link=in_link)
    if node.autolink and not in_link and node.href.lower().startswith(_LINKABLE):
        return f"<{node.href}>"
    if node.autolink and not in_link:  # an address written as <a@b.c>: as written
        return f"<{words(node.children)}>"
    if node.autolink:
        return _inline(node.children, active=active, in_link=True)
    if not words(node.children).strip():  # no label: the address, in brackets so markup beside it still closes
        linkable = node.href.lower().startswith(_LINKABLE) and not re.search(r"[\s<>]", node.href)
        return f"<{node.href}>" if linkable and not in_link else shown
    label = _inline(node.children, active=active, in_link=True)
    if in_link:
        return label
    if node.href.lower().startswith(_LINKABLE):
        return f"[{label}]({_href(node.href)})"
    return f"{label} ({shown})"


def _href(url: str) -> str:
    return url.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _code_span(text: str) -> str:
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"
