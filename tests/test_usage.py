"""The usage ledger through the real gateway: one row per model call, its purpose, tokens, cost and
outcome; `switchboard insights`; /usage showing a user their own calls only."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import Counter

import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.model import ModelClient, ModelSettings
from gateway.usage import CallContext, UsageRecorder
from state import AsyncSessionDB, SessionDB
from tests.fakes.model_server import Fail, FakeModel, Reply, ToolCall, refusal
from tests.harness import ApiClient, eventually, running_gateway

LONG = "details about the migration plan, the staging database and the rollback steps. " * 4
PRICE = {"input": 2.0, "output": 8.0, "cached_input": 0.5}  # US dollars per million tokens


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def priced(**extra):
    return {"pricing": {"fake-model": PRICE}, "model": {"context_length": 4096},
            "compression": {"timeout_seconds": 5}, **extra}


async def ledger(gw, count: int) -> list[dict]:
    """The ledger once ``count`` rows are written (they are written in the background)."""
    async def written():
        rows = await gw.db.usage.calls()
        return rows if len(rows) >= count else None
    return await eventually(written)


def insights(home, *args):
    result = CliRunner().invoke(main, ["insights", *args, "--home", str(home)])
    assert result.exit_code == 0, result.output
    return result


async def test_each_model_call_is_one_row_with_its_purpose_tokens_and_cost(tmp_path, model):
    model.cached_tokens = 20  # every prompt: 20 of its tokens read from the provider's cache
    model.script(ToolCall("memory", {"target": "user", "action": "add", "content": "Ann drinks tea"}),
                 Reply("noted"))
    async with running_gateway(tmp_path, model, **priced()) as gw:
        api = ApiClient(gw)
        assert await api.say("ann", "remember that I drink tea") == "noted"
        for i in range(6):
            await api.say("ann", f"turn {i}: {LONG}")
        model.script(Reply("nothing new to remember"), Reply("SUMMARY of the migration"))
        assert (await api.say("ann", "/compress")).startswith("Compressed: ")
        await api.close()
        rows = await ledger(gw, 10)
        child = await gw.db.sessions.get(await gw.db.routes.get("agent:main:api:dm:ann"))
        first_session = child.parent_session_id  # the one the calls were made for, compressed into the child
    assert Counter(r["purpose"] for r in rows) == {"turn": 7, "tool_loop": 1, "memory_flush": 1, "compression": 1}
    # the first turn: the call that asked for the tool, then the one that answered
    assert [r["purpose"] for r in rows[:2]] == ["turn", "tool_loop"]
    for row in rows:
        assert (row["session_id"], row["platform"], row["chat_id"], row["user_id"], row["agent"], row["model"]) == \
            (first_session, "api", "ann", "ann", "main", "fake-model"), row["purpose"]
        assert (row["outcome"], row["error"], row["attempts"], row["estimated"]) == ("ok", None, 1, 0)
        assert row["cached_tokens"] == 20 and row["prompt_tokens"] > 20 and row["completion_tokens"] > 0
        assert row["latency_ms"] >= 0
        assert (row["price_input"], row["price_output"], row["price_cached_input"]) == (2.0, 8.0, 0.5)
        expected = ((row["prompt_tokens"] - 20) * 2.0 + 20 * 0.5 + row["completion_tokens"] * 8.0) / 1e6
        assert row["cost"] == pytest.approx(expected)
    # the memory turn before the split, then the summary: the last two calls
    assert [r["purpose"] for r in rows[-2:]] == ["memory_flush", "compression"]


async def test_insights_json_counts_a_cached_read_once_and_marks_a_model_without_a_price(tmp_path, model):
    model.cached_tokens = 30
    async with running_gateway(tmp_path, model, **priced(compression={"model": "summarizer",
                                                                        "timeout_seconds": 5})) as gw:
        api = ApiClient(gw)
        for i in range(7):
            await api.say("bea", f"turn {i}: {LONG}")
        model.script(Reply("nothing new to remember"), Reply("the summary"))
        assert (await api.say("bea", "/compress")).startswith("Compressed: ")
        await api.close()
        rows = await ledger(gw, 9)
    by_model = json.loads(insights(tmp_path, "--by", "model", "--json", "--days", "7").output)
    named = {r["name"]: r for r in by_model["rows"]}
    assert set(named) == {"fake-model", "summarizer"}
    main_rows = [r for r in rows if r["model"] == "fake-model"]
    fake = named["fake-model"]
    assert fake["calls"] == len(main_rows) == 8  # seven turns and the memory turn
    assert fake["cached_input_tokens"] == 30 * 8
    assert fake["input_tokens"] == sum(r["prompt_tokens"] for r in main_rows) - 30 * 8  # no cached read twice
    assert fake["output_tokens"] == sum(r["completion_tokens"] for r in main_rows)
    assert fake["cost"] == pytest.approx(sum(r["cost"] for r in main_rows), abs=1e-6)
    assert fake["unpriced_calls"] == 0 and fake["daily_tokens"][-1] == (
        fake["input_tokens"] + fake["cached_input_tokens"] + fake["output_tokens"])
    summarizer = named["summarizer"]
    assert (summarizer["calls"], summarizer["cost"], summarizer["unpriced_calls"]) == (1, None, 1)
    assert by_model["total"]["calls"] == 9 and by_model["total"]["unpriced_calls"] == 1
    assert len(by_model["dates"]) == 7

    by_purpose = json.loads(insights(tmp_path, "--by", "purpose", "--json").output)
    assert {r["name"]: r["calls"] for r in by_purpose["rows"]} == {"turn": 7, "memory_flush": 1, "compression": 1}

    table = insights(tmp_path, "--by", "model").output
    assert "uncached input tokens" in table and "cached input tokens" in table and "output tokens" in table
    assert "no price" in table and "summarizer" in table
    sparkline_row = next(line.strip() for line in table.splitlines() if line.strip().startswith("fake-model"))
    assert sparkline_row.rstrip().endswith("█")  # today is the busiest (the only) day of the window


async def test_usage_shows_a_user_their_own_calls_only(tmp_path, model):
    async with running_gateway(tmp_path, model, **priced()) as gw:
        api = ApiClient(gw)
        for i in range(3):
            await api.say("cat", f"question {i}")
        await api.say("dan", "one question")
        rows = await ledger(gw, 4)
        cat = [r for r in rows if r["user_id"] == "cat"]
        cat_usage = await api.say("cat", "/usage")
        dan_usage = await api.say("dan", "/usage")
        await api.close()
    cat_input = sum(r["prompt_tokens"] for r in cat)
    cat_output = sum(r["completion_tokens"] for r in cat)
    cat_cost = sum(r["cost"] for r in cat)
    assert cat_usage.splitlines() == [
        "Your usage (the model calls made for your sessions here):",
        f"Last 7 days: 3 calls · {cat_input:,} uncached input tokens · 0 cached input tokens · {cat_output:,} output tokens"
        f" · cost ${cat_cost:,.4f}",
        f"Last 30 days: 3 calls · {cat_input:,} uncached input tokens · 0 cached input tokens · {cat_output:,} output tokens"
        f" · cost ${cat_cost:,.4f}",
    ]
    assert "Last 7 days: 1 call · " in dan_usage and f"{cat_input:,} uncached input" not in dan_usage
    # the operator sees everyone, per user, per chat and per day
    by_user = json.loads(insights(tmp_path, "--by", "user", "--json").output)
    assert {r["name"]: r["calls"] for r in by_user["rows"]} == {"api:cat": 3, "api:dan": 1}
    assert next(r for r in by_user["rows"] if r["name"] == "api:cat")["input_tokens"] == cat_input
    by_chat = json.loads(insights(tmp_path, "--by", "chat", "--json").output)
    assert {r["name"]: r["calls"] for r in by_chat["rows"]} == {"api:cat": 3, "api:dan": 1}
    by_day = json.loads(insights(tmp_path, "--by", "day", "--json", "--days", "3").output)
    assert [(r["name"], r["calls"]) for r in by_day["rows"]] == [(by_day["dates"][-1], 4)]


async def test_failed_and_retried_calls_are_recorded_with_their_outcome(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        model.script(refusal(401))
        status, refused = await api.failure("eve", "hello?")
        assert status == 502
        model.script(Fail(503), Reply("there you are"))
        assert await api.say("eve", "hello again") == "there you are"
        await api.close()
        rows = await ledger(gw, 2)
    assert "api key" in refused.lower()
    failed, retried = rows
    assert (failed["outcome"], failed["purpose"], failed["attempts"]) == ("failed", "turn", 1)
    assert failed["error"].startswith("ModelAuthRejected")
    # refused with an error answer: the model never ran, so the call costs nothing (no estimate either)
    assert (failed["estimated"], failed["prompt_tokens"], failed["completion_tokens"]) == (0, 0, 0)
    assert (failed["cost"], failed["price_input"]) == (None, None)  # no pricing: tokens only
    assert (retried["outcome"], retried["attempts"], retried["error"]) == ("retried", 2, None)
    out = insights(tmp_path, "--by", "purpose").output
    assert "1 call(s) failed, 1 succeeded after a retry" in out and "no price" in out


async def test_an_endpoint_reporting_no_usage_gives_estimates_marked_as_such(tmp_path, model):
    model.report_usage = False
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("fay", "count this for me please")
        await api.close()
        (row,) = await ledger(gw, 1)
    assert row["estimated"] == 1 and row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
    assert row["outcome"] == "ok"
    assert "1 call(s) reported no usage: their tokens are estimates" in insights(tmp_path).output


async def test_a_ledger_that_cannot_be_written_never_fails_the_turn(tmp_path, model, caplog):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("gil", "first")
        await ledger(gw, 1)
        with sqlite3.connect(gw.config.db_path) as conn:  # another process broke the table
            conn.execute("DROP TABLE model_calls")
        with caplog.at_level(logging.WARNING, logger="gateway.usage"):
            assert (await api.say("gil", "second")).startswith("echo: second")
            await eventually(lambda: "usage ledger: 1 model call(s) not recorded (OperationalError, first: the turn call "
                             "to fake-model)" in caplog.text)
        await api.close()


async def test_a_streamed_call_reads_cached_tokens_from_the_last_chunk(tmp_path, model):
    model.cached_tokens = 4
    db = await AsyncSessionDB.open(tmp_path / "state.db")
    client = ModelClient(ModelSettings(base_url=model.base_url, api_key="k", name="fake-model"),
                         usage=UsageRecorder(db, {}))
    shown: list[str] = []
    try:
        done = await client.complete([{"role": "user", "content": "stream this"}], on_text=shown.append,
                                     purpose=CallContext("turn", session_id=None, platform="api", chat_id="c",
                                                         user_id="u", agent="main"))
        rows = await eventually(lambda: db.usage.calls())
    finally:
        await client.close()
        await db.close()
    assert "".join(shown) == done.message["content"] and done.cached_tokens == 4
    assert (rows[0]["cached_tokens"], rows[0]["prompt_tokens"], rows[0]["estimated"]) == (4, done.prompt_tokens, 0)
    assert rows[0]["cost"] is None  # no price for fake-model


def test_a_sessions_rows_go_with_it_and_old_rows_are_pruned(store):
    with store as db:
        kept = db.sessions.create("s-kept", "api", user_id="u")
        gone = db.sessions.create("s-gone", "api", user_id="u")
        for sid, at in ((kept, 1_000.0), (kept, 5_000.0), (gone, 5_000.0)):
            db.usage.record_call({"at": at, "session_id": sid, "purpose": "turn", "model": "m", "outcome": "ok",
                                  "prompt_tokens": 10})
        assert {r["user_id"] for r in db.usage.calls()} == {"u"}  # filled in from the session
        assert db.sessions.delete(gone)
        assert [(r["session_id"], r["at"]) for r in db.usage.calls()] == [(kept, 1_000.0), (kept, 5_000.0)]
        assert db.usage.prune(before=2_000.0) == 1
        assert [r["at"] for r in db.usage.calls()] == [5_000.0]
        assert db.usage.reprice("m", {"input": 1.0, "output": 1.0, "cached_input": 1.0}) == 1
        assert db.usage.calls()[0]["cost"] == pytest.approx(10 / 1e6)


async def test_recall_summaries_fact_extraction_and_cron_runs_have_their_purpose(tmp_path, model):
    from tests.test_recall import seed

    jobs = [{"id": "digest", "name": "Digest", "schedule": "every 1d", "prompt": "anything new?"}]
    async with running_gateway(tmp_path, model, cron={"jobs": jobs}, facts={"extract_delay_seconds": 0}) as gw:
        await seed(gw.db, "old-talk", "api", "hal", ["the walrus plan is on", "good"], title="Walrus")
        model.script(ToolCall("session_search", {"query": "walrus"}))
        api = ApiClient(gw)
        await api.say("hal", "what was the walrus plan?")  # turn, recall summary, tool_loop
        await api.say("hal", "thanks")
        await api.say("hal", "/new")  # the ended session: a memory turn, then its facts are extracted
        await gw.cron.run_job("digest")
        await api.close()
        rows = await eventually(lambda: _with_purposes(gw, {"recall", "fact_extraction", "cron"}))
    by_purpose = {r["purpose"]: r for r in rows}
    hal = (by_purpose["recall"]["platform"], by_purpose["recall"]["chat_id"], by_purpose["recall"]["user_id"])
    assert hal == ("api", "hal", "hal")
    assert by_purpose["recall"]["session_id"] == by_purpose["turn"]["session_id"]  # made for the asking turn
    assert (by_purpose["fact_extraction"]["session_id"], by_purpose["fact_extraction"]["user_id"]) == \
        (by_purpose["turn"]["session_id"], "hal")
    cron = by_purpose["cron"]
    # a job has no user: its calls are the job's own (insights --by user names the job, not "cron:?")
    assert (cron["platform"], cron["chat_id"], cron["user_id"], cron["agent"]) == ("cron", "digest", "digest", "main")
    assert [r["purpose"] for r in rows[:3]] == ["turn", "recall", "tool_loop"]


async def _with_purposes(gw, wanted: set[str]) -> list[dict] | None:
    rows = await gw.db.usage.calls()
    return rows if wanted <= {r["purpose"] for r in rows} else None


@pytest.mark.slow  # 5 s measured under load: `make test-fast` leaves it out
async def test_the_daemon_deletes_ledger_rows_older_than_usage_keep_days(tmp_path, model):
    import time

    now = time.time()
    with SessionDB(tmp_path / "state.db") as db:
        for age_days in (40, 3, 0.5):
            db.usage.record_call({"at": now - age_days * 86_400, "purpose": "turn", "model": "m", "outcome": "ok"})
    async with running_gateway(tmp_path, model, usage={"keep_days": 7}) as gw:
        await eventually(lambda: gw.health()["store"]["last_upkeep"], timeout=30, what="the first upkeep pass")
        left = await eventually(lambda: _rows_if(gw, 2), timeout=10)
    assert sorted(round((now - r["at"]) / 86_400, 1) for r in left) == [0.5, 3.0]


async def _rows_if(gw, count: int) -> list[dict] | None:
    rows = await gw.db.usage.calls()
    return rows if len(rows) == count else None


def test_insights_refuses_a_grouping_it_does_not_know_naming_the_choices(tmp_path):
    result = CliRunner().invoke(main, ["insights", "--by", "weekday", "--home", str(tmp_path)])
    assert result.exit_code == 2
    assert "'weekday' is not one of 'day', 'model', 'platform', 'purpose', 'user', 'chat'" in result.output
    assert "No model calls in the last 30 days." in insights(tmp_path).output


def test_the_report_counts_each_utc_day_and_group_alike_on_both_backends(store):
    calls = [  # the last second of 1970-01-01 and the first of the next day
        {"at": 86_399.9, "platform": "telegram", "user_id": "7", "purpose": "turn", "model": "m", "outcome": "ok",
         "prompt_tokens": 100, "cached_tokens": 40, "completion_tokens": 5, "cost": 0.5},
        {"at": 86_400.1, "platform": "telegram", "user_id": "7", "purpose": "turn", "model": "m", "outcome": "failed"},
        {"at": 86_400.2, "platform": None, "user_id": "7", "purpose": "cron", "model": "m", "outcome": "retried",
         "prompt_tokens": 10, "estimated": True},
    ]
    store.usage.record_calls(calls)
    days = sorted(store.usage.report(0.0, "day"), key=lambda r: r["day"])
    assert [(r["day"], r["calls"], r["input_tokens"], r["cached_input_tokens"], r["unpriced"], r["failed"],
             r["retried"], r["estimated"]) for r in days] == [
        ("1970-01-01", 1, 60, 40, 0, 0, 0, 0),
        ("1970-01-02", 2, 10, 0, 2, 1, 1, 1),
    ]
    assert days[0]["grp"] == "1970-01-01" and days[0]["cost"] == 0.5
    mine = store.usage.report(0.0, "user", platform=None, user_id="7")
    assert [(r["grp"], r["day"], r["calls"]) for r in mine] == [("?:7", "1970-01-02", 1)]
