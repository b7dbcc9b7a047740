"""The email adapter after its IMAP connection ends: it reconnects with backoff and catches up on the mail
that landed meanwhile, by UID, each mail answered once and in the order it landed.

Against the real Dovecot, cut by ``doveadm kick`` (its BYE, then the close), and through
tests/fakes/cutting_relay.py in front of it for the faults a kick cannot aim at: a reset without a BYE,
the server unreachable for a while, and a cut between the gateway storing a mail and the server
setting its taken keyword (either side of the STORE).  What a user would see is asserted on the
replies the SMTP server accepted; that no mail is handed over twice, on the FETCHes the relay carried.

    .venv/bin/python -m pytest -q -n 0 tests/test_adapter_email_reconnect.py
"""

from __future__ import annotations

import re
from email.message import EmailMessage
from email.utils import make_msgid

import pytest

from gateway.runtime.daemon import Gateway
from tests.fakes.cutting_relay import CuttingRelay
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, gateway_config
from tests.mailservers import DovecotServer, SmtpSink, why_no_dovecot

pytestmark = pytest.mark.skipif(why_no_dovecot() is not None, reason=why_no_dovecot() or "")

BOSS = "boss@example.com"
KEYWORD = "$SwitchboardTaken"


class Thread:
    """The boss's mails, one thread: the first is its root, each later one answers it."""

    def __init__(self) -> None:
        self.root: str | None = None

    def mail(self, word: str) -> bytes:
        msg = EmailMessage()
        msg["From"] = f"Boss <{BOSS}>"
        msg["To"] = "bot@example.com"
        msg["Subject"] = "Re: Plan" if self.root else "Plan"
        msg["Message-ID"] = make_msgid(domain="example.com")
        if self.root:
            msg["In-Reply-To"] = msg["References"] = self.root
        else:
            self.root = str(msg["Message-ID"])
        msg.set_content(word)
        return msg.as_bytes()


def answered(smtp: SmtpSink) -> list[str]:
    """The word each reply echoed, in the order the SMTP server accepted them."""
    out = []
    for accepted in list(smtp.messages):
        text = accepted.message.get_body(("plain",)).get_content()
        found = re.search(r"echo: (?:Plan\s+)?(\w+)", text)
        out.append(found.group(1) if found else text)
    return out


def read_by_the_model(model: FakeModel) -> list[str]:
    """The boss's mails the model read in its last request, in order (the session as it was stored)."""
    users = [m["content"] for m in model.requests[-1].messages if m.get("role") == "user"]
    return [re.sub(r"^Plan\s+", "", str(text)).strip() for text in users]


async def answered_through(smtp: SmtpSink, model: FakeModel, words: list[str], timeout: float = 30.0) -> list[str]:
    """Until a reply echoes the last of ``words``; the mails the model had read by then.  Mails that land
    while a turn runs are answered together by the next one (the gateway's queue), so a reply per mail
    is not what a user sees; every mail read once, in order, is."""
    await eventually(lambda: words[-1] in answered(smtp), timeout, lambda: f"a reply to {words[-1]!r} "
                     f"(have {answered(smtp)})")
    return read_by_the_model(model)


async def replies(smtp: SmtpSink, count: int, timeout: float = 30.0) -> list[str]:
    await eventually(lambda: len(smtp.messages) >= count, timeout,
                     lambda: f"{count} replies (have {answered(smtp)})")
    return answered(smtp)


@pytest.fixture
def servers():
    imap = DovecotServer.start()
    smtp = SmtpSink().start()
    try:
        yield imap, smtp
    finally:
        smtp.stop()
        imap.stop()


@pytest.fixture
async def relay(servers):
    async with CuttingRelay(upstream_port=servers[0].port) as r:
        yield r


def section(imap: DovecotServer, smtp: SmtpSink, port: int) -> dict:
    return {"imap_host": "127.0.0.1", "imap_port": port, "imap_tls": "none", "username": imap.user,
            "password": imap.password, "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_tls": "none",
            "smtp_password": smtp.password, "allowed_users": [BOSS], "poll_seconds": 1}


class running:
    """The real gateway with the email platform reading the mailbox on ``port``."""

    def __init__(self, tmp_path, imap: DovecotServer, smtp: SmtpSink, port: int):
        self.tmp_path, self.imap, self.smtp, self.port = tmp_path, imap, smtp, port

    async def __aenter__(self) -> "running":
        self.model = FakeModel()
        await self.model.__aenter__()
        config = gateway_config(self.tmp_path / "home", self.model.base_url,
                                platforms={"email": section(self.imap, self.smtp, self.port)})
        self.gw = Gateway(config, serve_api=False)
        await self.gw.start()
        await eventually(lambda: self.state() == "connected", 15, "the email adapter connected")
        return self

    def state(self) -> str:
        return self.gw.health()["platforms"]["email"]["state"]

    async def __aexit__(self, *exc: object) -> None:
        await self.gw.stop(grace_seconds=5)
        await self.model.__aexit__(None, None, None)


