"""The model's Markdown, parsed once into a small tree that each platform renders.

:func:`parse` runs markdown-it-py (CommonMark with ``~~strike~~`` and pipe tables,
raw HTML shown as text) and turns its token stream into plain frozen dataclasses:

    blocks   Paragraph  Heading  CodeBlock  Quote  ListBlock  Table  Rule
    inlines  Text  Code  Styled(strong|em|strike)  Link  Image  Break

Nesting is the tree's, so a renderer never guesses where bold ends or whether a
code span sits in a quote: ``adapters/telegram/format.py`` (HTML),
``adapters/discord/format.py`` (Discord Markdown), ``adapters/slack/mrkdwn.py``
(mrkdwn) and :func:`common_markdown` (the subset Teams messages and Feishu/Lark
cards both render) are each a walk over it, and :func:`plain` is the walk that keeps only the
words (a fallback when a platform still refuses a formatted part).

One divergence from CommonMark: ``*`` does not split a word, as ``_`` never does, so
``2*3*4`` stays arithmetic instead of an italic 3 (models write it unquoted).

Formatting a platform still refuses is resent as plain text; the adapters count each
such resend with :func:`count_plain_fallback`, shown in ``/metrics`` as
``switchboard_plain_text_fallbacks_total{platform}``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Union

from markdown_it import MarkdownIt
from markdown_it.rules_inline.state_inline import Delimiter, StateInline
from markdown_it.token import Token

# -- the tree -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Code:
    """An inline code span."""

    text: str


@dataclass(frozen=True, slots=True)
class Styled:
    """``kind`` is ``strong``, ``em`` or ``strike``; ``markup`` the delimiter the model wrote (``**``, ``__``, ...)."""

    kind: str
    markup: str
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Link:
    """A link; ``autolink`` for ``<https://...>``, whose text is the address itself."""

    href: str
    children: tuple[Inline, ...]
    autolink: bool = False


@dataclass(frozen=True, slots=True)
class Image:
    src: str
    alt: str


@dataclass(frozen=True, slots=True)
class Break:
    """A line break inside a paragraph (a soft one is shown as a new line too: chats keep lines)."""


Inline = Union[Text, Code, Styled, Link, Image, Break]


@dataclass(frozen=True, slots=True)
class _Block:
    """``blank_before``: a blank line parted it from the block before (``Intro:\n- a`` has none)."""

    blank_before: bool = field(default=True, kw_only=True)


@dataclass(frozen=True, slots=True)
class Paragraph(_Block):
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Heading(_Block):
    level: int
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class CodeBlock(_Block):
    text: str  # without the final newline
    lang: str = ""  # the fence's first word, when it looks like a language name
    fenced: bool = True  # written between fences (False: indented four spaces or a tab)


@dataclass(frozen=True, slots=True)
class Quote(_Block):
    blocks: tuple[Block, ...]


@dataclass(frozen=True, slots=True)
class ListBlock(_Block):
    """``numbers``: each item's number as the model wrote it (``""`` in a bullet list)."""

    ordered: bool
    start: int
    items: tuple[tuple[Block, ...], ...]
    numbers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table(_Block):
    """A pipe table, kept as its source rows (chats have no tables: each platform shows it as code)."""

    source: str


@dataclass(frozen=True, slots=True)
class Rule(_Block):
    """A horizontal rule (``---``)."""


Block = Union[Paragraph, Heading, CodeBlock, Quote, ListBlock, Table, Rule]

# -- parsing --------------------------------------------------------------------------------

_LANG = re.compile(r"[\w+#.-]+")
_QUOTE_PREFIX = re.compile(r"^[ \t>]*")


def _emphasis_without_intraword_star(state: StateInline, silent: bool) -> bool:
    """markdown-it's emphasis tokenizer with ``canSplitWord`` off for ``*`` too (see the module docstring)."""
    marker = state.src[state.pos]
    if silent or marker not in ("_", "*"):
        return False
    scanned = state.scanDelims(state.pos, False)
    for _ in range(scanned.length):
        token = state.push("text", "", 0)
        token.content = marker
        state.delimiters.append(Delimiter(marker=ord(marker), length=scanned.length, token=len(state.tokens) - 1,
                                          end=-1, open=scanned.can_open, close=scanned.can_close))
    state.pos += scanned.length
    return True


_md = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
_md.inline.ruler.at("emphasis", _emphasis_without_intraword_star)


def parse(markdown: str) -> tuple[Block, ...]:
    """The blocks of ``markdown`` (NUL characters dropped, as CommonMark replaces them anyway)."""
    source = markdown.replace("\x00", "")
    tokens = _md.parse(source)
    blocks, _ = _blocks(tokens, 0, source.split("\n"), closing="")
    return tuple(blocks)


