"""The email platform's reading and writing of mail, without a server: who sent it, whether a machine
did, which thread it belongs to, what the model reads, and the reply's headers and HTML."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

import pytest
from hypothesis import given, settings, strategies as st

from adapters.email.compose import compose_reply, markdown_to_html
from adapters.email.config import EmailConfig, strict_address
from adapters.email.message import Rules, Thread, read_mail, reply_subject, split_chat
from gateway.errors import ConfigError
from gateway.types import ChatType, MediaLimits

RULES = Rules(own="bot@example.com")


def mail(body: str = "Hello there", *, sender: str = "Boss <boss@example.com>", subject: str = "Question",
         message_id: str = "<q1@example.com>", headers: dict[str, str] | None = None, html: str | None = None,
         attach: tuple[str, str, bytes] | None = None) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "bot@example.com"
    msg["Subject"] = subject
    if message_id:
        msg["Message-ID"] = message_id
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(body)
    if html is not None:
        msg.add_alternative(html, subtype="html")
    if attach is not None:
        name, mime, data = attach
        major, minor = mime.split("/")
        msg.add_attachment(data, maintype=major, subtype=minor, filename=name)
    return msg.as_bytes()


def test_a_new_mail_is_a_thread_of_its_own_keyed_by_its_sender():
    read = read_mail(mail(), event_id="7:1", rules=RULES)
    assert read.skipped is None and read.message is not None
    m = read.message
    assert (m.platform, m.chat_type, m.chat_id, m.user_id, m.thread_id, m.message_id) == (
        "email", ChatType.DM, "boss@example.com <q1@example.com>", "boss@example.com", None, "<q1@example.com>")
    assert split_chat(m.chat_id) == ("boss@example.com", "<q1@example.com>")
    assert split_chat("boss@example.com") == ("boss@example.com", None)  # a new mail (a scheduled job's)
    assert split_chat('"x" <evil@x.org>')[0] is None  # never an address to send to
    assert m.text == "Question\n\nHello there"  # the first mail of a thread carries its subject
    assert m.user_name == "Boss"


def test_a_reply_joins_its_thread_through_references():
    raw = mail("Thanks", subject="Re: Question", message_id="<q2@example.com>",
               headers={"In-Reply-To": "<sb.1@example.com>", "References": "<q1@example.com> <sb.1@example.com>"})
    m = read_mail(raw, event_id="7:2", rules=RULES).message
    assert m is not None and (m.chat_id, m.text) == ("boss@example.com <q1@example.com>", "Thanks")


def test_a_display_name_is_never_read_as_the_address():
    # a quoted display name holding the allowed address: the sender is the address in the brackets
    m = read_mail(mail(sender='"boss@example.com" <evil@x.org>'), event_id="7:3", rules=RULES).message
    assert m is not None and m.user_id == "evil@x.org" and m.chat_id == "evil@x.org <q1@example.com>"
    # the same unquoted is not a valid From at all
    assert read_mail(mail(sender="boss@example.com <evil@x.org>"), event_id="7:3", rules=RULES).message is None


@pytest.mark.parametrize("sender", [
    "boss@example.com, evil@x.org",        # two senders
    "",                                    # none
    "not an address",
    "<boss@example.com",                   # broken
    "Boss <boss@example.com> <evil@x.org>",
])
def test_a_from_that_is_not_exactly_one_clean_address_is_refused(sender):
    raw = mail(sender="placeholder@example.com").replace(b"placeholder@example.com", sender.encode(), 1)
    read = read_mail(raw, event_id="7:4", rules=RULES)
    assert read.message is None and read.skipped.startswith("sender")


def test_two_from_headers_are_refused():
    raw = mail().replace(b"From: Boss", b"From: evil@x.org\r\nFrom: Boss", 1)
    assert read_mail(raw, event_id="7:5", rules=RULES).message is None


@pytest.mark.parametrize("headers, why", [
    ({"Auto-Submitted": "auto-replied"}, "auto-reply"),
    ({"Auto-Submitted": "auto-generated; owner-email=x@y.z"}, "auto-reply"),
    ({"Precedence": "bulk"}, "bulk"),
    ({"Precedence": "list"}, "bulk"),
    ({"Precedence": "junk"}, "bulk"),
    ({"List-Id": "<team.lists.example.com>"}, "mailing-list"),
    ({"List-Unsubscribe": "<mailto:unsub@example.com>"}, "mailing-list"),
    ({"X-Autoreply": "yes"}, "auto-reply"),
    ({"Return-Path": "<>"}, "null sender"),
])
def test_mail_from_machines_is_never_answered(headers, why):
    read = read_mail(mail(headers=headers), event_id="7:6", rules=RULES)
    assert read.message is None and why in read.skipped


def test_auto_submitted_no_is_a_person():
    assert read_mail(mail(headers={"Auto-Submitted": "no"}), event_id="7:7", rules=RULES).message is not None


@pytest.mark.parametrize("sender", ["MAILER-DAEMON@example.com", "postmaster@example.com", "Bot <bot@example.com>"])
def test_bounces_and_our_own_mail_are_never_answered(sender):
    assert read_mail(mail(sender=sender), event_id="7:8", rules=RULES).message is None


def test_a_delivery_report_is_a_bounce():
    raw = (b"From: Mail Delivery <mailer@example.net>\r\nTo: bot@example.com\r\nSubject: Undelivered\r\n"
           b"Message-ID: <b1@example.net>\r\nMIME-Version: 1.0\r\n"
           b'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
           b"--b\r\nContent-Type: text/plain\r\n\r\nfailed\r\n--b--\r\n")
    read = read_mail(raw, event_id="7:9", rules=RULES)
    assert read.message is None and "bounce" in read.skipped


AUTH = Rules(own="bot@example.com", authserv_id="mx.example.com")


@pytest.mark.parametrize("results, passes", [
    ("mx.example.com; dkim=pass header.d=example.com header.s=s1; spf=fail", True),
    ("mx.example.com; dkim=pass (good signature) header.d=mail.example.com", False),  # a subdomain signs less
    ("mx.example.com; spf=pass smtp.mailfrom=boss@example.com", True),
    ("mx.example.com; spf=pass smtp.mailfrom=example.com", True),
    ("mx.example.com; dkim=pass header.d=other.org; spf=pass smtp.mailfrom=bounce@other.org", False),
    ("mx.example.com; dkim=fail header.d=example.com; spf=softfail smtp.mailfrom=example.com", False),
    ("evil.example.org; dkim=pass header.d=example.com", False),  # someone else's server
])
def test_only_mail_the_operators_server_vouched_for_passes(results, passes):
    read = read_mail(mail(headers={"Authentication-Results": results}), event_id="7:10", rules=AUTH)
    assert (read.message is not None) is passes, read.skipped


def test_without_authentication_results_the_mail_is_refused_when_they_are_required():
    read = read_mail(mail(), event_id="7:11", rules=AUTH)
    assert read.message is None and "no Authentication-Results from mx.example.com" in read.skipped


def test_the_newest_header_of_our_server_decides_not_a_forged_one_below_it():
    raw = mail().replace(b"From:", b"Authentication-Results: mx.example.com; dkim=fail header.d=example.com\r\n"
                                   b"Authentication-Results: mx.example.com; dkim=pass header.d=example.com\r\nFrom:", 1)
    assert read_mail(raw, event_id="7:12", rules=AUTH).message is None


def test_quoted_history_and_the_signature_never_reach_the_model():
    body = ("Can you check the logs too?\n\n--\nBoss Person\nCEO, Example Inc.\n\n"
            "On Tue, 1 Dec 2026 at 10:00, Switchboard <bot@example.com> wrote:\n> The answer was 42.\n> More.\n")
    raw = mail(body, subject="Re: Question", headers={"In-Reply-To": "<sb.1@example.com>"})
    m = read_mail(raw, event_id="7:13", rules=RULES).message
    assert m is not None and m.text == "Can you check the logs too?"


def test_html_only_mail_is_read_as_text():
    msg = EmailMessage()
    msg["From"] = "boss@example.com"
    msg["Subject"] = "Hi"
    msg["Message-ID"] = "<h1@example.com>"
    msg.set_content("<p>Please <b>summarise</b> this</p><script>steal()</script><img src='http://t.example/x.gif'>",
                    subtype="html")
    m = read_mail(msg.as_bytes(), event_id="7:14", rules=RULES).message
    assert m is not None and m.text == "Hi\n\nPlease **summarise** this"


def test_attachments_come_with_the_message_within_the_limits():
    raw = mail("see attached", attach=("notes.txt", "text/plain", b"line one\n"))
    m = read_mail(raw, event_id="7:15", rules=RULES).message
    assert m is not None and [(a.kind, a.name, a.mime_type, a.size, a.data) for a in m.attachments] == [
        ("document", "notes.txt", "text/plain", 9, b"line one\n")]
    small = Rules(own="bot@example.com", media=MediaLimits(document=4))
    m = read_mail(raw, event_id="7:16", rules=small).message
    assert m is not None and m.attachments[0].data is None and m.attachments[0].size == 9  # described, not kept


def test_hostile_mail_is_harmless():
    for raw in (b"", b"\x00\xff\xfe garbage", b"From: \xff\xfe\r\n\r\n", mail("a\x00b \ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace")),
                b"From: boss@example.com\r\nContent-Type: text/plain; charset=no-such-charset\r\n\r\n\xe9t\xe9\r\n",
                mail("x" * 200_000)):
        read = read_mail(raw, event_id="7:17", rules=RULES)
        if read.message is not None:
            assert "\x00" not in read.message.text and len(read.message.text) < 51_000


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.sampled_from([b"", b"From: boss@example.com\r\n",
                                                  b"From: boss@example.com\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n"]))
def test_no_bytes_make_the_reader_raise(noise, head):
    read = read_mail(head + noise, event_id="7:99", rules=RULES)
    assert (read.message is None) == (read.skipped is not None)


def test_a_mail_without_message_id_gets_one_from_its_uid():
    m = read_mail(mail(message_id=""), event_id="7:18", rules=RULES).message
    assert m is not None and m.message_id == "<7:18@switchboard.invalid>"
    assert m.chat_id == "boss@example.com <7:18@switchboard.invalid>"


def test_the_reply_threads_under_the_mail_it_answers():
    thread = Thread("<q2@example.com>", ("<q1@example.com>", "<sb.1@example.com>"), "Re: Question")
    reply = compose_reply("**Yes.**", sender="bot@example.com", sender_name="Switchboard", to="boss@example.com",
                          thread=thread)
    parsed = email.message_from_bytes(reply.as_bytes(), policy=email.policy.default)
    assert parsed["Subject"] == "Re: Question"
    assert parsed["In-Reply-To"] == "<q2@example.com>"
    assert parsed["References"] == "<q1@example.com> <sb.1@example.com> <q2@example.com>"
    assert parsed["Auto-Submitted"] == "auto-replied"
    text = parsed.get_body(("plain",)).get_content()
    html = parsed.get_body(("html",)).get_content()
    assert text == "**Yes.**\n" and "<strong>Yes.</strong>" in html
    again = compose_reply("**Yes.**", sender="bot@example.com", sender_name="Switchboard", to="boss@example.com",
                          thread=thread)
    assert again["Message-ID"] == reply["Message-ID"]  # resent after a crash: the same mail to the reader


def test_subjects_get_one_re():
    assert [reply_subject(s) for s in ("Question", "Re: Question", "RE:  Question", "AW: Frage", "")] == [
        "Re: Question", "Re: Question", "RE: Question", "AW: Frage", "Re: your message"]


def test_the_html_escapes_what_the_model_writes_and_links_only_safe_addresses():
    html = markdown_to_html("<script>x</script> [a](javascript:alert(1)) [b](https://ok.example/?q=1&r=2) "
                            "![pic](http://tracker.example/p.gif)\n\n- one\n- two\n\n```\nif a < b:\n```")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "javascript:" not in html.split("href=")[1] if "href=" in html else True
    assert 'href="javascript' not in html
    assert '<a href="https://ok.example/?q=1&amp;r=2">b</a>' in html
    assert "<img" not in html and '<a href="http://tracker.example/p.gif">pic</a>' in html
    assert "<ul><li>one</li><li>two</li></ul>" in html and "<pre><code>if a &lt; b:</code></pre>" in html


@pytest.mark.parametrize("value, address", [
    ("Boss@Example.com", "boss@example.com"),
    ('"boss@example.com" <evil@x.org>', None),
    ("<boss@example.com>", None),
    ("boss@example.com evil@x.org", None),
    ("boss@localhost", None),
    ("boss", None),
])
def test_allowed_addresses_are_bare(value, address):
    assert strict_address(value) == address


def _config(**section):
    from gateway.config import config_from_dict

    return config_from_dict({"platforms": {"email": section}})


def test_config_refuses_an_allowed_sender_with_a_display_name():
    with pytest.raises(ConfigError) as err:
        _config(imap_host="imap.example.com", username="bot@example.com", password="pw", smtp_host="smtp.example.com",
                allowed_users=['"boss@example.com" <evil@x.org>'])
    assert "platforms.email.allowed_users[0]" in str(err.value) and "bare address" in str(err.value)


def test_config_says_what_is_missing():
    cfg = _config()
    assert cfg.enabled_platforms()["email"] == "off: platforms.email.imap_host is not set"
    with pytest.raises(ConfigError) as err:
        _config(imap_host="imap.example.com", username="bot@example.com", password="pw")
    assert "platforms.email.smtp_host" in str(err.value)
    cfg = _config(imap_host="imap.example.com", username="bot@example.com", password="pw", smtp_host="smtp.example.com",
                  allowed_users=["Boss@Example.com"])
    section: EmailConfig = cfg.platforms.email
    assert cfg.enabled_platforms()["email"] == "on" and section.allowed_users == ("boss@example.com",)
    assert "pw" not in repr(section)
