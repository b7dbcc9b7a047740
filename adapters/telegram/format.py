"""Markdown from the model to Telegram's HTML parse mode.

Telegram's HTML mode knows a handful of tags (``b i s u code pre a
blockquote``) and requires ``& < >`` to be escaped everywhere else.  The
converter handles what models actually write: ``**bold**``,
``*italic*``, ``_italic_``, ``~~strike~~``, `` `code` ``, fenced code blocks
(with a language), ``[links](url)``, ``# headings`` (shown bold) and ``-``/``*``
bullets (shown as ``•``).  Anything else passes through escaped.

The converter never has to be perfect: when Telegram still answers 400
"can't parse entities", the adapter resends that part as plain text
(:func:`is_parse_error`).
"""

from __future__ import annotations

import html
import re

_FENCED = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.M | re.S)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]+)\]\(\s*(https?://[^\s)]+|tg://[^\s)]+|mailto:[^\s)]+)\s*\)")
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_BULLET = re.compile(r"^([ \t]*)[*+-][ \t]+", re.M)
# ``__bold__`` is left alone: models write ``__init__`` unquoted far more often than they mean bold.
_BOLD = (re.compile(r"\*\*(?=\S)([^\n]+?)(?<=\S)\*\*"),)
_ITALIC = (
    re.compile(r"(?<![\w*])\*(?=[^\s*])([^\n*]+?)(?<=[^\s*])\*(?![\w*])"),
    re.compile(r"(?<![\w_])_(?=[^\s_])([^\n_]+?)(?<=[^\s_])_(?![\w_])"),
)
_STRIKE = re.compile(r"~~(?=\S)([^\n]+?)(?<=\S)~~")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _inline(text: str, keep: list[str]) -> str:
    """Escape ``text`` and convert inline emphasis; protected pieces go into ``keep``."""

    def protect(fragment: str) -> str:
        keep.append(fragment)
        return f"\x00{len(keep) - 1}\x00"

    text = _INLINE_CODE.sub(lambda m: protect(f"<code>{_esc(m.group(1))}</code>"), text)
    text = _LINK.sub(
        lambda m: protect(f'<a href="{html.escape(m.group(2), quote=True)}">{_emphasis(_esc(m.group(1)))}</a>'),
        text,
    )
    text = _esc(text)
    text = _HEADING.sub(lambda m: f"<b>{m.group(1)}</b>", text)
    text = _BULLET.sub(lambda m: f"{m.group(1)}• ", text)
    return _emphasis(text)


def _emphasis(text: str) -> str:
    for pattern in _BOLD:
        text = pattern.sub(r"<b>\1</b>", text)
    for pattern in _ITALIC:
        text = pattern.sub(r"<i>\1</i>", text)
    return _STRIKE.sub(r"<s>\1</s>", text)


def markdown_to_html(markdown: str) -> str:
    """Telegram HTML for ``markdown`` (escaped; code blocks kept verbatim)."""
    keep: list[str] = []
    text = markdown.replace("\x00", "")
    out: list[str] = []
    pos = 0
    for m in _FENCED.finditer(text):
        out.append(_inline(text[pos : m.start()], keep))
        lang, body = m.group(1), m.group(2)
        body = body[:-1] if body.endswith("\n") else body
        attr = f' class="language-{html.escape(lang, quote=True)}"' if lang else ""
        out.append(f"<pre><code{attr}>{_esc(body)}</code></pre>")
        pos = m.end()
    out.append(_inline(text[pos:], keep))
    joined = "".join(out)
    # Pieces protected inside a protected piece (a code span in a link text) resolve in turn.
    while _PLACEHOLDER.search(joined):
        joined = _PLACEHOLDER.sub(lambda m: keep[int(m.group(1))], joined)
    return joined


def is_parse_error(error: BaseException) -> bool:
    """True for Telegram's 400 "can't parse entities" (the formatting was rejected)."""
    text = str(error).lower()
    return "can't parse entities" in text or "can't find end of" in text or "unsupported start tag" in text
