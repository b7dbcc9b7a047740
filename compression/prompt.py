"""The request that asks a model to summarize the middle of a conversation.

:func:`build_summary_request` turns a :class:`~compression.planning.Plan` into
chat messages for ``summarize``: a system message with the rules and a user
message holding the earlier summary (when the conversation was compressed
before, so it is updated rather than lost), the transcript of the middle,
the user's focus (``/compress <focus>``) and a target length.  Everything in
it passes through :func:`~compression.redaction.redact` first.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .planning import SUMMARY_MAX_TOKENS, SUMMARY_MIN_TOKENS, TARGET_SHARE, Plan, summary_target
from .redaction import redact
from .tokens import estimate_text_tokens

__all__ = ["SUMMARY_MAX_TOKENS", "SUMMARY_MIN_TOKENS", "SYSTEM_PROMPT", "TARGET_SHARE", "build_summary_request",
           "render_transcript", "target_summary_tokens"]
# One message of the transcript is cut to this many characters (head and end
# kept); a pasted log or a large tool result should not crowd out the rest.
MESSAGE_CHAR_LIMIT = 6_000

SECTIONS = (
    "Latest user request (verbatim): the user's most recent request that is not yet fully done, "
    "quoted word for word",
    "Goals: what the user is trying to achieve overall",
    "Constraints and preferences: requirements, limits, style and tone the user asked for",
    "Decisions: what was decided, and why",
    "Facts: names, numbers, dates, file paths, URLs, commands, identifiers, exactly as written",
    "Completed work: what has been done, with results",
    "Open questions: what is unresolved or waiting on the user",
    "Remaining work: the next steps, in order",
)

SYSTEM_PROMPT = (
    "You write the memory of a long conversation between a user and an AI assistant. The earlier "
    "part of the conversation is about to be removed from the assistant's context window and replaced "
    "by your summary, so anything you leave out is forgotten. The assistant must be able to continue "
    "the work from your summary alone, without asking the user to repeat anything.\n\n"
    "Rules:\n"
    "- Write in the language the user writes in.\n"
    "- Use these sections, as short headings, and leave out a section only when it would be empty:\n"
    + "".join(f"  {i}. {s}\n" for i, s in enumerate(SECTIONS, 1))
    + "- Keep every name, number, path, URL and identifier exactly as written.\n"
    "- For each picture, document or voice note the user sent (shown as [image ...], [document ...] or "
    "[attached ...]), keep one short line: its name and what it showed or said.\n"
    "- Secrets were replaced by [REDACTED]; keep that placeholder and never guess the secret.\n"
    "- State facts; do not address the user, do not greet, do not add commentary about the summary.\n"
    "- When an earlier summary is given, produce one updated summary that keeps everything in it that "
    "is still true and adds what happened since."
)


def target_summary_tokens(plan: Plan) -> int:
    """How long the summary should be: what the plan left room for, else about 20 % of what it
    replaces, between 200 and 4,000 tokens."""
    return plan.summary_tokens or summary_target(plan.middle_tokens, plan.previous_summary)


def _clip(text: str, limit: int = MESSAGE_CHAR_LIMIT) -> str:
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep:,} characters left out ...]\n{text[-keep:]}"


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            elif isinstance(part, Mapping) and part.get("type") in ("image_url", "input_image", "image"):
                parts.append("[image: the picture itself is not shown here; keep what the text says of it]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def _tool_calls(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    calls = message.get("tool_calls") or []
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except ValueError:
            return [("?", calls)]
    out = []
    for call in calls:
        fn = call.get("function", {}) if isinstance(call, Mapping) else {}
        args = fn.get("arguments", "")
        out.append((str(fn.get("name") or "?"), args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    return out


def render_transcript(messages: tuple[Mapping[str, Any], ...] | list[Mapping[str, Any]],
                      clip: int = MESSAGE_CHAR_LIMIT) -> str:
    """The messages as plain text, one block per message, long ones clipped."""
    blocks = []
    for m in messages:
        role = str(m.get("role") or "?")
        text = _content_text(m.get("content"))
        if role == "tool":
            name = m.get("name") or m.get("tool_name") or "tool"
            blocks.append(f"TOOL RESULT ({name}):\n{_clip(text, clip)}")
            continue
        if role == "assistant":
            calls = _tool_calls(m)
            lines = [f"ASSISTANT:\n{_clip(text, clip)}"] if text else []
            lines += [f"ASSISTANT called tool {name} with arguments: {_clip(args, min(2_000, clip))}" for name, args in calls]
            blocks.append("\n".join(lines) or "ASSISTANT: (no text)")
            continue
        blocks.append(f"{role.upper()}:\n{_clip(text, clip)}")
    return "\n\n".join(blocks)


# Clips tried in turn when the request does not fit the window: one message of the transcript to this
# many characters (its start and end kept).
TIGHTER_CLIPS = (2_000, 800, 300)


def build_summary_request(plan: Plan, *, focus: str | None = None,
                          max_prompt_tokens: int | None = None) -> list[dict[str, str]]:
    """Chat messages asking for the summary of ``plan.middle`` (secrets already redacted).

    ``max_prompt_tokens``: the most the request may take of the summarizer's window (what is left
    after the summary it asks for); long messages of the transcript are clipped harder, and then the
    transcript's own middle is left out, until it fits."""
    request = _summary_request(plan, focus, MESSAGE_CHAR_LIMIT)
    if max_prompt_tokens is None:
        return request
    for clip in TIGHTER_CLIPS:
        if _request_tokens(request) <= max_prompt_tokens:
            return request
        request = _summary_request(plan, focus, clip)
    over = _request_tokens(request) - max_prompt_tokens
    if over > 0:
        body = request[1]["content"]
        start, end = body.index("<transcript>\n") + len("<transcript>\n"), body.index("\n</transcript>")
        transcript = body[start:end]
        keep = max(0, len(transcript) - int(over * 3.5 * 1.1) - 200)  # 3.5 characters a token, and some slack
        cut = (f"{transcript[:keep // 2]}\n[... {len(transcript) - keep:,} characters of the transcript left out "
               f"to fit the model's context window ...]\n{transcript[len(transcript) - keep // 2:]}" if keep else
               "[the transcript is too long for the model's context window: only the earlier summary is left]")
        request[1]["content"] = body[:start] + cut + body[end:]
    return request


def _request_tokens(request: list[dict[str, str]]) -> int:
    return sum(4 + estimate_text_tokens(m["content"]) for m in request)


def _summary_request(plan: Plan, focus: str | None, clip: int) -> list[dict[str, str]]:
    target = target_summary_tokens(plan)
    parts = []
    if plan.previous_summary:
        parts.append(
            "EARLIER SUMMARY (of the conversation before the messages below; update it, keep what is "
            "still true):\n<earlier-summary>\n" + redact(plan.previous_summary) + "\n</earlier-summary>"
        )
    parts.append(
        "MESSAGES TO SUMMARIZE:\n<transcript>\n" + redact(render_transcript(plan.middle, clip)) + "\n</transcript>"
    )
    if focus and focus.strip():
        parts.append(
            "FOCUS: the user asked that the summary concentrate on the following; give it the most "
            "detail, and keep the rest brief:\n" + redact(focus.strip())
        )
    parts.append(
        f"The conversation's first {len(plan.head)} and last {len(plan.tail)} messages are kept word for word "
        "around your summary and are not shown here.\n"
        f"Write the {'updated ' if plan.previous_summary else ''}summary now, in about {target:,} tokens "
        f"(roughly {round(target * 0.75):,} words) at most, using the sections from your instructions."
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]
