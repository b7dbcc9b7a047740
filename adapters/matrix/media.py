"""Files people send: fetched from the content repository (``mxc://``) within their kind's limit.

An ``m.image``, ``m.file``, ``m.audio`` (a voice message carries ``org.matrix.msc3245.voice``) is
downloaded through nio's authenticated media API when it fits ``media.max_bytes`` for its kind and
``platforms.matrix.max_media_bytes``; the gateway keeps it in the media store (a voice message is
transcribed there like the other platforms').  Videos, anything too big, anything whose download
fails are passed with name, type and size only, so the message still goes through and the model knows
something came.  A file in an encrypted room (``content.file``: its ``url`` with the AES key, IV and
SHA-256 the Megolm-encrypted event carried) is downloaded the same way and decrypted here; one whose
hash does not match is described only.  Only
``mxc://`` URIs are fetched, and only from our homeserver's media API: never a URL a message names.
"""

from __future__ import annotations

import logging

from nio import AsyncClient, MemoryDownloadResponse
from nio.crypto.attachments import decrypt_attachment

from gateway.types import Attachment, MediaLimits, attachment_kind

from .events import VOICE_KEY

log = logging.getLogger(__name__)


async def collect(client: AsyncClient, content: dict, *, limits: MediaLimits, cap: int) -> tuple[Attachment, ...]:
    msgtype = content.get("msgtype")
    if msgtype not in ("m.image", "m.file", "m.audio", "m.video"):
        return ()
    info = content.get("info") if isinstance(content.get("info"), dict) else {}
    name = content.get("filename") or content.get("body") or "file"
    name = name if isinstance(name, str) and name.strip() else "file"
    mime = info.get("mimetype") if isinstance(info.get("mimetype"), str) else None
    size = info.get("size") if isinstance(info.get("size"), int) else None
    duration = info.get("duration") / 1000 if isinstance(info.get("duration"), (int, float)) else None
    if msgtype == "m.image":
        kind = "image"
    elif msgtype == "m.audio":
        kind = "audio"
        if VOICE_KEY in content and not mime:
            mime = "audio/ogg"
    elif msgtype == "m.video":
        kind = "file"
    else:
        kind = attachment_kind(mime, name)
    described = Attachment(kind=kind, name=name, mime_type=mime, size=size, duration=duration)
    secret = content.get("file") if isinstance(content.get("file"), dict) else None
    url = secret.get("url") if secret is not None else content.get("url")
    if msgtype == "m.video" or not isinstance(url, str) or not url.startswith("mxc://"):
        return (described,)
    limit = min(limits.for_kind(kind), cap)
    if size is not None and size > limit:
        log.info("not downloading a %d-byte matrix %s (limit %d bytes)", size, kind, limit)
        return (described,)
    try:
        resp = await client.download(mxc=url)
    except Exception as exc:  # noqa: BLE001 - the message still goes through without the file
        log.warning("could not download a matrix %s: %s: %s", kind, type(exc).__name__, exc)
        return (described,)
    if not isinstance(resp, MemoryDownloadResponse):
        log.warning("could not download a matrix %s: %s", kind, resp)
        return (described,)
    data = bytes(resp.body)
    if secret is not None:
        try:
            data = decrypt_attachment(data, secret["key"]["k"], secret["hashes"]["sha256"], secret["iv"])
        except Exception as exc:  # noqa: BLE001 - a wrong key or hash: described, never passed on as it is
            log.warning("could not decrypt a matrix %s: %s: %s", kind, type(exc).__name__, exc)
            return (described,)
    if len(data) > limit:
        log.info("a matrix %s of %d bytes is over its %d-byte limit; described only", kind, len(data), limit)
        return (described,)
    return (Attachment(kind=kind, name=name, mime_type=mime or resp.content_type or None, size=len(data),
                       data=data, duration=duration),)
