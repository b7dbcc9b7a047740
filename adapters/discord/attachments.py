"""Discord attachments to :class:`~gateway.types.Attachment`.

Images are downloaded (when the model has vision) up to ``max_bytes`` and
passed as bytes; larger ones, failed downloads and every other file are
passed as a description (name, type, size, URL) without downloading.  A
broken attachment is logged and skipped; it never stops the message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

import aiohttp
import discord

from gateway.types import Attachment

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT = aiohttp.ClientTimeout(total=30)


def _is_image(att: discord.Attachment) -> bool:
    return bool(att.content_type and att.content_type.split(";")[0].strip().startswith("image/"))


async def _download(session: aiohttp.ClientSession, url: str, max_bytes: int) -> bytes | None:
    """The body of ``url``, or None when it is not 200 or larger than ``max_bytes``."""
    async with session.get(url, timeout=DOWNLOAD_TIMEOUT) as resp:
        if resp.status != 200:
            log.warning("discord attachment download answered %s; passing the image without its bytes", resp.status)
            return None
        data = await resp.content.read(max_bytes + 1)
        if len(data) > max_bytes:
            log.warning("discord attachment is larger than %d bytes; passing it without its bytes", max_bytes)
            return None
        return data


async def collect(
    attachments: Iterable[discord.Attachment],
    session: aiohttp.ClientSession | None,
    *,
    vision: bool,
    max_image_bytes: int,
) -> tuple[Attachment, ...]:
    out: list[Attachment] = []
    for att in attachments:
        try:
            mime = att.content_type.split(";")[0].strip() if att.content_type else None
            if not _is_image(att):
                out.append(Attachment(kind="file", name=att.filename, mime_type=mime, size=att.size, url=att.url))
                continue
            data = None
            if vision and session is not None:
                if att.size > max_image_bytes:
                    log.info("discord image %s is %d bytes (limit %d); not downloaded", att.id, att.size, max_image_bytes)
                else:
                    data = await _download(session, att.url, max_image_bytes)
            out.append(Attachment(kind="image", name=att.filename, mime_type=mime, size=att.size, url=att.url, data=data))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad attachment must not lose the message
            log.warning("discord attachment %s skipped: %s", getattr(att, "id", "?"), type(exc).__name__)
    return tuple(out)
