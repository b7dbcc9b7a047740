"""The fallback chain's cost: how much later the first token comes when the primary is down.

The fake model server runs in another process and streams each answer.  The real ``ModelClient``
(the openai SDK and its aiohttp transport) makes streamed calls three ways, interleaved:

- ``direct``: to the fallback's server alone (its own time to the first token);
- ``refused``: the primary is a closed port (connection refused) and is tried first on every call
  (its breaker closes at once, ``breaker_seconds`` tiny), then the fallback answers;
- ``breaker open``: the primary failed once and is left out, so calls go straight to the fallback.

Printed: the time from the call to its first token, p50 / p95 / max for each, and the difference
from ``direct`` (the cost of the failure and the switch; target at most 200 ms).

    .venv/bin/python bench/fallback.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.fallback import Capabilities, ChainSettings, Endpoint
from gateway.model import ModelClient, ModelSettings


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def first_token(client: ModelClient) -> float:
    """Seconds from the call to its first piece of answer text (the call then runs to its end)."""
    started = time.perf_counter()
    seen: list[float] = []
    await client.complete([{"role": "user", "content": "hello"}],
                          on_text=lambda text: seen.append(time.perf_counter()) if not seen else None)
    return seen[0] - started


async def main(calls: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.model_server", "--stream-chunk-chars", "8", "--reply-chars", "200",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    port = int((await proc.stdout.readline()).split()[1])
    backup = ModelSettings(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", name="fake-model", max_retries=3)
    down = ModelSettings(base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="k", name="primary", max_retries=3)
    direct = ModelClient(backup)
    refused = ModelClient(down, fallbacks=[Endpoint("backup", backup, Capabilities())],
                          chain=ChainSettings(breaker_seconds=1e-9))  # the primary is tried (and refused) every call
    skipped = ModelClient(down, fallbacks=[Endpoint("backup", backup, Capabilities())],
                          chain=ChainSettings(breaker_seconds=3600))
    clients = {"direct": direct, "refused": refused, "breaker open": skipped}
    times: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for client in clients.values():  # warm up: connections made, the breaker opened once
            for _ in range(5):
                await first_token(client)
        for _ in range(calls):
            for name, client in clients.items():
                times[name].append(await first_token(client))
    finally:
        for client in clients.values():
            await client.close()
        proc.terminate()
        await proc.wait()
    base = times["direct"]
    print(f"{calls} streamed calls each, interleaved; time to the first token (ms)")
    for name, values in times.items():
        line = f"  {name:<13} p50 {pct(values, 0.5) * 1000:6.2f}  p95 {pct(values, 0.95) * 1000:6.2f}  " \
               f"max {max(values) * 1000:6.2f}"
        if name != "direct":
            line += f"   beyond direct: p50 {(pct(values, 0.5) - pct(base, 0.5)) * 1000:+.2f}  " \
                    f"p95 {(pct(values, 0.95) - pct(base, 0.95)) * 1000:+.2f}"
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    logging.disable(logging.WARNING)  # each refused call logs its switch to the fallback
    asyncio.run(main(parser.parse_args().calls))
