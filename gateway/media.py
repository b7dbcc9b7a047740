"""The media a conversation brought: kept as files, remembered by the agent, gone with their session.

- :meth:`MediaService.keep` takes a message's downloaded attachments: each file goes to the
  media folder (``state.media_files``, content-addressed, outside the database), a document's
  text is read once (``gateway.media_read``), and the message refers to them by hash
  (``db.media``).  A file that cannot be used is still referred to, with one line saying why,
  which the user is told.
- :meth:`MediaService.expand` is what a turn sends: a stored user message with media gets its
  documents' text and its images' descriptions, and the last ``media.images_in_context`` images
  of the session go to a vision model again as pictures.  For a model without vision an image
  is described once by ``media.describe_with`` and the description stored as the message's text
  part.
- :meth:`MediaService.audio_of` reads a stored message's audio back from the media folder, for a
  voice message transcribed after a restart or on another instance of a cluster (``gateway.voice``).
- :meth:`MediaService.sweep` deletes the files no message (and no dead letter) refers to any more.

Disk work runs on a worker thread; the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from gateway.media_read import Reading, read_file
from gateway.types import Attachment, MediaLimits, article
from state import AsyncSessionDB
from state.media_files import SWEEP_GRACE_SECONDS, MediaFiles, Swept

log = logging.getLogger(__name__)

DESCRIBE_PROMPT = ("Describe this picture for someone who cannot see it, in at most three sentences: what it "
                   "shows, and any text in it word for word.")
DEFAULT_LIMITS = MediaLimits()
#: the longest a file is read for (a document's text); past it the file is kept without
READ_TIMEOUT_SECONDS = 30.0
#: a description is cut here (it is stored, and sent with every later turn)
MAX_DESCRIPTION_CHARS = 1_000

# (image bytes, its type) -> its description; None when it could not be described
Describer = Callable[[bytes, str], Awaitable[str | None]]


@dataclass(frozen=True, slots=True)
class Kept:
    """What :meth:`MediaService.keep` stored for one message: the references, and the lines for the
    user about the files that could not be used."""

    items: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()


class MediaService:
    def __init__(self, db: AsyncSessionDB, files: MediaFiles, *, limits: MediaLimits = DEFAULT_LIMITS,
                 images_in_context: int = 4, max_document_chars: int = 50_000,
                 describer: Describer | None = None, vision: Callable[[str | None], bool] = lambda model: False,
                 read_timeout: float = READ_TIMEOUT_SECONDS):
        self.db = db
        self.read_timeout = read_timeout
        self._vision = vision
        self.files = files
        self.limits = limits
        self.images_in_context = images_in_context
        self.max_document_chars = max_document_chars
        self.describer = describer
        self._undescribable: set[str] = set()  # tried and failed this run: not asked again every turn

    @classmethod
    def from_config(cls, cfg, db: AsyncSessionDB, *, describer: Describer | None = None) -> MediaService:
        m = cfg.media
        return cls(db, MediaFiles(cfg.media_path), limits=media_limits(cfg),
                   images_in_context=m.images_in_context, max_document_chars=m.max_document_chars,
                   describer=describer, vision=lambda name: vision_of(cfg, name))

    def vision_of(self, model: str | None) -> bool:
        """Whether the model a turn runs on (a name under ``models``; None or ``default``: ``model``) sees pictures."""
        return self._vision(model)

    # -- a message's files in --------------------------------------------------------------
    async def keep(self, message_id: int | None, attachments: Sequence[Attachment]) -> Kept:
        """Store the attachments that came with their bytes and refer ``message_id`` to them."""
        items: list[dict] = []
        notes: list[str] = []
        for a in attachments:
            if a.data is None:
                continue
            kind = a.kind if a.kind in ("image", "audio", "document") else "document"
            limit = self.limits.for_kind(kind)
            if len(a.data) > limit:
                notes.append(f"{a.name} is {len(a.data):,} bytes, more than the {limit:,} kept for {article(kind)}; "
                             "only its name reaches the model.")
                continue
            reading = await self._read(kind, a)
            sha = await asyncio.to_thread(self.files.put, a.data)
            items.append({"sha256": sha, "name": a.name, "mime": reading.mime, "size": len(a.data),
                          "kind": reading.kind, "text": reading.text, "note": reading.note})
            if reading.note:
                notes.append(f"{a.name} {reading.note}.")
        if message_id is not None and items:
            await self.db.media.attach(message_id, items)
        return Kept(tuple(items), tuple(notes))

    async def _read(self, kind: str, a: Attachment) -> Reading:
        """What ``a`` really is and its text, on a worker thread, within ``read_timeout`` seconds (a crafted
        PDF can make a parser work for minutes: the message goes on without its text)."""
        assert a.data is not None
        work = asyncio.to_thread(read_file, kind, a.name, a.mime_type, a.data, max_chars=self.max_document_chars)
        try:
            return await asyncio.wait_for(work, self.read_timeout)
        except asyncio.TimeoutError:
            log.warning("reading %s took over %g s; kept without its text", a.name, self.read_timeout)
            return Reading(kind, a.mime_type, note=f"took too long to read (over {self.read_timeout:g} s); "
                                                   "only its name reaches the model")

    async def keep_notes(self, message_id: int, attachments: tuple[Attachment, ...]) -> tuple[str, ...]:
        """:meth:`keep`, giving only the lines for the user (``gateway.router.SessionHooks.keep_media``)."""
        return (await self.keep(message_id, attachments)).notes

    async def audio_of(self, message_id: int) -> tuple[Attachment, ...]:
        """The audio ``message_id`` brought, in order, read back from the media folder (a file gone
        with its session has no ``data``); what ``gateway.router.SessionHooks.stored_audio`` gives."""
        rows = [row for row in await self.db.media.of_message(message_id) if row["kind"] == "audio"]
        out: list[Attachment] = []
        for row in rows:
            data = await asyncio.to_thread(self.files.read, row["sha256"])
            out.append(Attachment("audio", row["name"], row.get("mime"), row.get("size"), data=data))
        return tuple(out)

    # -- what a turn sends -------------------------------------------------------------------
    async def expand(self, session_id: str, history: list[dict], *, vision: bool,
                     rows: tuple[dict, ...] | None = None) -> list[dict]:
        """``history`` (the session as stored) with each user message's media in it: documents' text,
        images' descriptions, and the last ``images_in_context`` images as pictures when ``vision``.
        ``rows``: the media of the session's lineage, read already with the turn's context (None: read now)."""
        found = list(rows) if rows is not None else await self.db.media.of_lineage(session_id)
        if not found:
            return history
        matched = _align(history, _by_message(found))
        if not matched:
            return history
        if not vision and self.describer is not None:
            await self._describe_missing([item for items in matched.values() for item in items])
        pictures: dict[int, list[dict]] = {}
        if vision:
            for i, item in self._pictures(history, matched):
                data = await asyncio.to_thread(self.files.read, item["sha256"])
                if data is not None:
                    url = f"data:{item.get('mime') or 'image/jpeg'};base64,{base64.b64encode(data).decode()}"
                    pictures.setdefault(i, []).append({"type": "image_url", "image_url": {"url": url}})
        out = list(history)
        for i, items in matched.items():
            text = _with_media_text(out[i].get("content") or "", items)
            out[i] = {**out[i], "content": [{"type": "text", "text": text}, *pictures[i]] if i in pictures else text}
        return out

    def _pictures(self, history: list[dict], matched: dict[int, list[dict]]) -> list[tuple[int, dict]]:
        """The pictures a vision model is sent with ``history``: those of the messages this turn answers,
        always, and the last ``images_in_context`` of the session; never one with a note (unusable)."""
        images = [(i, item) for i in sorted(matched) for item in matched[i]
                  if item["kind"] == "image" and not item.get("note")]
        asked = _first_unanswered(history)
        recent = images[-self.images_in_context:] if self.images_in_context else []
        return [(i, item) for i, item in images if i >= asked or (i, item) in recent]

    async def refused(self, session_id: str, history: list[dict], reason: str) -> tuple[str, ...]:
        """The model refused the pictures :meth:`expand` put in ``history`` (``reason``, e.g. "HTTP 400:
        invalid_image_format"): those of the messages the turn answers (the new ones; the others were taken
        before), else all of them, are noted as refused and never sent again.  Returns their names."""
        rows = await self.db.media.of_lineage(session_id)
        matched = _align(history, _by_message(rows)) if rows else {}
        sent = self._pictures(history, matched)
        asked = _first_unanswered(history)
        suspects = [item for i, item in sent if i >= asked] or [item for _, item in sent]
        note = f"was refused by the model ({reason}), so it is no longer shown to it"
        for item in suspects:
            await self.db.media.set_note(item["sha256"], note)
            log.warning("the model refused image %s (%s); it is not sent again", item["name"], reason)
        return tuple(dict.fromkeys(item["name"] for item in suspects))

    async def _describe_missing(self, items: list[dict]) -> None:
        assert self.describer is not None
        for item in items:
            sha = item["sha256"]
            if item["kind"] != "image" or item.get("text") or item.get("note") or sha in self._undescribable:
                continue
            data = await asyncio.to_thread(self.files.read, sha)
            description = None
            if data is not None:
                try:
                    description = await self.describer(data, item.get("mime") or "image/jpeg")
                except Exception as exc:  # noqa: BLE001 - the turn goes on with the image's name alone
                    log.warning("describing image %s failed: %s", item["name"], exc)
            if not description:
                self._undescribable.add(sha)
                continue
            description = description.strip()[:MAX_DESCRIPTION_CHARS]
            await self.db.media.set_text(sha, description)
            item["text"] = description

    # -- files that nothing refers to any more -----------------------------------------------
    async def sweep(self, *, doomed: Sequence[str] = (), grace_seconds: float = SWEEP_GRACE_SECONDS) -> Swept:
        """Delete the files no message or dead letter refers to: ``doomed`` (the files of sessions just
        deleted) at once, any other after ``grace_seconds`` (see :meth:`state.media_files.MediaFiles.sweep`)."""
        referenced = await self.db.media.referenced()
        return await asyncio.to_thread(self.files.sweep, referenced, doomed=doomed, grace_seconds=grace_seconds)


def _first_unanswered(history: list[dict]) -> int:
    """The index of the first of the user messages at the end (those a turn answers)."""
    i = len(history)
    while i > 0 and history[i - 1].get("role") == "user":
        i -= 1
    return i


def _by_message(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """The media rows grouped by message, in order: (the message's stored content, its media)."""
    out: list[tuple[str, list[dict]]] = []
    last = None
    for row in rows:
        if row["role"] != "user":
            continue
        if row["message_id"] != last:
            out.append((row.get("content") or "", []))
            last = row["message_id"]
        out[-1][1].append(row)
    return out


def _align(history: list[dict], messages: list[tuple[str, list[dict]]]) -> dict[int, list[dict]]:
    """Which of ``history``'s user messages are which stored messages with media: matched by their
    stored content from the end (a compressed session carries the last messages of its parent over
    as copies), each stored message used once and in order."""
    matched: dict[int, list[dict]] = {}
    j = len(messages) - 1
    for i in range(len(history) - 1, -1, -1):
        if j < 0:
            break
        message = history[i]
        if message.get("role") != "user" or not isinstance(message.get("content"), str):
            continue
        k = j
        while k >= 0 and messages[k][0] != message["content"]:
            k -= 1
        if k >= 0:
            matched[i] = messages[k][1]
            j = k - 1
    return matched


def _with_media_text(content: str, items: list[dict]) -> str:
    """A user message's stored text with what its files hold."""
    blocks = [content] if content else []
    for item in items:
        name, kind, text, note = item["name"], item["kind"], item.get("text"), item.get("note")
        if note:
            blocks.append(f"[{kind} {name} {note}]")
        elif kind == "document" and text:
            blocks.append(f"[document {name}:]\n{text}\n[end of {name}]")
        elif kind == "image" and text:
            blocks.append(f"[image {name}: {text}]")
    return "\n".join(blocks)


def describer_for(model, name: str, purpose) -> Describer:
    """A :data:`Describer` asking the model ``name`` (under ``models``) through ``model``, a
    ``gateway.model.ModelClient``."""

    async def describe(data: bytes, mime: str) -> str | None:
        url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
        completion = await model.complete(
            [{"role": "user", "content": [{"type": "text", "text": DESCRIBE_PROMPT},
                                          {"type": "image_url", "image_url": {"url": url}}]}],
            model=name, purpose=purpose)
        return completion.message.get("content") or None

    return describe


def media_limits(cfg) -> MediaLimits:
    """``media.max_bytes`` as the adapters take it."""
    b = cfg.media.max_bytes
    return MediaLimits(b.image, b.audio, b.document)


def vision_of(cfg, name: str | None) -> bool:
    """``models.<name>.vision``, or ``model.vision`` for the default model."""
    named = cfg.models.get(name) if name else None
    return named.vision if named is not None else cfg.model.vision


def media_usage(root: Path) -> tuple[int, int]:
    """(files, bytes) in the media folder at ``root``."""
    return MediaFiles(root).usage()


__all__ = ["DESCRIBE_PROMPT", "Describer", "Kept", "MediaService", "describer_for", "media_limits", "media_usage",
           "vision_of"]
