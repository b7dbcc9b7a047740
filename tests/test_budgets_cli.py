"""``switchboard budgets list|show|set|reset [--json]`` and the dashboard's budgets page.

The CLI runs against the store of a home (tmp), as an operator's shell would beside the daemon; the
page is read through the real daemon's local API, logged in as the dashboard test's browser does.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

import state
from gateway.budgets import period_key
from gateway.cli.main import main
from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, running_gateway
from tests.test_dashboard import TOKEN, Browser

CONFIG = """
identities:
  ann: ["telegram:1", "slack:U2"]
budgets:
  rules:
    - {scope: "user:telegram:1", period: day, cost: 2}
"""


@pytest.fixture
def home(tmp_path):
    (tmp_path / "config.yaml").write_text(CONFIG, encoding="utf-8")
    return tmp_path


def run(home, *args: str):
    return CliRunner().invoke(main, ["budgets", *args, "--home", str(home), "--config", str(home / "config.yaml")])


def test_list_set_show_and_reset(home):
    with state.SessionDB(home / "state.db") as db:
        db.budgets.record_calls([], [("user:ann", period_key("day", time.time(), ZoneInfo("UTC")), 1.5, 900)])
    listed = run(home, "list", "--json")
    assert listed.exit_code == 0, listed.output
    [rule] = json.loads(listed.output)
    assert (rule["name"], rule["used"], rule["left"], rule["share"], rule["source"]) == \
        ("user:ann/day/cost", 1.5, 0.5, 0.75, "config")

    changed = run(home, "set", "user:slack:U2", "--cost", "5", "--json")  # the identity's rule, overridden
    assert changed.exit_code == 0, changed.output
    assert json.loads(changed.output)["set"] == "user:ann/day/cost"
    assert run(home, "set", "gateway", "--period", "month", "--tokens", "100000").exit_code == 0
    shown = json.loads(run(home, "show", "user:ann", "--json").output)
    assert shown["spent"]["day"]["tokens"] == 900
    assert [(r["name"], r["limit"], r["source"]) for r in shown["rules"]] == [("user:ann/day/cost", 5.0, "set")]
    text = run(home, "list").output
    assert "gateway/month/tokens" in text and "100,000" in text and "user:ann/day/cost" in text

    reset = json.loads(run(home, "reset", "user:ann", "--period", "day", "--json").output)
    assert reset["reset"] == [period_key("day", time.time(), ZoneInfo("UTC"))]
    assert json.loads(run(home, "show", "user:ann", "--json").output)["spent"]["day"]["tokens"] == 0

    off = run(home, "set", "user:ann", "--off", "--kind", "cost", "--json")
    assert off.exit_code == 0, off.output
    assert [r["name"] for r in json.loads(run(home, "list", "--json").output)] == ["gateway/month/tokens"]


def test_a_bad_scope_or_limit_is_refused_and_changes_nothing(home):
    unknown = run(home, "set", "user:bob", "--cost", "1")
    assert unknown.exit_code == 2 and "neither a name under identities (known: ann)" in unknown.output
    job = run(home, "set", "cron:nightly", "--cost", "1")
    assert job.exit_code == 2 and "not a job under cron.jobs" in job.output
    both = run(home, "set", "gateway", "--cost", "1", "--tokens", "5")
    assert both.exit_code == 2 and "give one limit" in both.output
    assert [r["name"] for r in json.loads(run(home, "list", "--json").output)] == ["user:ann/day/cost"]


def test_a_bad_rule_in_the_config_exits_78(home):
    (home / "config.yaml").write_text("budgets:\n  rules:\n    - {scope: 'user:nobody', cost: 1}\n")
    result = run(home, "list")
    assert result.exit_code == 78
    assert "budgets.rules[0].scope" in result.output


def _rows(body: str) -> list[list[str]]:
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
    return [r[:7] for r in rows if r]


async def test_the_dashboard_shows_each_rule_with_what_is_left_and_changes_it(tmp_path):
    async with FakeModel() as model, running_gateway(
            tmp_path, model, ui={"enabled": True}, api={"token": TOKEN}, identities={"ann": ["telegram:1"]},
            budgets={"rules": [{"scope": "user:ann", "period": "day", "tokens": 1000},
                               {"scope": "gateway", "period": "month", "cost": 10}]}) as gw:
        day = period_key("day", time.time(), gw.config.tzinfo)
        await gw.db.budgets.record_calls([], [("user:ann", day, 0.0, 250)])
        browser = Browser(gw)
        try:
            await browser.login()
            status, body, _ = await browser.get("/ui/budgets")
            assert status == 200
            assert _rows(body) == [["gateway/month/cost", "gateway", "month", "10.00", "0.00", "10.00", "0"],
                                   ["user:ann/day/tokens", "user:ann", "day", "1,000", "250", "750", "25"]]
            csrf = await browser.csrf("/ui/budgets")
            status, _, response = await browser.post("/ui/budgets/set", {"csrf": csrf, "name": "user:ann/day/tokens",
                                                                         "limit": "2,000"})
            assert status == 303, response.headers
            status, body, _ = await browser.post("/ui/budgets/set", {"csrf": csrf, "name": "user:ann/day/tokens",
                                                                     "limit": "lots"})
            assert status == 400 and "must be a number above 0" in html.unescape(body)
            status, _, _ = await browser.post("/ui/budgets/reset", {"csrf": csrf, "name": "user:ann/day/tokens"})
            assert status == 303
            status, _, _ = await browser.post("/ui/budgets/set", {"csrf": csrf, "name": "gateway/month/cost",
                                                                  "off": "1"})
            assert status == 303
            status, _, _ = await browser.post("/ui/budgets/reset", {"csrf": "forged", "name": "user:ann/day/tokens"})
            assert status == 403, "a change without the page's CSRF token is refused"
            _, body, _ = await browser.get("/ui/budgets")
            assert _rows(body) == [["user:ann/day/tokens", "user:ann", "day", "2,000", "0", "2,000", "0"]]
            assert [s.rule.name for s in await gw.services.budgets.listing()] == ["user:ann/day/tokens"], \
                "the daemon enforces what the page set"
        finally:
            await browser.close()


def test_config_check_warns_of_a_model_without_a_price_under_a_cost_budget(home):
    result = CliRunner().invoke(main, ["config", "check", "--json", "--config", str(home / "config.yaml")])
    assert result.exit_code == 0, result.output
    assert ("budgets: default has no price (pricing) under a cost budget; its calls are counted as free: set "
            "budgets.default_price or pricing") in json.loads(result.output)["warnings"]


async def test_a_deleted_sessions_spend_stays_in_the_budget_and_show_and_the_dashboard_say_how_much(tmp_path):
    """Two chats over the local API; one session deleted: the budget keeps its spend, the usage ledger
    (and so insights) drops its calls, and `budgets show` and the Budgets page name the difference."""
    async with FakeModel() as model, running_gateway(
            tmp_path, model, ui={"enabled": True}, api={"token": TOKEN},
            budgets={"rules": [{"scope": "gateway", "period": "day", "tokens": 1_000_000}]}) as gw:
        api = ApiClient(gw)
        try:
            await api.say("keep", "a question that stays")
            await api.say("drop", "a question whose session is deleted " * 20)
        finally:
            await api.close()
        await gw.services.usage.drain()
        dropped = await gw.db.routes.get("agent:main:api:dm:drop")
        calls = await gw.db.usage.calls(0)
        gone = sum(r["prompt_tokens"] + r["completion_tokens"] for r in calls if r["session_id"] == dropped)
        total = sum(r["prompt_tokens"] + r["completion_tokens"] for r in calls)
        assert 0 < gone < total
        deleted = await asyncio.to_thread(CliRunner().invoke, main, ["sessions", "delete", dropped, "--yes",
                                                                     "--home", str(tmp_path)])
        assert deleted.exit_code == 0, deleted.output
        shown = await asyncio.to_thread(CliRunner().invoke, main, ["budgets", "show", "gateway", "--home", str(tmp_path)])
        as_json = await asyncio.to_thread(CliRunner().invoke, main, ["budgets", "show", "gateway", "--json",
                                                                     "--home", str(tmp_path)])
        insights = (await gw.db.usage.summary(time.time() - 86_400))["total"]
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/budgets")
        finally:
            await browser.close()
    day = json.loads(as_json.output)["spent"]["day"]
    assert (day["tokens"], day["deleted_sessions"]["tokens"]) == (total, gone), "the budget keeps it and says whose"
    assert insights["input_tokens"] + insights["cached_input_tokens"] + insights["output_tokens"] == total - gone
    assert f"of which cost 0.0000, {gone:,} tokens by sessions deleted since" in " ".join(shown.output.split())
    [row] = [r for r in _all_cells(body) if r[0] == "gateway/day/tokens"]
    assert row[4] == f"{total:,}" and row[7] == f"{gone:,}", row


def _all_cells(body: str) -> list[list[str]]:
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
    return [r for r in rows if r]
