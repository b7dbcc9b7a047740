"""Which session a local API request continues, for clients that send their whole history.

A request names its conversation by an id a real client already sends (Open WebUI's
``X-OpenWebUI-Chat-Id``, a LibreChat ``X-Conversation-Id``, ``prompt_cache_key``), or by
nothing: then the conversation is recognised by its *fingerprint*, a hash of the caller (a hash of
its bearer token, the ``model`` it names, its user scope) and the first user message, plus the
first reply once there is one.  The system message is left out (Open WebUI fills the date into it).

Where things are kept, all in the store's routing table (key -> session, the key its primary key, so
a fingerprint is found with one indexed read whatever the number of conversations):

    agent:<agent>:api:chat:<client id>   the conversation: its live session (moved on by compression
                                         and by a branch); a fingerprinted one gets a random id
    agent:<agent>:api:fp:<hash>          a fingerprint: the session it was first seen in, whose
                                         ``session_key`` names the conversation
    agent:<agent>:api:own:<hash>         a session a caller (a hash of its token, its user scope and
                                         the session's id) was answered in: the sessions it may name
                                         in ``X-Switchboard-Session``

When the turn starts (under the conversation's lane lock), :meth:`ClientHistory.prepare` lines the
client's messages up with the stored conversation (user messages and answers, the compressed
parents' included): if the stored one is where the client's begins, the rest of the client's is
stored and answered; if they part (an edited message, a regenerated answer), a child session
(``parent_session_id`` the stored one) takes the stored messages up to the last one both share,
then the client's from there, and the conversation continues in it.  Nothing is stored twice: a request
that repeats one left unanswered (a retry after an outage) is answered without storing again.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

import state
from gateway.keys import api_conversation_key
from gateway.runtime.api_request import ChatRequest, ClientMessage
from gateway.turn import CUT_OFF_NOTE, EMPTY_ANSWER
from gateway.types import Attachment

log = logging.getLogger(__name__)

# the fields of a stored message a branch copies (as compression copies them)
_COPIED_FIELDS = (
    "role", "content", "tool_call_id", "tool_calls", "tool_name", "token_count", "finish_reason",
    "reasoning", "reasoning_details", "codex_reasoning_items", "platform_message_id", "timestamp",
)
LIBRECHAT_UNSET = ("", "new")  # what LibreChat's templated header holds before the conversation has an id


#: Owner keys a process remembers having stored (:meth:`Conversations.remember_owner`); past this, the oldest
#: is forgotten (and read once again after its session's next answer).
MAX_OWNERS_REMEMBERED = 20_000


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sends a request: a hash of its bearer token (never the token), and its user scope."""

    token_hash: str
    user: str | None


@dataclass(frozen=True, slots=True)
class ConversationId:
    """How a request named its conversation: ``source`` (openwebui, librechat, prompt_cache_key,
    fingerprint) and the conversation's key, or None for a fingerprint not seen before."""

    source: str
    key: str | None
    fingerprint: str | None = None  # fingerprint mode: the key of the fingerprint found or to record


def _hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:40]


def token_hash(authorization: str | None) -> str:
    return _hash("bearer", authorization or "")


def explicit_id(headers, request: ChatRequest) -> tuple[str, str] | None:
    """The conversation id a client sent (source, id), or None."""
    chat = headers.get("X-OpenWebUI-Chat-Id")
    if chat:
        return "openwebui", chat
    conversation = headers.get("X-Conversation-Id")
    if conversation is not None and conversation.strip().lower() not in LIBRECHAT_UNSET:
        return "librechat", conversation.strip()
    if request.prompt_cache_key:
        return "prompt_cache_key", request.prompt_cache_key
    return None


