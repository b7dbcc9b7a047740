"""End to end: a real Dovecot (IMAP) and aiosmtpd (SMTP submission) <-> aioimaplib and aiosmtplib <-> our
adapter <-> the real gateway <-> the fake model.

Mail lands in the inbox by IMAP APPEND, as a delivery agent would put it there; what the user would
see is asserted on what the SMTP server accepted (the reply's headers and parts), what is remembered
on the model's requests and in state.db, and which mails carry the taken keyword in the mailbox.
"""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage
from email.utils import make_msgid

import pytest

from adapters.email import EmailAdapter, EmailConfig
from gateway.runtime.cluster import connection_key
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, gateway_config, stored_routes
from tests.mailservers import DovecotServer, SmtpSink, why_no_dovecot

pytestmark = pytest.mark.skipif(why_no_dovecot() is not None, reason=why_no_dovecot() or "")

BOSS = "boss@example.com"


def mail(body: str, *, sender: str = f"Boss <{BOSS}>", subject: str = "Question", message_id: str | None = None,
         reply_to_id: str | None = None, references: str | None = None, headers: dict | None = None,
         attach: tuple[str, str, bytes] | None = None) -> tuple[bytes, str]:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "bot@example.com"
    msg["Subject"] = subject
    msg["Message-ID"] = message_id or make_msgid(domain="example.com")
    if reply_to_id:
        msg["In-Reply-To"] = reply_to_id
        msg["References"] = references or reply_to_id
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(body)
    if attach:
        name, mime, data = attach
        major, minor = mime.split("/")
        msg.add_attachment(data, maintype=major, subtype=minor, filename=name)
    return msg.as_bytes(), str(msg["Message-ID"])


def email_section(imap: DovecotServer, smtp: SmtpSink, **extra) -> dict:
    return {"imap_host": "127.0.0.1", "imap_port": imap.port, "imap_tls": "none", "username": imap.user,
            "password": imap.password, "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_tls": "none",
            "smtp_password": smtp.password, "allowed_users": [BOSS], "poll_seconds": 1, **extra}


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
async def world(tmp_path, servers):
    imap, smtp = servers
    async with FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, platforms={"email": email_section(imap, smtp)})
        gw = Gateway(config, serve_api=False)  # the adapter comes from its entry point and from_config
        await gw.start()
        try:
            assert isinstance(gw.adapters["email"], EmailAdapter)
            await eventually(lambda: gw.health()["platforms"]["email"]["state"] == "connected", timeout=15,
                             what="the email adapter connected")
            yield imap, smtp, model, gw, config
        finally:
            await gw.stop(grace_seconds=5)


def body(accepted) -> tuple[str, str]:
    msg = accepted.message
    return tuple(msg.get_body((kind,)).get_content().replace("\r\n", "\n") for kind in ("plain", "html"))


async def replies(smtp: SmtpSink, count: int, timeout: float = 20.0):
    await eventually(lambda: len(smtp.messages) >= count, timeout=timeout,
                     what=lambda: f"{count} replies accepted by SMTP (have {len(smtp.messages)})")
    return list(smtp.messages)


