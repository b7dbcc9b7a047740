"""Attachments: images downloaded (bounded) for a vision model, other files described.

An image is downloaded only when vision is on and it fits ``max_image_bytes``
(for photos, the largest size Telegram offers that fits).  Anything else, and
any image that is too big or fails to download, becomes an
``Attachment(kind="file")`` with name, type and size, so the message still
goes through and the model knows something was attached.
"""

from __future__ import annotations

import logging
from typing import Sequence

from telegram import Bot, Message, PhotoSize

from gateway.types import Attachment

from .redact import describe

log = logging.getLogger(__name__)

_OTHER_MEDIA = ("audio", "video", "voice", "video_note", "animation", "sticker")


async def collect_attachments(bot: Bot, message: Message, *, vision: bool, max_image_bytes: int) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    if message.photo:
        found.append(await _photo(bot, message.photo, vision=vision, limit=max_image_bytes))
    doc = message.document
    if doc is not None:
        mime = doc.mime_type or None
        if mime and mime.startswith("image/"):
            found.append(await _image(bot, doc.file_id, doc.file_name or "image", mime, doc.file_size,
                                      vision=vision, limit=max_image_bytes))
        else:
            found.append(Attachment(kind="file", name=doc.file_name or "file", mime_type=mime, size=doc.file_size))
    for kind in _OTHER_MEDIA:
        media = getattr(message, kind, None)
        if media is None or (kind == "animation" and doc is not None):  # a GIF comes as both
            continue
        found.append(Attachment(kind="file", name=getattr(media, "file_name", None) or kind,
                                mime_type=getattr(media, "mime_type", None), size=getattr(media, "file_size", None)))
    return tuple(found)


async def _photo(bot: Bot, sizes: Sequence[PhotoSize], *, vision: bool, limit: int) -> Attachment:
    fitting = [p for p in sizes if p.file_size is None or p.file_size <= limit]  # smallest first
    best = fitting[-1] if fitting else sizes[-1]
    return await _image(bot, best.file_id, "photo.jpg", "image/jpeg", best.file_size, vision=vision, limit=limit)


async def _image(bot: Bot, file_id: str, name: str, mime: str, size: int | None, *, vision: bool,
                 limit: int) -> Attachment:
    if not vision:
        return Attachment(kind="image", name=name, mime_type=mime, size=size)
    if size is not None and size > limit:
        log.info("not downloading a %d-byte image (limit %d bytes)", size, limit)
        return Attachment(kind="file", name=name, mime_type=mime, size=size)
    try:
        file = await bot.get_file(file_id)
        if file.file_size is not None and file.file_size > limit:
            raise ValueError(f"{file.file_size} bytes is over the {limit}-byte limit")
        data = bytes(await file.download_as_bytearray())
        if len(data) > limit:
            raise ValueError(f"{len(data)} bytes is over the {limit}-byte limit")
    except Exception as exc:  # noqa: BLE001 - the message still goes through without the image
        log.warning("could not download a telegram image: %s", describe(exc))
        return Attachment(kind="file", name=name, mime_type=mime, size=size)
    return Attachment(kind="image", name=name, mime_type=mime, size=len(data), data=data)