def all_taken(imap: DovecotServer, count: int) -> bool:
    flags = imap.flags()
    return len(flags) == count and all(KEYWORD in f for f in flags.values())


async def test_after_a_doveadm_kick_the_mails_that_landed_meanwhile_are_answered_once_in_order(tmp_path, servers):
    imap, smtp = servers
    thread = Thread()
    async with running(tmp_path, imap, smtp, imap.port) as run:
        imap.append(thread.mail("one"))
        assert await replies(smtp, 1) == ["one"]
        logins = imap.logins()
        imap.kick()  # Dovecot says BYE and closes: the adapter is away until it reconnects
        for word in ("two", "three", "four"):
            imap.append(thread.mail(word))
        assert await answered_through(smtp, run.model, ["two", "three", "four"]) == ["one", "two", "three", "four"]
        await eventually(lambda: all_taken(imap, 4), 10, "every mail flagged taken")
        imap.append(thread.mail("five"))  # and the new connection waits in IDLE again
        assert await answered_through(smtp, run.model, ["five"]) == ["one", "two", "three", "four", "five"]
        assert run.state() == "connected"
        assert imap.logins() > logins  # it did log in again
        assert len(set(answered(smtp))) == len(answered(smtp))  # no reply twice


async def test_while_the_server_is_unreachable_it_backs_off_then_catches_up(tmp_path, servers, relay):
    imap, smtp = servers
    thread = Thread()
    async with running(tmp_path, imap, smtp, relay.port) as run:
        imap.append(thread.mail("one"))
        assert await replies(smtp, 1) == ["one"]
        relay.refuse = True
        assert relay.cut() >= 1  # a reset: no BYE, nothing said
        await eventually(lambda: run.state() == "reconnecting", 10, "the health says it is reconnecting")
        for word in ("two", "three", "four"):
            imap.append(thread.mail(word))  # landing while it is away
        await eventually(lambda: len(relay.refused_at) >= 3, 20, lambda: f"3 attempts (saw {relay.refused_at})")
        gaps = [b - a for a, b in zip(relay.refused_at, relay.refused_at[1:], strict=False)]
        # reconnect_backoff 1 s doubling, with equal jitter: 1-2 s after the first refusal, then 2-4 s
        assert gaps[0] >= 0.95 and gaps[1] >= 1.95, gaps
        assert "IMAP" in (run.gw.health()["platforms"]["email"]["last_error"] or "")
        relay.refuse = False
        assert await answered_through(smtp, run.model, ["two", "three", "four"]) == ["one", "two", "three", "four"]
        await eventually(lambda: run.state() == "connected", 10, "connected again")
        await eventually(lambda: all_taken(imap, 4), 10, "every mail flagged taken")
        assert len(set(answered(smtp))) == len(answered(smtp))


@pytest.mark.parametrize("side", ["before", "after"])
async def test_a_cut_between_storing_a_mail_and_flagging_it_never_hands_it_over_twice(tmp_path, servers, relay, side):
    """``before``: the STORE never reached the server; ``after``: it did, and its answer never came back."""
    imap, smtp = servers
    thread = Thread()
    async with running(tmp_path, imap, smtp, relay.port):
        (relay.cut_before if side == "before" else relay.cut_after)(b"UID store 1 ")
        imap.append(thread.mail("one"))
        assert await replies(smtp, 1) == ["one"]
        await eventually(lambda: relay.cuts >= 1, 10, "the scripted cut")
        await eventually(lambda: all_taken(imap, 1), 15, "the mail flagged taken by the next connection")
        imap.append(thread.mail("two"))
        assert await replies(smtp, 2) == ["one", "two"]
        assert relay.accepted >= 2  # it reconnected
        assert relay.count(b"UID fetch 1 ") == 1, [c for c in relay.sent if b"fetch" in c.lower()]
        assert relay.count(b"UID fetch 2 ") == 1
    assert len(smtp.messages) == 2


async def test_the_imap_connection_probes_a_silent_peer_so_a_cut_without_a_reset_ends_it(servers):
    # a cut that sends no reset (a NAT forgetting the connection) would otherwise be seen only at IDLE's renewal
    import socket

    from adapters.email.outbound import KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES, ImapLogin, close

    imap, _ = servers
    client = await ImapLogin("127.0.0.1", imap.port, "none", imap.user, imap.password, "INBOX").open()
    try:
        sock = client.protocol.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)) == (KEEPALIVE_IDLE, KEEPALIVE_INTERVAL,
                                                                            KEEPALIVE_PROBES)
    finally:
        await close(client)