def _blocks(tokens: list[Token], i: int, lines: list[str], *, closing: str) -> tuple[list[Block], int]:
    """Blocks from ``tokens[i]`` up to the token of type ``closing``; returns them and the index after it."""
    out: list[Block] = []
    while i < len(tokens):
        t = tokens[i]
        if t.type == closing:
            return out, i + 1
        count = len(out)
        first = t.map[0] if t.map else 0
        if t.type == "paragraph_open":
            out.append(Paragraph(_inlines(tokens[i + 1].children or [])))
            i += 3
        elif t.type == "heading_open":
            out.append(Heading(int(t.tag[1]), _inlines(tokens[i + 1].children or [])))
            i += 3
        elif t.type in ("fence", "code_block"):
            words = t.info.split()
            lang = words[0] if words and _LANG.fullmatch(words[0]) else ""
            out.append(CodeBlock(t.content.removesuffix("\n"), lang, fenced=t.type == "fence"))
            i += 1
        elif t.type == "blockquote_open":
            inner, i = _blocks(tokens, i + 1, lines, closing="blockquote_close")
            out.append(Quote(tuple(inner)))
        elif t.type in ("bullet_list_open", "ordered_list_open"):
            ordered = t.type == "ordered_list_open"
            start = int(t.attrs.get("start", 1) or 1) if ordered else 1
            items: list[tuple[Block, ...]] = []
            numbers: list[str] = []
            i += 1
            while tokens[i].type == "list_item_open":
                numbers.append(tokens[i].info)
                inner, i = _blocks(tokens, i + 1, lines, closing="list_item_close")
                items.append(tuple(inner))
            out.append(ListBlock(ordered, start, tuple(items), tuple(numbers)))
            i += 1  # the list's close
        elif t.type == "table_open":
            first, last = t.map or (0, 0)
            rows = [_QUOTE_PREFIX.sub("", line).strip() for line in lines[first:last]]
            out.append(Table("\n".join(rows)))
            while tokens[i].type != "table_close":
                i += 1
            i += 1
        elif t.type == "hr":
            out.append(Rule())
            i += 1
        elif t.type == "html_block":  # not produced with html off; shown as text should that change
            out.append(Paragraph((Text(t.content.rstrip("\n")),)))
            i += 1
        else:
            raise ValueError(f"unexpected Markdown token {t.type!r}: gateway.markdown needs a case for it")
        if len(out) > count and 0 < first <= len(lines) and _QUOTE_PREFIX.sub("", lines[first - 1]):
            out[-1] = replace(out[-1], blank_before=False)  # the line above it is not blank
    return out, i


def _inlines(tokens: list[Token]) -> tuple[Inline, ...]:
    out, _ = _inline_run(tokens, 0, closing="")
    return tuple(out)


_STYLE = {"strong_open": ("strong", "strong_close"), "em_open": ("em", "em_close"), "s_open": ("strike", "s_close")}


def _inline_run(tokens: list[Token], i: int, *, closing: str) -> tuple[list[Inline], int]:
    out: list[Inline] = []
    while i < len(tokens):
        t = tokens[i]
        if t.type == closing:
            return out, i + 1
        if t.type in ("text", "text_special", "html_inline"):
            if not t.content:  # the emphasis rule leaves empty text tokens behind
                pass
            elif out and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + t.content)
            else:
                out.append(Text(t.content))
            i += 1
        elif t.type == "code_inline":
            out.append(Code(t.content))
            i += 1
        elif t.type in ("softbreak", "hardbreak"):
            out.append(Break())
            i += 1
        elif t.type in _STYLE:
            kind, close = _STYLE[t.type]
            inner, i = _inline_run(tokens, i + 1, closing=close)
            last = out[-1] if out else None
            # **a****b** and _a_*b*: one bold, one italic (but __x__ is not **x** to every platform)
            if isinstance(last, Styled) and last.kind == kind and (kind != "strong" or last.markup == t.markup):
                out[-1] = Styled(kind, t.markup, last.children + tuple(inner))
            else:
                out.append(Styled(kind, t.markup, tuple(inner)))
        elif t.type == "link_open":
            inner, i = _inline_run(tokens, i + 1, closing="link_close")
            out.append(Link(str(t.attrs.get("href", "")), tuple(inner), autolink=t.markup == "autolink"))
        elif t.type == "image":
            out.append(Image(str(t.attrs.get("src", "")), t.content))
            i += 1
        else:
            raise ValueError(f"unexpected Markdown token {t.type!r}: gateway.markdown needs a case for it")
    return out, i


