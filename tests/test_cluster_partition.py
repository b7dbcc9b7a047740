"""A partition that drops packets (not refuses them) fails a statement within about 10 s, then recovers.

A real store client (``SessionDB``, the pool with the keepalives and ``tcp_user_timeout`` of
``state/_liveness.py``) runs in a network namespace of its own, joined to this one by a veth pair,
and reaches the test's PostgreSQL through a relay on the host side of the pair.  The partition is a
``blackhole`` queueing discipline on both ends of the pair: every packet is dropped silently, as a
pulled cable or a firewall that stops answering would, with no RST and no ICMP.  The write sent
into it must fail on its own within ~10 s (not hang until the kernel gives up, many minutes), and
the next write once the link is back must succeed on a fresh connection.

Needs root and ``ip netns`` with the ``blackhole`` qdisc; skipped otherwise, saying which.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CLIENT = r"""
import os, sys, time
import psycopg
from state import SessionDB
from state._liveness import connection_kwargs
db = SessionDB(os.environ["STORE_URL"], write_timeout=60)
db.sessions.create("s", "api")
raw = psycopg.connect(os.environ["STORE_URL"], autocommit=True, **connection_kwargs(os.environ["STORE_URL"]))
raw.execute("SELECT 1")
print("ready", flush=True)
sys.stdin.readline()
start = time.monotonic()
try:
    raw.execute("SELECT 1")
    print(f"answered {time.monotonic() - start:.2f}", flush=True)
except Exception as exc:
    print(f"failed {time.monotonic() - start:.2f} {type(exc).__name__}", flush=True)
start = time.monotonic()
try:
    db.messages.append("s", "user", "into the partition")
    print(f"wrote {time.monotonic() - start:.2f}", flush=True)
except Exception as exc:
    print(f"failed {time.monotonic() - start:.2f} {type(exc).__name__}", flush=True)
sys.stdin.readline()
start = time.monotonic()
while True:
    try:
        db.messages.append("s", "user", "after the partition")
        print(f"recovered {time.monotonic() - start:.2f}", flush=True)
        break
    except Exception as exc:
        time.sleep(0.2)
db.close()
"""


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a network namespace and a veth pair)"
    probe = f"swbp{os.getpid() % 100000}"
    made = _run("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe)
    veth = _run("ip", "link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b")
    if veth.returncode != 0:
        return f"no veth pair: {veth.stderr.strip()}"
    hole = _run("tc", "qdisc", "add", "dev", f"{probe}a", "root", "blackhole")
    _run("ip", "link", "del", f"{probe}a")
    if hole.returncode != 0:
        return f"no blackhole qdisc: {hole.stderr.strip()}"
    return None


async def _relay(host: str, target_port: int) -> asyncio.Server:
    """host:<any port> -> 127.0.0.1:target_port, byte for byte (the server's end of the network path)."""
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, host, 0)


@pytest.fixture
def netns():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    n = os.getpid() % 100000
    ns, host_end, ns_end = f"swb{n}", f"swb{n}h", f"swb{n}n"
    subnet = 10 + n % 200
    host_ip, ns_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    for cmd in (("ip", "netns", "add", ns),
                ("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end),
                ("ip", "link", "set", ns_end, "netns", ns),
                ("ip", "addr", "add", f"{host_ip}/30", "dev", host_end),
                ("ip", "link", "set", host_end, "up"),
                ("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_end),
                ("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up"),
                ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")):
        done = _run(*cmd)
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr}"
    try:
        yield ns, host_end, ns_end, host_ip
    finally:
        _run("ip", "link", "del", host_end)
        _run("ip", "netns", "del", ns)


def _cut(ns: str, host_end: str, ns_end: str, on: bool) -> None:
    verb = "add" if on else "del"
    for cmd in (("tc", "qdisc", verb, "dev", host_end, "root", *(["blackhole"] if on else [])),
                ("ip", "netns", "exec", ns, "tc", "qdisc", verb, "dev", ns_end, "root",
                 *(["blackhole"] if on else []))):
        done = _run(*cmd)
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr}"


async def test_a_statement_sent_into_a_silent_partition_fails_within_ten_seconds_and_the_store_recovers(
        netns, pg_url):
    ns, host_end, ns_end, host_ip = netns
    pg_port = int(pg_url.rsplit(":", 1)[1].split("/", 1)[0])
    relay = await _relay(host_ip, pg_port)
    relay_port = relay.sockets[0].getsockname()[1]
    url = pg_url.replace(f"127.0.0.1:{pg_port}", f"{host_ip}:{relay_port}")
    client = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns, sys.executable, "-c", CLIENT,
        env={**os.environ, "STORE_URL": url, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None

    async def line(timeout: float) -> str:
        assert client.stdout is not None
        return (await asyncio.wait_for(client.stdout.readline(), timeout)).decode().strip()

    try:
        assert await line(60) == "ready"
        _cut(ns, host_end, ns_end, True)
        cut_at = time.monotonic()
        client.stdin.write(b"go\n")
        await client.stdin.drain()
        statement = await line(120)
        outcome = await line(120)
        failed_after = time.monotonic() - cut_at
        _cut(ns, host_end, ns_end, False)
        client.stdin.write(b"healed\n")
        await client.stdin.drain()
        recovered = await line(60)
    finally:
        if client.returncode is None:
            client.kill()
        await client.wait()
        relay.close()
    print(f"\na statement into the partition: {statement}; then a store write: {outcome} "
          f"(both seen after {failed_after:.1f}s); after healing: {recovered}")
    assert statement.startswith("failed") and float(statement.split()[1]) < 12.0, statement  # keepalives: 10 s
    assert outcome.startswith("failed"), outcome
    assert float(outcome.split()[1]) < 15.0, outcome  # tcp_user_timeout 10 s, plus the statement's own time
    assert recovered.startswith("recovered"), recovered
