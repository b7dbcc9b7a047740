"""Which named models a chat may choose (``/model``, the local API's ``model`` field).

The names are ``default`` (the ``model`` section) and the keys of ``models``.  ``models.<name>.allowed_for``
(``platform:user_id`` refs and/or chat keys) limits a model to those users and chats; absent, everyone
may use it.  ``default`` is open to every chat.  A choice is checked again at every turn, against the
sender and the chat, so a stored choice never reaches further than its chooser could (a model later
closed to a user, or chosen by someone else in a shared chat, falls back to ``default``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class ModelChoices:
    names: tuple[str, ...] = (DEFAULT,)
    # name -> the refs it is limited to (platform:user_id, chat keys); a name not here is open to everyone
    allowed_for: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))

    def allowed(self, name: str, platform: str, user_id: str | None, chat_key: str) -> bool:
        if name not in self.names:
            return False
        refs = self.allowed_for.get(name)
        if refs is None:
            return True
        return chat_key in refs or (user_id is not None and f"{platform}:{user_id}" in refs)

    def available(self, platform: str, user_id: str | None, chat_key: str) -> list[str]:
        """The names this user may choose in this chat, in config order."""
        return [n for n in self.names if self.allowed(n, platform, user_id, chat_key)]


def model_choices(names: tuple[str, ...], allowed_for: Mapping[str, tuple[str, ...] | None]) -> ModelChoices:
    limits = {name: frozenset(refs) for name, refs in allowed_for.items() if refs is not None}
    return ModelChoices(tuple(names), MappingProxyType(limits))
