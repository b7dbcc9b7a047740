"""Compression on small windows, through the real gateway and its local API against the fake model.

For each window (1,500 / 4,000 / 8,000 / 32,000 tokens, ``model.context_length``) and each turn size
(50, 260 and 1,000 words from the user; the fake model answers with an echo about twice as long),
turns are sent until the conversation is first split (a ``#2`` child) or ``--max-turns`` pass, and it
prints the turn of the first split, the child's prompt as sent with that turn (our estimate, the same
one the trigger uses, and the fake's own count), how many turns were told that no split could make
room, and the splits in all.

Then the issue's llama.cpp scenario (#36): the window unknown (8,192 assumed), the server's real one
2,048 (``llama_cpp_window``: an over-window streamed request gets an empty 200 event stream); a
19,000-character pasted log, then short messages, streamed over the API: what the user reads.

    .venv/bin/python bench/small_windows.py [--max-turns 120]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp

from compression import estimate_tokens
from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, running_gateway

KEY = "agent:main:api:dm:k"
WINDOWS = (1_500, 4_000, 8_000, 32_000)
TURN_WORDS = (50, 260, 1_000)
_WORDS = ("the staging database migration needs a rollback plan before friday because the replica lags "
          "behind and the deploy scripts still point at the old host").split()


def words(n: int, seed: int = 0) -> str:
    return " ".join(_WORDS[(seed + i) % len(_WORDS)] for i in range(n))


def _summarizer(messages: list[dict]) -> str | None:
    if "write the memory" in (messages[0].get("content") or ""):
        body = messages[-1]["content"]
        asked = int(body.split("in about ", 1)[1].split(" tokens", 1)[0].replace(",", ""))
        return "Latest user request: go on. Goals: migrate. " + words(int(asked * 3.5 / 6.2))  # as long as asked
    if "about to be compressed" in str(messages[-1].get("content")):
        return "nothing new to remember"
    return None


async def one(window: int, turn_words: int, max_turns: int) -> tuple[str, str, str, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeModel() as model:
            model.responder = _summarizer
            async with running_gateway(Path(tmp), model, model={"context_length": window},
                                       compression={"timeout_seconds": 30}) as gw:
                api = ApiClient(gw)
                root = None
                first_split = child_prompt = fake_prompt = None
                told = splits = 0
                current = None
                for i in range(max_turns):
                    raw = await api.client.chat.completions.with_raw_response.create(
                        model="m", messages=[{"role": "user", "content": f"turn {i}: {words(turn_words, i)}"}],
                        extra_headers={"X-Session-Key": "k"})
                    notice = raw.headers.get("X-Switchboard-Notice", "")
                    told += "/new" in notice
                    sid = await gw.db.routes.get(KEY)
                    if root is None:
                        root = current = sid
                    if sid != current:
                        splits += 1
                        current = sid
                        if first_split is None:
                            first_split = i + 1
                            sent = model.requests[-1]
                            child_prompt = estimate_tokens(sent.body["messages"])
                            fake_prompt = sum(len(str(m.get("content") or "")) for m in sent.body["messages"]) // 4
                    if first_split is not None and i + 1 >= first_split + 10:
                        break  # ten turns in the child say whether it splits again at once
                await api.close()
    return (f"{first_split}" if first_split else f"none in {max_turns}",
            f"~{child_prompt:,}" if child_prompt else "-", f"~{fake_prompt:,}" if fake_prompt else "-", told, splits)


async def _streamed(port: int, text: str) -> tuple[str, list[str]]:
    """One streamed request as a client reads it: the answer's text and the notices (SSE comments)."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}
    answer, notices = "", []
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                             headers={"X-Session-Key": "k"}) as r:
            headers = r.headers.getall("X-Switchboard-Notice", [])  # the same lines, ASCII-escaped
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith(": notice:"):
                    notices.append(line.removeprefix(": notice:").strip())
                elif line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        answer += (choice.get("delta") or {}).get("content") or ""
    return answer, list(dict.fromkeys(notices or headers))


async def llama_scenario() -> list[tuple[str, str]]:
    log_line = "2026-12-01 10:00:01 INFO worker-3 processed job 48213 in 120 ms, queue depth 17, retries 0\n"
    pasted = (log_line * 220)[:19_000]
    seen = []
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeModel() as model:
            model.llama_cpp_window = 2048
            model.responder = _summarizer
            async with running_gateway(Path(tmp), model, model={"context_length": None}) as gw:
                for text in (pasted, "what failed?", "and the queue depth?", "thanks", "one more thing"):
                    answer, notices = await _streamed(gw.api.bound_port, text)
                    sent = f"{len(text):,} characters" if len(text) > 100 else text
                    seen += [(sent, f"[notice] {n}") for n in notices] + [(sent, answer)]
                learned = gw.health()["models"]["default"]
            refused = len(model.refused)
    seen.append(("/healthz models.default", f"learned {learned['learned']}, fix: {learned.get('fix')}"))
    seen.append(("requests over the window", f"{refused} (the first message's streamed and unstreamed tries)"))
    return seen


async def run(max_turns: int, llama_only: bool = False) -> int:
    logging.disable(logging.WARNING)
    if llama_only:
        for sent, read in await llama_scenario():
            print(f"  {sent:>26} -> {read[:130]!r}")
        return 0
    print(f"compression through the gateway and its local API (up to {max_turns} turns, then 10 in the child):")
    print(f"  {'window':>7} {'words/turn':>10}  {'first split at turn':>20}  {'child prompt (ours / fake)':>27}"
          f"  {'told no room':>12}  {'splits':>6}")
    for window in WINDOWS:
        for turn_words in TURN_WORDS:
            first, ours, fake, told, splits = await one(window, turn_words, max_turns)
            print(f"  {window:>7,} {turn_words:>10}  {first:>20}  {ours + ' / ' + fake:>27}  {told:>12}  {splits:>6}")
    print("\nllama.cpp-like server, window unknown (8,192 assumed), really 2,048; streamed over the API:")
    for sent, read in await llama_scenario():
        print(f"  {sent:>26} -> {read[:130]!r}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-turns", type=int, default=120)
    parser.add_argument("--llama-only", action="store_true", help="only the llama.cpp scenario")
    args = parser.parse_args()
    return asyncio.run(run(args.max_turns, args.llama_only))


if __name__ == "__main__":
    sys.exit(main())