async def test_a_mail_is_answered_threaded_in_text_and_html_and_a_reply_continues_the_session(world):
    imap, smtp, model, gw, config = world
    raw, first_id = mail("My name is **Ann**.", subject="Hello")
    imap.append(raw)
    (reply,) = await replies(smtp, 1)
    assert reply.mail_from == "bot@example.com" and reply.rcpt_tos == [BOSS]
    msg = reply.message
    assert (msg["Subject"], msg["In-Reply-To"], msg["References"]) == ("Re: Hello", first_id, first_id)
    assert msg["Auto-Submitted"] == "auto-replied"
    text, html = body(reply)
    assert "echo: Hello\n\nMy name is **Ann**." in text and "<strong>Ann</strong>" in html

    # the boss answers in the thread, quoting us: the model sees only the new words, in the same session
    quoted = "\n".join("> " + line for line in text.splitlines())
    raw, second_id = mail(f"What is my name?\n\nOn Tue, 1 Dec 2026 at 10:00, Switchboard <bot@example.com> wrote:\n"
                          f"{quoted}\n", subject="Re: Hello", reply_to_id=str(msg["Message-ID"]),
                          references=f"{first_id} {msg['Message-ID']}")
    imap.append(raw)
    _, again = await replies(smtp, 2)
    assert "echo: What is my name? | turns: 2 | first: Hello" in body(again)[0]
    assert again.message["In-Reply-To"] == second_id
    assert again.message["References"].split() == [first_id, str(msg["Message-ID"]), second_id]
    assert stored_routes(config) == [f"agent:main:email:dm:{BOSS} {first_id}"]
    # both mails carry the keyword: they are never taken again
    await eventually(lambda: all("$SwitchboardTaken" in f for f in imap.flags().values()), timeout=10,
                     what="both mails flagged as taken")


async def test_two_threads_are_two_sessions(world):
    imap, smtp, model, gw, config = world
    imap.append(mail("first thread", subject="One")[0])
    await replies(smtp, 1)
    imap.append(mail("second thread", subject="Two")[0])
    sent = await replies(smtp, 2)
    assert all("turns: 1" in body(s)[0] for s in sent)
    assert len(stored_routes(config)) == 2 and all(k.startswith(f"agent:main:email:dm:{BOSS} <")
                                                   for k in stored_routes(config))


async def test_strangers_and_a_spoofed_display_name_never_reach_the_model(world):
    imap, smtp, model, gw, config = world
    imap.append(mail("let me in", sender='"boss@example.com" <evil@x.org>')[0])
    imap.append(mail("me too", sender="stranger@x.org")[0])
    imap.append(mail("and this one is real")[0])
    sent = await replies(smtp, 3)  # two pairing offers, one answer
    offers = {s.rcpt_tos[0]: body(s)[0] for s in sent if "pairing approve" in body(s)[0]}
    assert sorted(offers) == ["evil@x.org", "stranger@x.org"]  # the spoofed display name is evil@x.org's
    assert all("switchboard pairing approve email " in text for text in offers.values())
    [answer] = [s for s in sent if s.rcpt_tos == [BOSS]]
    assert "and this one is real" in body(answer)[0]
    await eventually(lambda: len(imap.flags()) == 3 and all("$SwitchboardTaken" in f for f in imap.flags().values()),
                     timeout=10, what="every mail taken")
    assert [r.last_user_text for r in model.requests] == ["Question\n\nand this one is real"]


async def test_auto_replies_bounces_and_list_mail_are_never_answered(world):
    imap, smtp, model, gw, config = world
    for headers in ({"Auto-Submitted": "auto-replied"}, {"Precedence": "bulk"}, {"List-Id": "<team.example.com>"},
                    {"Return-Path": "<>"}):
        imap.append(mail("I am out of office", headers=headers)[0])
    imap.append(mail("a person")[0])
    (reply,) = await replies(smtp, 1)
    assert "a person" in body(reply)[0]
    await eventually(lambda: len(imap.flags()) == 5 and all("$SwitchboardTaken" in f for f in imap.flags().values()),
                     timeout=10, what="every mail taken")
    assert len(smtp.messages) == 1 and len(model.requests) == 1


async def test_the_same_mail_delivered_twice_is_answered_once(world):
    imap, smtp, model, gw, config = world
    raw, _ = mail("only once please")
    imap.append(raw)
    imap.append(raw)  # delivered twice (two MX paths, a resend): two UIDs, one Message-ID
    imap.append(mail("next")[0])
    sent = await replies(smtp, 2)
    await eventually(lambda: len(imap.flags()) == 2 or all("$SwitchboardTaken" in f for f in imap.flags().values()),
                     timeout=10, what="every mail taken")
    assert sorted(body(s)[0].split(" | ")[0] for s in sent) == ["echo: Question\n\nnext", "echo: Question\n\nonly once please"]
    assert len(smtp.messages) == 2


