"""WhatsApp: webhook to reply request, and what a forged-signature flood costs.

The gateway runs as `switchboard run` in its own process, the fake model in another (it answers at
once), the fake Graph API (tests/fakes/whatsapp.py) and the load in this one, all on 127.0.0.1.

  (a) --messages WhatsApp messages from --senders senders, each sender writing its next message once
      the last was answered: from the signed webhook POST to the reply's send request reaching the
      fake Graph API, minus the time the model server held the request (the model excluded), p50/p95.
  (b) --flood POSTs with forged X-Hub-Signature-256 values (from a separate process, 50 at a time):
      how many reached the store (user messages stored before and after), and the daemon's CPU per
      refused request (all its threads, /proc/<pid>/stat).

    .venv/bin/python bench/whatsapp.py [--messages 1000] [--senders 50] [--flood 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.model_server import start_in_process as start_model
from tests.fakes.whatsapp import FakeWhatsApp

SWITCHBOARD = str(Path(sys.executable).parent / "switchboard")

FLOOD = r'''
import asyncio, os, sys, aiohttp
async def main(url, n):
    body = b'{"object": "whatsapp_business_account", "entry": []}'
    sem = asyncio.Semaphore(50)
    codes = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def one(i):
            async with sem:
                async with http.post(url, data=body, headers={"X-Hub-Signature-256": "sha256=" + os.urandom(32).hex()}) as r:
                    await r.read()
                    codes[r.status] = codes.get(r.status, 0) + 1
        await asyncio.gather(*(one(i) for i in range(n)))
    print(codes)
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
'''


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def user_messages(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT COUNT(*) FROM messages WHERE role = 'user'").fetchone()[0]
    finally:
        con.close()


async def start_gateway(home: Path, model_port: int, wa: FakeWhatsApp, port: int, senders: list[str]):
    config = home.parent / "bench-config.yaml"
    config.write_text(yaml.safe_dump({
        "home": str(home),
        "model": {"base_url": f"http://127.0.0.1:{model_port}/v1", "name": "fake", "api_key": "x",
                  "max_concurrent_calls": 256, "context_length": 32768},
        "api": {"port": port},  # Meta's webhook lands on the local API's /whatsapp/webhook
        "auth": {"allowed_users": [f"whatsapp:{s}" for s in senders]},
        "logging": {"level": "WARNING", "format": "json"},
        "platforms": {"whatsapp": {"access_token": wa.token, "phone_number_id": wa.phone_number_id,
                                   "app_secret": wa.app_secret, "verify_token": wa.verify_token,
                                   "api_base_url": wa.base_url}},
    }))
    sock_path = home.parent / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.setblocking(False)
    proc = await asyncio.create_subprocess_exec(SWITCHBOARD, "run", "--config", str(config),
                                                env={**os.environ, "NOTIFY_SOCKET": str(sock_path)},
                                                stderr=asyncio.subprocess.DEVNULL)
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        data = (await asyncio.wait_for(loop.sock_recv(sock, 4096), 60)).decode()
        if re.search(r"whatsapp: on", data) or "STATUS=serving" in data:
            break
    sock.close()
    return proc


async def model_seconds(model_port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{model_port}/_timings") as r:
            return {t["last_user"]: t["answered"] - t["at"] for t in await r.json() if t["answered"]}


async def latency(wa: FakeWhatsApp, senders: list[str], per_sender: int) -> list[tuple[str, float]]:
    waiting: dict[str, tuple[str, asyncio.Future]] = {}

    def on_sent(message: dict) -> None:
        pending = waiting.get(message.get("to", ""))
        text = (message.get("text") or {}).get("body", "")
        if pending and text.startswith(f"echo: {pending[0]} |") and not pending[1].done():
            pending[1].set_result(message["at"])

    wa.on_sent = on_sent
    out: list[tuple[str, float]] = []

    async def sender(wa_id: str) -> None:
        for n in range(per_sender):
            text = f"message {n} from {wa_id}"
            body, headers = wa.signed(wa.message(wa_id, "text", {"body": text}))
            future = asyncio.get_running_loop().create_future()
            waiting[wa_id] = (text, future)
            sent = time.monotonic()
            status = await wa.post(body, headers)
            assert status == 200, status
            answered = await asyncio.wait_for(future, 60)
            out.append((text, answered - sent))

    await asyncio.gather(*(sender(s) for s in senders))
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--senders", type=int, default=50)
    parser.add_argument("--flood", type=int, default=10000)
    args = parser.parse_args()
    senders = [f"4917{i:08d}" for i in range(args.senders)]
    model_proc, model_port = await start_model(0.0)
    async with FakeWhatsApp() as wa:
        port = free_port()
        wa.webhook_url = f"http://127.0.0.1:{port}/whatsapp/webhook"
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / "home"
            proc = await start_gateway(home, model_port, wa, port, senders)
            try:
                deadline = time.monotonic() + 30
                while await wa.post(b"{}", {}) != 401:  # listening (and refusing the unsigned)
                    if time.monotonic() > deadline:
                        raise SystemExit("the daemon's webhook never answered")
                    await asyncio.sleep(0.1)
                started = time.monotonic()
                turns = await latency(wa, senders, args.messages // args.senders)
                total = time.monotonic() - started
                held = await model_seconds(model_port)
                own = [(lat - held.get(text, 0.0)) * 1000 for text, lat in turns]
                print(f"(a) {len(turns)} messages from {len(senders)} senders in {total:.1f} s: webhook POST to the "
                      f"reply's send request, the model's time excluded: p50 {statistics.median(own):.1f} ms, "
                      f"p95 {pct(own, 0.95):.1f} ms (max {max(own):.1f} ms)")

                before_rows = user_messages(home / "state.db")
                cpu_before = cpu_seconds(proc.pid)
                flood_started = time.monotonic()
                client = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOD, wa.webhook_url,
                                                              str(args.flood), stdout=asyncio.subprocess.PIPE)
                codes = (await client.communicate())[0].decode().strip()
                flood_seconds = time.monotonic() - flood_started
                cpu = cpu_seconds(proc.pid) - cpu_before
                await asyncio.sleep(1.0)  # anything that had got through would be stored by now
                after_rows = user_messages(home / "state.db")
                print(f"(b) {args.flood} forged POSTs in {flood_seconds:.1f} s, answered {codes}: "
                      f"{after_rows - before_rows} reached the store; daemon CPU {cpu * 1000 / args.flood:.3f} ms "
                      f"per refused request ({cpu:.2f} s in all)")
            finally:
                proc.terminate()
                await proc.wait()
    model_proc.terminate()
    await model_proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
