"""What the user is told when the model could not answer: one line that says what to do.

    failure_line(ContextTooLong(400, "..."))   # "... Send /compress ... or /new ..."

A refusal (:class:`gateway.errors.ModelRefused`) names what to fix, since
sending the same message again cannot work; anything else is temporary and
the user may simply try again.  The message is stored either way.  No line
carries the endpoint's own words, which may quote part of the API key.
"""

from __future__ import annotations

from gateway.errors import ContextTooLong, ModelAuthRejected, ModelForbidden, ModelNotFound, ModelUnavailable

__all__ = ["failure_line"]

SAVED = "Your message is saved."


def outage_line(exc: ModelUnavailable) -> str:
    """The line for a chat whose messages wait for the model to come back (they are answered then)."""
    return f"The model is unavailable right now ({exc}). Your message is saved: I'll answer it when the model is back."


def failure_line(exc: ModelUnavailable) -> str:
    """The one line sent to the user for a turn that failed with ``exc``."""
    if isinstance(exc, ContextTooLong):
        return ("This conversation no longer fits the model's context window (the model refused it as too long). "
                f"{SAVED} Send /compress to summarize the conversation so far, or /new to start a fresh one.")
    if isinstance(exc, ModelAuthRejected):
        return f"The model endpoint refused the API key (401): check model.api_key in the config. {SAVED}"
    if isinstance(exc, ModelForbidden):
        return (f"The model endpoint refused access to the model (403): check that model.api_key may use "
                f"model.name. {SAVED}")
    if isinstance(exc, ModelNotFound):
        return f"The model endpoint does not know the model (404): check model.name and model.base_url. {SAVED}"
    return f"The model is unavailable right now ({exc}). Your message is saved; send another message to try again."
