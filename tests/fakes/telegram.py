"""A local fake of the Telegram Bot API, for tests and bench scripts.

It speaks the slice of the Bot API that python-telegram-bot needs for a bot
that long-polls (or takes webhooks), answers and shows "typing": every method
is a POST to ``/bot<token>/<method>`` with form fields whose values are JSON
(strings raw), answered with ``{"ok": true, "result": ...}`` or
``{"ok": false, "error_code": N, "description": ..., "parameters": ...}``.
Files are served from ``/file/bot<token>/<path>``.

    async with FakeTelegram() as tg:
        bot = telegram.Bot(tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url)
        tg.dm(tg.user(42, "Ann"), "hello")           # queue an update for getUpdates
        await tg.wait_for_sent(1)                     # poll until the bot answered
        tg.sent[0].visible_text                       # what the user sees

Every request is recorded in :attr:`FakeTelegram.requests`.  Failures are
scripted per method: :meth:`fail_next` (an error answer, e.g. 429 with
``retry_after``, 409, 400 "can't parse entities"), :meth:`drop_next` (the
connection is cut without an answer) and :meth:`hang_next` (no answer until
the client gives up), :meth:`delay_next` (a late answer); :meth:`go_down`/:meth:`come_back` make a whole outage.  ``parse_mode=HTML`` texts are checked the way Telegram
does (known tags, balanced, ``<&>`` escaped) and rejected with the real
error text when they are not; texts over 4,096 UTF-16 units after entity
parsing are rejected too.  Tags nested against Telegram's entity rules (code
inside bold, a quote in a quote) are accepted, as Telegram accepts them, and
listed in :attr:`SentMessage.lost_formatting`: Telegram shows the text without them.
"""

from __future__ import annotations

import asyncio
import html
import itertools
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
from aiohttp import web

from tests.waiting import eventually

DEFAULT_TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijk"
_ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre",
                 "tg-spoiler", "span", "blockquote", "tg-emoji"}
_TAG = re.compile(r"<(/?)([a-zA-Z][\w-]*)((?:\s+[^>]*)?)>")
_RAW_STRING_FIELDS = {"text", "parse_mode", "action", "url", "secret_token", "file_id", "caption"}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    params: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


@dataclass
class SentVoice:
    """A voice message the bot sent (sendVoice) and the fake accepted: the uploaded bytes and where."""

    message_id: int
    chat_id: int | str
    data: bytes
    filename: str | None
    caption: str | None = None
    reply_to: int | None = None


@dataclass
class SentMessage:
    """A message the bot sent and the fake accepted."""

    message_id: int
    chat_id: int | str
    text: str
    parse_mode: str | None
    visible_text: str  # what the user sees: tags removed, entities unescaped
    thread_id: int | None = None
    reply_to: int | None = None
    at: float = field(default_factory=time.monotonic)  # when the fake accepted it
    edits: int = 0  # editMessageText calls that changed it
    lost_formatting: list[str] = field(default_factory=list)  # entities Telegram would drop (see parse_html)
    reply_markup: dict | None = None  # an inline keyboard: {"inline_keyboard": [[{"text", "callback_data"}]]}

    def button_data(self) -> list[str]:
        """The callback data of its inline buttons, in order."""
        return [b["callback_data"] for row in (self.reply_markup or {}).get("inline_keyboard", []) for b in row]


@dataclass
class _Scripted:
    kind: str  # "fail" | "drop" | "hang" | "delay"
    status: int = 500
    description: str = ""
    retry_after: int | None = None
    parameters: dict | None = None
    delay: float = 0.0


class HTMLRejected(ValueError):
    pass


_ENTITY = {"b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline", "ins": "underline",
           "s": "strikethrough", "strike": "strikethrough", "del": "strikethrough", "tg-spoiler": "spoiler",
           "span": "spoiler", "a": "text_link", "code": "code", "pre": "pre", "blockquote": "blockquote",
           "tg-emoji": "custom_emoji"}
_SPLITTABLE = {"bold", "italic", "underline", "strikethrough", "spoiler"}