class Conversations:
    """Finds and records the sessions of conversations whose history the client keeps."""

    def __init__(self, db: state.AsyncSessionDB, agent: str, model_name: str, persona: str, *,
                 keep_media: Callable[[int, tuple[Attachment, ...]], Awaitable[tuple[str, ...]]] | None = None):
        self.db = db
        self.keep_media = keep_media  # a new message's files into the media store (gateway.media)
        self.agent = agent
        self.model_name = model_name
        self.persona = persona
        # owner keys seen stored by this process (remember_owner): such a route never changes (it names
        # the one session whose id it is made of) and goes only with that session
        self._owners_stored: dict[str, None] = {}

    def fingerprint_key(self, caller: Caller, request: ChatRequest, first_reply: str | None) -> str:
        """The routing key of a conversation's fingerprint: the caller, the model named, the first user
        message, and the first reply when there is one."""
        first_user = next(m.stored for m in request.messages if m.role == "user")
        parts = [caller.token_hash, request.model or "", caller.user or "", first_user]
        if first_reply is not None:
            parts.append(first_reply)
        return api_conversation_key(self.agent, _hash(*parts), kind="fp")

    async def identify(self, caller: Caller, request: ChatRequest, client_id: tuple[str, str] | None,
                       idempotency_key: str | None) -> ConversationId:
        """The conversation ``request`` belongs to (one indexed read for a fingerprint)."""
        if client_id is not None:
            source, ident = client_id
            scope = f"{source}:{caller.user or ''}:{ident}"
            return ConversationId(source, api_conversation_key(self.agent, scope))
        first_reply = _first_reply(request)
        fingerprint = self.fingerprint_key(caller, request, first_reply)
        if first_reply is None and idempotency_key is None:
            return ConversationId("fingerprint", None, fingerprint)  # a first message: a new conversation
        session = await self.db.routes.session(fingerprint)  # one indexed read: the route and its session
        if session is None or not session.get("session_key"):
            return ConversationId("fingerprint", None, fingerprint)
        if first_reply is None:  # a retry of a first message is the conversation it started
            first = next((m for m in await self.db.messages.get(session["id"]) if m.role == "user"), None)
            if first is None or first.platform_message_id != idempotency_key:
                return ConversationId("fingerprint", None, fingerprint)
        return ConversationId("fingerprint", session["session_key"], fingerprint)

    def new_key(self) -> str:
        return api_conversation_key(self.agent, f"conv:{uuid.uuid4().hex}")

    async def prepare(self, key: str, request: ChatRequest, *, user_id: str | None, user_name: str | None,
                      idempotency_key: str | None, fingerprint: str | None) -> str | None:
        """Store what the client's history adds to the conversation ``key`` and return the session to
        answer in; None when this request (by its Idempotency-Key) was stored and answered before.
        Runs under the conversation's lane lock."""
        incoming = list(request.messages)
        routed = await self.db.routes.session(key)
        if routed is None:
            session_id = await self._create(key, None, user_id, user_name)
            await self._append(session_id, [], incoming, idempotency_key)
            if fingerprint is not None:
                await self.db.routes.set(fingerprint, session_id)
            return session_id
        rows = await self._lineage_rows(routed["id"], routed.get("parent_session_id"))
        if idempotency_key is not None:
            at = next((i for i, row in enumerate(rows) if row.role == "user"
                       and row.platform_message_id == idempotency_key), None)
            if at is not None:
                return None if _answered(rows, at) else routed["id"]
        stored = [(i, row) for i, row in enumerate(rows) if _in_transcript(row)]
        common = 0
        while common < min(len(stored), len(incoming)) and _same(stored[common][1], incoming[common]):
            common += 1
        if common == len(stored) and routed.get("ended_at") is None:
            await self._append(routed["id"], [], incoming[common:], idempotency_key)
            return routed["id"]
        # the client's history parts from the stored one (or the stored session was ended): a branch with the
        # stored messages up to the last one both share (the parted answer's tool calls stay with it)
        before = stored[common - 1][0] + 1 if common else 0
        child = await self._create(key, routed["id"], user_id, user_name)
        await self._append(child, rows[:before], incoming[common:], idempotency_key)
        await self.db.routes.set(key, child)  # the branch is the conversation from now on
        await self.db.sessions.end(routed["id"], "branched")  # listed as its branch from now on (first end wins)
        log.info("API conversation %s branched from session %s into %s after %d messages", key, routed["id"],
                 child, common)
        return child

    def owner_key(self, caller: Caller, session_id: str) -> str:
        """The routing key saying that ``caller`` was answered in ``session_id``."""
        return api_conversation_key(self.agent, _hash(caller.token_hash, caller.user or "", session_id), kind="own")

    async def remember_owner(self, caller: Caller, session_id: str) -> None:
        """After an answer in ``session_id``: the caller may name it in ``X-Switchboard-Session``.  Read
        (and written) once per caller and session in this process, not after every answer."""
        key = self.owner_key(caller, session_id)
        if key in self._owners_stored:
            return
        if await self.db.routes.get(key) != session_id:
            await self.db.routes.set(key, session_id)
        if len(self._owners_stored) >= MAX_OWNERS_REMEMBERED:
            self._owners_stored.pop(next(iter(self._owners_stored)))
        self._owners_stored[key] = None

    async def owned(self, caller: Caller, session_id: str) -> state.Session | None:
        """The session ``session_id`` when ``caller`` (its token and user) was answered in it; None
        otherwise, whether it exists or not (another caller's session is never told apart from none)."""
        if await self.db.routes.get(self.owner_key(caller, session_id)) != session_id:
            return None
        return await self.db.sessions.get(session_id)

    async def continue_named(self, key: str, request: ChatRequest, *, user_id: str | None, user_name: str | None,
                             idempotency_key: str | None) -> str | None:
        """``X-Switchboard-Session``: store what the request brings in the conversation ``key`` (routed
        at the named session) and return the session to answer in.  A request whose history begins as
        the stored one does is lined up with it (:meth:`prepare`: an edit branches); one that holds only
        what is new (a user message, no answer) has it stored after the session's messages."""
        routed = await self.db.routes.session(key)
        if routed is None:
            return None
        rows = await self._lineage_rows(routed["id"], routed.get("parent_session_id"))
        if idempotency_key is not None:
            at = next((i for i, row in enumerate(rows) if row.role == "user"
                       and row.platform_message_id == idempotency_key), None)
            if at is not None:
                return None if _answered(rows, at) else routed["id"]
        stored = [row for row in rows if _in_transcript(row)]
        incoming = list(request.messages)
        if len(incoming) > 1 and stored and _same(stored[0], incoming[0]):
            return await self.prepare(key, request, user_id=user_id, user_name=user_name,
                                      idempotency_key=idempotency_key, fingerprint=None)
        if routed.get("ended_at") is not None:
            await self.db.sessions.reopen(routed["id"])  # named again: it goes on
        await self._append(routed["id"], [], incoming, idempotency_key)
        return routed["id"]

    async def remember_first_reply(self, caller: Caller, request: ChatRequest, reply: str, session_id: str) -> None:
        """After the first answer of a fingerprinted conversation: its fingerprint with that answer, which
        the client's next request (its history holding the answer) is recognised by."""
        if _first_reply(request) is None:
            await self.db.routes.set(self.fingerprint_key(caller, request, reply), session_id)

    async def _create(self, key: str, parent: str | None, user_id: str | None, user_name: str | None) -> str:
        session_id = state.new_session_id()
        await self.db.sessions.create(session_id, "api", self.model_name, user_id, parent, session_key=key,
                                     user_name=user_name, system_prompt=self.persona)
        if parent is None:
            await self.db.routes.set(key, session_id)
        return session_id

    async def _append(self, session_id: str, copied: list[state.StoredMessage], new: list[ClientMessage],
                      idempotency_key: str | None) -> None:
        messages = [{k: getattr(row, k) for k in _COPIED_FIELDS if getattr(row, k) is not None} for row in copied]
        for i, message in enumerate(new):
            entry: dict = {"role": message.role, "content": message.stored}
            if i == len(new) - 1 and idempotency_key is not None:
                entry["platform_message_id"] = idempotency_key
            messages.append(entry)
        if messages:
            ids = await self.db.messages.append_many(session_id, messages)
            if self.keep_media is not None:
                for message_id, message in zip(ids[len(copied):], new, strict=True):
                    if any(a.data for a in message.images):
                        await self.keep_media(message_id, message.images)

    async def _lineage_rows(self, session_id: str, parent_id: str | None) -> list[state.StoredMessage]:
        """The stored messages of the session as the client saw them: a compressed parent's own, then
        the messages added after the compression (not its summary and copies)."""
        rows = await self.db.messages.get(session_id)
        parent = await self.db.sessions.get(parent_id) if parent_id else None
        if parent is None or parent.end_reason != "compression" or parent.ended_at is None:
            return rows
        ended_at = parent.ended_at
        own = [row for row in rows if row.timestamp > ended_at]
        return await self._lineage_rows(parent.id, parent.parent_session_id) + own


