"""Kill -9 the real daemon under load and start it again on the same home, then count what the
users saw: the part of tests/test_crash_recovery.py and bench/chaos.py that drives processes.

    async with FakeTelegram() as tg, FakeModel(delay=0.1) as model:
        run = ChaosRun(TelegramSide(tg), tmp_path, model.base_url, Plan(kills=2, seed=7))
        outcome = await run.run()
    assert not outcome.problems(), outcome.report()

``switchboard run`` is started as a subprocess from this venv with a config file and a
NOTIFY_SOCKET (systemd's datagram socket, to see READY=1); the fake platform and the fake model
run wherever the caller runs them.  Users write DMs at a steady rate from a window of chats; at
a random moment (seeded) the daemon gets SIGKILL, and the chats that were writing then partly go
quiet for good (fresh ones take over), so whatever the kill left unanswered stays unanswered
unless the restarted daemon answers it.  After the last kill the daemon starts once more and
every message gets ``Plan.settle_seconds`` to be answered.

What is counted (from what the fake platform accepted, and from state.db once no daemon runs):

* sent: user messages the platform handed, or will hand, to the bot (Discord does not queue
  events for a bot that is offline, so nothing is sent to it then);
* stored: how many times each message is in state.db as a user message (must be once);
* answered: a bot reply in the same chat echoes it or a later message of that chat (the fake
  model echoes the last user message it was shown, and one turn answers a whole batch);
* off the conversation: replies whose echo shows the model something other than the chat's
  messages once each, in the order written, in one session, up to the one it answers (where the
  adapter does not keep one chat's order, see Side.keeps_order, only more messages than written
  is a problem);
* duplicated: copies of a reply (same chat, same text) beyond the first;
* in flight at a kill: deliveries pending in state.db at the kill whose text the platform had
  already accepted, and streamed messages being posted then (``streaming``, with the text of the
  message being posted) that the platform had accepted under an id state.db never noted: the only
  replies a restart may send twice;
* resumed answer: after a restart, the first reply to a message written before the kill, in
  seconds from READY=1 (a reply stored before the kill and sent again counts; the first answer
  from a resumed turn, which calls the model, is counted apart).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import random
import re
import signal
import socket
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Protocol

import yaml

from tests.harness import eventually

SWITCHBOARD = str(Path(sys.executable).parent / "switchboard")
_ECHO = re.compile(r"echo: (.*?) \| turns: (\d+) \| first: (.*?)\s*$")


# -- the daemon as a process ---------------------------------------------------------------


class NotifySocket:
    """A unix datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.received: list[str] = []

    async def wait_for(self, predicate, timeout: float = 20.0) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for line in self.received:
            if predicate(line):
                return line
        while loop.time() < deadline:
            try:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 4096), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            for line in data.decode().split("\n"):
                self.received.append(line)
                if predicate(line):
                    return line
        raise AssertionError(f"no matching notification; got {self.received}")

    def close(self) -> None:
        self.sock.close()


