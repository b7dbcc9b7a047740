"""Deterministic session keys: which conversation a message belongs to, per platform and chat type.

    DM       agent:<agent>:<platform>:dm:<chat_id>
    group    agent:<agent>:<platform>:group:<chat_id>:<user_id>
             agent:<agent>:<platform>:group:<chat_id>            (shared room, or no user id)
    thread   agent:<agent>:<platform>:group:<chat_id>:<thread_id>           (shared, default)
             agent:<agent>:<platform>:group:<chat_id>:<thread_id>:<user_id> (per user)
    channel  agent:<agent>:<platform>:channel:<chat_id>:<user_id>
             agent:<agent>:<platform>:channel:<chat_id>          (shared room, or no user id)
    cron     agent:<agent>:cron:<job_id>
    own      agent:<agent>:<platform>:<part>:<part>...     (InboundMessage.key_parts: a webhook's
                                                            <hook>:<conversation>:<sender>)

The same message always maps to the same key, so the routing table in
state.db (key -> active session) continues a conversation across restarts.
Two agent names never share a key.  ``:`` inside an id is escaped so a
crafted id cannot collide with another chat's key.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.types import ChatType, InboundMessage


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    agent: str = "main"
    group_sessions_per_user: bool = True
    thread_sessions_per_user: bool = False


def _part(value: str) -> str:
    return value.replace("%", "%25").replace(":", "%3A")


def session_key(msg: InboundMessage, policy: KeyPolicy) -> str:
    """The session key for an inbound message under ``policy``."""
    head = f"agent:{_part(policy.agent)}:{_part(msg.platform)}"
    if msg.key_parts:  # the platform names its own conversations (a webhook: hook, conversation, sender)
        return ":".join((head, *(_part(p) for p in msg.key_parts)))
    chat = _part(msg.chat_id)
    user = _part(msg.user_id) if msg.user_id else None
    if msg.chat_type is ChatType.DM:
        return f"{head}:dm:{chat}"
    if msg.chat_type is ChatType.THREAD and msg.thread_id:
        key = f"{head}:group:{chat}:{_part(msg.thread_id)}"
        if policy.thread_sessions_per_user and user:
            key += f":{user}"
        return key
    kind = "channel" if msg.chat_type is ChatType.CHANNEL else "group"
    if policy.group_sessions_per_user and user:
        return f"{head}:{kind}:{chat}:{user}"
    return f"{head}:{kind}:{chat}"


def _unpart(value: str) -> str:
    return value.replace("%3A", ":").replace("%25", "%")


def chat_of_key(key: str | None) -> str | None:
    """The chat a session key names: the chat id (dm, group, thread, channel), the cron job, the API
    client's key; None for what is not a session key."""
    parts = (key or "").split(":")
    if len(parts) < 4 or parts[0] != "agent":
        return None
    if len(parts) >= 5 and parts[3] in ("dm", "group", "channel", "chat", "fp"):
        return _unpart(parts[4])
    return _unpart(parts[3])


def cron_key(agent: str, job_id: str) -> str:
    return f"agent:{_part(agent)}:cron:{_part(job_id)}"


def api_key(agent: str, client_key: str) -> str:
    """Key for the local API: the client's own key, namespaced under the agent."""
    return f"agent:{_part(agent)}:api:{_part(client_key)}"


def api_conversation_key(agent: str, ident: str, *, kind: str = "chat") -> str:
    """Key of a local API conversation whose history the client keeps (``chat``), or of a fingerprint
    that leads to one (``fp``); see ``gateway.runtime.api_sessions``."""
    return f"agent:{_part(agent)}:api:{kind}:{_part(ident)}"
