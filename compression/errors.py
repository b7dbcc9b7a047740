"""The compression package's errors.

    CompressionError                 root of everything compression raises on purpose
    ├── NothingToCompress            too few messages to gain anything; nothing changed
    ├── TooLittleToGain              a split would leave too little room under the threshold to be
    │                                worth a new session (.tokens_before, .tokens_after, .limit);
    │                                nothing changed and no model was asked
    ├── CompressionFailed            the summarizer raised, timed out or answered nothing;
    │                                nothing changed (the summarizer's error is ``__cause__``)
    └── SessionChanged               the session ended or lost messages while being compressed;
                                     nothing changed

``compress_session`` raises only these (and ``state`` errors from the store
itself), always before anything was written (the split is one store
transaction), so the gateway can catch :class:`CompressionError`, answer the
turn uncompressed and, after a :class:`CompressionFailed`, start its cooldown.
``prepare_history`` catches them itself and returns the reason in
``Prepared.failure``.
"""

from __future__ import annotations

from .tokens import round_tokens


class CompressionError(Exception):
    """A compression did not happen; the session is as it was."""


class NothingToCompress(CompressionError):
    """The conversation is too short for a compression to gain anything."""

    def __init__(self, session_id: str, message_count: int):
        self.session_id = session_id
        self.message_count = message_count
        super().__init__(
            f"nothing to compress: session {session_id} has {message_count} messages, all of them in the "
            "protected head and recent tail; nothing was changed"
        )


class TooLittleToGain(CompressionError):
    """A split would leave the conversation too close to the threshold to be worth a new session;
    the session was left as it was and no model was asked."""

    def __init__(self, session_id: str, tokens_before: int, tokens_after: int, limit: int):
        self.session_id = session_id
        self.tokens_before = tokens_before
        self.tokens_after = tokens_after  # the child's expected size
        self.limit = limit  # the most the child could hold for the split to be worth it
        super().__init__(
            f"not compressing session {session_id}: a split would save too little "
            f"(~{round_tokens(tokens_before):,} → ~{round_tokens(tokens_after):,} tokens, where at most "
            f"~{round_tokens(limit):,} leave room to go on); nothing was changed. "
            "A larger model.context_length, or /new, gives the conversation room"
        )


class CompressionFailed(CompressionError):
    """The summarizer failed; the session was left as it was."""

    def __init__(self, session_id: str, reason: str):
        self.session_id = session_id
        self.reason = reason
        super().__init__(
            f"compression of session {session_id} failed: {reason}; nothing was changed. "
            "Check the compression model's endpoint, or try /compress again later"
        )


class SessionChanged(CompressionError):
    """The session was ended or rewritten while its summary was being written."""

    def __init__(self, session_id: str, reason: str):
        self.session_id = session_id
        self.reason = reason
        super().__init__(f"session {session_id} {reason} during compression; nothing was changed")