async def start_daemon(config: Path, env_extra: dict, *, stderr: int | IO = asyncio.subprocess.PIPE
                       ) -> asyncio.subprocess.Process:
    """``switchboard run --config CONFIG`` with systemd's variables only as ``env_extra`` gives them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env.update(env_extra)
    return await asyncio.create_subprocess_exec(
        SWITCHBOARD, "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.PIPE if stderr is asyncio.subprocess.PIPE else asyncio.subprocess.DEVNULL,
        stderr=stderr,
    )


@dataclass
class Start:
    spawned: float  # time.monotonic() when the process was started
    ready: float  # ... and when it sent READY=1


class Daemon:
    """``switchboard run`` on one home, started again after every kill; each run logs to its own file."""

    def __init__(self, workdir: Path, settings: dict):
        self.workdir = workdir
        self.home = workdir / "home"
        self.config = workdir / "config.yaml"
        self.config.write_text(yaml.safe_dump({"home": str(self.home), "api": {"port": 0}, **settings}))
        self.starts: list[Start] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._notify: NotifySocket | None = None

    @property
    def db_path(self) -> Path:
        return self.home / "state.db"

    def log_path(self, run: int) -> Path:
        return self.workdir / f"daemon-{run}.log"

    async def start(self, timeout: float = 60.0) -> Start:
        run = len(self.starts)
        self._notify = NotifySocket(self.workdir / f"notify-{run}.sock")
        with open(self.log_path(run), "wb") as log:
            spawned = time.monotonic()
            self.proc = await start_daemon(self.config, {"NOTIFY_SOCKET": str(self._notify.path)}, stderr=log)
        try:
            await self._notify.wait_for(lambda line: line == "READY=1", timeout)
        except AssertionError:
            raise AssertionError(f"the daemon sent no READY=1 in {timeout:.0f}s; its log:\n{self.log_tail()}") from None
        start = Start(spawned, time.monotonic())
        self.starts.append(start)
        return start

    def freeze(self) -> None:
        """SIGSTOP: the process runs no more, though what is sent to it still reaches its sockets."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: a frozen process runs on."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed or confirmed."""
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()
        self._close_notify()

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and the exit code."""
        assert self.proc is not None
        self.proc.terminate()
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
            self._close_notify()

    def _close_notify(self) -> None:
        if self._notify is not None:
            self._notify.close()
            self._notify = None

    def log_problems(self, limit: int = 40) -> str:
        """The warnings and errors every run of the daemon logged, in order (the last ``limit`` lines)."""
        lines = []
        for run in range(len(self.starts) + 1):
            path = self.log_path(run)
            if path.exists():
                lines += [f"[run {run}] {line}" for line in path.read_text(errors="replace").splitlines()
                          if " WARNING " in line or " ERROR " in line or " CRITICAL " in line]
        return "\n".join(lines[-limit:])

    def log_tail(self, lines: int = 30) -> str:
        """The end of the newest run's log."""
        paths = [self.log_path(run) for run in range(len(self.starts) + 1) if self.log_path(run).exists()]
        return "\n".join(paths[-1].read_text(errors="replace").splitlines()[-lines:]) if paths else ""


# -- the platforms, as the users' side sees them ---------------------------------------------


@dataclass
class UserMessage:
    chat: str  # the chat as the platform names it (replies are matched to it)
    text: str
    at: float  # time.monotonic() when the platform published it
    cycle: int  # how many kills came before it


@dataclass
class BotReply:
    chat: str
    text: str
    at: float  # time.monotonic() when the platform accepted it
    message_id: str = ""  # the platform's id for it, as the delivery record notes it (sent_ids)

    @property
    def echo(self) -> tuple[str, int, str] | None:
        """What the fake model was shown: the last user message, how many there were, the first."""
        found = _ECHO.search(self.text)
        return (found.group(1), int(found.group(2)), found.group(3)) if found else None

    @property
    def echoes(self) -> str | None:
        """The user message the fake model was answering (the last one it was shown)."""
        echo = self.echo
        return echo[0] if echo else None


class Side(Protocol):
    """One platform's fake, driven as its users would."""

    name: str
    redelivers: bool  # an event the killed daemon had not acknowledged comes again
    keeps_order: bool  # one chat's messages are stored in the order they were written, even in a burst

    def settings(self) -> dict: ...

    def chat_of(self, index: int) -> str: ...

    async def ready(self, start: Start, timeout: float) -> None: ...

    async def send(self, index: int, text: str) -> bool: ...

    def replies(self) -> list[BotReply]: ...

    def notes(self) -> dict[str, int]: ...


