"""Build an adapter the way the gateway does: from its config model, plus what the rest of the config gives.

    adapter = configured(TelegramAdapter, TelegramConfig, token=tg.token, base_url=tg.base_url, send_backoff=FAST)

The keywords that are fields of the model build (and validate) the model; the others (``commands``,
``vision``, ``media``, an adapter's pacing and retry knobs) go to the adapter's constructor.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

A = TypeVar("A")


def configured(adapter: type[A], model: type[BaseModel], **keywords: Any) -> A:
    settings = {k: v for k, v in keywords.items() if k in model.model_fields}
    rest = {k: v for k, v in keywords.items() if k not in model.model_fields}
    return adapter(model(**settings), **rest)  # type: ignore[call-arg]
