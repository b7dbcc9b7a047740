"""Context compression: when a conversation outgrows the model's window.

Before a model call the gateway calls :func:`prepare_history`, which asks
:func:`should_compress` (with :func:`prompt_tokens`; the window comes from
:func:`context_length_for` at start) and, when it says yes, calls
:func:`compress_session`, which summarizes the middle of the
conversation through the ``summarize`` callable it is given, ends the session
with ``end_reason='compression'`` and continues it in a child session (head,
summary, tail; title ``#N``; the route moved).  The parent keeps its full
history.  When the conversation is too short to compress
(:class:`NothingToCompress`), :func:`fit_to_window` trims that one prompt.

Modules: ``tokens`` (estimates, context lengths, the trigger), ``planning``
(head / middle / tail), ``summary`` (the marked summary message), ``redaction``
(secrets), ``prompt`` (the summarizer's request), ``split`` (the store-side
split), ``trigger`` (:func:`prepare_history`: the whole before-the-model-call
decision), ``errors``.  This package imports ``state`` and nothing from
``gateway`` or ``adapters``; it never calls a model itself.
"""

from .errors import CompressionError, CompressionFailed, NothingToCompress, SessionChanged, TooLittleToGain
from .planning import Plan, fit_to_window, plan
from .prompt import build_summary_request, render_transcript, target_summary_tokens
from .redaction import REDACTED, redact
from .split import END_REASON, CompressionResult, Summarize, compress_session
from .summary import SUMMARY_MARKER, is_summary, make_summary_message, summary_text
from .tokens import (
    CONTEXT_LENGTHS,
    DEFAULT_CONTEXT_LENGTH,
    IMAGE_TOKENS,
    context_length_for,
    estimate_message_tokens,
    estimate_text_tokens,
    estimate_tokens,
    known_context_length,
    prompt_tokens,
    round_tokens,
    should_compress,
)
from .trigger import Prepared, prepare_history

__all__ = [
    "CONTEXT_LENGTHS",
    "DEFAULT_CONTEXT_LENGTH",
    "END_REASON",
    "IMAGE_TOKENS",
    "REDACTED",
    "SUMMARY_MARKER",
    "CompressionError",
    "CompressionFailed",
    "CompressionResult",
    "NothingToCompress",
    "Plan",
    "Prepared",
    "SessionChanged",
    "Summarize",
    "TooLittleToGain",
    "build_summary_request",
    "compress_session",
    "context_length_for",
    "estimate_message_tokens",
    "estimate_text_tokens",
    "estimate_tokens",
    "fit_to_window",
    "is_summary",
    "known_context_length",
    "make_summary_message",
    "plan",
    "prepare_history",
    "prompt_tokens",
    "redact",
    "render_transcript",
    "round_tokens",
    "should_compress",
    "summary_text",
    "target_summary_tokens",
]
