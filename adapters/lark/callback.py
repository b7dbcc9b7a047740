"""The HTTP callback mode (``mode: http``): events POSTed to ``/lark/events`` on the local API.

What the open platform sends, and what is checked before an event reaches anything:

* with an Encrypt Key set in the developer console, the body is ``{"encrypt": "<base64>"}``: AES-256-CBC
  under SHA-256 of the key, the IV its first 16 bytes, PKCS#7 padded (decrypted with lark-oapi's own
  ``AESCipher``), and every event request carries ``X-Lark-Request-Timestamp``,
  ``X-Lark-Request-Nonce`` and ``X-Lark-Signature``, the hex SHA-256 of timestamp + nonce + key + the
  raw body.  The key is required here: without it the platform neither encrypts nor signs, and
  anyone who learnt the token could write as any user.  A body that is not encrypted, cannot be
  decrypted, or is signed wrongly is refused (401) and reaches nothing;
* the Verification Token, in the event's ``header.token`` (schema 2.0) or ``token`` (the
  url_verification request), compared in constant time: a wrong or missing one is 401;
* ``url_verification``: the console's check of the URL (encrypted, not signed), answered
  ``{"challenge": ...}``.

An event that passes is the same JSON the long connection carries; the adapter hands it over and
answers 200 once it is stored (500: the platform sends it again), deduplicating by event id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from gateway.errors import AdapterError
from gateway.types import HttpRequest

from .sdk import AESCipher

__all__ = ["Callback", "CallbackKeys", "Refused", "open_callback"]

URL_VERIFICATION = "url_verification"


class Refused(AdapterError):
    """A callback request that is not the platform's (``status`` and why)."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


@dataclass(frozen=True, slots=True, repr=False)
class CallbackKeys:
    verification_token: str
    encrypt_key: str


@dataclass(frozen=True, slots=True)
class Callback:
    """A checked request: the url_verification's ``challenge``, or an ``event``."""

    challenge: str | None = None
    event: dict | None = None


def _same(a: object, b: str) -> bool:
    return isinstance(a, str) and bool(a) and hmac.compare_digest(a.encode(), b.encode())


def _plaintext(body: bytes, keys: CallbackKeys) -> dict:
    try:
        outer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, "the body is not JSON") from None
    if not isinstance(outer, dict):
        raise Refused(400, "the body is not a JSON object")
    encrypted = outer.get("encrypt")
    if not isinstance(encrypted, str):
        raise Refused(401, "the body is not encrypted, but every request of the platform is "
                           "(platforms.lark.encrypt_key is the console's Encrypt Key)")
    try:
        inner = json.loads(AESCipher(keys.encrypt_key).decrypt_str(encrypted))
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        raise Refused(401, "the body does not decrypt with platforms.lark.encrypt_key (is it the console's "
                           "current Encrypt Key?)") from None
    if not isinstance(inner, dict):
        raise Refused(400, "the decrypted body is not a JSON object")
    return inner


def _check_signature(request: HttpRequest, key: str) -> None:
    timestamp = request.headers.get("x-lark-request-timestamp", "")
    nonce = request.headers.get("x-lark-request-nonce", "")
    signature = request.headers.get("x-lark-signature", "")
    if not (timestamp and nonce and signature):
        raise Refused(401, "the request is not signed (X-Lark-Signature and its timestamp and nonce)")
    expected = hashlib.sha256((timestamp + nonce + key).encode() + request.body).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise Refused(401, "the signature does not match (X-Lark-Signature)")


def open_callback(request: HttpRequest, keys: CallbackKeys) -> Callback:
    """Decrypt and check one callback request; raises :class:`Refused` for anything not the platform's."""
    event = _plaintext(request.body, keys)
    if event.get("type") == URL_VERIFICATION:
        if not _same(event.get("token"), keys.verification_token):
            raise Refused(401, "the url_verification names another Verification Token "
                               "(platforms.lark.verification_token)")
        challenge = event.get("challenge")
        if not isinstance(challenge, str):
            raise Refused(400, "a url_verification without a challenge")
        return Callback(challenge=challenge)
    _check_signature(request, keys.encrypt_key)
    header = event.get("header")
    token = header.get("token") if isinstance(header, dict) else event.get("token")
    if not _same(token, keys.verification_token):
        raise Refused(401, "the event names another Verification Token (platforms.lark.verification_token)")
    return Callback(event=event)