def check_html(text: str) -> str:
    """The visible text of Telegram HTML, or :class:`HTMLRejected` with Telegram's message."""
    return parse_html(text)[0]


def parse_html(text: str) -> tuple[str, list[str]]:
    """``(visible text, formatting Telegram would not show)``, or :class:`HTMLRejected` with Telegram's message.

    The second item lists entities nested against the Bot API's rules ("Message entities can be
    nested, providing following restrictions are met": bold, italic, underline, strikethrough and
    spoiler may hold and sit in anything but code and pre; blockquotes do not nest; no other entity
    holds another, except a ``<pre>`` its ``<code class="language-...">``).  Telegram does not refuse
    such a message: it shows the text without that entity, so the fake accepts it too and reports it.
    """
    stack: list[str] = []
    visible: list[str] = []
    lost: list[str] = []
    pos = 0
    for m in _TAG.finditer(text):
        visible.append(text[pos : m.start()])
        closing, name, attrs = m.group(1), m.group(2).lower(), m.group(3) or ""
        byte_offset = len(text[: m.start()].encode())
        if name not in _ALLOWED_TAGS:
            raise HTMLRejected(f'Bad Request: can\'t parse entities: Unsupported start tag "{name}" at byte offset {byte_offset}')
        if closing:
            if not stack or stack[-1] != name:
                raise HTMLRejected(f'Bad Request: can\'t parse entities: Unmatched end tag at byte offset {byte_offset}, expected "</{stack[-1] if stack else name}>", found "</{name}>"')
            stack.pop()
        else:
            if name == "span" and not re.search(r"""class\s*=\s*["']?tg-spoiler""", attrs):
                raise HTMLRejected(f'Bad Request: can\'t parse entities: Tag "span" must have class "tg-spoiler" at byte offset {byte_offset}')
            if fault := _nesting_fault(name, [_ENTITY[t] for t in stack]):
                lost.append(f"{fault} at byte offset {byte_offset}")
            stack.append(name)
        pos = m.end()
    visible.append(text[pos:])
    if stack:
        raise HTMLRejected(f'Bad Request: can\'t parse entities: Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    plain = "".join(visible)
    if "<" in plain or ">" in plain:
        at = len(text[: text.find("<") if "<" in text else text.find(">")].encode())
        raise HTMLRejected(f"Bad Request: can't parse entities: Unexpected end of name token at byte offset {at}")
    for entity in re.finditer(r"&[^;\s]*;?", plain):
        if not re.fullmatch(r"&(lt|gt|amp|quot|#\d+|#x[0-9a-fA-F]+);", entity.group()):
            raise HTMLRejected("Bad Request: can't parse entities: Unsupported HTML entity")
    return html.unescape(plain), lost


def _nesting_fault(name: str, outer: list[str]) -> str | None:
    """Why Telegram would drop entity ``name`` opened inside ``outer`` (outermost first), or None."""
    kind = _ENTITY[name]
    if outer and outer[-1] == "pre" and kind == "code" and outer.count("pre") == 1:
        return None  # <pre><code class="language-x">: one entity, a pre (with its language)
    if {"code", "pre"} & set(outer):
        return f"{kind} inside code"
    if kind == "blockquote":
        return "a blockquote inside a blockquote" if "blockquote" in outer else None
    if kind in _SPLITTABLE:
        return None
    if kind in ("code", "pre") and (held := [o for o in outer if o in _SPLITTABLE]):
        return f"{kind} inside {held[-1]}"
    holders = [o for o in outer if o not in _SPLITTABLE and o != "blockquote"]
    return f"{kind} inside {holders[-1]}" if holders else None


class FakeTelegram:
    """The fake Bot API server (an async context manager; bound to 127.0.0.1 on a free port)."""

    def __init__(self, *, token: str = DEFAULT_TOKEN, bot_id: int = 7_000_001, bot_username: str = "switchboard_bot"):
        self.token = token
        self.bot_user = {"id": bot_id, "is_bot": True, "first_name": "Switchboard", "username": bot_username,
                         "can_join_groups": True, "can_read_all_group_messages": False, "supports_inline_queries": False}
        self.requests: list[Recorded] = []
        self.sent: list[SentMessage] = []
        self.commands: list[dict] = []
        self.webhook: dict[str, Any] | None = None
        self.files: dict[str, tuple[bytes, str]] = {}
        self.voices: list[SentVoice] = []  # sendVoice uploads the fake accepted, in order
        self.confirmed_offset = 0
        # getUpdates calls that began while another was still being answered (Telegram answers the
        # earlier one 409 "terminated by other getUpdates request"): (time.monotonic(), offset) each
        self.overlapping_polls: list[tuple[float, int]] = []
        # called with each message the bot sent or edited, once the fake accepted it (benchmarks wait on it)
        self.on_shown: Callable[[SentMessage], None] | None = None
        self._polls_in_flight = 0
        self._poll_generation = 0
        self._updates: deque[dict] = deque()
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(100)
        self._callback_ids = itertools.count(9_000_000_001)
        self.queries: dict[str, bool] = {}  # callback query id -> answered (answerCallbackQuery)
        self._scripts: dict[str, deque[_Scripted]] = {}
        self._changed: asyncio.Condition | None = None
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> "FakeTelegram":
        self._changed = asyncio.Condition()
        await self._listen(0)
        return self

    async def go_down(self) -> None:
        """Close the listener and every connection (an outage); queued updates are kept."""
        self._closing = True
        await self._notify()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def come_back(self) -> None:
        """Listen again on the same port after :meth:`go_down`."""
        self._closing = False
        await self._listen(self.port)

    async def _listen(self, port: int) -> None:
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.go_down()

    async def __aenter__(self) -> "FakeTelegram":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

    # -- building inbound events -----------------------------------------------------

    @staticmethod
    def user(user_id: int, first_name: str = "Ann", *, username: str | None = None, last_name: str | None = None,
             is_bot: bool = False) -> dict:
        user = {"id": user_id, "is_bot": is_bot, "first_name": first_name}
        if username:
            user["username"] = username
        if last_name:
            user["last_name"] = last_name
        return user

    @staticmethod
    def private_chat(user: dict) -> dict:
        return {"id": user["id"], "type": "private", "first_name": user["first_name"]}

    @staticmethod
    def group_chat(chat_id: int = -1001234567890, title: str = "Team", *, forum: bool = False,
                   supergroup: bool = True) -> dict:
        chat = {"id": chat_id, "type": "supergroup" if supergroup else "group", "title": title}
        if forum:
            chat["is_forum"] = True
        return chat

    @staticmethod
    def channel_chat(chat_id: int = -1009876543210, title: str = "News") -> dict:
        return {"id": chat_id, "type": "channel", "title": title}

    def bot_message(self, chat: dict, text: str) -> dict:
        """A message as if this bot had sent it (to reply to)."""
        return self.message(chat, self.bot_user, text, entities=[])

    def message(self, chat: dict, sender: dict | None, text: str | None = None, *, thread_id: int | None = None,
                topic: bool = False, reply_to: dict | None = None, entities: list[dict] | None = None,
                caption: str | None = None, photo: list[dict] | None = None, document: dict | None = None,
                **extra: Any) -> dict:
        """A Message dict; entities for ``/commands`` and ``@mentions`` are found like Telegram does."""
        msg: dict[str, Any] = {"message_id": next(self._message_ids), "date": int(time.time()), "chat": chat}
        if sender is not None:
            msg["from"] = sender
        if chat.get("type") == "channel":
            msg["sender_chat"] = chat
        if text is not None:
            msg["text"] = text
            msg["entities"] = self.detect_entities(text) if entities is None else entities
        if caption is not None:
            msg["caption"] = caption
            msg["caption_entities"] = self.detect_entities(caption)
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
        if topic:
            msg["is_topic_message"] = True
        if reply_to is not None:
            msg["reply_to_message"] = reply_to
        if photo is not None:
            msg["photo"] = photo
        if document is not None:
            msg["document"] = document
        msg.update(extra)
        return msg

    @staticmethod
    def detect_entities(text: str) -> list[dict]:
        entities = []
        for m in re.finditer(r"(?<![\w/])/[a-zA-Z0-9_]{1,32}(?:@[a-zA-Z0-9_]{5,32})?|(?<!\w)@[a-zA-Z0-9_]{5,32}", text):
            kind = "bot_command" if m.group().startswith("/") else "mention"
            entities.append({"type": kind, "offset": utf16_len(text[: m.start()]), "length": utf16_len(m.group())})
        return entities

    def push(self, message: dict, *, kind: str = "message") -> dict:
        """Queue an update carrying ``message``; returns the update."""
        if kind == "message" and message.get("chat", {}).get("type") == "channel":
            kind = "channel_post"
        update = {"update_id": next(self._update_ids), kind: message}
        self._updates.append(update)
        self._notify_soon()
        return update

    def press(self, sent: SentMessage, sender: dict, data: str, *, chat: dict | None = None) -> dict:
        """``sender`` presses the inline button with callback ``data`` under the bot's message ``sent``
        (a callback_query update, as Telegram sends it); the button must be on the message."""
        assert data in sent.button_data(), f"no button {data!r} under message {sent.message_id}: {sent.button_data()}"
        if chat is None:
            chat = self.private_chat(sender) if int(sent.chat_id) > 0 else self.group_chat(int(sent.chat_id))
        message = {"message_id": sent.message_id, "date": int(time.time()), "chat": chat, "from": self.bot_user,
                   "text": sent.visible_text, "reply_markup": sent.reply_markup}
        query = {"id": str(next(self._callback_ids)), "from": sender, "message": message,
                 "chat_instance": f"ci{chat['id']}", "data": data}
        self.queries[query["id"]] = False
        return self.push(query, kind="callback_query")

    def redeliver(self, update: dict) -> dict:
        """Deliver the same message again under a new update id (a duplicate delivery)."""
        kind = next(k for k in update if k != "update_id")
        return self.push(update[kind], kind=kind)

    def dm(self, sender: dict, text: str, **kw: Any) -> dict:
        return self.push(self.message(self.private_chat(sender), sender, text, **kw))

    def in_group(self, chat: dict, sender: dict, text: str, **kw: Any) -> dict:
        return self.push(self.message(chat, sender, text, **kw))

    def in_topic(self, chat: dict, sender: dict, text: str, thread_id: int, **kw: Any) -> dict:
        return self.push(self.message(chat, sender, text, thread_id=thread_id, topic=True, **kw))

    def voice_note(self, file_id: str, data: bytes, *, duration: int | None = None,
                   mime_type: str = "audio/ogg") -> dict:
        """A Voice object served by this fake (``message(..., voice=...)``): a recorded voice note."""
        voice = {**self.add_file(file_id, data, f"voice/{file_id}.oga"), "mime_type": mime_type}
        if duration is not None:
            voice["duration"] = duration
        else:
            voice["duration"] = 0  # Telegram always sends it; 0 says "unknown" to a test that wants that
        return voice

    def add_file(self, file_id: str, data: bytes, path: str | None = None) -> dict:
        path = path or f"photos/{file_id}.jpg"
        self.files[file_id] = (data, path)
        return {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_size": len(data)}

    def photo(self, file_id: str, data: bytes) -> list[dict]:
        """A message's ``photo`` (one size) whose bytes this fake serves."""
        return [dict(self.add_file(file_id, data, path=f"photos/{file_id}.jpg"), width=64, height=64)]

    def document(self, file_id: str, data: bytes, name: str, mime_type: str) -> dict:
        """A message's ``document`` whose bytes this fake serves."""
        return dict(self.add_file(file_id, data, path=f"documents/{name}"), file_name=name, mime_type=mime_type)

    def voice(self, file_id: str, data: bytes, duration: int = 2) -> dict:
        """A message's ``voice`` note (Ogg Opus) whose bytes this fake serves."""
        return dict(self.add_file(file_id, data, path=f"voice/{file_id}.oga"), duration=duration, mime_type="audio/ogg")

    # -- scripting failures ----------------------------------------------------------

    def fail_next(self, method: str, times: int = 1, *, status: int = 500, description: str = "Internal Server Error",
                  retry_after: int | None = None, parameters: dict | None = None) -> None:
        self._script(method, times, _Scripted("fail", status, description, retry_after, parameters))

    def rate_limit_next(self, method: str = "sendMessage", times: int = 1, *, retry_after: int = 1) -> None:
        self.fail_next(method, times, status=429, description=f"Too Many Requests: retry after {retry_after}",
                       retry_after=retry_after)

    def drop_next(self, method: str, times: int = 1) -> None:
        self._script(method, times, _Scripted("drop"))

    def hang_next(self, method: str, times: int = 1) -> None:
        self._script(method, times, _Scripted("hang"))

    def delay_next(self, method: str, seconds: float, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` normally, but only after ``seconds`` (a slow API)."""
        self._script(method, times, _Scripted("delay", delay=seconds))

    def _script(self, method: str, times: int, item: _Scripted) -> None:
        self._scripts.setdefault(method.lower(), deque()).extend([item] * times)

    # -- assertions and waiting ------------------------------------------------------

    def calls(self, method: str) -> list[dict]:
        return [r.params for r in self.requests if r.method.lower() == method.lower()]

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
        return await eventually(predicate, timeout, what)

    async def wait_for_sent(self, n: int, timeout: float = 5.0) -> list[SentMessage]:
        await self.wait_for(lambda: len(self.sent) >= n, timeout, f"{n} sent messages (have {len(self.sent)})")
        return self.sent[:n]

    async def wait_for_calls(self, method: str, n: int = 1, timeout: float = 5.0) -> list[dict]:
        await self.wait_for(lambda: len(self.calls(method)) >= n, timeout, f"{n} {method} calls")
        return self.calls(method)

    async def wait_until_confirmed(self, update: dict, timeout: float = 5.0) -> None:
        """Until the bot acknowledged ``update`` (asked for an offset past it)."""
        await self.wait_for(lambda: self.confirmed_offset > update["update_id"], timeout,
                            f"offset past update {update['update_id']}")

    async def deliver_webhook(self, update: dict, url: str | None = None, *, secret: str | None = None,
                              send_secret: bool = True) -> int:
        """POST ``update`` to the webhook like Telegram does; returns the HTTP status."""
        hook = self.webhook or {}
        url = url or hook.get("url")
        headers = {"Content-Type": "application/json"}
        secret = hook.get("secret_token") if secret is None else secret
        if send_secret and secret:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=json.dumps(update), headers=headers) as response:
                return response.status

    # -- the API -----------------------------------------------------------------------

    def _notify_soon(self) -> None:
        try:
            asyncio.get_running_loop().create_task(self._notify())
        except RuntimeError:  # pushed before the loop runs: the next poll sees it anyway
            pass

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    async def _params(self, request: web.Request) -> dict[str, Any]:
        if request.content_type == "application/json":
            body = await request.read()
            return json.loads(body) if body else {}
        form = await request.post()
        params: dict[str, Any] = {}
        for key, value in form.items():
            if not isinstance(value, str):
                params[key] = {"filename": value.filename, "data": value.file.read()}
                continue
            if key in _RAW_STRING_FIELDS:
                params[key] = value
                continue
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
        return params

    @staticmethod
    def _ok(result: Any) -> web.Response:
        return web.json_response({"ok": True, "result": result})

    @staticmethod
    def _error(status: int, description: str, retry_after: int | None = None,
               parameters: dict | None = None) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
        if retry_after is not None or parameters:
            body["parameters"] = dict(parameters or {}, **({"retry_after": retry_after} if retry_after is not None else {}))
        return web.json_response(body, status=status)

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await self._params(request)
        self.requests.append(Recorded(method, request.path.replace(self.token, "<token>"), params))
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        script = self._scripts.get(method.lower())
        if script:
            item = script.popleft()
            if item.kind == "fail":
                return self._error(item.status, item.description, item.retry_after, item.parameters)
            if item.kind == "drop":
                assert request.transport is not None
                request.transport.abort()
                return web.Response(status=500)
            if item.kind == "hang":
                while not self._closing:
                    await asyncio.sleep(0.05)
                return self._error(500, "shutting down")
            if item.kind == "delay":
                await asyncio.sleep(item.delay)
        handler = getattr(self, f"_m_{method.lower()}", None)
        if handler is None:
            return self._error(404, "Not Found: method not found")
        return await handler(params)

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.Response(status=401)
        path = request.match_info["path"]
        for data, file_path in self.files.values():
            if file_path == path:
                return web.Response(body=data, content_type="application/octet-stream")
        return web.Response(status=404)

    async def _m_getme(self, params: dict) -> web.Response:
        return self._ok(self.bot_user)

    async def _m_deletewebhook(self, params: dict) -> web.Response:
        self.webhook = None
        return self._ok(True)

    async def _m_setwebhook(self, params: dict) -> web.Response:
        self.webhook = dict(params)
        return self._ok(True)

    async def _m_getwebhookinfo(self, params: dict) -> web.Response:
        hook = self.webhook or {}
        return self._ok({"url": hook.get("url", ""), "has_custom_certificate": False,
                         "pending_update_count": len(self._updates)})

    async def _m_setmycommands(self, params: dict) -> web.Response:
        self.commands = list(params.get("commands") or [])
        return self._ok(True)

    async def _m_sendchataction(self, params: dict) -> web.Response:
        return self._ok(True)

    async def _m_getfile(self, params: dict) -> web.Response:
        file_id = params.get("file_id")
        if file_id not in self.files:
            return self._error(400, "Bad Request: invalid file_id")
        data, path = self.files[file_id]
        return self._ok({"file_id": file_id, "file_unique_id": f"u{file_id}", "file_size": len(data),
                         "file_path": path})

    async def _m_getupdates(self, params: dict) -> web.Response:
        if self.webhook:
            return self._error(409, "Conflict: can't use getUpdates method while webhook is active; "
                                    "use deleteWebhook to delete the webhook first")
        offset = int(params.get("offset") or 0)
        if self._polls_in_flight:
            self.overlapping_polls.append((time.monotonic(), offset))
            self._poll_generation += 1  # the earlier poll is terminated, as Telegram does
            await self._notify()
        self._polls_in_flight += 1
        try:
            return await self._poll(params, offset, self._poll_generation)
        finally:
            self._polls_in_flight -= 1

    async def _poll(self, params: dict, offset: int, generation: int) -> web.Response:
        if offset:
            self.confirmed_offset = max(self.confirmed_offset, offset)
        while self._updates and self._updates[0]["update_id"] < offset:
            self._updates.popleft()
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        assert self._changed is not None
        deadline = time.monotonic() + timeout
        async with self._changed:
            while not self._updates and not self._closing and (left := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    break
                if generation != self._poll_generation:
                    return self._error(409, "Conflict: terminated by other getUpdates request; make sure "
                                            "that only one bot instance is running")
        return self._ok([u for u in self._updates if u["update_id"] >= offset][:limit])

    async def _m_answercallbackquery(self, params: dict) -> web.Response:
        query_id = str(params.get("callback_query_id"))
        if query_id not in self.queries:
            return self._error(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
        if self.queries[query_id]:
            return self._error(400, "Bad Request: query is already answered")
        self.queries[query_id] = True
        return self._ok(True)

    async def _m_editmessagetext(self, params: dict) -> web.Response:
        text = params.get("text") or ""
        mode = params.get("parse_mode")
        try:
            visible, lost = parse_html(text) if mode and mode.upper() == "HTML" else (text, [])
        except HTMLRejected as exc:
            return self._error(400, str(exc))
        chat_id, message_id = params.get("chat_id"), int(params.get("message_id") or 0)
        [sent] = [m for m in self.sent if m.message_id == message_id and str(m.chat_id) == str(chat_id)] or [None]
        if sent is None:
            return self._error(400, "Bad Request: message to edit not found")
        if not visible.strip():
            return self._error(400, "Bad Request: message text is empty")
        if utf16_len(visible) > 4096:
            return self._error(400, "Bad Request: message is too long")
        # an inline keyboard given with the edit replaces the message's; an edit without one removes it
        markup = params.get("reply_markup")
        for row in (markup or {}).get("inline_keyboard", []):
            for button in row:
                if len(button.get("callback_data", "").encode()) > 64:
                    return self._error(400, "Bad Request: BUTTON_DATA_INVALID")
        if (text, mode, markup) == (sent.text, sent.parse_mode, sent.reply_markup):
            return self._error(400, "Bad Request: message is not modified: specified new message content and "
                                    "reply markup are exactly the same as a current content and reply markup of the message")
        sent.text, sent.parse_mode, sent.visible_text, sent.lost_formatting = text, mode, visible, lost
        sent.reply_markup = markup
        sent.edits += 1
        if self.on_shown is not None:
            self.on_shown(sent)
        result = {"message_id": sent.message_id, "date": int(time.time()), "edit_date": int(time.time()),
                  "chat": {"id": chat_id, "type": "private" if str(chat_id).lstrip("-").isdigit()
                           and int(chat_id) > 0 else "supergroup"}, "from": self.bot_user, "text": visible}
        return self._ok(result)

    async def _m_sendvoice(self, params: dict) -> web.Response:
        """sendVoice: an uploaded OGG/Opus file (multipart), recorded in ``voices``."""
        upload = params.get("voice")
        if not isinstance(upload, dict) or not upload.get("data"):
            return self._error(400, "Bad Request: there is no voice in the request")
        chat_id = params.get("chat_id")
        reply = params.get("reply_parameters") or {}
        sent = SentVoice(next(self._message_ids), chat_id, upload["data"], upload.get("filename"),
                         params.get("caption"), reply.get("message_id") if isinstance(reply, dict) else None)
        self.voices.append(sent)
        chat = {"id": chat_id, "type": "private" if isinstance(chat_id, int) and chat_id > 0 else "supergroup"}
        if chat["type"] == "private":
            chat["first_name"] = "user"
        return self._ok({"message_id": sent.message_id, "date": int(time.time()), "chat": chat, "from": self.bot_user,
                         "voice": {"file_id": f"sent{sent.message_id}", "file_unique_id": f"usent{sent.message_id}",
                                   "duration": 1, "mime_type": "audio/ogg", "file_size": len(sent.data)}})

    async def _m_sendmessage(self, params: dict) -> web.Response:
        text = params.get("text") or ""
        mode = params.get("parse_mode")
        try:
            visible, lost = parse_html(text) if mode and mode.upper() == "HTML" else (text, [])
        except HTMLRejected as exc:
            return self._error(400, str(exc))
        if not visible.strip():
            return self._error(400, "Bad Request: message text is empty")
        if utf16_len(visible) > 4096:
            return self._error(400, "Bad Request: message is too long")
        chat_id = params.get("chat_id")
        reply = params.get("reply_parameters") or {}
        markup = params.get("reply_markup")
        if markup is not None:
            for row in markup.get("inline_keyboard", []):
                for button in row:
                    if len(button.get("callback_data", "").encode()) > 64:
                        return self._error(400, "Bad Request: BUTTON_DATA_INVALID")
        sent = SentMessage(next(self._message_ids), chat_id, text, mode, visible, params.get("message_thread_id"),
                           reply.get("message_id") if isinstance(reply, dict) else None, lost_formatting=lost,
                           reply_markup=markup)
        self.sent.append(sent)
        if self.on_shown is not None:
            self.on_shown(sent)
        chat = {"id": chat_id, "type": "private" if isinstance(chat_id, int) and chat_id > 0 else "supergroup"}
        if chat["type"] == "private":
            chat["first_name"] = "user"
        result = {"message_id": sent.message_id, "date": int(time.time()), "chat": chat, "from": self.bot_user,
                  "text": visible}
        if sent.thread_id is not None:
            result["message_thread_id"] = sent.thread_id
        return self._ok(result)
