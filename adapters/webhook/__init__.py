"""Webhooks: signed JSON requests on the local API (``POST /webhooks/<name>``), replies to a callback URL.

Modules: ``adapter`` (requests in, replies out), ``signing`` (HMAC-SHA256 of timestamp and body, stale
and replayed requests refused), ``payload`` (the body's fields by configurable paths), ``config``
(the ``platforms.webhook`` settings).  docs/webhooks.md is the guide.
"""

from adapters import lazy_exports

from .config import WebhookConfig

__all__ = ["WebhookAdapter", "WebhookConfig"]
__getattr__ = lazy_exports(__name__, {"WebhookAdapter": ".adapter"})
