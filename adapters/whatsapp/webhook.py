"""The webhook Meta calls: the verification handshake and the signed POSTs.

    GET  /whatsapp/webhook?hub.mode=subscribe&hub.verify_token=T&hub.challenge=C  -> 200 C (T is ours) | 403
    POST /whatsapp/webhook  X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body with the app secret>
                 -> 200 once every message in it is stored (or it is unreadable: asking again would not
                    help); 401 unsigned or forged (nothing parsed);
                    500 when the gateway could not store one (Meta retries the POST)

The path is served by the daemon's local API (``WhatsAppConfig.HTTP_PATHS``, mounted by
``gateway.runtime.platform_http``), which hands the request over read whole; the API's bearer token
does not apply there, this signature does.  The signature is checked on the raw bytes before
anything is parsed, in constant time, so a forged request costs one HMAC and reaches nothing.
Bodies over :data:`MAX_BODY` are refused unparsed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024  # Meta's payloads are a few KB; media come by id, never inline
SIGNATURE_HEADER = "x-hub-signature-256"

Deliver = Callable[[dict], Awaitable[bool]]  # True once the payload may be acknowledged


def signature(app_secret: str, body: bytes) -> str:
    """The X-Hub-Signature-256 value Meta sends for ``body``."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookEndpoint:
    """What the webhook answers, independent of the server it runs on."""

    def __init__(self, *, app_secret: str, verify_token: str, deliver: Deliver):
        self._secret = app_secret.encode()
        self._verify = verify_token.encode()
        self._deliver = deliver
        self.refused = 0  # POSTs refused for their signature or size

    def verify(self, query: dict[str, str]) -> tuple[int, str]:
        given = query.get("hub.verify_token", "").encode()
        if query.get("hub.mode") == "subscribe" and hmac.compare_digest(given, self._verify):
            return 200, query.get("hub.challenge", "")
        return 403, "verification refused: hub.verify_token is not platforms.whatsapp.verify_token"

    def signed(self, headers: dict[str, str], body: bytes) -> bool:
        given = headers.get(SIGNATURE_HEADER, "")
        if not given.startswith("sha256="):
            return False
        expected = "sha256=" + hmac.new(self._secret, body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(given.encode(), expected.encode())

    async def handle(self, method: str, query: dict[str, str], headers: dict[str, str],
                     body: bytes) -> tuple[int, str]:
        """(status, text) for one request; ``headers`` lower-cased.  Never raises."""
        if method == "GET":
            return self.verify(query)
        if method != "POST":
            return 405, "GET (verification) or POST (events) only"
        if len(body) > MAX_BODY:
            self.refused += 1
            return 413, f"refused: over {MAX_BODY} bytes (Meta's payloads are a few KB)"
        if not self.signed(headers, body):
            self.refused += 1
            return 401, "refused: X-Hub-Signature-256 is missing or does not match the app secret"
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):  # signed by Meta, so asking again would bring the same bytes
            log.warning("whatsapp: a signed webhook POST is not a JSON object (%d bytes); acknowledged and dropped",
                        len(body))
            return 200, "not a JSON object: ignored"
        try:
            ok = await self._deliver(payload)
        except Exception:  # Meta delivers it again
            log.exception("whatsapp: a webhook payload could not be handed over; Meta will retry it")
            ok = False
        return (200, "ok") if ok else (500, "not stored yet: deliver it again")
