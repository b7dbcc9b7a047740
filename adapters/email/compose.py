"""The reply as a mail: the model's Markdown as the text part, HTML rendered from it, threaded.

    mail = compose_reply(markdown, sender=..., to="boss@example.com", thread=Thread(...), domain="example.com")

The HTML is a walk over :func:`gateway.markdown.parse` (the one parse every
platform renders): every string is escaped, links keep only ``http``, ``https``
and ``mailto`` addresses (anything else is shown as text), and a picture is a link
(no remote image is ever loaded by the reader's client on our behalf).

Threading: ``In-Reply-To`` is the mail answered, ``References`` its references and
its id (:meth:`~adapters.email.message.Thread.reply_references`), the subject
``Re: <its subject>``.  ``Auto-Submitted: auto-replied`` (RFC 3834) tells other
auto-responders not to answer us, so two of them cannot loop.

The ``Message-ID`` is derived from what the reply answers and what it says, so a
reply sent again after a crash carries the same id and mail clients show it once.
"""

from __future__ import annotations

import hashlib
import html
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, localtime

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
)

from .message import Thread, reply_subject

_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_TAG = {"strong": "strong", "em": "em", "strike": "del"}


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _inline(nodes: tuple[Inline, ...]) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(_esc(node.text))
        elif isinstance(node, Code):
            out.append(f"<code>{_esc(node.text)}</code>")
        elif isinstance(node, Styled):
            tag = _TAG.get(node.kind, "span")
            out.append(f"<{tag}>{_inline(node.children)}</{tag}>")
        elif isinstance(node, Link):
            inner = _inline(node.children) if node.children else _esc(address(node.href))
            if node.href.lower().startswith(_SAFE_SCHEMES):
                out.append(f'<a href="{_esc(node.href)}">{inner}</a>')
            else:
                out.append(f"{inner} ({_esc(address(node.href))})")
        elif isinstance(node, Image):
            label = _esc(node.alt or address(node.src))
            if node.src.lower().startswith(_SAFE_SCHEMES):
                out.append(f'<a href="{_esc(node.src)}">{label}</a>')
            else:
                out.append(label)
        elif isinstance(node, Break):
            out.append("<br>\n")
    return "".join(out)


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_inline(block.children)}</p>"
    if isinstance(block, Heading):
        level = min(max(block.level, 1), 6)
        return f"<h{level}>{_inline(block.children)}</h{level}>"
    if isinstance(block, CodeBlock):
        lang = f' class="language-{_esc(block.lang)}"' if block.lang else ""
        return f"<pre><code{lang}>{_esc(block.text)}</code></pre>"
    if isinstance(block, Quote):
        return f"<blockquote>{_blocks(block.blocks)}</blockquote>"
    if isinstance(block, ListBlock):
        tag = "ol" if block.ordered else "ul"
        start = f' start="{block.start}"' if block.ordered and block.start != 1 else ""
        items = "".join(f"<li>{_item(item)}</li>" for item in block.items)
        return f"<{tag}{start}>{items}</{tag}>"
    if isinstance(block, Table):
        return f"<pre>{_esc(block.source)}</pre>"
    if isinstance(block, Rule):
        return "<hr>"
    return ""


def _item(blocks: tuple[Block, ...]) -> str:
    # a tight item's paragraph is shown without the paragraph's margins
    if len(blocks) == 1 and isinstance(blocks[0], Paragraph):
        return _inline(blocks[0].children)
    return _blocks(blocks)


def _blocks(blocks: tuple[Block, ...]) -> str:
    return "\n".join(_block(b) for b in blocks)


def markdown_to_html(markdown: str) -> str:
    """A whole HTML document for ``markdown`` (escaped; only safe link schemes are links)."""
    body = _blocks(parse(markdown))
    return ('<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head>'
            f'<body style="font-family: sans-serif; line-height: 1.4">\n{body}\n</body></html>\n')


def reply_id(to: str, answering: str | None, text: str, domain: str) -> str:
    """A ``Message-ID`` that is the same whenever the same reply to the same mail is sent again."""
    digest = hashlib.sha256(f"{to}\0{answering or ''}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"<sb.{digest}@{domain}>"


def compose_reply(markdown: str, *, sender: str, sender_name: str, to: str, thread: Thread | None,
                  fallback_subject: str = "Message from Switchboard") -> EmailMessage:
    """The reply to ``thread`` (None: a new mail, such as a scheduled job's) as text plus HTML."""
    domain = sender.rsplit("@", 1)[1]
    mail = EmailMessage()
    mail["From"] = formataddr((sender_name, sender)) if sender_name else sender
    mail["To"] = to
    mail["Date"] = format_datetime(localtime())
    if thread is not None:
        mail["Subject"] = reply_subject(thread.subject)
        mail["In-Reply-To"] = thread.message_id
        mail["References"] = " ".join(thread.reply_references())
    else:
        mail["Subject"] = fallback_subject
    mail["Message-ID"] = reply_id(to, thread.message_id if thread else None, markdown, domain)
    mail["Auto-Submitted"] = "auto-replied"
    mail["X-Auto-Response-Suppress"] = "All"  # Exchange: no out-of-office replies to us
    mail.set_content(markdown if markdown.endswith("\n") else markdown + "\n", subtype="plain", cte="quoted-printable")
    mail.add_alternative(markdown_to_html(markdown), subtype="html", cte="quoted-printable")
    return mail
