"""The platform adapters, one package per platform on its real library.

Their errors derive from ``gateway.errors.AdapterError`` (drawn in :mod:`gateway.errors`):

    AdapterError                     a platform adapter could not start or deliver
    ├── PlatformHTTPError            (gateway.errors) the platform answered with an error status
    │   └── GraphError               whatsapp/graph.py: Meta refused a Graph API call (its code kept)
    │       ├── TokenRefused         190 / HTTP 401: the access token is invalid; no send retries it
    │       ├── Throttled            130429, 131056: Meta asked us to slow down; waited out with backoff
    │       └── OutsideWindow        131047: past the user's 24-hour window; the configured template
    │                                instead, or a failed Delivery that says so
    ├── RateLimited                  (gateway.errors) the platform said "wait retry_after seconds"
    ├── NotConnected                 discord/outbound.py: no logged-in client right now
    │                                (starting or reconnecting); the send is retried
    ├── _Fatal                       discord/adapter.py, internal: a start failure retrying cannot
    │                                fix (bad token, missing intent); its message says what to change
    ├── PartFailed                   slack/outbound.py, teams/outbound.py: one part of a reply was not
    │                                delivered; the adapter reports a failed Delivery with the reason
    ├── SignalError                  signal/rpc.py: signal-cli answered a JSON-RPC error (its code kept)
    │   ├── SignalThrottled          Signal's rate limit (a RATE_LIMIT_FAILURE result): waited out
    │   └── SignalUnavailable        signal-cli did not answer (down, restarting, 5xx): retried
    ├── SmtpRefused                  email/outbound.py: the SMTP server refused the reply for good (5xx)
    ├── ImapError                    email/outbound.py: the IMAP server refused a command or the
    │                                connection failed
    ├── Refused                      webhook/signing.py: a hook's request refused (unsigned, forged,
    │                                stale, replayed, a body without sender or text); its status and why
    ├── CallbackFailed               webhook/adapter.py: the callback refused a reply with a 4xx that a
    │                                retry will not change; the reply is set aside as a dead letter
    ├── Unauthorized                 teams/auth.py: an activity whose token is missing, malformed or not
    │                                signed by a key Microsoft publishes; answered 401, it reaches nothing
    ├── CredentialsRejected          teams/auth.py, lark/api.py: the token endpoint refused the app id or
    │                                secret; retrying cannot help, the start fails naming the keys
    ├── AppRefused                   lark/connection.py: the open platform refused the app on the long
    │                                connection's endpoint (a wrong id or secret)
    └── Refused                      lark/callback.py (as webhook/signing.py's): a callback request that
                                     is not the platform's (unsigned, undecryptable); its status and why

An adapter's start raises ``AdapterError`` with a message naming the config key
to fix; a send never raises: it returns a ``Delivery`` that says what failed.

A package's ``config`` module holds its settings model; the gateway loads it
through the ``switchboard.adapter_configs`` entry point without loading the
platform's library, so each package imports its adapter lazily
(:func:`lazy_exports`).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a name to the submodule
    (``".adapter"``) it is imported from on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    return __getattr__
