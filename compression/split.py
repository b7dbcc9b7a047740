"""The store side of a compression: summarize, then continue in a child session.

:func:`compress_session` reads the session, cuts it (:func:`~compression.planning.plan`),
asks ``summarize`` for the summary of the middle and, only once it has one,
writes the split:

1. a child session is created with ``parent_session_id`` = the old one, the
   same source, user, session key, model and system prompt, and the next
   title of the lineage (``my project`` -> ``my project #2``; untitled stays
   untitled);
2. the head, the summary message and the tail are copied into it in one
   transaction (with their original timestamps and platform message ids, so
   a redelivered platform event is still recognised);
3. the route of the session key is pointed at the child;
4. the parent is ended with ``end_reason='compression'``;
5. messages that reached the parent while the summary was being written are
   copied to the child too.

The parent keeps every message: nothing is deleted or rewritten.  When the
summarizer fails nothing is written at all; when a write of steps 1-4 fails,
what was written is undone (the child deleted, the route and the parent's
end restored) and the store's error is raised.

Only the head, tail and summary are copied; the summary is redacted, the
copied messages are the user's own and stay verbatim.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from state import AsyncSessionDB, SessionNotFound, TitleConflict, new_session_id

from .errors import CompressionFailed, NothingToCompress, SessionChanged
from .planning import Plan, plan
from .prompt import build_summary_request
from .redaction import redact
from .summary import make_summary_message
from .tokens import estimate_tokens

log = logging.getLogger(__name__)

Summarize = Callable[[list[dict]], Awaitable[str]]

END_REASON = "compression"
DEFAULT_TIMEOUT = 120.0

# The fields of a stored message that are copied into the child session.
_COPIED_FIELDS = (
    "role", "content", "tool_call_id", "tool_calls", "tool_name", "token_count", "finish_reason",
    "reasoning", "reasoning_details", "codex_reasoning_items", "platform_message_id", "timestamp",
)


@dataclass(frozen=True, slots=True)
class CompressionResult:
    """What a compression did: everything the ``/compress`` reply and the logs need."""

    old_session_id: str
    new_session_id: str
    title: str | None
    session_key: str | None
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary: str

    def describe(self) -> str:
        """``Compressed: 48 → 11 messages, ~61,000 → ~9,000 tokens. Continuing as "my project #2".``"""
        where = f'Continuing as "{self.title}".' if self.title else "Continuing in a new session."
        return (
            f"Compressed: {self.messages_before} → {self.messages_after} messages, "
            f"~{_round_tokens(self.tokens_before):,} → ~{_round_tokens(self.tokens_after):,} tokens. {where}"
        )


def _round_tokens(n: int) -> int:
    if n >= 1_000:
        return round(n, -3)
    if n >= 100:
        return round(n, -2)
    return n


def _copy(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in _COPIED_FIELDS if message.get(k) is not None}


async def _summarize(summarize: Summarize, request: list[dict], session_id: str, timeout: float | None) -> str:
    try:
        if timeout is None:
            text = await summarize(request)
        else:
            text = await asyncio.wait_for(summarize(request), timeout)
    except asyncio.TimeoutError as exc:
        reason = f"did not answer within {timeout:g}s" if timeout is not None else "timed out"
        raise CompressionFailed(session_id, f"the summarizer {reason}") from exc
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # any failure of the model call: nothing is written
        raise CompressionFailed(session_id, f"the summarizer failed ({type(exc).__name__}: {exc})") from exc
    if not isinstance(text, str) or not text.strip():
        raise CompressionFailed(session_id, "the summarizer returned an empty summary")
    return redact(text.strip())


async def _create_child(db: AsyncSessionDB, parent: Mapping[str, Any], session_key: str | None) -> tuple[str, str | None]:
    """Create the child session; on a title taken meanwhile, take the next one."""
    child_id = new_session_id()
    for attempt in range(5):
        title = await db.get_next_title_in_lineage(parent["title"]) if parent.get("title") else None
        try:
            await db.create_session(
                child_id, parent["source"], parent.get("model"), parent.get("user_id"), parent["id"],
                system_prompt=parent.get("system_prompt"), model_config=parent.get("model_config"),
                session_key=session_key, user_name=parent.get("user_name"), title=title,
            )
            return child_id, title
        except TitleConflict:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


async def _undo(
    db: AsyncSessionDB, parent_id: str, child_id: str, session_key: str | None, old_route: str | None, ended: bool
) -> None:
    """Best effort: put the store back as it was before the split started."""
    try:
        if session_key is not None and await db.get_route(session_key) == child_id:
            if old_route is None:
                await db.delete_route(session_key)
            else:
                await db.set_route(session_key, old_route)
        if ended:
            await db.reopen_session(parent_id)
        await db.delete_session(child_id)
    except Exception:  # the original error is the one to raise; say what is left over
        log.exception("could not undo the split of session %s (child %s); check both with 'switchboard sessions'",
                      parent_id, child_id)


async def compress_session(
    db: AsyncSessionDB,
    session_id: str,
    summarize: Summarize,
    *,
    context_length: int,
    threshold: float = 0.75,
    focus: str | None = None,
    session_key: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    head: int = 3,
    min_tail: int = 6,
) -> CompressionResult:
    """Compress ``session_id`` into a child session and return what happened.

    ``summarize(messages)`` gets chat messages (see
    :func:`~compression.prompt.build_summary_request`) and returns the summary
    text; it is given ``timeout`` seconds (None: no limit).  ``focus`` steers
    the summary (``/compress <focus>``).  ``session_key`` is the routing key to
    move to the child; it defaults to the parent's own ``session_key``.

    Raises :class:`NothingToCompress` (too short), :class:`CompressionFailed`
    (the summarizer raised, timed out or returned nothing) and
    :class:`SessionChanged` (the session was ended or lost messages meanwhile);
    in all three cases nothing was written.  ``state.SessionNotFound`` when
    there is no such session.
    """
    parent = await db.get_session(session_id)
    if parent is None:
        raise SessionNotFound(session_id)
    if parent.get("ended_at") is not None:
        raise SessionChanged(session_id, f"was already ended ({parent.get('end_reason') or 'no reason'})")
    stored = await db.get_messages(session_id)
    # Planning and the request are pure CPU (a few ms for hundreds of messages,
    # more with huge tool results): off the event loop, so other chats go on.
    cut, request = await asyncio.to_thread(_prepare, stored, context_length, threshold, head, min_tail, focus)
    if cut is None:
        raise NothingToCompress(session_id, len(stored))

    text = await _summarize(summarize, request, session_id, timeout)

    # The summary took a while: make sure the session is still ours to split.
    parent = await db.get_session(session_id)
    if parent is None:
        raise SessionNotFound(session_id)
    if parent.get("ended_at") is not None:
        raise SessionChanged(session_id, f"was ended ({parent.get('end_reason') or 'no reason'})")
    key = session_key if session_key is not None else parent.get("session_key")

    summary = make_summary_message(text, cut.head[-1] if cut.head else None)
    summary["timestamp"] = cut.head[-1].get("timestamp") if cut.head else cut.tail[0].get("timestamp")
    copied = [_copy(m) for m in cut.head] + [_copy(summary)] + [_copy(m) for m in cut.tail]
    if estimate_tokens(copied) >= cut.tokens_before:
        # A split that saves nothing would only trigger again on the next turn.
        raise CompressionFailed(session_id, "the summary is not shorter than the messages it replaces")

    old_route = await db.get_route(key) if key is not None else None
    child_id, title = await _create_child(db, parent, key)
    ended = False
    try:
        await db.append_messages(child_id, copied)
        if key is not None:
            await db.set_route(key, child_id)
        ended = await db.end_session(session_id, END_REASON)
        if not ended:
            raise SessionChanged(session_id, "was ended by someone else")
        late = await _late_messages(db, session_id, stored)
        if late:
            await db.append_messages(child_id, [_copy(m) for m in late])
    except BaseException:
        await asyncio.shield(_undo(db, session_id, child_id, key, old_route, ended))
        raise

    result = CompressionResult(
        old_session_id=session_id,
        new_session_id=child_id,
        title=title,
        session_key=key,
        messages_before=len(stored) + len(late),
        messages_after=len(copied) + len(late),
        tokens_before=cut.tokens_before + estimate_tokens(late),
        tokens_after=estimate_tokens(copied) + estimate_tokens(late),
        summary=text,
    )
    log.info(
        "compressed session %s into %s: %d -> %d messages, ~%d -> ~%d tokens",
        session_id, child_id, result.messages_before, result.messages_after, result.tokens_before,
        result.tokens_after,
    )
    return result


def _prepare(
    stored: list[dict], context_length: int, threshold: float, head: int, min_tail: int, focus: str | None
) -> tuple[Plan | None, list[dict]]:
    cut = plan(stored, context_length=context_length, threshold=threshold, head=head, min_tail=min_tail)
    return cut, (build_summary_request(cut, focus=focus) if cut is not None else [])


async def _late_messages(db: AsyncSessionDB, session_id: str, stored: list[dict]) -> list[dict]:
    """Messages stored in the parent after ``stored`` was read (a turn racing the compression)."""
    if await db.message_count(session_id) == len(stored):
        return []  # the common case, without reading the whole session again
    now = await db.get_messages(session_id)
    known = {m["id"] for m in stored}
    if not known <= {m["id"] for m in now}:
        raise SessionChanged(session_id, "lost messages")
    return [m for m in now if m["id"] not in known]


__all__ = ["END_REASON", "CompressionResult", "compress_session"]
