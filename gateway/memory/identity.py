"""Who a user is across platforms, and what of the history they may see.

One person's accounts are linked in the config::

    identities:
      alice: [telegram:123, discord:456, slack:U789]
    auth:
      owner: alice          # the operator: may search everything

:func:`recall_scope` turns the account a message came from into a
:class:`Scope`: the accounts whose sessions the user may search (their whole
identity, or just this account when it is not linked to one), always within
one agent's sessions; the operator's scope has no account limit.
:func:`user_dir_name` names the user's folder of persistent memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Scope", "identity_of", "recall_scope", "user_dir_name"]


@dataclass(frozen=True, slots=True)
class Scope:
    """The sessions a search may see: ``agent_prefix`` (None: every agent) and
    ``accounts`` as ``"platform:user_id"`` (None: every account; empty: none)."""

    agent_prefix: str | None
    accounts: frozenset[str] | None
    identity: str | None = None
    operator: bool = False


def identity_of(identities: Mapping[str, tuple[str, ...]], platform: str, user_id: str | None) -> str | None:
    """The identity name listing ``platform:user_id``, if any."""
    if user_id is None:
        return None
    ref = f"{platform}:{user_id}"
    for name, refs in identities.items():
        if ref in refs:
            return name
    return None


def recall_scope(config, agent: str, platform: str, user_id: str | None) -> Scope:
    """What ``user_id`` on ``platform`` may recall of ``agent``'s history.

    The operator (the identity named by ``auth.owner``) sees every session of
    every agent; anyone else sees only sessions of ``agent`` that belong to
    their accounts.  A message with no user sees nothing.
    """
    name = identity_of(config.identities, platform, user_id)
    if name is not None and name == config.auth.owner:
        return Scope(agent_prefix=None, accounts=None, identity=name, operator=True)
    if user_id is None:
        return Scope(agent_prefix=f"agent:{agent}:", accounts=frozenset())
    accounts = frozenset(config.identities[name]) if name is not None else frozenset({f"{platform}:{user_id}"})
    return Scope(agent_prefix=f"agent:{agent}:", accounts=accounts, identity=name)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]")


def user_dir_name(config, platform: str, user_id: str | None) -> str | None:
    """The folder name of a user's memory: their identity's name, else ``platform_userid``.

    Characters other than letters, digits and ``_.@-`` become ``_`` (and the
    result never starts with a dot), so a user id can never climb out of the
    memory folder.  None when there is no user.
    """
    name = identity_of(config.identities, platform, user_id)
    if name is None:
        if user_id is None or user_id == "":
            return None
        name = f"{platform}_{user_id}"
    safe = _UNSAFE.sub("_", name)
    return "_" + safe[1:] if safe.startswith(".") else safe
