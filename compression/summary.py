"""The summary message: how it looks in a prompt and in a stored session.

A summary is an ordinary chat message whose text content starts with
:data:`SUMMARY_MARKER` on its own line::

    [Summary of earlier conversation]
    <the summary>

    (This summary replaces earlier messages of this conversation; ...)

Its role is ``"user"`` or ``"assistant"``, chosen to differ from the message
before it (see :func:`summary_role`): several OpenAI-compatible servers
(llama.cpp and vLLM chat templates among them) reject a ``system`` message
after the first one or two messages with the same role in a row, so a
``system`` summary would break them.  Recognize a summary with
:func:`is_summary`, never by its role.
"""

from __future__ import annotations

from typing import Any, Mapping

SUMMARY_MARKER = "[Summary of earlier conversation]"
SUMMARY_FOOTER = (
    "(This summary replaces earlier messages of this conversation, which were compressed to fit the "
    "model's context window. It is a record, not a new request: continue from the messages that follow.)"
)


def is_summary(message: Mapping[str, Any]) -> bool:
    """True for a message written by :func:`make_summary_message`."""
    content = message.get("content")
    return (
        message.get("role") in ("user", "assistant", "system")
        and isinstance(content, str)
        and content.startswith(SUMMARY_MARKER)
    )


def summary_text(message: Mapping[str, Any]) -> str:
    """The summary itself, without the marker and footer."""
    text = str(message.get("content") or "")
    text = text.removeprefix(SUMMARY_MARKER)
    text = text.strip()
    if text.endswith(SUMMARY_FOOTER):
        text = text[: -len(SUMMARY_FOOTER)].rstrip()
    return text


def summary_role(previous: Mapping[str, Any] | None) -> str:
    """``"assistant"`` after a user message, else ``"user"``: never two user messages in a row."""
    return "assistant" if previous is not None and previous.get("role") == "user" else "user"


def make_summary_message(text: str, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The message that stands for the compressed middle, placed after ``previous``."""
    return {
        "role": summary_role(previous),
        "content": f"{SUMMARY_MARKER}\n{text.strip()}\n\n{SUMMARY_FOOTER}",
    }
