"""Wiring the ``compression`` package into the gateway: the trigger before each model call, ``/compress``.

:class:`Compressor` is the turn's ``before_model_call`` hook.  It remembers
the model's last reported ``usage.prompt_tokens`` per session (and how many
history messages that prompt held) so :func:`compression.prepare_history`
can size the next prompt without a tokenizer, and a cooldown per session
after a failed compression so a broken summarizer never loops.  A
compression runs inside its own session's turn: other sessions go on.
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable, Mapping

import compression
from gateway.model import ModelClient
from gateway.turn import TurnRequest
from gateway.usage import OTHER, CallContext, for_session

log = logging.getLogger(__name__)

RESERVE_FOR_ANSWER = 1024  # at most; a small window keeps a quarter of itself for the answer
MAX_REMEMBERED = 20_000  # sessions whose last reported prompt size is kept


class Compressor:
    def __init__(self, db, model: ModelClient, *, context_length: int, threshold: float, summary_model: str | None,
                 timeout: float, cooldown: float, enabled: bool = True,
                 before_split: Callable[[str], Awaitable[object]] | None = None,
                 after_split: Callable[[str, str], object] | None = None, clock=time.monotonic,
                 context_lengths: Mapping[str, int] | None = None):
        self.db = db
        self.model = model
        self.context_length = context_length  # the default model's window
        # the named models' windows (``models.<name>.context_length``), for a chat that chose one
        self.context_lengths = dict(context_lengths or {})
        self.threshold = threshold
        self.summary_model = summary_model
        self.timeout = timeout
        self.cooldown = cooldown
        self.enabled = enabled
        self.clock = clock
        self._reported: dict[str, tuple[int, int]] = {}  # session -> (prompt_tokens, history messages)
        self._failed_at: dict[str, float] = {}
        # sessions told that compressing them would save too little: the line is said once
        self._told_too_little: dict[str, None] = {}
        # Called with the session id once a compression is decided, before the summary is asked
        # for: the memory turn that keeps what matters before the middle is summarized.
        self.before_split = before_split
        # Told (the old session id, its key) once a compression moved the conversation to a new
        # session, in the task that compressed: fact extraction of the session left behind.
        self.after_split = after_split

    async def summarize(self, messages: list[dict], purpose: CallContext = OTHER) -> str:
        completion = await self.model.complete(messages, model=self.summary_model, timeout=self.timeout,
                                               purpose=purpose)
        return completion.message.get("content") or ""

    def _summarizer_for(self, session_id: str, session_key: str):
        before_split = self.before_split
        purpose = for_session("compression", session_id, session_key)

        async def summarize(messages: list[dict]) -> str:
            if before_split is not None:
                await before_split(session_id)
            return await self.summarize(messages, purpose)

        return summarize

    def record_usage(self, session_id: str, prompt_tokens: int, history_messages: int) -> None:
        if prompt_tokens > 0:
            self._reported.pop(session_id, None)
            self._reported[session_id] = (prompt_tokens, history_messages)
            if len(self._reported) > MAX_REMEMBERED:  # the oldest report: a later turn just estimates
                self._reported.pop(next(iter(self._reported)))

    def window_of(self, model: str | None) -> int:
        """The context window of the named model a turn runs on (``default`` or None: the chat's own): the
        one the model's server named in a context-length error this run, else the configured one."""
        learned = getattr(self.model, "learned_window", None)
        known = learned(model) if learned is not None else None
        return known or self.context_lengths.get(model or "", self.context_length)

    def _cooling_down(self, session_id: str) -> bool:
        failed = self._failed_at.get(session_id)
        return failed is not None and self.clock() - failed < self.cooldown

    async def before_model_call(self, req: TurnRequest, history: list[dict], system_tokens: int) -> tuple[str, list[dict], list[str]]:
        """The history to send (maybe from a new child session) and lines for the user."""
        reported = self._reported.get(req.session_id)
        window = self.window_of(req.model)
        prepared = await compression.prepare_history(
            self.db, req.session_id, history, self._summarizer_for(req.session_id, req.session_key),
            context_length=window, threshold=self.threshold,
            reported_prompt_tokens=reported[0] if reported else None,
            reported_message_count=reported[1] if reported else None,
            overhead_tokens=system_tokens, reserve_tokens=min(RESERVE_FOR_ANSWER, window // 4),
            allow_compression=self.enabled and not self._cooling_down(req.session_id),
            session_key=req.session_key, timeout=self.timeout, summary_window=self.window_of(self.summary_model),
        )
        if isinstance(prepared.failure, compression.CompressionFailed):
            now = self.clock()
            self._failed_at = {sid: at for sid, at in self._failed_at.items() if now - at < self.cooldown}
            self._failed_at[req.session_id] = now
        if prepared.compressed is not None:
            self._reported.pop(req.session_id, None)
        if prepared.session_id != req.session_id:
            self._split(req.session_id, req.session_key)
        notice = prepared.notice
        if prepared.compressed is None and (prepared.dropped or prepared.overflows
                                            or isinstance(prepared.failure, compression.TooLittleToGain)):
            # that no split can make room (and that old messages are left out) is said once a session;
            # the turns after it go on quietly
            if req.session_id in self._told_too_little:
                notice = None
            else:
                self._told_too_little[req.session_id] = None
                if len(self._told_too_little) > MAX_REMEMBERED:
                    self._told_too_little.pop(next(iter(self._told_too_little)))
        return prepared.session_id, prepared.history, [notice] if notice else []

    async def compress_now(self, session_id: str, session_key: str, focus: str | None,
                           model: str | None = None) -> tuple[str, str]:
        """``/compress [focus]``: returns (the session to continue in, the line for the user)."""
        try:
            result = await compression.compress_session(
                self.db, session_id, self._summarizer_for(session_id, session_key),
                context_length=self.window_of(model),
                threshold=self.threshold,
                focus=focus, session_key=session_key, timeout=self.timeout,
            )
        except compression.NothingToCompress:
            return session_id, "Nothing to compress yet: the conversation is still short. Nothing was changed."
        except compression.CompressionError as exc:
            log.warning("/compress of %s failed: %s", session_id, exc)
            return session_id, f"Compression failed ({exc}). Nothing was changed; the conversation goes on as it was."
        self._reported.pop(session_id, None)
        if result.new_session_id != session_id:
            self._split(session_id, session_key)
        return result.new_session_id, result.describe()

    def _split(self, session_id: str, session_key: str) -> None:
        if self.after_split is not None:
            self.after_split(session_id, session_key)
