"""Email: time from a mail landing in the IMAP inbox to its reply accepted by the SMTP server.

A real Dovecot (Debian's ``dovecot-imapd``, started from a config file written
here, as the tests do: ``tests/mailservers.py``) and aiosmtpd for submission, the
real gateway and email adapter in this process, and the fake model answering at
once.  Mails land one at a time by IMAP APPEND (from another thread, as a delivery
agent would put them there) from ``--chats`` senders, each sender's mails one
thread; a mail's latency runs from the server's OK to the APPEND to the SMTP
server's 250 to the reply's DATA, less the model's own time for that turn (from
the fake model's records).  So it holds the IDLE push, the fetch, the parse, the
router's store, the prompt, the reply's render and its submission.

    .venv/bin/python bench/email.py [--messages 200] [--chats 10] [--gap 0.05] [--poll]

``--poll`` turns IDLE off (``idle: false``, polling every second) for comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where this file would stand in for the
# standard library's ``email`` package: take the folder off before anything imports it.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import argparse
import asyncio
import statistics
import tempfile
import time
from email.message import EmailMessage

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.harness import gateway_config
from tests.mailservers import DovecotServer, SmtpSink, why_no_dovecot


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def mail(index: int, chat: int, roots: dict[int, str]) -> tuple[bytes, str]:
    msg = EmailMessage()
    msg["From"] = f"user{chat}@example.com"
    msg["To"] = "bot@example.com"
    msg["Message-ID"] = f"<bench.{index}@example.com>"
    root = roots.setdefault(chat, str(msg["Message-ID"]))
    if root != msg["Message-ID"]:
        msg["In-Reply-To"] = root
        msg["References"] = root
    text = f"message {index} from chat {chat}"
    msg.set_content(text)
    return msg.as_bytes(), text


async def run(messages: int, chats: int, gap: float, idle: bool) -> None:
    imap = DovecotServer.start()
    smtp = SmtpSink().start()
    home = Path(tempfile.mkdtemp(prefix="switchboard-bench-email-"))
    try:
        async with FakeModel() as model:
            section = {"imap_host": "127.0.0.1", "imap_port": imap.port, "imap_tls": "none", "username": imap.user,
                       "password": imap.password, "smtp_host": "127.0.0.1", "smtp_port": smtp.port,
                       "smtp_tls": "none", "smtp_password": smtp.password, "idle": idle, "poll_seconds": 1}
            config = gateway_config(home, model.base_url, auth={"allow_all": True}, logging={"level": "WARNING"},
                                    platforms={"email": section})
            gw = Gateway(config, serve_api=False)
            await gw.start()
            try:
                deadline = time.monotonic() + 20
                while gw.health()["platforms"]["email"]["state"] != "connected":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the email adapter did not connect")
                    await asyncio.sleep(0.05)
                landed: dict[str, float] = {}
                roots: dict[int, str] = {}
                for i in range(messages):
                    raw, text = mail(i, i % chats, roots)
                    await asyncio.to_thread(imap.append, raw)
                    landed[text] = time.time()
                    await asyncio.sleep(gap)
                deadline = time.monotonic() + 120
                while len(smtp.messages) < messages:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {len(smtp.messages)} of {messages} replies were accepted")
                    await asyncio.sleep(0.05)
                model_time = {r.last_user_text: (r.answered or r.at) - r.at for r in model.requests}
                latencies = []
                for accepted in smtp.messages:
                    body = accepted.message.get_body(("plain",)).get_content()
                    answered = body.split("echo: ", 1)[1].split(" | ", 1)[0].strip()
                    latencies.append(accepted.at - landed[answered] - model_time.get(answered, 0.0))
            finally:
                await gw.stop(grace_seconds=5)
    finally:
        smtp.stop()
        imap.stop()
    mode = "IDLE" if idle else "polling every 1 s"
    print(f"email ({mode}): {messages} mails from {chats} senders, one every {gap * 1000:.0f} ms")
    print(f"  inbox to reply accepted by SMTP, model time excluded: p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
          f"p95 {percentile(latencies, 0.95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms, "
          f"mean {statistics.mean(latencies) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between two mails landing")
    parser.add_argument("--poll", action="store_true", help="poll every second instead of IDLE")
    args = parser.parse_args()
    reason = why_no_dovecot()
    if reason:
        print(f"email: skipped: {reason}")
        return
    asyncio.run(run(args.messages, args.chats, args.gap, idle=not args.poll))


if __name__ == "__main__":
    main()
