"""WhatsApp through Meta's WhatsApp Business Cloud API (the Graph API), over aiohttp directly.

Why not ``pywa``: it brings its own webhook server integration (FastAPI or Flask) and handler
registry, and parses a payload before we could check its signature and deduplicate it; the Graph API
we need is six HTTP calls (send, mark read / typing, media get, media download, media upload, the
phone number's own record for ``doctor``), so the adapter speaks them with the aiohttp client the
gateway already ships, and every check Meta documents (X-Hub-Signature-256, the verify token, the
error codes) is ours to read and test.

Modules: ``adapter`` (lifecycle, inbound delivery, sending), ``webhook`` (the verification
handshake and the signed POSTs, on our own aiohttp listener), ``graph`` (the Graph API client and
its error codes), ``events`` (webhook payload -> InboundMessage and statuses), ``format``
(Markdown -> WhatsApp's own markup), ``config`` (the ``platforms.whatsapp`` settings).
"""

from adapters import lazy_exports

from .config import WhatsAppConfig

__all__ = ["WhatsAppAdapter", "WhatsAppConfig"]
__getattr__ = lazy_exports(__name__, {"WhatsAppAdapter": ".adapter"})