class TelegramSide:
    """Long polling: updates stay queued until a getUpdates offset confirms them."""

    name = "telegram"
    redelivers = True
    keeps_order = True  # the adapter hands one chat's updates over one at a time

    def __init__(self, fake):
        self.fake = fake

    def settings(self) -> dict:
        return {"platforms": {"telegram": {"token": self.fake.token, "base_url": self.fake.base_url,
                                           "base_file_url": self.fake.base_file_url, "poll_timeout": 10}}}

    def _user(self, index: int) -> dict:
        return self.fake.user(10_000 + index, f"User{index}")

    def chat_of(self, index: int) -> str:
        return str(10_000 + index)

    async def ready(self, start: Start, timeout: float) -> None:
        await eventually(lambda: any(r.method == "getUpdates" and r.at >= start.spawned for r in self.fake.requests),
                     timeout, "the daemon's first getUpdates")

    async def send(self, index: int, text: str) -> bool:
        self.fake.dm(self._user(index), text)
        return True

    def replies(self) -> list[BotReply]:
        return [BotReply(str(m.chat_id), m.visible_text, m.at, str(m.message_id)) for m in self.fake.sent]

    def notes(self) -> dict[str, int]:
        return {}


class DiscordSide:
    """The gateway websocket: an event goes to whoever is connected when it happens, never again."""

    name = "discord"
    redelivers = False
    keeps_order = True

    def __init__(self, fake):
        self.fake = fake
        self._users: dict[int, dict] = {}
        self._identified = 0

    def settings(self) -> dict:
        return {"platforms": {"discord": {"token": self.fake.token, "api_base_url": self.fake.api_base_url,
                                          "gateway_url": self.fake.gateway_url}}}

    def _user(self, index: int) -> dict:
        if index not in self._users:
            self._users[index] = self.fake.add_user(f"user{index}", global_name=f"User {index}")
        return self._users[index]

    def chat_of(self, index: int) -> str:
        return self._user(index)["dm_channel_id"]

    async def ready(self, start: Start, timeout: float) -> None:
        self._identified += 1
        await eventually(lambda: sum(1 for op in self.fake.gateway_ops if op.get("op") == 2) >= self._identified
                     and self.fake.live_connections > 0, timeout, "the daemon to identify on the gateway")

    async def send(self, index: int, text: str) -> bool:
        if not self.fake.live_connections:
            return False  # the bot is offline: Discord would not tell it about this message, ever
        await self.fake.dm(self._user(index), text)
        return True

    def replies(self) -> list[BotReply]:
        offset = time.time() - time.monotonic()
        return [BotReply(m["channel_id"], m["content"],
                         datetime.datetime.fromisoformat(m["timestamp"]).timestamp() - offset, m["id"])
                for m in self.fake.sent()]

    def notes(self) -> dict[str, int]:
        return {}


class SlackSide:
    """Socket Mode: an envelope not acknowledged is delivered again on the next connection."""

    name = "slack"
    redelivers = True
    # The adapter takes one chat's events one at a time in the order they reach it, but Slack promises
    # no order: an envelope redelivered after a reconnect can come after a newer one of the same chat,
    # and is then stored after it.  Counted, not failed.
    keeps_order = False

    def __init__(self, fake):
        self.fake = fake
        self._connections = 0

    def settings(self) -> dict:
        return {"platforms": {"slack": {"bot_token": self.fake.bot_token, "app_token": self.fake.app_token,
                                        "api_base_url": self.fake.base_url, "mode": "socket"}}}

    def chat_of(self, index: int) -> str:
        return f"D{100 + index}"

    async def ready(self, start: Start, timeout: float) -> None:
        self._connections += 1
        await self.fake.wait_connected(self._connections, timeout)

    async def send(self, index: int, text: str) -> bool:
        user = f"U{100 + index}"
        self.fake.users.setdefault(user, f"user{index}")
        await self.fake.send_event(self.fake.message(self.chat_of(index), user, text))
        return True

    def replies(self) -> list[BotReply]:
        accepted = {id(body) for body in self.fake.sent}
        ts_of = {id(body): ts for ts, body in self.fake.posted.items()}
        return [BotReply(str(c.body.get("channel")), str(c.body.get("text") or ""), c.at, ts_of.get(id(c.body), ""))
                for c in self.fake.calls_to("chat.postMessage") if id(c.body) in accepted]

    def notes(self) -> dict[str, int]:
        return {"envelopes delivered again": sum(1 for d in self.fake.deliveries if d.get("retry_attempt")),
                "envelopes never acknowledged": len(self.fake.unacknowledged())}


