"""Real mail servers for the email tests: Debian's Dovecot for IMAP, aiosmtpd for SMTP submission.

    with DovecotServer.start() as imap:          # a throw-away Dovecot on 127.0.0.1, one user, maildir in a tmp dir
        imap.append(raw_bytes)                   # a message lands in the inbox (IMAP APPEND, as delivery would)
    smtp = SmtpSink(); smtp.start()               # aiosmtpd with AUTH PLAIN; smtp.messages holds what it accepted

Dovecot is started from a config file written here (passdb and userdb from a file, ``mail_location``
a maildir in the tmp dir, listening on a free port of 127.0.0.1), as root (the mail user is then
Debian's ``dovecot`` user: Dovecot refuses uid 0 for mail) or as the user running the tests.  Where
Dovecot is not installed the tests skip and say how to install it (``make mail-servers``, or
``apt-get install dovecot-imapd``).

The SMTP sink checks what a submission server checks: AUTH before MAIL FROM (535 for a wrong
password, 530 without it), and it can script faults: ``fail_next`` answers the next N DATA with a
4xx, ``refusals`` with answers of the test's choosing, ``delays`` late; ``attempts`` records every
DATA with its time and answer.  ``DovecotServer.kick`` cuts every IMAP connection (doveadm kick).
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import imaplib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests.pgserver import free_port

DOVECOT_CANDIDATES = ("/usr/sbin/dovecot", "/usr/local/sbin/dovecot")
USER = "bot@example.com"
PASSWORD = "s3cret-imap-password"


def find_dovecot() -> str | None:
    found = shutil.which("dovecot")
    if found:
        return found
    return next((p for p in DOVECOT_CANDIDATES if os.path.exists(p)), None)


def why_no_dovecot() -> str | None:
    if find_dovecot() is None:
        return ("Dovecot is not installed: `make mail-servers` installs it as root on Debian "
                "(apt-get install dovecot-imapd); the email tests against a real IMAP server skip without it")
    return None


def _mail_user() -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    entry = pwd.getpwnam("dovecot")  # Dovecot refuses uid 0 as a mail user
    return entry.pw_uid, entry.pw_gid


_CONFIG = """\
base_dir = {root}/run
state_dir = {root}/state
instance_name = switchboard-test-{port}
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
first_valid_uid = {uid}
last_valid_uid = {uid}
first_valid_gid = {gid}
mail_location = maildir:{root}/mail/%n
mail_fsync = never
{internal}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/users
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/home/%n
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
service imap-login {{
  chroot =
}}
protocol imap {{
  imap_idle_notify_interval = 1 secs
}}
"""


@dataclass
class DovecotServer:
    root: Path
    port: int
    process: subprocess.Popen | None = None
    user: str = USER
    password: str = PASSWORD
    own_logins: int = 0

    @classmethod
    def start(cls) -> DovecotServer:
        binary = find_dovecot()
        if binary is None:
            raise RuntimeError(why_no_dovecot())
        root = Path(tempfile.mkdtemp(prefix="switchboard-dovecot-"))
        uid, gid = _mail_user()
        for sub in ("run", "state", "mail", "home"):
            (root / sub).mkdir()
        for sub in ("mail", "home"):
            os.chown(root / sub, uid, gid)
        os.chmod(root, 0o755)
        (root / "users").write_text(f"{USER}:{{PLAIN}}{PASSWORD}\n")
        if os.geteuid() != 0:
            me = pwd.getpwuid(os.getuid()).pw_name
            internal = (f"default_internal_user = {me}\ndefault_login_user = {me}\n"
                        f"default_internal_group = {pwd.getpwuid(os.getuid()).pw_gid}")
        else:
            internal = ""
        server = cls(root=root, port=0)
        for _attempt in range(5):  # another process may take the port between free_port() and Dovecot's bind
            server.port = free_port()
            (root / "dovecot.conf").write_text(_CONFIG.format(root=root, port=server.port, uid=uid, gid=gid,
                                                              internal=internal))
            server.process = subprocess.Popen([binary, "-F", "-c", str(root / "dovecot.conf")],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if server._wait_ready():
                return server
            server._kill()
        raise RuntimeError(f"Dovecot did not start: {server.log_tail()}")

    def _wait_ready(self, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError, imaplib.IMAP4.error):
                with imaplib.IMAP4("127.0.0.1", self.port, timeout=2) as conn:
                    self.own_logins += 1
                    conn.login(USER, PASSWORD)
                    conn.logout()
                    return True
            time.sleep(0.05)
        return False

    def log_tail(self) -> str:
        path = self.root / "dovecot.log"
        text = path.read_text(errors="replace")[-2000:] if path.exists() else ""
        if self.process is not None and self.process.stdout is not None and self.process.poll() is not None:
            text += self.process.stdout.read().decode(errors="replace")[-2000:]
        return text

    def logins(self) -> int:
        """How many IMAP logins others made (the adapter's): those in Dovecot's log less this helper's own."""
        path = self.root / "dovecot.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return sum(1 for line in text.splitlines() if "imap-login: Info: Login: user=<" in line) - self.own_logins

    def connect(self) -> imaplib.IMAP4:
        self.own_logins += 1  # counted before the login, so logins() never counts it as someone else's
        conn = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        conn.login(USER, PASSWORD)
        return conn

    @contextlib.contextmanager
    def session(self) -> Iterator[imaplib.IMAP4]:
        conn = self.connect()
        try:
            yield conn
        finally:
            with contextlib.suppress(OSError, imaplib.IMAP4.error):
                conn.logout()

    def append(self, raw: bytes, mailbox: str = "INBOX") -> None:
        """A message lands in ``mailbox`` (as a delivery agent would put it there)."""
        with self.session() as conn:
            status, detail = conn.append(mailbox, "", imaplib.Time2Internaldate(time.time()), raw)
            assert status == "OK", detail

    def flags(self, mailbox: str = "INBOX") -> dict[str, str]:
        """Message-ID -> its flags, for every message in ``mailbox``."""
        out: dict[str, str] = {}
        with self.session() as conn:
            conn.select(mailbox, readonly=True)
            status, data = conn.uid("FETCH", "1:*", "(FLAGS BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
            for item in data:
                if isinstance(item, tuple):
                    header = email.message_from_bytes(item[1])
                    out[str(header["Message-ID"]).strip()] = item[0].decode()
        return out

    def kick(self) -> None:
        """Cut every IMAP connection of the user (``doveadm kick``), as a server restart or a network cut would."""
        doveadm = shutil.which("doveadm") or "/usr/bin/doveadm"
        subprocess.run([doveadm, "-c", str(self.root / "dovecot.conf"), "kick", self.user], check=True,
                       capture_output=True, timeout=20)

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DovecotServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Accepted:
    """One message the SMTP sink accepted."""

    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    at: float

    @property
    def message(self) -> email.message.EmailMessage:
        return email.message_from_bytes(self.raw, policy=email.policy.default)  # type: ignore[return-value]


@dataclass
class SmtpSink:
    """aiosmtpd on 127.0.0.1 (port 0), in its own thread, with AUTH PLAIN/LOGIN required."""

    user: str = USER
    password: str = "s3cret-smtp-password"
    messages: list[Accepted] = field(default_factory=list)
    fail_next: int = 0  # the next N DATA commands are answered 451
    refusals: list[str] = field(default_factory=list)  # the answers to the next DATA commands ("421 ...")
    delays: list[float] = field(default_factory=list)  # seconds before answering the next DATA commands
    attempts: list[tuple[float, list[str], str]] = field(default_factory=list)  # (monotonic, recipients, answer)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: object | None = None
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> SmtpSink:
        from aiosmtpd.smtp import SMTP, AuthResult

        sink = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                if sink.delays:
                    await asyncio.sleep(sink.delays.pop(0))
                answer = sink.refusals.pop(0) if sink.refusals else None
                if answer is None and sink.fail_next > 0:
                    sink.fail_next -= 1
                    answer = "451 4.3.0 try again later (scripted)"
                sink.attempts.append((time.monotonic(), list(envelope.rcpt_tos), answer or "250"))
                if answer is not None:
                    return answer
                with sink._arrived:
                    sink.messages.append(Accepted(envelope.mail_from, list(envelope.rcpt_tos),
                                                  bytes(envelope.original_content or envelope.content), time.time()))
                    sink._arrived.notify_all()
                return "250 2.0.0 accepted"

        def authenticate(server, session, envelope, mechanism, auth_data):
            ok = getattr(auth_data, "login", None) == sink.user.encode() and \
                getattr(auth_data, "password", None) == sink.password.encode()
            return AuthResult(success=ok, handled=False)  # not handled: aiosmtpd answers 535 itself

        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            server = loop.run_until_complete(loop.create_server(
                lambda: SMTP(Handler(), hostname="127.0.0.1", authenticator=authenticate, auth_required=True,
                             auth_require_tls=False),
                "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
            self._server = server
            ready.set()
            loop.run_forever()
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="smtp-sink", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the SMTP sink did not start")
        return self

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Accepted]:
        """Block until ``count`` messages were accepted (at most ``timeout`` seconds); returns them all."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the SMTP server accepted {len(self.messages)} message(s), not {count}, "
                                         f"within {timeout}s")
                self._arrived.wait(left)
            return list(self.messages)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = self._thread = None


@contextlib.contextmanager
def mail_servers() -> Iterator[tuple[DovecotServer, SmtpSink]]:
    imap = DovecotServer.start()
    smtp = SmtpSink().start()
    try:
        yield imap, smtp
    finally:
        smtp.stop()
        imap.stop()
