"""From `git clone` to the first answered Telegram DM, as a newcomer does it with `make setup`.

Against the fake model and the fake Telegram (tests/fakes/), in one terminal (a pseudo-terminal, as
a person at a keyboard): clone this checkout, `make setup` (which installs the runtime, then asks),
the newcomer's answers typed in, `make run`, a DM sent, and the seconds until the bot answers it.
Prints the steps, the terminals, the seconds of each phase and the runtime's install size::

    .venv/bin/python bench/first_hour.py          # pip's cache warm, as on a machine that installed once

The step "create a bot with @BotFather" is the fake's token here; setup shows the two lines of how.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.ptykit import Terminal
from tests.waiting import eventually

ANN = FakeTelegram.user(111, "Ann", username="ann")
STEPS = ["git clone", "create the bot with @BotFather (setup shows how)", "make setup (answer its questions, "
         "DM the bot once when it asks)", "make run", "DM the bot: answered"]


async def expect(term: Terminal, pattern: str, timeout: float = 600) -> None:
    await eventually(lambda: re.search(pattern, term.text()), timeout, lambda: f"{pattern!r} in:\n{term.text()}")


def _du(path: Path) -> str:
    return subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True).stdout.split()[0]


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="first-hour-") as tmp:
        clone, user = Path(tmp) / "switchboard", Path(tmp) / "user"
        user.mkdir()
        async with FakeModel() as model, FakeTelegram() as tg:
            model.served, model.max_model_len = ["llama3.2:1b", "qwen2.5:7b"], 32768
            env = {"PATH": os.environ["PATH"], "HOME": str(user), "LANG": "C.UTF-8", "USER": "newcomer",
                   "TELEGRAM_BASE_URL": tg.base_url, "SWITCHBOARD_API_PORT": "0"}
            began = time.monotonic()
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            cloned = time.monotonic()
            term = Terminal(["bash", "-c", f"cd {clone} && make setup"], env=env)
            try:
                await expect(term, r"Which model server\?", timeout=900)
                installed = time.monotonic()
                await expect(term, r"Number \[\d\]: ")
                term.type("6\r")
                await expect(term, r"Its base URL")
                term.type(model.base_url.removesuffix("/v1") + "\r")
                await expect(term, r"(?s)Which model\?.*Number \[1\]: ")
                term.type("2\r")
                await expect(term, r"Set up Telegram\? \[Y/n\]")
                term.type("\r")
                await expect(term, r"Telegram bot token: ")
                term.type(tg.token + "\r")
                await expect(term, r"Set up Discord\? \[y/N\]")
                term.type("\r")
                await expect(term, r"Set up Slack\? \[y/N\]")
                term.type("\r")
                await expect(term, r"Send any message to @switchboard_bot now")
                await eventually(lambda: tg.calls("getUpdates"), 30, "setup polling")
                tg.dm(ANN, "hello, it's me")
                await expect(term, r"Make this account the owner.*\[Y/n\]")
                term.type("\r")
                await expect(term, r"Done\. Start it now|Install it as a systemd service", timeout=120)
                if "Install it as a systemd service" in term.text():
                    term.type("none\r")
                await expect(term, r"Done\. Start it now")
                if term.wait(60) != 0:
                    raise SystemExit(f"make setup failed:\n{term.text()}")
            finally:
                term.close()
            set_up = time.monotonic()
            run = await asyncio.create_subprocess_exec("make", "run", cwd=clone, env=env, start_new_session=True,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            try:
                assert run.stdout is not None
                while b"switchboard is serving" not in await asyncio.wait_for(run.stdout.readline(), 120):
                    pass
                serving = time.monotonic()
                before = len(tg.sent)
                tg.dm(ANN, "what can you do?")
                await tg.wait_for_sent(before + 1, timeout=60)
                answered = time.monotonic()
            finally:
                if run.returncode is None:
                    os.killpg(run.pid, 15)
                    await run.wait()
        size = _du(clone / ".venv")
    print(f"steps: {len(STEPS)} ({'; '.join(f'{i}. {s}' for i, s in enumerate(STEPS, 1))})")
    print("terminals: 1")
    print(f"git clone: {cloned - began:.1f} s")
    print(f"make setup, installing the runtime: {installed - cloned:.1f} s ({size} in .venv)")
    print(f"make setup, the questions (typed at once here): {set_up - installed:.1f} s")
    print(f"make run to serving: {serving - set_up:.1f} s")
    print(f"the DM to its answer: {answered - serving:.2f} s")
    print(f"git clone to the first answered DM: {answered - began:.1f} s ({(answered - began) / 60:.1f} min), "
          "plus the newcomer's own typing and BotFather")


if __name__ == "__main__":
    asyncio.run(main())
