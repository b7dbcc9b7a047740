"""OAuth for remote MCP servers, end to end: the real SDK 2.x MCP server that requires a bearer token
and the SDK's own authorisation server (tests/mcp_servers/oauth_server.py), both on 127.0.0.1; the
gateway with the fake Telegram server and the real client library; the person's browser an HTTP
client that opens the link sent in the chat, signs in and follows the redirect to the local API's
callback.  What a user sees is asserted: the link in their chat, the model told they must authorise
the server first, the next call answered with their own account, never another's."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import stat

import httpx
import pytest

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually, gateway_config
from tests.mcp_servers.oauth_server import oauth_servers

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team")
LINK = re.compile(r"(http://127\.0\.0\.1:\d+/authorize\?\S+)")
MUST = "error: the user must authorise docs first. A sign-in link was sent to them; once they have signed in, call the tool again."
# a real call (not docs__authorise): it runs again by itself once the asker has signed in
MUST_RERUN = ("error: the user must authorise docs first. A sign-in link was sent to them; once they have signed in, "
              "this call runs again by itself and you are given its result.")


def _config(tmp_path, tg, model, url, *, auth="per_user", server=None, **tools):
    docs = {"url": url, "auth": auth, "allow": ["docs__*"], **(server or {})}
    return gateway_config(tmp_path / "home", model.base_url,
                          tools={"mcp_servers": {"docs": docs}, "approvers": ["telegram:111"], **tools},
                          auth={"allowed_users": ["telegram:111", "telegram:222"]}, streaming={"enabled": False},
                          platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})


async def _started(config, tg) -> Gateway:
    gw = Gateway(config, serve_api=True)
    await gw.start()
    await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
    return gw


def _tool_results(model) -> list[str]:
    """Each tool result as the model was sent it (the last message of the request after the call), in order."""
    return [r.messages[-1]["content"] for r in model.requests if r.messages and r.messages[-1].get("role") == "tool"]


async def _link_to(tg, chat_id: int, after: int = 0) -> str:
    def found():
        for sent in tg.sent[after:]:
            match = LINK.search(sent.visible_text)
            if match and int(sent.chat_id) == chat_id:
                return match.group(1)
        return None
    return await tg.wait_for(found, 20, lambda: f"a sign-in link in chat {chat_id}: {[s.visible_text for s in tg.sent]}")


async def _answered(tg, model, n: int):
    await eventually(lambda: len(_tool_results(model)) >= n, 20, lambda: f"{n} tool results: {_tool_results(model)}")


async def test_each_person_signs_in_through_a_link_and_their_calls_carry_their_own_token(tmp_path, caplog):
    caplog.set_level("DEBUG")
    async with oauth_servers() as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("I sent you a sign-in link"),
                     ToolCall("docs__whoami", {}), Reply("done, Ann"),
                     ToolCall("docs__whoami", {}), Reply("Bob must sign in"),
                     Reply("done, Bob"),  # the turn going on once Bob signed in: his call ran again
                     ToolCall("docs__whoami", {}), Reply("Ann again"))
        gw = await _started(_config(tmp_path, tg, model, servers.mcp_url), tg)
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, lambda: f"unauthorised ({server.state})")
            assert [t.name for t in gw.tools.tools() if t.name.startswith("docs__")] == ["docs__authorise"]

            # Ann asks; nobody is signed in: the model calls the one tool there is, Ann gets the link
            tg.dm(ANN, "search my docs")
            link = await _link_to(tg, 111)
            await _answered(tg, model, 1)
            assert _tool_results(model) == [MUST]
            assert "code_challenge_method=S256" in link and "resource=" in link and "scope=docs.read" in link
            # the browser: Ann signs in at the authorisation server, which redirects to the local API
            page = await servers.browser(link, account="ann")
            assert page.status_code == 200 and "Signed in" in page.text, page.text
            await tg.wait_for(lambda: any("Signed in to docs" in s.visible_text for s in tg.sent), 10, "told")
            await eventually(lambda: server.available and "whoami" in server.tools, 20,
                             lambda: f"docs ready ({server.state}: {server.last_error})")
            assert "docs__authorise" not in {t.name for t in gw.tools.tools()}
            # the same link again: used up, nothing signed in twice
            again = await servers.browser(link, account="mallory")
            assert again.status_code == 400 and "used up" in again.text

            tg.dm(ANN, "who am I there?")
            await _answered(tg, model, 2)
            assert _tool_results(model)[1] == "you are ann"

            # Bob has not signed in: Ann's token is never used for him; he is sent a link of his own
            sent_before = len(tg.sent)
            tg.dm(BOB, "who am I there?")
            bobs_link = await _link_to(tg, 222, sent_before)
            await _answered(tg, model, 3)
            assert _tool_results(model)[2] == MUST_RERUN
            assert not any(LINK.search(s.visible_text) for s in tg.sent[sent_before:] if int(s.chat_id) == 111)
            assert (await servers.browser(bobs_link, account="bob")).status_code == 200
            # the callback resumes Bob's call: run again with his own account, answered in his chat
            await _answered(tg, model, 4)
            assert _tool_results(model)[3] == "you are bob"
            await tg.wait_for(lambda: any("done, Bob" in s.visible_text for s in tg.sent if int(s.chat_id) == 222),
                              20, "the turn's answer in Bob's chat")
            assert any("Signed in to docs. Running the call that waited for it." in s.visible_text
                       for s in tg.sent if int(s.chat_id) == 222)
            tg.dm(ANN, "and me?")
            await _answered(tg, model, 5)
            assert _tool_results(model)[4] == "you are ann"
            tokens = dict(servers.provider.subjects())
        finally:
            await gw.stop(grace_seconds=5)
        home = tmp_path / "home"
        # secrets: sealed in the store, the key file its owner's alone, none in the log or before the model
        assert stat.S_IMODE(os.stat(home / "mcp-oauth.key").st_mode) == 0o600
        stored = (home / "state.db").read_bytes() + b"".join(
            p.read_bytes() for p in home.glob("state.db-wal"))
        with sqlite3.connect(home / "state.db") as conn:
            rows = conn.execute("SELECT server, principal, kind FROM mcp_auth ORDER BY principal, kind").fetchall()
        assert rows == [("docs", "", "client"), ("docs", "telegram:111", "tokens"), ("docs", "telegram:222", "tokens")]
        said = caplog.text + json.dumps([r.body for r in model.requests])
        refresh_tokens = list(servers.provider.refresh)
        for secret in [*tokens, *refresh_tokens]:
            assert secret.encode() not in stored and secret not in said
        assert set(tokens.values()) == {"ann", "bob"}


async def test_a_token_near_its_expiry_is_refreshed_and_logout_revokes_it(tmp_path):
    async with oauth_servers(access_seconds=4) as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("link sent"),
                     ToolCall("docs__search", {"words": "cats"}), Reply("found"),
                     ToolCall("docs__search", {"words": "dogs"}), Reply("sign in again"))
        gw = await _started(_config(tmp_path, tg, model, servers.mcp_url), tg)
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, "unauthorised")
            tg.dm(ANN, "find cats")
            link = await _link_to(tg, 111)
            assert (await servers.browser(link, account="ann")).status_code == 200
            await eventually(lambda: server.available, 20, lambda: f"ready ({server.last_error})")
            # a 4 s token is refreshed once in the second half of its life (the server's own connection
            # uses it every 10 s at most): by then the first one has run out at the server
            first = next(iter(servers.provider.access))
            await eventually(lambda: servers.provider.refreshed >= 1, 30, "a refresh")
            tg.dm(ANN, "find cats")
            await _answered(tg, model, 2)
            assert _tool_results(model)[1] == "ann's documents about cats: 3 found"
            assert await servers.provider.load_access_token(first) is None
            assert servers.provider.refreshed <= 4  # once per token's life, not at every request
            current = list(servers.provider.access)[-1]

            sent_before = len(tg.sent)
            tg.dm(ANN, "/tools logout docs")
            await tg.wait_for(lambda: any("Signed out of docs" in s.visible_text for s in tg.sent[sent_before:]), 10,
                              lambda: f"signed out: {[s.visible_text for s in tg.sent[sent_before:]]}")
            assert servers.provider.revoked  # the refresh token, then the access token, revoked at the server
            assert await servers.provider.load_access_token(current) is None
            assert not servers.provider.refresh  # nor can it be refreshed
            tg.dm(ANN, "find dogs")
            await _link_to(tg, 111, sent_before + 1)
            await _answered(tg, model, 3)
            assert _tool_results(model)[2] == MUST_RERUN
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_per_user_servers_question_waits_its_own_deadline_not_the_connections(tmp_path):
    """The connection's deadline (connect_timeout_seconds) covers connecting and signing in; a question the
    server asks mid-call waits for the user as on any server (approval_timeout), then the call goes on."""
    async with oauth_servers() as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("link sent"),
                     ToolCall("docs__share", {}), Reply("shared, as you said"))
        config = _config(tmp_path, tg, model, servers.mcp_url, approval_timeout=120,
                         server={"connect_timeout_seconds": 2, "timeout_seconds": 2})
        gw = await _started(config, tg)
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, "unauthorised")
            tg.dm(ANN, "sign me in")
            assert (await servers.browser(await _link_to(tg, 111), account="ann")).status_code == 200
            await eventually(lambda: server.available and "share" in server.tools, 20,
                             lambda: f"ready ({server.state}: {server.last_error})")
            tg.dm(ANN, "share my document")
            asked = await tg.wait_for(lambda: next((s for s in tg.sent if "(question " in s.visible_text), None), 20,
                                      lambda: f"the question ({[s.visible_text for s in tg.sent]})")
            assert "docs__share asks: May I share the document?" in asked.visible_text
            await asyncio.sleep(5)  # past the connection's 2 s and the call's 2 s together: the old cut-off
            yes, _no, _decline = asked.button_data()
            tg.press(asked, ANN, yes)
            await _answered(tg, model, 2)
            assert _tool_results(model)[1] == "ann's document shared"
            await tg.wait_for(lambda: any("shared, as you said" in s.visible_text for s in tg.sent), 20, "the answer")
        finally:
            await gw.stop(grace_seconds=5)


async def test_in_a_group_the_link_goes_to_the_asker_alone(tmp_path):
    async with oauth_servers() as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("check your messages"))
        gw = await _started(_config(tmp_path, tg, model, servers.mcp_url), tg)
        try:
            await eventually(lambda: gw.mcp.servers["docs"].state == "unauthorised", 20, "unauthorised")
            tg.dm(ANN, "/tools")  # nobody signed in: the one tool that sends the link, not "unavailable"
            listed = await tg.wait_for(lambda: next((s for s in tg.sent if "docs__authorise" in s.visible_text), None),
                                       10, "/tools")
            assert "needs the user to sign in" in listed.visible_text and "unavailable" not in listed.visible_text
            tg.in_group(TEAM, ANN, "@switchboard_bot search the docs")
            link = await _link_to(tg, 111)
            await tg.wait_for(lambda: any("I sent you the link in a direct message" in s.visible_text
                                          for s in tg.sent if int(s.chat_id) == TEAM["id"]), 10, "told in the group")
            assert not any(LINK.search(s.visible_text) for s in tg.sent if int(s.chat_id) == TEAM["id"])

            # what reaches the callback that is not a good answer harms nothing and says why
            callback = f"http://127.0.0.1:{gw.api.bound_port}/mcp/oauth/callback"
            async with httpx.AsyncClient(timeout=10) as http:
                bare = await http.get(callback)
                forged = await http.get(callback, params={"state": "made-up", "code": "x"})
                # Ann says no at the authorisation server: it sends the browser back with an error
                refused = await http.get(callback, params={"state": httpx.URL(link).params["state"],
                                                           "error": "access_denied"})
                again = await http.get(callback, params={"state": httpx.URL(link).params["state"], "code": "x"})
            assert (bare.status_code, forged.status_code, refused.status_code) == (400, 400, 400)
            assert "used up" in forged.text and "access_denied" in refused.text and "used up" in again.text
            await tg.wait_for(lambda: any("Signing in to docs was refused (access_denied)" in s.visible_text
                                          for s in tg.sent), 10, "told it was refused")
            assert await gw.db.mcp_auth.principals("docs") == []
        finally:
            await gw.stop(grace_seconds=5)


async def test_in_a_group_the_call_that_waited_for_a_sign_in_runs_once_signed_in_and_the_turn_answers_there(tmp_path):
    async with oauth_servers() as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("link sent"),
                     ToolCall("docs__whoami", {}), Reply("Bob must sign in first"),
                     Reply("Bob, you are bob there"))
        gw = await _started(_config(tmp_path, tg, model, servers.mcp_url), tg)
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, "unauthorised")
            tg.dm(ANN, "sign me in")  # someone signed in: the server's tools are read and offered
            assert (await servers.browser(await _link_to(tg, 111), account="ann")).status_code == 200
            await eventually(lambda: server.available and "whoami" in server.tools, 20, "docs ready")

            sent_before = len(tg.sent)
            tg.in_group(TEAM, BOB, "@switchboard_bot who am I in the docs?")
            link = await _link_to(tg, 222, sent_before)  # to Bob alone
            await _answered(tg, model, 2)
            assert _tool_results(model)[1] == MUST_RERUN
            assert not any(LINK.search(s.visible_text) for s in tg.sent if int(s.chat_id) == TEAM["id"])
            assert (await servers.browser(link, account="bob")).status_code == 200
            answer = await tg.wait_for(lambda: next((s for s in tg.sent if "Bob, you are bob there" in s.visible_text),
                                                    None), 20, lambda: f"the answer ({[s.visible_text for s in tg.sent]})")
            assert int(answer.chat_id) == TEAM["id"]  # where the turn was asked
            assert _tool_results(model)[2] == "you are bob"  # with Bob's own token, never Ann's
            again = await servers.browser(link, account="bob")  # the link again: used up, nothing runs twice
            assert again.status_code == 400
            assert len(_tool_results(model)) == 3
            with_call = model.requests[-1].messages
            assert with_call[-2]["tool_calls"][0]["function"]["name"] == "docs__whoami"
        finally:
            await gw.stop(grace_seconds=5)
        with sqlite3.connect(tmp_path / "home" / "state.db") as conn:
            tools = [r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'tool' ORDER BY id")]
        assert tools[-1] == "you are bob"  # the session keeps the call run again and its result


async def test_an_operator_server_signs_in_once_for_everyone_and_only_an_approver_gets_the_link(tmp_path):
    async with oauth_servers() as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("ask the operator"),
                     ToolCall("docs__authorise", {}), Reply("link sent"),
                     ToolCall("docs__whoami", {}), Reply("done"))
        gw = await _started(_config(tmp_path, tg, model, servers.mcp_url, auth="operator"), tg)
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, "unauthorised")
            tg.dm(BOB, "search the docs")  # Bob is no approver
            await _answered(tg, model, 1)
            assert _tool_results(model)[0].startswith("error: the operator must authorise docs first")
            assert not any(LINK.search(s.visible_text) for s in tg.sent)
            tg.dm(ANN, "search the docs")  # Ann approves tools: she signs in for everyone
            link = await _link_to(tg, 111)
            assert (await servers.browser(link, account="ops-account")).status_code == 200
            await eventually(lambda: server.available, 20, lambda: f"ready ({server.last_error})")
            tg.dm(BOB, "who am I there?")
            await _answered(tg, model, 3)
            assert _tool_results(model)[2] == "you are ops-account"
            tg.dm(BOB, "/tools logout docs")  # only an approver signs the operator out
            await tg.wait_for(lambda: any("only an approver" in s.visible_text for s in tg.sent), 10, "refused")
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_client_id_metadata_document_is_used_where_the_server_takes_one(tmp_path):
    import socket

    with socket.socket() as probe:  # the API's port must be known before start: it is in the client's URL
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    async with oauth_servers(cimd=True) as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("link sent"))
        config = _config(tmp_path, tg, model, servers.mcp_url,
                         oauth={"public_url": base, "client_id_url": f"{base}/mcp/oauth/client.json"})
        config = config.model_copy(update={"api": config.api.model_copy(update={"port": port})})
        gw = await _started(config, tg)
        try:
            await eventually(lambda: gw.mcp.servers["docs"].state == "unauthorised", 20, "unauthorised")
            tg.dm(ANN, "search")
            link = await _link_to(tg, 111)
            assert f"client_id={httpx.QueryParams({'x': base + '/mcp/oauth/client.json'})['x']}" in \
                str(httpx.URL(link).params) or httpx.URL(link).params["client_id"] == f"{base}/mcp/oauth/client.json"
            assert (await servers.browser(link, account="ann")).status_code == 200
            assert servers.provider.registered == 0  # no dynamic registration
            assert servers.provider.documents_fetched == [f"{base}/mcp/oauth/client.json"] * len(
                servers.provider.documents_fetched) and servers.provider.documents_fetched
            await eventually(lambda: gw.mcp.servers["docs"].available, 20, "ready")
        finally:
            await gw.stop(grace_seconds=5)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:  # the CLI and the daemon must agree on the callback's address
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_the_operator_signs_in_and_out_from_the_cli_and_the_daemon_receives_the_callback(tmp_path):
    import asyncio

    import yaml
    from click.testing import CliRunner

    from gateway.cli.main import main
    from gateway.config import load_config

    port = _free_port()
    async with oauth_servers() as servers, FakeModel() as model:
        data = {"home": str(tmp_path / "home"), "api": {"host": "127.0.0.1", "port": port},
                "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000"},
                "tools": {"mcp_servers": {"docs": {"url": servers.mcp_url, "auth": "operator", "allow": ["docs__*"]}}}}
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump(data))

        def cli(*args: str):
            return CliRunner().invoke(main, ["tools", *args, "--config", str(config_file)])

        gw = Gateway(load_config(config_file), serve_api=True)
        await gw.start()
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, "unauthorised")
            said = await asyncio.to_thread(cli, "login", "docs")
            assert said.exit_code == 0, said.output
            link = LINK.search(said.output).group(1)
            page = await servers.browser(link, account="ops")
            assert page.status_code == 200 and "for everyone" in page.text
            await eventually(lambda: server.available, 20, lambda: f"ready ({server.last_error})")
            assert await server.call("whoami", {}) == "you are ops"

            wrong = await asyncio.to_thread(cli, "logout", "docs", "--user", "telegram:1")
            assert wrong.exit_code != 0 and "--user is for auth: per_user" in wrong.output
            said = await asyncio.to_thread(cli, "logout", "docs")
            assert said.exit_code == 0 and "signed out the operator (1 sign-in deleted" in said.output, said.output
            assert servers.provider.revoked and not servers.provider.refresh
            # the daemon's connection is refused now: it waits for a sign-in again, offering only the link
            await eventually(lambda: server.state == "unauthorised", 40, lambda: f"unauthorised ({server.state})")
            assert [t.name for t in gw.tools.tools() if t.name.startswith("docs__")] == ["docs__authorise"]
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_flood_of_callbacks_from_one_address_is_refused_before_the_store_and_a_real_sign_in_still_works(
        tmp_path):
    from gateway.runtime.api_oauth import CALLBACK_PER_CLIENT

    async with oauth_servers() as servers, FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("docs__authorise", {}), Reply("I sent you a sign-in link"))
        gw = await _started(_config(tmp_path, tg, model, servers.mcp_url), tg)
        try:
            server = gw.mcp.servers["docs"]
            await eventually(lambda: server.state == "unauthorised", 20, "unauthorised")
            tg.dm(ANN, "search my docs")
            link = await _link_to(tg, 111)
            callback = f"http://127.0.0.1:{gw.api.bound_port}/mcp/oauth/callback"
            flood = httpx.AsyncHTTPTransport(local_address="127.0.0.2")  # another address than the browser's
            async with httpx.AsyncClient(transport=flood, timeout=10) as http:
                guessed = [await http.get(callback, params={"state": f"guess-{n}", "code": "x"})
                           for n in range(CALLBACK_PER_CLIENT)]
                # past the limit even the real state is refused unread: had it reached the store, the flow
                # would be taken (used up) and Ann's own sign-in below would fail
                refused = [await http.get(callback, params={"state": httpx.URL(link).params["state"], "code": "x"})
                           for _ in range(30)]
            assert {r.status_code for r in guessed} == {400} and all("used up" in r.text for r in guessed)
            assert {r.status_code for r in refused} == {429}
            assert all(1 <= int(r.headers["Retry-After"]) <= 61 for r in refused)
            page = await servers.browser(link, account="ann")
            assert page.status_code == 200 and "Signed in" in page.text, page.text
            await eventually(lambda: server.available, 20, lambda: f"docs ready ({server.state}: {server.last_error})")
        finally:
            await gw.stop(grace_seconds=5)
