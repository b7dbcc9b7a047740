"""Dead letters on the gateway's side: what is stored, and the replay an operator asks for.

An adapter hands over an event that failed again and again
(:class:`gateway.types.FailedEvents`); :func:`dead_letter_row` turns it into
what the store keeps: the payload as JSON with every secret masked by the
redaction the logs use (known secrets and token shapes, values first, then the
encoded text, so a ``"token": "..."`` field is caught too), the normalised
message as JSON (what a replay hands to the gateway again), the masked error.

An attachment's bytes are never stored in the row: they go to the media folder
(``state.media_files``) and the row refers to them by SHA-256, which keeps the
file until the dead letter is dropped (``state._media.referenced_hashes``).

``switchboard deadletters retry ID`` marks a row ``retry``; the daemon's
:class:`DeadLetterReplay` polls for such rows every couple of seconds, hands the
stored message to the router's intake (``SessionRouter.take``) and marks the row ``retried``, or
``held`` again with the new error.  The same poll keeps the count of held dead
letters for ``/healthz`` and ``/metrics`` fresh without blocking the loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import asdict
from typing import Any, Awaitable, Callable, Iterable

from gateway.errors import NotReplayable
from gateway.logging_setup import Redactor, redact
from gateway.types import DEAD_LETTER_AFTER, Attachment, ChatType, InboundMessage, clean_text
from state import AsyncSessionDB
from state.media_files import MediaFiles

log = logging.getLogger(__name__)

REPLAY_EVERY_SECONDS = 2.0


def masker(secrets: Iterable[str] = ()) -> Callable[[str], str]:
    """The logs' redaction: the adapters' tokens and every token shape, plus ``secrets`` (the config's)."""
    known = Redactor(secrets)
    return lambda text: known(redact(text))


def mask(value: Any, hide: Callable[[str], str] = redact) -> Any:
    """``value`` as plain JSON-able data with ``hide`` applied to every string (dict keys included)."""
    if isinstance(value, str):
        return hide(clean_text(value))
    if isinstance(value, dict):
        return {mask(str(k), hide): mask(v, hide) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask(v, hide) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return mask(str(value), hide)


def dead_letter_row(platform: str, event_id: str | None, payload: dict, message: InboundMessage | None,
                    error: str, *, secrets: Iterable[str] = (), files: MediaFiles | None = None) -> dict:
    """The ``SessionDB.add_dead_letter`` arguments for an event set aside: nothing in them holds a token,
    and no file's bytes (they go to ``files``; without one, only the file's name is kept).  Writes
    files: call it off the event loop."""
    hide = masker(secrets)
    text = json.dumps(mask(payload, hide), ensure_ascii=False, sort_keys=True)
    return {
        "platform": platform,
        "event_id": None if event_id is None else clean_text(str(event_id)),
        "payload": hide(text),  # once more on the encoded text: '"token": "..."' fields
        "message": None if message is None else message_to_json(message, hide, files),
        "error": hide(clean_text(error)),
        "attempts": DEAD_LETTER_AFTER,
    }


def message_to_json(msg: InboundMessage, hide: Callable[[str], str] = redact, files: MediaFiles | None = None) -> str:
    """``msg`` as JSON with ``hide`` applied to its text (a token a user pasted is not kept either); an
    attachment's bytes go to ``files``, the JSON holds their SHA-256."""
    data = mask({k: v for k, v in asdict(msg).items() if k != "attachments"}, hide)
    data["chat_type"] = msg.chat_type.value
    data["attachments"] = [
        {**mask({k: v for k, v in asdict(a).items() if k != "data"}, hide),
         "sha256": files.put(a.data) if a.data is not None and files is not None else None}
        for a in msg.attachments
    ]
    return json.dumps(data, ensure_ascii=False)


def message_from_json(text: str | None, files: MediaFiles | None = None) -> InboundMessage:
    """The stored message, ready to hand to the gateway again; :class:`NotReplayable` when there is none.
    An attachment's bytes come back from ``files`` while they are there (reads files: off the event loop)."""
    if not text:
        raise NotReplayable("the dead letter failed before it was read into a message, so there is nothing to replay: "
                            "read it with 'switchboard deadletters show ID' and drop it with 'switchboard deadletters drop ID'")
    data = json.loads(text)
    data["chat_type"] = ChatType(data["chat_type"])
    data["attachments"] = tuple(_attachment(a, files) for a in data.get("attachments") or ())
    return InboundMessage(**data)


def _attachment(fields: dict, files: MediaFiles | None) -> Attachment:
    sha, encoded = fields.pop("sha256", None), fields.pop("data", None)
    if sha and files is not None:
        data = files.read(sha)
    else:  # a row written before the media folder held them (base64 in the row)
        data = base64.b64decode(encoded) if encoded else None
    return Attachment(**fields, data=data)


class DeadLetterReplay:
    """The daemon's poll: replays the rows marked ``retry`` and keeps the held count fresh."""

    def __init__(self, db: AsyncSessionDB, replay: Callable[[InboundMessage], Awaitable[Any]], *,
                 on_count: Callable[[int], None], interval: float = REPLAY_EVERY_SECONDS,
                 files: MediaFiles | None = None):
        self._db = db
        self._files = files
        self._replay = replay
        self._on_count = on_count
        self.interval = interval

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed poll (store busy) is logged and tried again
                log.exception("dead-letter poll failed; trying again in %.0fs", self.interval)
            await asyncio.sleep(self.interval)

    async def refresh_count(self) -> int:
        held = await self._db.dead_letters.count()
        self._on_count(held)
        return held

    async def tick(self) -> None:
        for row in await self._db.dead_letters.due_for_retry():
            await self._replay_one(row)
        await self.refresh_count()

    async def _replay_one(self, row: dict) -> None:
        dl = row["id"]
        try:
            msg = await asyncio.to_thread(message_from_json, row.get("message"), self._files)
            await self._replay(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the row goes back to held with the reason
            error = redact(clean_text(f"{type(exc).__name__}: {exc}"))
            await self._db.dead_letters.set_status(dl, "held", only_from=("retry",), error=error, failed_attempt=True)
            log.error("dead letter %d (%s event %s) failed again on replay: %s; it is held again",
                      dl, row["platform"], row.get("event_id"), error)
            return
        await self._db.dead_letters.set_status(dl, "retried", only_from=("retry",))
        log.info("dead letter %d (%s event %s) replayed", dl, row["platform"], row.get("event_id"))
