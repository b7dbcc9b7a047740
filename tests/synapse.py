"""A real Synapse homeserver for the tests: ``matrix-synapse`` from PyPI (the test extra), SQLite, 127.0.0.1.

    with started_synapse(tmp) as hs:          # one per test session: it takes a few seconds to start
        bot = hs.register("bot")              # registration by shared secret: an access token
        ann = hs.register("ann")
        room = ann.create_room(invite=[bot.user_id], direct=True)

The server runs as a subprocess (``python -m synapse.app.homeserver``) from a minimal
``homeserver.yaml`` written into a temporary folder: one client listener on a free port of
127.0.0.1, no federation listener and no key servers (``trusted_key_servers: []``), presence off,
no registration but by the shared secret, and message rate limits lifted for the test users (the
fake homeserver proves the rate limits; this one proves the protocol).  It is stopped (SIGTERM,
then SIGKILL) and its folder removed when the session ends.

:class:`Client` is a user's side: plain HTTP calls of the client-server API (``urllib``, run off
the event loop by the async tests), so what the bot sent is read back exactly as any client reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tests.pgserver import free_port

SERVER_NAME = "localhost"


def why_unavailable() -> str | None:
    try:
        import synapse  # noqa: F401
    except ImportError:
        return "matrix-synapse is not installed (it comes with the test extra: pip install -e '.[test]')"
    return None


def _config(folder: Path, port: int, secret: str) -> str:
    return f"""
server_name: "{SERVER_NAME}"
pid_file: "{folder}/homeserver.pid"
listeners:
  - port: {port}
    bind_addresses: ["127.0.0.1"]
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{folder}/homeserver.db"
log_config: "{folder}/log.yaml"
media_store_path: "{folder}/media"
signing_key_path: "{folder}/signing.key"
registration_shared_secret: "{secret}"
macaroon_secret_key: "{secrets.token_hex(16)}"
form_secret: "{secrets.token_hex(16)}"
report_stats: false
enable_registration: false
trusted_key_servers: []
suppress_key_server_warning: true
federation_domain_whitelist: []
use_presence: false
enable_metrics: false
url_preview_enabled: false
rc_message: {{per_second: 1000, burst_count: 1000}}
rc_login:
  address: {{per_second: 1000, burst_count: 1000}}
  account: {{per_second: 1000, burst_count: 1000}}
  failed_attempts: {{per_second: 1000, burst_count: 1000}}
rc_joins:
  local: {{per_second: 1000, burst_count: 1000}}
rc_invites:
  per_room: {{per_second: 1000, burst_count: 1000}}
  per_user: {{per_second: 1000, burst_count: 1000}}
rc_registration: {{per_second: 1000, burst_count: 1000}}
rc_admin_redaction: {{per_second: 1000, burst_count: 1000}}
"""


_LOG = """
version: 1
formatters:
  precise: {format: '%(asctime)s %(levelname)s %(name)s %(message)s'}
handlers:
  file: {class: logging.FileHandler, formatter: precise, filename: "FOLDER/homeserver.log"}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
"""


def _call(base: str, method: str, path: str, body: Any = None, token: str | None = None,
          query: dict | None = None, raw: bytes | None = None, content_type: str = "application/json") -> Any:
    url = base + path + (("?" + urllib.parse.urlencode(query)) if query else "")
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            payload = resp.read()
            return json.loads(payload) if resp.headers.get_content_type() == "application/json" else payload
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from None


@dataclass
class Client:
    """One user of the homeserver, calling the client-server API as any client would."""

    base: str
    user_id: str
    token: str

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        return _call(self.base, method, f"/_matrix/client/v3{path}", body, self.token, **kw)

    def create_room(self, *, invite: list[str] = (), direct: bool = False, name: str | None = None,  # type: ignore[assignment]
                    encrypted: bool = False) -> str:
        body: dict = {"invite": list(invite), "is_direct": direct, "preset": "private_chat"}
        if name:
            body["name"] = name
        if encrypted:  # as Element creates a private room: Megolm from the first event on
            body["initial_state"] = [{"type": "m.room.encryption", "state_key": "",
                                      "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]
        return self.call("POST", "/createRoom", body)["room_id"]

    def join(self, room_id: str) -> None:
        self.call("POST", f"/join/{urllib.parse.quote(room_id)}", {})

    def send(self, room_id: str, content: dict, event_type: str = "m.room.message") -> str:
        txn = secrets.token_hex(8)
        path = f"/rooms/{urllib.parse.quote(room_id)}/send/{event_type}/{txn}"
        return self.call("PUT", path, content)["event_id"]

    def say(self, room_id: str, body: str, **content: Any) -> str:
        return self.send(room_id, {"msgtype": "m.text", "body": body, **content})

    def messages(self, room_id: str, limit: int = 1000) -> list[dict]:
        """The room's events, oldest first (``/messages``, as a client's scrollback reads them)."""
        out = self.call("GET", f"/rooms/{urllib.parse.quote(room_id)}/messages",
                        query={"dir": "b", "limit": str(limit)})
        return list(reversed(out.get("chunk", [])))

    def upload(self, data: bytes, mime: str, name: str) -> str:
        return _call(self.base, "POST", "/_matrix/media/v3/upload", token=self.token, raw=data, content_type=mime,
                     query={"filename": name})["content_uri"]


class Synapse:
    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.secret = secrets.token_hex(16)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "homeserver.yaml"
        config.write_text(_config(self.folder, self.port, self.secret))
        (self.folder / "log.yaml").write_text(_LOG.replace("FOLDER", str(self.folder)))
        command = [sys.executable, "-m", "synapse.app.homeserver", "--config-path", str(config)]
        subprocess.run([*command, "--generate-keys"], check=True, capture_output=True, timeout=120)
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(self.folder / "stderr.log", "wb"),
                                     env={**os.environ, "SYNAPSE_CACHE_FACTOR": "0.5"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"synapse exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                _call(self.base_url, "GET", "/_matrix/client/versions")
                return
            except (OSError, AssertionError):
                time.sleep(0.2)
        raise RuntimeError(f"synapse did not answer within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for name in ("stderr.log", "homeserver.log"):
            path = self.folder / name
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        return text

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def register(self, localpart: str, *, admin: bool = False, password: str | None = None) -> Client:
        """A new user, registered by the shared secret (the admin API's nonce and HMAC)."""
        nonce = _call(self.base_url, "GET", "/_synapse/admin/v1/register")["nonce"]
        password = password or secrets.token_hex(8)
        # the HMAC covers the four fields joined by NULs
        body: dict = {"nonce": nonce, "username": localpart, "password": password, "admin": admin}
        mac = hmac.new(self.secret.encode(), "\x00".join((nonce, localpart, password,
                                                           "admin" if admin else "notadmin")).encode(), hashlib.sha1)
        body["mac"] = mac.hexdigest()
        out = _call(self.base_url, "POST", "/_synapse/admin/v1/register", body)
        return Client(self.base_url, out["user_id"], out["access_token"])


@contextmanager
def started_synapse(folder: Path) -> Iterator[Synapse]:
    hs = Synapse(folder)
    try:
        hs.start()
        yield hs
    finally:
        hs.stop()
