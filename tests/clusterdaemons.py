"""Real ``switchboard run`` instances on one PostgreSQL store: for tests/test_cluster_*.py and bench/cluster.py.

    daemons = [Daemon(instance_dir(tmp_path, name), instance_settings(pg_url, name, model.base_url,
                                                                      cluster=FAST_FAILOVER, **side.settings()))
               for name in ("a", "b", "c")]
    ...
    owner = await owner_of(daemons, "telegram")   # the instance that runs the poller, per /healthz

Each instance has a home of its own (its logs, its config) and the same ``store.url``; the configs
differ only in ``api.port`` and the instance's name.  The figures a kill test counts come from the
database (messages stored, replies pending) and from what the fake platform accepted.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import aiohttp
import psycopg
import yaml

from tests.crashkit import BotReply, Daemon, Kill
from tests.pgserver import free_port  # outside the ephemeral range: a parallel test's port 0 never takes it

# The smallest failover the config allows (a new owner waits 1.5 s before it connects) and short
# work leases, so a test holds whichever instance a turn runs on.
FAST_FAILOVER = {"failover_seconds": 5, "lease_seconds": 3}
# A send the platform accepted up to this long after a SIGKILL was still the killed instance's: its
# request was in the fake's socket buffer.  Well below the 1.5 s a new owner waits with FAST_FAILOVER.
KILL_SETTLES_SECONDS = 0.5


def instance_settings(url: str, instance: str, model_url: str, *, cluster: dict | None = None, **extra) -> dict:
    """The config of one instance named ``instance`` on the store ``url`` (``extra``: the platforms...)."""
    return {
        "model": {"base_url": model_url, "name": "fake-model", "api_key": "sk-cluster-not-a-secret-0000",
                  "max_concurrent_calls": 32, "context_length": 32768},
        "auth": {"allow_all": True},
        "sessions": {"reset": {"mode": "none"}},
        "logging": {"level": "INFO", "format": "text"},
        "shutdown": {"grace_seconds": 5},
        "store": {"url": url},
        "cluster": {"instance_id": instance, **(cluster or {})},
        "api": {"port": free_port()},  # the configs differ in this only (and the instance's name)
        **extra,
    }


def instance_dir(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir()
    return path




async def health(daemon: Daemon) -> dict:
    """The instance's /healthz."""
    port = yaml.safe_load(daemon.config.read_text())["api"]["port"]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
            return await response.json()


async def owner_of(daemons: list[Daemon], platform: str) -> Daemon | None:
    """The running instance whose /healthz says it owns ``platform``'s connection and runs it, if one does."""
    for daemon in daemons:
        if daemon.proc is None or daemon.proc.returncode is not None:
            continue
        shown = (await health(daemon))["cluster"]["connections"].get(platform) or {}
        if shown.get("role") == "owner" and shown.get("running"):
            return daemon
    return None


def stored(url: str) -> Counter:
    """How many times each user message text is stored."""
    with psycopg.connect(url) as conn:
        return Counter(dict(conn.execute(
            "SELECT content, COUNT(*) FROM messages WHERE role = 'user' GROUP BY content").fetchall()))


def pending(url: str) -> list[tuple[str, str]]:
    """Replies stored and not confirmed sent: (chat, text)."""
    with psycopg.connect(url) as conn:
        return [(str(chat), text) for chat, text in
                conn.execute("SELECT chat_id, text FROM deliveries WHERE status = 'pending'").fetchall()]


def after_kill(url: str, at: float) -> Kill:
    """What a kill at ``at`` left in the store: replies pending and messages stored but not answered."""
    with psycopg.connect(url) as conn:
        unanswered = conn.execute("SELECT COUNT(*) FROM inbox").fetchone()[0]
    return Kill(at, pending(url), unanswered, "ok")


def recorded_ids(url: str) -> set[str]:
    """The platform's ids of every message the delivery record notes as posted."""
    with psycopg.connect(url) as conn:
        return {str(i) for (sent,) in conn.execute("SELECT sent_ids FROM deliveries").fetchall()
                for i in json.loads(sent or "[]")}


def undone_in(url: str, chats: list[str]) -> bool:
    """Whether one of ``chats`` has work left: a message stored and not answered, or a reply not sent."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT EXISTS (SELECT 1 FROM inbox WHERE chat_id = ANY(%s))"
            " OR EXISTS (SELECT 1 FROM deliveries WHERE status = 'pending' AND chat_id = ANY(%s))",
            (chats, chats)).fetchone()[0]


def count_in_flight(kills: list[Kill], replies: list[BotReply], recorded: set[str]) -> list[BotReply]:
    """Set each kill's ``in_flight``: the messages the platform accepted up to it and the store never noted
    as posted (``recorded``, read once everything is over), so the killed instance sent them and died
    before noting it.  Whoever takes over may post such a reply again: the only duplicates allowed.

    A message accepted up to :data:`KILL_SETTLES_SECONDS` after a kill counts for it (the request
    was in the fake's socket buffer).  Returns the messages accepted after the last kill and never
    noted: there should be none, as every reply a live instance posts is noted.
    """
    unnoted = sorted((r for r in replies if r.message_id not in recorded), key=lambda r: r.at)
    since = float("-inf")
    for kill in kills:
        cutoff = kill.at + KILL_SETTLES_SECONDS
        kill.in_flight = sum(1 for r in unnoted if since < r.at <= cutoff)
        since = cutoff
    return [r for r in unnoted if r.at > since]