def _first_reply(request: ChatRequest) -> str | None:
    """The first assistant message after the first user message, if the client's history has one (a
    tool-call message as its ``calls_signature``)."""
    if request.first_calls is not None:
        return request.first_calls
    seen_user = False
    for message in request.messages:
        if message.role == "user":
            seen_user = True
        elif seen_user:
            return message.stored
    return None


def _in_transcript(row: state.StoredMessage) -> bool:
    """Whether a stored message is one the client sees: a user message or an answer (not a tool call,
    a tool result, a note for the model)."""
    if row.role == "user":
        return True
    return row.role == "assistant" and not row.tool_calls


def _same(row: state.StoredMessage, message: ClientMessage) -> bool:
    """Whether a stored message is the client's: the same role and text (an answer as it was sent: an
    empty one as the line standing for it, one that broke off with the note saying so)."""
    if row.role != message.role:
        return False
    stored, sent = (row.content or "").strip(), message.stored.strip()
    if row.role == "assistant":
        if not stored:
            return sent in ("", EMPTY_ANSWER)
        if row.finish_reason == "incomplete":
            return sent in (stored, f"{stored}\n\n{CUT_OFF_NOTE}")
    return stored == sent


def _answered(rows: list[state.StoredMessage], at: int) -> bool:
    return any(row.role == "assistant" and row.content and not row.tool_calls
               for row in rows[at + 1:])