# -- what every renderer shares -------------------------------------------------------------


def words(inlines: tuple[Inline, ...]) -> str:
    """The text of ``inlines`` without any formatting (a link's label, an image's alt or address)."""
    out: list[str] = []
    for node in inlines:
        if isinstance(node, (Text, Code)):
            out.append(node.text)
        elif isinstance(node, (Styled, Link)):
            out.append(words(node.children))
        elif isinstance(node, Image):
            out.append(node.alt or address(node.src))
        else:
            out.append("\n")
    return "".join(out)


def marker(block: ListBlock, index: int) -> str:
    """The item marker a chat shows: ``•``, or the number the model wrote (``3.``)."""
    return f"{block.numbers[index] or block.start + index}." if block.ordered else "•"


def address(url: str) -> str:
    """A link's address as a person reads it (``%C3%A9`` shown as ``é``), never longer than the model wrote it."""
    return str(_md.normalizeLinkText(url))


def render_list(block: ListBlock, render: Callable[[Block], str], *, depth: int = 0,
                own_line: tuple[type, ...] = (), flush: tuple[type, ...] = ()) -> str:
    """A list as lines ``• item``, a nested list two spaces further in, the item's other blocks under it.

    Nothing is indented but the nested items, so a code block in an item keeps its lines as
    written and a chat message is never longer than the Markdown it came from (Telegram splits
    the Markdown by its length).  An item that opens with a block of an ``own_line`` type puts it
    under the marker (Slack reads ``>`` and a fence only at a line's start); one that opens with a
    ``flush`` type follows the marker with no space (Telegram shows ``<pre>`` as a block of its own,
    and a tab the code block expanded into spaces already costs the character the space would)."""
    out: list[str] = []
    for n, item in enumerate(block.items):
        body = "\n".join(render_list(b, render, depth=depth + 1, own_line=own_line, flush=flush) if isinstance(b, ListBlock)
                         else render(b) for b in item)
        head = "  " * depth + marker(block, n)
        if not body.strip():
            out.append(head)
        elif isinstance(item[0], own_line):
            out.append(f"{head}\n{body}")
        elif isinstance(item[0], flush):
            out.append(f"{head}{body}")
        else:
            out.append(f"{head} {body.lstrip(' ')}")
    return "\n".join(out)


def _fenced(block: Block) -> bool:
    return isinstance(block, CodeBlock) and block.fenced


def join_blocks(rendered: list[tuple[Block, str]]) -> str:
    """Blocks one blank line apart where the Markdown had one, else on the next line (``Steps:\n- a``).

    A fenced code block always stands apart (its fence lines, which a chat does not show, pay for the
    blank line); an indented one has no fences to pay for it, so it keeps the Markdown's spacing."""
    out: list[str] = []
    previous: Block | None = None
    for block, text in rendered:
        if previous is not None:
            apart = block.blank_before or _fenced(block) or _fenced(previous)
            out.append("\n\n" if apart else "\n")
        out.append(text)
        previous = block
    return "".join(out)


def wrap(inner: str, mark: str) -> str:
    """``inner`` between ``mark``s, its spaces outside them (``** x**`` is no bold anywhere)."""
    core = inner.strip()
    if not mark or not core:
        return inner
    at = inner.index(core)
    return f"{inner[:at]}{mark}{core}{mark}{inner[at + len(core):]}"


def indent(text: str, prefix: str, first: str | None = None) -> str:
    """Every line of ``text`` after ``prefix`` (the first after ``first`` when given); empty lines stay bare."""
    lines = text.split("\n")
    out = [(first if first is not None else prefix) + lines[0]]
    out.extend(prefix + line if line else prefix.rstrip() for line in lines[1:])
    return "\n".join(out)


def plain(blocks: tuple[Block, ...]) -> str:
    """The words a reader sees, with no markup at all: links as ``label (address)``, bullets as ``•``."""

    def inline(nodes: tuple[Inline, ...]) -> str:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, Link) and not node.autolink and words(node.children).strip():
                out.append(f"{inline(node.children)} ({address(node.href)})")
            elif isinstance(node, Link):
                out.append(address(node.href))
            elif isinstance(node, Styled):
                out.append(inline(node.children))
            elif isinstance(node, Image):
                out.append(f"{node.alt} ({address(node.src)})" if node.alt else address(node.src))
            else:
                out.append(words((node,)))
        return "".join(out)

    def block(b: Block) -> str:
        if isinstance(b, (Paragraph, Heading)):
            return inline(b.children)
        if isinstance(b, CodeBlock):
            return b.text
        if isinstance(b, Table):
            return b.source
        if isinstance(b, Quote):
            return join_blocks([(x, block(x)) for x in b.blocks])
        if isinstance(b, ListBlock):
            return render_list(b, block)
        return ""

    return join_blocks([(b, block(b)) for b in blocks if not isinstance(b, Rule)]).strip()


