"""A local-API conversation that branched (the client edited a message, or regenerated an answer) is
listed as its newest branch, in ``switchboard sessions list`` and on the dashboard, and ``sessions show``
names the session it branched from: driven by the stock openai SDK against the running gateway."""

import json
import re

import aiohttp
import openai
import pytest
from click.testing import CliRunner

from gateway.cli.sessions import sessions
from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway

TOKEN = "branch-test-token-5b1e"


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def _branched_conversation(gw) -> tuple[str, str, str]:
    """A conversation, then the same with its second message edited, then that answer regenerated:
    the ids of the first session, the edit's branch and the regeneration's branch."""
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.api.bound_port}/v1", api_key=TOKEN)

    async def say(messages: list[dict]) -> tuple[str, str]:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
        return raw.parse().choices[0].message.content, raw.headers["X-Switchboard-Session"]

    u1 = {"role": "user", "content": "plan a trip"}
    a1, first = await say([u1])
    a2, _ = await say([u1, {"role": "assistant", "content": a1}, {"role": "user", "content": "to Rome"}])
    edited = [u1, {"role": "assistant", "content": a1}, {"role": "user", "content": "to Oslo"}]
    _, edit = await say(edited)
    _, regenerated = await say(edited)  # the same history again, without the answer it got
    await client.close()
    return first, edit, regenerated


async def test_the_newest_branch_stands_for_the_conversation_in_the_listing_and_on_the_dashboard(tmp_path, model):
    async with running_gateway(tmp_path, model, api={"token": TOKEN}, ui={"enabled": True}) as gw:
        first, edit, regenerated = await _branched_conversation(gw)
        listed = await gw.db.sessions.list_rich(source="api")
        parents = [await gw.db.sessions.get(s) for s in (first, edit)]
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            root = f"http://127.0.0.1:{gw.api.bound_port}"
            async with http.get(root + "/ui/login") as r:
                csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text()).group(1)
            async with http.post(root + "/ui/login", data={"csrf": csrf, "token": TOKEN}, allow_redirects=False) as r:
                assert r.status == 303
            async with http.get(root + "/ui/sessions?platform=api") as r:
                page = await r.text()
    assert len({first, edit, regenerated}) == 3
    # one row for the conversation: the live branch, with the first session as its root
    assert [(row["id"], row["lineage_root"]) for row in listed] == [(regenerated, first)]
    assert [p.end_reason for p in parents] == ["branched", "branched"]
    linked = set(re.findall(r'href="/ui/sessions/([^"/]+)"', page))
    assert regenerated in linked and first not in linked and edit not in linked


async def test_sessions_list_and_show_from_the_cli(tmp_path, model, monkeypatch):
    async with running_gateway(tmp_path, model, api={"token": TOKEN}) as gw:
        first, edit, regenerated = await _branched_conversation(gw)
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    runner = CliRunner()
    listed = runner.invoke(sessions, ["list", "--json"], catch_exceptions=False)
    shown = runner.invoke(sessions, ["show", regenerated], catch_exceptions=False)
    shown_first = runner.invoke(sessions, ["show", first], catch_exceptions=False)
    everything = runner.invoke(sessions, ["list", "--json", "--all"], catch_exceptions=False)
    assert listed.exit_code == shown.exit_code == 0, listed.output + shown.output
    assert [row["id"] for row in json.loads(listed.output)] == [regenerated]
    assert f"Branched  from {edit}" in shown.output and "Parent " not in shown.output
    assert f"Continued {regenerated}" in shown_first.output and "(branched)" in shown_first.output
    assert everything.exit_code == 0 and {row["id"] for row in json.loads(everything.output)} == {
        first, edit, regenerated}