class EmailSide:
    """IMAP: a mail stays in the mailbox without the taken keyword until the daemon stored it, so a mail the
    killed daemon had not flagged is read again.  Each user's mails are one thread (one session)."""

    name = "email"
    redelivers = True
    keeps_order = True  # the mailbox is read oldest first, one mail at a time

    def __init__(self, imap, smtp):
        self.imap = imap  # tests.mailservers.DovecotServer
        self.smtp = smtp  # tests.mailservers.SmtpSink
        self._threads: dict[int, str] = {}
        self._logins = 0

    def settings(self) -> dict:
        return {"auth": {"allow_all": True},
                "platforms": {"email": {"imap_host": "127.0.0.1", "imap_port": self.imap.port, "imap_tls": "none",
                                        "username": self.imap.user, "password": self.imap.password,
                                        "smtp_host": "127.0.0.1", "smtp_port": self.smtp.port, "smtp_tls": "none",
                                        "smtp_password": self.smtp.password, "poll_seconds": 1}}}

    def chat_of(self, index: int) -> str:
        return f"user{index}@example.com"

    @staticmethod
    def delivery_chat(chat_id: str, thread_id: str | None) -> str:
        """A delivery record's chat as replies() names it: the address its mail goes to (the record's chat
        is ``address <thread root>``); without this no pending mail ever counted as in flight at a kill."""
        return chat_id.partition(" ")[0]

    async def ready(self, start: Start, timeout: float) -> None:
        self._logins += 1
        await eventually(lambda: self.imap.logins() >= self._logins, timeout, "the daemon's IMAP login")

    async def send(self, index: int, text: str) -> bool:
        from email.message import EmailMessage

        msg = EmailMessage()
        msg["From"] = self.chat_of(index)
        msg["To"] = self.imap.user
        # no subject: the text the model sees is the body alone (a thread's subject would come first)
        root = self._threads.get(index)
        msg["Message-ID"] = f"<m{index}.{time.monotonic_ns()}@example.com>"
        if root is None:
            self._threads[index] = str(msg["Message-ID"])
        else:
            msg["In-Reply-To"] = root
            msg["References"] = root
        msg.set_content(text)
        # Appended in this thread, not to_thread: the load is cancelled at a kill, and a cancelled await would
        # leave a mail in the inbox that the run never counted as written (its answer then looks lost).  The
        # daemon is another process, so blocking this loop for the append's few milliseconds stalls nothing.
        self.imap.append(msg.as_bytes())
        return True

    def replies(self) -> list[BotReply]:
        offset = time.time() - time.monotonic()
        out = []
        for accepted in list(self.smtp.messages):
            body = accepted.message.get_body(("plain",))
            text = body.get_content().replace("\r\n", "\n").strip() if body is not None else ""
            out.append(BotReply(accepted.rcpt_tos[0], text, accepted.at - offset, str(accepted.message["Message-ID"])))
        return out

    def notes(self) -> dict[str, int]:
        return {}


# -- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    kills: int = 3
    rate: float = 20.0  # user messages per second, all chats together
    chats: int = 6  # chats writing at any moment
    retire: int = 3  # of those, how many go quiet for good at each kill (as many fresh ones take over)
    load_seconds: tuple[float, float] = (1.0, 2.5)  # the kill comes this long after the load began (uniform)
    settle_seconds: float = 15.0  # after the last restart, how long every message may take to be answered
    # freeze the daemon (SIGSTOP) at the moment of the kill and kill it only once one more message was
    # published to it: that message reached it and was certainly neither stored nor acknowledged
    kill_on_send: bool = False
    seed: int = 0


@dataclass
class Kill:
    at: float  # time.monotonic() of the SIGKILL
    pending: list[tuple[str, str]]  # deliveries pending in state.db then: (chat, text)
    unanswered: int  # inbox rows then: messages stored and not answered
    integrity: str  # PRAGMA integrity_check of the killed daemon's state.db
    in_flight: int = 0  # of ``pending`` and ``posting``, those the platform had already accepted before the restart
    # streamed replies whose turn never finished: (chat, the text of the message each was posting, or posted
    # last, the ids it noted); one the platform accepted under an id never noted was in flight
    posting: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)