# -- the common subset: Teams messages and Feishu/Lark card Markdown -----------------------------
#
# Both render bold, italic, strikethrough, inline code, code blocks, links, bulleted and numbered
# lists, block quotes and line breaks, and read tags (``<at>``) in the text.  common_markdown keeps
# those and rewrites the rest:
#
#     **bold**, *italic*, ~~strike~~, `code`   -> the same
#     [text](url)                              -> the same for http(s)/mailto, else text (url)
#     ![alt](src)                              -> [alt](src)  (a message cannot inline an image)
#     # Heading (any level)                    -> **Heading**
#     - item / 1. item                         -> - item / 1. item (nested ones indented)
#     > quote                                  -> > quote (one level)
#     ```lang ... ```                          -> the same fence
#     | table |                                -> a code block of its rows (neither has tables)
#     < > &                                    -> &lt; &gt; &amp; outside code

_COMMON_MARK = {"strong": "**", "em": "*", "strike": "~~"}
_COMMON_LINKABLE = ("http://", "https://", "mailto:")


def escape_entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _common_inline(nodes: tuple[Inline, ...]) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(escape_entities(node.text))
        elif isinstance(node, Code):
            tick = "``" if "`" in node.text else "`"
            out.append(f"{tick}{node.text}{tick}")
        elif isinstance(node, Styled):
            out.append(wrap(_common_inline(node.children), _COMMON_MARK.get(node.kind, "")))
        elif isinstance(node, Link):
            label = (_common_inline(node.children) if words(node.children).strip()
                     else escape_entities(address(node.href)))
            if node.href.startswith(_COMMON_LINKABLE):
                out.append(f"[{label}]({node.href.replace(')', '%29')})")
            else:
                out.append(f"{label} ({escape_entities(address(node.href))})")
        elif isinstance(node, Image):
            out.append(f"[{escape_entities(node.alt or address(node.src))}]({node.src.replace(')', '%29')})"
                       if node.src.startswith(_COMMON_LINKABLE) else escape_entities(node.alt or node.src))
        elif isinstance(node, Break):
            out.append("\n")
        else:
            out.append(escape_entities(words((node,))))
    return "".join(out)


def _common_block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return _common_inline(block.children)
    if isinstance(block, Heading):
        return wrap(_common_inline(block.children), "**")
    if isinstance(block, CodeBlock):
        fence = "````" if "```" in block.text else "```"
        return f"{fence}{block.lang}\n{block.text.rstrip(chr(10))}\n{fence}"
    if isinstance(block, Table):
        return f"```\n{block.source.rstrip(chr(10))}\n```"
    if isinstance(block, Quote):
        inner = join_blocks([(b, _common_block(b)) for b in block.blocks if not isinstance(b, Quote)]
                            + [(b, plain((b,))) for b in block.blocks if isinstance(b, Quote)])
        return indent(inner, "> ")
    if isinstance(block, ListBlock):
        return render_list(block, _common_block, own_line=(CodeBlock, Quote)).replace("•", "-")
    if isinstance(block, Rule):
        return "———"
    return ""


def common_markdown(markdown: str) -> str:
    """``markdown`` in the subset Teams messages and Feishu/Lark cards render (see the section above)."""
    if not markdown.strip():
        return ""
    return join_blocks([(b, _common_block(b)) for b in parse(markdown)]).strip("\n")


# -- the plain-text fallback, counted ---------------------------------------------------------

_plain_fallbacks: Counter[str] = Counter()


def count_plain_fallback(platform: str) -> None:
    """Note that ``platform`` refused a formatted part and it went again as plain text."""
    _plain_fallbacks[platform] += 1


def plain_fallbacks() -> dict[str, int]:
    """Parts resent as plain text in this process, by platform (one daemon per process, as gateway.tasks)."""
    return dict(_plain_fallbacks)


__all__ = [
    "Block", "Break", "Code", "CodeBlock", "Heading", "Image", "Inline", "Link", "ListBlock", "Paragraph", "Quote",
    "Rule", "Styled", "Table", "Text", "address", "common_markdown", "count_plain_fallback", "escape_entities",
    "indent", "join_blocks", "marker", "parse", "plain", "plain_fallbacks", "render_list", "words", "wrap",
]