async def test_an_attachment_reaches_the_media_store(world):
    imap, smtp, model, gw, config = world
    imap.append(mail("what does the file say?", attach=("notes.txt", "text/plain", b"the launch is on Friday\n"))[0])
    await replies(smtp, 1)
    stored = [p for p in (config.home / "media").rglob("*") if p.is_file()]
    assert any(p.read_bytes() == b"the launch is on Friday\n" for p in stored), stored
    assert "the launch is on Friday" in str(model.requests[-1].messages)


async def test_a_refused_submission_is_retried_and_sent_once(world):
    imap, smtp, model, gw, config = world
    smtp.fail_next = 2  # 451 twice, then accepted
    imap.append(mail("are you there?")[0])
    (reply,) = await replies(smtp, 1, timeout=30)
    assert "are you there?" in body(reply)[0] and len(smtp.messages) == 1


async def test_a_reply_after_a_restart_threads_from_the_mailbox(tmp_path, servers):
    """The adapter that sends never read the mail (a restart, a standby): the subject and references come
    from the mailbox, looked up by Message-ID."""
    imap, smtp = servers
    raw, mid = mail("stored earlier", subject="Budget", reply_to_id="<root@example.com>",
                    references="<root@example.com> <mid@example.com>")
    imap.append(raw)
    adapter = EmailAdapter(EmailConfig(**email_section(imap, smtp, imap_tls="none")))
    await adapter.open_for_sending()
    from gateway.types import ChatRef

    delivery = await adapter.send(ChatRef("email", f"{BOSS} <root@example.com>"), "Here it is.", reply_to=mid)
    assert delivery.ok, delivery.error
    (reply,) = await replies(smtp, 1)
    assert reply.message["Subject"] == "Re: Budget"
    assert reply.message["References"].split() == ["<root@example.com>", "<mid@example.com>", mid]
    assert delivery.message_ids == (str(reply.message["Message-ID"]),)
    await adapter.stop()


def test_a_cluster_runs_one_imap_loop_per_mailbox_and_never_names_its_secrets():
    from gateway.config import config_from_dict

    def section(**extra):
        base = {"imap_host": "imap.example.com", "username": "bot@example.com", "password": "hunter2-secret",
                "smtp_host": "smtp.example.com"}
        return config_from_dict({"platforms": {"email": {**base, **extra}}}).platforms.email

    key = connection_key("email", section())
    assert key is not None and key.startswith("email:") and "bot" not in key and "hunter2" not in key
    assert connection_key("email", section(password="another")) == key  # the same mailbox
    assert connection_key("email", section(mailbox="Support")) != key


def test_raw_reply_parses_strictly():
    # the sink's parsing matches what a client does (a guard on the helpers above)
    raw, _ = mail("x")
    assert email.message_from_bytes(raw, policy=email.policy.default)["From"].addresses[0].addr_spec == BOSS


async def test_doctor_logs_in_to_both_servers_and_says_which_one_refused(servers):
    import aiohttp

    from gateway.cli.doctor import check_platforms
    from gateway.config import config_from_dict

    imap, smtp = servers
    async with aiohttp.ClientSession() as http:
        good = config_from_dict({"platforms": {"email": email_section(imap, smtp)}})
        (check,) = [c for c in await check_platforms(http, good) if c.name == "email"]
        assert check.ok is True and check.detail == "IMAP login to INBOX (IDLE) and SMTP login work"
        bad = config_from_dict({"platforms": {"email": email_section(imap, smtp, smtp_password="wrong-smtp-pw")}})
        (check,) = [c for c in await check_platforms(http, bad) if c.name == "email"]
        assert (check.ok, check.detail) == (False, "the SMTP server refused the login")
        worse = config_from_dict({"platforms": {"email": email_section(imap, smtp, password="wrong-imap-pw")}})
        (check,) = [c for c in await check_platforms(http, worse) if c.name == "email"]
        assert check.ok is False and "refused the login" in check.detail and "wrong-imap-pw" not in check.line()
