"""A stored session as the dashboard shows and exports it: lineage, summary, Markdown, snippets.

The session and its messages come from the store's own export (``export_session``: the same record
``switchboard sessions export`` writes, secrets in its model settings redacted); this module only
arranges them.

Message text is shown as Markdown (:func:`as_html`): markdown-it-py with raw HTML off (a ``<script>``
in a message is text), and its output sanitised once more by nh3 with a short list of tags and
attributes, links to http, https and mailto only, and no image (an image becomes a link to it: the
page loads nothing from elsewhere).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markupsafe import Markup, escape

import compression
import state


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a session sits among compression chains: its parent and its children (``#N`` titles)."""

    parent: state.Session | None
    children: list[state.Session]
    tip: str  # the live end of its chain (the session itself when it was not compressed)


def as_json(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, indent=2, default=str) + "\n"


def _when(ts: float | None, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M:%S %Z") if ts else "-"


def _fence(text: str) -> str:
    """``text`` in a code fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def as_markdown(record: dict, tz: dt.tzinfo) -> str:
    """The session as a Markdown document: a header of facts, then each message under its role and time.
    Message text is quoted as written (it is Markdown already, or plain text)."""
    title = record.get("title") or record["id"]
    lines = [f"# {title}", ""]
    facts = [("Session", f"`{record['id']}`"), ("Source", record.get("source") or "-")]
    if record.get("user_id"):
        facts.append(("User", f"{record.get('user_name') or ''} ({record['user_id']})".strip()))
    facts += [("Model", record.get("model") or "-"), ("Started", _when(record.get("started_at"), tz)),
              ("Ended", _when(record.get("ended_at"), tz) + (f" ({record['end_reason']})" if record.get("end_reason") else ""))]
    if record.get("parent_session_id"):
        facts.append(("Parent", f"`{record['parent_session_id']}`"))
    lines += [f"- **{name}:** {value}" for name, value in facts]
    for message in record.get("messages") or []:
        head = f"## {message['role']}"
        if message.get("tool_name"):
            head += f" ({message['tool_name']})"
        head += f" · {_when(message.get('timestamp'), tz)}"
        if message.get("trace_id"):
            head += f" · trace `{message['trace_id']}`"
        lines += ["", head, ""]
        if compression.is_summary(message):
            lines += ["*Summary of the earlier conversation:*", "", compression.summary_text(message)]
        elif message.get("content"):
            lines.append(message["content"] if message["role"] != "tool" else _fence(message["content"]))
        for line in tool_call_lines(message):
            lines += ["", _fence(line)]
    return "\n".join(lines) + "\n"


_MARK = re.compile(r">>>(.*?)<<<", re.S)


def highlighted(snippet: str | None) -> Markup:
    """A search snippet as HTML: the store's ``>>>match<<<`` marks become ``<mark>``, everything else escaped."""
    text = snippet or ""
    out: list[Any] = []
    at = 0
    for found in _MARK.finditer(text):
        out.append(escape(text[at:found.start()]))
        out.append(Markup("<mark>%s</mark>") % found.group(1))
        at = found.end()
    out.append(escape(text[at:]))
    return Markup("").join(out)


def tool_call_lines(message: dict) -> list[str]:
    lines = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        lines.append(f"{fn.get('name', '?')}({fn.get('arguments', '')})")
    return lines


def shown(message: dict) -> dict:
    """A stored message as the transcript shows it: ``summary`` (a compression summary's text, else None),
    ``html`` (the text as safe HTML: Markdown, or a tool's output as preformatted text) and ``calls``
    (its tool calls, one line each) added.  Markdown takes CPU: call it off the event loop."""
    summary = compression.summary_text(message) if compression.is_summary(message) else None
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    if summary is not None:
        body = as_html(summary)
    elif message.get("role") == "tool":
        body = Markup("<pre><code>%s</code></pre>") % text
    else:
        body = as_html(text)
    return {**message, "summary": summary, "html": body, "calls": tool_call_lines(message)}


ALLOWED_TAGS = {"p", "br", "strong", "em", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li", "hr", "a",
                "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"}
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}}
URL_SCHEMES = {"http", "https", "mailto"}
_local = threading.local()


def _image_as_link(self, tokens, idx, options, env) -> str:
    """An image is shown as a link to it (its alt text, else its address): the page loads nothing from elsewhere."""
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = self.renderInlineAsText(token.children or [], options, env) or src
    return f'<a href="{escapeHtml(src)}">{escapeHtml(alt)}</a>'


def _markdown() -> MarkdownIt:
    md = getattr(_local, "md", None)
    if md is None:  # one parser per thread: the pages render transcripts on worker threads
        md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
        md.add_render_rule("image", _image_as_link)
        _local.md = md
    return md


def as_html(text: str) -> Markup:
    """``text`` (a message, Markdown or plain) as HTML safe to put in a page: raw HTML in it stays text,
    and what the Markdown makes is sanitised again (tags, attributes and link schemes on a short list)."""
    if not text:
        return Markup("")
    html = _markdown().render(text)
    return Markup(nh3.clean(html, tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES, url_schemes=URL_SCHEMES,
                            link_rel="noopener noreferrer nofollow"))