@dataclass
class Outcome:
    platform: str
    plan: Plan
    redelivers: bool
    messages: list[UserMessage]
    replies: list[BotReply]
    stored: Counter  # user message text -> times stored
    kills: list[Kill]
    starts: list[Start]
    integrity: str
    exit_code: int | None
    notes: dict[str, int] = field(default_factory=dict)
    log_problems: str = ""
    keeps_order: bool = True  # see Side.keeps_order
    # the conversations were compressed (ChaosRun(summarized=True)): after a split the model sees the
    # head, a summary and the tail, not every message, so only more messages than written is a problem
    summarized: bool = False

    # -- figures --------------------------------------------------------------------------
    def expected(self) -> list[UserMessage]:
        """The messages the bot must answer: all sent, or on a platform that never redelivers, the stored ones."""
        return [m for m in self.messages if self.redelivers or self.stored[m.text]]

    def answered(self) -> set[str]:
        """Texts answered: a reply in the chat echoes the message or a later one of that chat, or shows
        the model as many of the chat's messages as reach it (one turn answers a whole batch)."""
        order: dict[str, dict[str, int]] = {}
        for m in self.messages:
            chat = order.setdefault(m.chat, {})
            chat[m.text] = len(chat)
        reach: dict[str, int] = {}
        for r in self.replies:
            echo = r.echo
            position = order.get(r.chat, {}).get(echo[0]) if echo else None
            if position is not None:
                reach[r.chat] = max(reach.get(r.chat, -1), position, echo[1] - 1)
        return {m.text for m in self.messages if order[m.chat][m.text] <= reach.get(m.chat, -1)}

    def lost(self) -> list[UserMessage]:
        answered = self.answered()
        return [m for m in self.expected() if m.text not in answered]

    def not_stored(self) -> list[UserMessage]:
        return [m for m in self.messages if not self.stored[m.text]]

    def stored_twice(self) -> list[str]:
        return [text for text, n in self.stored.items() if n > 1]

    def duplicates(self) -> int:
        copies = Counter((r.chat, r.text.strip()) for r in self.replies)
        return sum(n - 1 for n in copies.values())

    def _conversations(self) -> list[tuple[BotReply, int, int, int]]:
        """Each echoing reply with the places in its chat (order written) of the message it echoes and of
        the first message the model was shown, and how many messages the model was shown."""
        places: dict[str, dict[str, int]] = {}
        for m in self.expected():
            chat = places.setdefault(m.chat, {})
            chat[m.text] = len(chat)
        out = []
        for r in self.replies:
            echo = r.echo
            chat = places.get(r.chat, {})
            if echo and echo[0] in chat:
                out.append((r, chat[echo[0]], echo[1], chat.get(echo[2], len(chat))))
        return out

    def off_the_conversation(self) -> list[BotReply]:
        """Replies whose echo shows the model something other than the chat's messages once each, in the
        order written, in one session, up to the one it answers."""
        counts = Counter(m.chat for m in self.expected())
        return [r for r, last, shown, first in self._conversations()
                if last != shown - 1 or first != 0 or shown > counts[r.chat]]

    def more_than_written(self) -> list[BotReply]:
        """Replies whose echo shows the model more messages than the chat has: some stored twice or from elsewhere."""
        counts = Counter(m.chat for m in self.expected())
        return [r for r, _, shown, _ in self._conversations() if shown > counts[r.chat]]

    def in_flight(self) -> int:
        return sum(k.in_flight for k in self.kills)

    def resume_seconds(self, *, new_turns_only: bool = False) -> list[float]:
        """Per restart that had something to resume: READY=1 to the first reply to a message written
        before the kill; with ``new_turns_only``, leaving out the replies stored before the kill
        (sent again without a model call), so the first answer a resumed turn gave."""
        sent_at = {m.text: m.at for m in self.messages}
        out = []
        for kill, start in zip(self.kills, self.starts[1:], strict=False):
            stored_before = {(chat, text.strip()) for chat, text in kill.pending} if new_turns_only else set()
            resumed = [r.at for r in self.replies
                       if r.at >= start.spawned and sent_at.get(r.echoes or "", kill.at) < kill.at
                       and (r.chat, r.text.strip()) not in stored_before]
            if resumed:
                out.append(min(resumed) - start.ready)
        return out

    def figures(self) -> dict[str, object]:
        return {
            "sent": len(self.messages),
            "stored": sum(1 for m in self.messages if self.stored[m.text]),
            "stored twice": len(self.stored_twice()),
            "answered": len(self.answered() & {m.text for m in self.expected()}),
            "lost": len(self.lost()),
            "lost in a kill, never stored": 0 if self.redelivers else len(self.not_stored()),
            "replies": len(self.replies),
            "replies off the conversation": len(self.off_the_conversation()),
            "duplicated": self.duplicates(),
            "in flight at the kills": self.in_flight(),
            "pending at the kills": sum(len(k.pending) for k in self.kills),
            "unanswered at the kills": sum(k.unanswered for k in self.kills),
            **self.notes,
        }

    def problems(self) -> list[str]:
        """What a user would notice (empty: nothing)."""
        out = []
        if self.redelivers and (missing := self.not_stored()):
            out.append(f"{len(missing)} messages never stored: {_some(m.text for m in missing)}")
        if twice := self.stored_twice():
            out.append(f"{len(twice)} messages stored more than once: {_some(twice)}")
        if lost := self.lost():
            out.append(f"{len(lost)} of {len(self.expected())} messages never answered: "
                       f"{_some(f'{m.text} ({self._when(m)})' for m in lost)}")
        if bad := (self.off_the_conversation() if self.keeps_order and not self.summarized
                   else self.more_than_written()):
            out.append(f"{len(bad)} replies show the model something other than the chat's messages once each, "
                       f"in order, in one session: {_some(r.text for r in bad)}")
        if self.duplicates() > self.in_flight():
            out.append(f"{self.duplicates()} replies delivered twice, more than the {self.in_flight()} "
                       f"sends in flight at the kills")
        for n, kill in enumerate(self.kills, 1):
            if kill.integrity != "ok":
                out.append(f"integrity_check after kill {n}: {kill.integrity}")
        if self.integrity != "ok":
            out.append(f"integrity_check at the end: {self.integrity}")
        if self.exit_code != 0:
            out.append(f"the last daemon exited {self.exit_code} on SIGTERM")
        if self.notes.get("envelopes never acknowledged"):
            out.append(f"{self.notes['envelopes never acknowledged']} Slack envelopes never acknowledged")
        return out

    def _when(self, m: UserMessage) -> str:
        return f"written before kill {m.cycle + 1}" if m.cycle < len(self.kills) else "written after the last kill"

    def report(self) -> str:
        """Figures, problems and how to run the same kills again."""
        lines = [f"{self.platform}: {len(self.kills)} kills, seed {self.plan.seed} "
                 f"(run again with CHAOS_SEED={self.plan.seed})"]
        lines += [f"  {name}: {value}" for name, value in self.figures().items()]
        for what, seconds in (("answer", self.resume_seconds()),
                              ("answer from a new turn", self.resume_seconds(new_turns_only=True))):
            if seconds:
                lines.append(f"  READY=1 to the first resumed {what}: {', '.join(f'{s:.2f}' for s in seconds)} s")
        lines += [f"  problem: {p}" for p in self.problems()]
        if self.problems() and self.log_problems:
            lines.append("  warnings and errors the daemon logged:\n" + self.log_problems)
        return "\n".join(lines)


