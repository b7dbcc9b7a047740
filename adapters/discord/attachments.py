"""Discord attachments to :class:`~gateway.types.Attachment`.

Images are downloaded (when the model has vision) up to ``max_bytes`` and
passed as bytes; voice messages and audio files up to ``MAX_AUDIO_BYTES``, for
the gateway to transcribe (with Discord's ``duration_secs`` when it gives one);
larger ones, failed downloads and every other file are passed as a
description (name, type, size, URL) without downloading.  A
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
MAX_AUDIO_BYTES = 25 * 1024 * 1024  # what a Discord user without Nitro may upload


def _is_audio(att: discord.Attachment) -> bool:
    return att.is_voice_message() or bool(
        att.content_type and att.content_type.split(";")[0].strip().startswith("audio/"))


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
            if _is_audio(att):
                data = None
                if session is not None and att.size <= MAX_AUDIO_BYTES:
                    data = await _download(session, att.url, MAX_AUDIO_BYTES)
                out.append(Attachment(kind="audio" if data else "file", name=att.filename, mime_type=mime,
                                      size=att.size, url=att.url, data=data, duration=att.duration))
                continue
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
