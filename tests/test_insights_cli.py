"""`switchboard insights` over a ledger in a real store: an identity's accounts as one user, the biggest
groups and one row for the rest, `insights reprice` after a price change, and `--plot` (PNG, SVG, and
the error that says what to install without matplotlib)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.insights import window
from state import SessionDB


def call(at: float, *, platform="telegram", user="1", model="gpt-4o", purpose="turn", prompt=1_000, cached=0,
         output=100, cost=None, price=None) -> dict:
    return {"at": at, "platform": platform, "chat_id": user, "user_id": user, "agent": "main", "purpose": purpose,
            "model": model, "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": output,
            "outcome": "ok", "cost": cost, "price_input": price, "price_output": price, "price_cached_input": price}


@pytest.fixture
def home(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "identities:\n  alice: [telegram:1, slack:U2]\n"
        "platforms:\n  telegram:\n    token: ${TELEGRAM_TOKEN_THE_SHELL_DOES_NOT_EXPORT}\n"  # insights need not read it
        "pricing:\n  gpt-4o: {input: 2.0, output: 10.0, cached_input: 1.0}\n  summarizer: {input: 1.0, output: 1.0}\n")
    return tmp_path


def run(home, *args, code=0):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD")}
    result = CliRunner(env={**env, "SWITCHBOARD_HOME": str(home)}).invoke(main, ["insights", *args])
    assert result.exit_code == code, result.output
    return result.output


def test_by_user_puts_an_identitys_linked_accounts_in_one_row(home):
    now = time.time()
    with SessionDB(home / "state.db") as db:
        db.usage.record_calls([call(now - 10, user="1", prompt=500), call(now - 10, platform="slack", user="U2",
                                                                          prompt=700),
                               call(now - 10, platform="discord", user="9", prompt=300),
                               call(now - 10, platform="discord", user="1", prompt=200)])  # not alice's: discord
    rows = {r["name"]: r for r in json.loads(run(home, "--by", "user", "--json"))["rows"]}
    assert {name: (r["calls"], r["input_tokens"]) for name, r in rows.items()} == {
        "alice": (2, 1_200), "discord:9": (1, 300), "discord:1": (1, 200)}
    table = run(home, "--by", "user")
    alice = next(line for line in table.splitlines() if line.strip().startswith("alice"))
    assert "1,200" in alice and alice.rstrip().endswith("█")  # today: the sparkline's last day
    for header in ("uncached input tokens", "cached input tokens", "output tokens", "cost (USD)", "tokens per day"):
        assert header in table
    # by chat, the same calls stay per account
    chats = {r["name"] for r in json.loads(run(home, "--by", "chat", "--json"))["rows"]}
    assert chats == {"telegram:1", "slack:U2", "discord:9", "discord:1"}


def test_the_biggest_groups_then_one_row_for_the_rest(home):
    now = time.time()
    with SessionDB(home / "state.db") as db:
        db.usage.record_calls([call(now - 10, platform="api", user=f"u{i:02}", prompt=100 * (i + 1), cached=10,
                                    cost=0.001 * (i + 1)) for i in range(30)])
    found = json.loads(run(home, "--by", "chat", "--top", "5", "--json"))
    assert [r["name"] for r in found["rows"]] == ["api:u29", "api:u28", "api:u27", "api:u26", "api:u25"]
    others = found["others"]
    assert (others["name"], others["calls"], found["groups"]) == ("25 more", 25, 30)
    assert others["input_tokens"] == sum(100 * (i + 1) - 10 for i in range(25))
    assert others["cached_input_tokens"] == 250 and others["cost"] == pytest.approx(sum(0.001 * (i + 1) for i in range(25)))
    assert sum(r["calls"] for r in found["rows"]) + others["calls"] == found["total"]["calls"] == 30
    assert others["daily_tokens"][-1] + sum(r["daily_tokens"][-1] for r in found["rows"]) == \
        found["total"]["daily_tokens"][-1]
    table = run(home, "--by", "chat", "--top", "5")
    assert "25 more" in table and "api:u24" not in table
    every = json.loads(run(home, "--by", "chat", "--top", "0", "--json"))
    assert (len(every["rows"]), every["others"], every["groups"]) == (30, None, 30)


def test_reprice_recomputes_costs_from_the_config_after_a_price_change(home):
    now = time.time()
    since_today, _ = window(1, now)
    with SessionDB(home / "state.db") as db:
        db.usage.record_calls([
            call(since_today - 3 * 86_400, prompt=1_000_000, cached=400_000, output=100_000, cost=99.0, price=99.0),
            call(now - 10, prompt=1_000_000, cached=400_000, output=100_000, cost=99.0, price=99.0),
            call(now - 10, model="summarizer", purpose="compression", prompt=2_000_000, output=0),  # no price then
            call(now - 10, model="retired", prompt=10, output=10, cost=1.0, price=1.0),  # no longer in pricing
        ])
    out = run(home, "reprice", "--days", "1")
    assert out.splitlines() == [
        "gpt-4o: 1 call at $2 input, $1 cached input, $10 output per million tokens",
        "retired: 1 call, no price (pricing.retired is not in the config)",
        "summarizer: 1 call at $1 input, $1 cached input, $1 output per million tokens",
    ]
    rows = {r["name"]: r for r in json.loads(run(home, "--by", "model", "--json", "--days", "7"))["rows"]}
    # today's gpt-4o call: 600k uncached at $2, 400k cached at $1, 100k output at $10; the older one kept $99
    assert rows["gpt-4o"]["cost"] == pytest.approx(1.2 + 0.4 + 1.0 + 99.0)
    assert (rows["summarizer"]["cost"], rows["summarizer"]["unpriced_calls"]) == (pytest.approx(2.0), 0)
    assert (rows["retired"]["cost"], rows["retired"]["unpriced_calls"]) == (None, 1)
    assert "no price" in run(home, "--by", "model")
    assert run(home, "reprice", "--model", "gpt-4o").splitlines() == [
        "gpt-4o: 2 calls at $2 input, $1 cached input, $10 output per million tokens"]
    rows = {r["name"]: r for r in json.loads(run(home, "--by", "model", "--json", "--days", "7"))["rows"]}
    assert rows["gpt-4o"]["cost"] == pytest.approx(2 * (1.2 + 0.4 + 1.0))


@pytest.mark.slow  # 6 s measured under load: `make test-fast` leaves it out
def test_plot_writes_a_png_or_an_svg_chart(home):
    now = time.time()
    with SessionDB(home / "state.db") as db:
        db.usage.record_calls([call(now - 10, purpose="turn", cost=0.5), call(now - 86_400, purpose="cron"),
                               call(now - 10, purpose="compression", model="summarizer", cost=0.25)])
    out = run(home, "--days", "7", "--plot", str(home / "usage.png"))
    assert f"Chart written to {home / 'usage.png'}" in out
    png = (home / "usage.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    run(home, "--days", "7", "--by", "purpose", "--plot", str(home / "usage.svg"))
    svg = ET.parse(home / "usage.svg").getroot()
    texts = {"".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert not (home / "usage.svg").read_text().count("<script")
    assert {"turn", "cron", "compression", "cost (USD)", "purpose"} <= texts
    out = run(home, "--plot", str(home / "usage.jpg"), code=2)
    assert "should end in .png or .svg" in out and not (home / "usage.jpg").exists()


def test_plot_without_matplotlib_says_what_to_install(home):
    script = ("import sys; sys.modules['matplotlib'] = None\n"  # as if it were not installed
              "from gateway.cli.main import main\n"
              f"main(['insights', '--home', {str(home)!r}, '--plot', {str(home / 'usage.png')!r}])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "--plot needs matplotlib, which is not installed: pip install 'switchboard[plots]'" in done.stderr
    assert not (home / "usage.png").exists()