class ChaosRun:
    """Kill the daemon ``plan.kills`` times under load and restart it; see the module docstring."""

    def __init__(self, side: Side, workdir: Path, model_base_url: str, plan: Plan, *,
                 kill_when: Callable[[], bool] | None = None, model: dict | None = None,
                 settings: dict | None = None, summarized: bool = False):
        self.side = side
        self.plan = plan
        self.kill_when = kill_when  # past the random moment, the kill also waits for this (e.g. a turn running)
        # the conversations are compressed: the model sees a summary instead of their middle (Outcome.summarized)
        self.summarized = summarized
        settings = {
            "model": {"base_url": model_base_url, "name": "fake-model", "api_key": "sk-chaos-not-a-secret-0000",
                      "max_concurrent_calls": 32, "context_length": 32768, **(model or {})},
            "auth": {"allow_all": True},
            "sessions": {"reset": {"mode": "none"}},  # one session per chat for the whole run
            "logging": {"level": "INFO", "format": "text"},
            "shutdown": {"grace_seconds": 5},
            **side.settings(),
            **(settings or {}),
        }
        self.daemon = Daemon(workdir, settings)
        self.messages: list[UserMessage] = []
        self.kills: list[Kill] = []
        self._kill_rng = random.Random(plan.seed)
        self._chat_rng = random.Random(plan.seed + 1)
        self._counts: Counter = Counter()
        self._sent = asyncio.Event()  # a message was just published (for Plan.kill_on_send)
        self._cycle = 0  # kills so far, as the load sees them

    async def run(self) -> Outcome:
        plan = self.plan
        exit_code = None
        load: asyncio.Task | None = None
        try:
            for cycle in range(plan.kills):
                await self._start()
                if load is None:
                    load = asyncio.create_task(self._load())
                await asyncio.sleep(self._kill_rng.uniform(*plan.load_seconds))  # the random moment of the kill
                await self._kill_moment()
                await self.daemon.kill()
                self._cycle = cycle + 1  # some chats go quiet for good, fresh ones write even while it is down
                pending, unanswered, integrity, posting = await asyncio.to_thread(
                    _after_kill, self.daemon.db_path, getattr(self.side, "delivery_chat", None))
                self.kills.append(Kill(time.monotonic(), pending, unanswered, integrity, posting=posting))
            await self._start()
            if load is not None:
                await _cancel(load)
            await self._settle()
        finally:
            if load is not None:
                await _cancel(load)
            if self.daemon.proc is not None and self.daemon.proc.returncode is None:
                exit_code = await self.daemon.stop()
        stored = await asyncio.to_thread(_stored, self.daemon.db_path, self.summarized)
        integrity = await asyncio.to_thread(_integrity, self.daemon.db_path)
        return Outcome(self.side.name, plan, self.side.redelivers, self.messages, self.side.replies(), stored,
                       self.kills, self.daemon.starts, integrity, exit_code, self.side.notes(),
                       self.daemon.log_problems(), self.side.keeps_order, self.summarized)

    async def _kill_moment(self) -> None:
        """Past the random moment, wait for ``kill_when``; with ``Plan.kill_on_send``, freeze the daemon
        then and wait for the next message published to it."""
        while self.kill_when is not None and not self.kill_when():
            await asyncio.sleep(0.005)
        if self.plan.kill_on_send:
            self.daemon.freeze()
            self._sent.clear()
            await self._sent.wait()

    async def _start(self) -> None:
        if self.kills:  # what the platform accepted from the killed daemon is all in by now
            kill = self.kills[-1]
            kill.in_flight = count_in_flight(kill, self.side.replies())
        start = await self.daemon.start()
        await self.side.ready(start, 30.0)

    async def _load(self) -> None:
        """Users write at ``plan.rate`` until cancelled: after ``n`` kills, chats ``n * retire`` onwards."""
        plan = self.plan
        loop = asyncio.get_running_loop()
        began = loop.time()
        for i in range(10**9):
            wait = began + i / plan.rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            cycle = self._cycle
            index = self._chat_rng.randrange(cycle * plan.retire, cycle * plan.retire + plan.chats)
            text = f"c{index:03d} m{self._counts[index]:04d}"
            at = time.monotonic()
            if await self.side.send(index, text):
                self._counts[index] += 1
                self.messages.append(UserMessage(self.side.chat_of(index), text, at, cycle))
                self._sent.set()

    async def _settle(self) -> None:
        """Until every message is answered or ``plan.settle_seconds`` passed (the figures tell which)."""
        deadline = time.monotonic() + self.plan.settle_seconds
        while time.monotonic() < deadline:
            stored = Counter() if self.side.redelivers else await asyncio.to_thread(_stored, self.daemon.db_path,
                                                                                    self.summarized)
            outcome = Outcome(self.side.name, self.plan, self.side.redelivers, self.messages, self.side.replies(),
                              stored, [], [], "ok", 0)
            # a side whose senders retry (webhooks) is settled only once none of its requests is still being sent
            busy = getattr(self.side, "busy", None)
            if not outcome.lost() and not (busy is not None and busy()):
                return
            await asyncio.sleep(0.2)


def count_in_flight(kill: Kill, replies: list[BotReply]) -> int:
    """Of the deliveries pending at ``kill``, how many the platform had accepted, and of the streamed
    messages being posted then, how many it had accepted under an id the store never noted (from the
    killed daemon, when ``replies`` are read before the restart sends anything)."""
    accepted = {(r.chat, r.text.strip()) for r in replies}
    posted = sum(1 for chat, text, noted in kill.posting
                 if any((r.chat, r.text.strip()) == (chat, text.strip()) and r.message_id not in noted for r in replies))
    return posted + sum(1 for chat, text in kill.pending if (chat, text.strip()) in accepted)


def _after_kill(db_path: Path, chat_of: Callable[[str, str | None], str] | None = None
                ) -> tuple[list[tuple[str, str]], int, str, list[tuple[str, str, tuple[str, ...]]]]:
    """Deliveries pending, inbox rows, integrity_check and streamed replies unfinished (Kill.posting) of a
    killed daemon's state.db; ``chat_of(chat_id, thread_id)`` names a delivery's chat as the side's replies
    do (default: the chat id)."""
    con = sqlite3.connect(db_path)

    def named(chat, thread) -> str:
        return chat_of(str(chat), thread) if chat_of else str(chat)

    try:
        integrity = "; ".join(row[0] for row in con.execute("PRAGMA integrity_check"))
        pending = [(named(chat, thread), text) for chat, thread, text in
                   con.execute("SELECT chat_id, thread_id, text FROM deliveries WHERE status = 'pending'")]
        posting = [(named(chat, thread), text, tuple(str(i) for i in json.loads(ids or "[]")))
                   for chat, thread, text, ids in con.execute(
                       "SELECT chat_id, thread_id, text, sent_ids FROM deliveries WHERE status = 'streaming'")]
        unanswered = con.execute("SELECT COUNT(*) FROM inbox").fetchone()[0]
        return pending, unanswered, integrity, posting
    finally:
        con.close()


def _stored(db_path: Path, summarized: bool = False) -> Counter:
    """How many times each user message text is stored (read-only: a daemon may be writing).

    ``summarized``: a compression's copies (a child's message with the platform id and timestamp of one
    of its parent's) are the same message, not another storing of it, and its summary is no user's."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    copies = (" AND NOT EXISTS (SELECT 1 FROM sessions s JOIN messages p ON p.session_id = s.parent_session_id"
              " WHERE s.id = m.session_id AND p.platform_message_id = m.platform_message_id"
              " AND p.timestamp = m.timestamp)"
              " AND content NOT LIKE '[Summary of earlier conversation]%'") if summarized else ""
    try:
        return Counter(dict(con.execute(
            f"SELECT content, COUNT(*) FROM messages m WHERE role = 'user'{copies} GROUP BY content")))
    finally:
        con.close()


def _integrity(db_path: Path) -> str:
    con = sqlite3.connect(db_path)
    try:
        return "; ".join(row[0] for row in con.execute("PRAGMA integrity_check"))
    finally:
        con.close()


def _some(items, limit: int = 12) -> str:
    items = list(items)
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


async def _cancel(task: asyncio.Task) -> None:
    """Cancel ``task``; an exception it died of earlier is raised here, never swallowed."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()
