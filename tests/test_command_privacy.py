"""No slash command shows one user anything of another's: ids, titles, text, or whether they exist.

Every registered command (the daemon's whole set, /search and /facts included) is sent by
Mallory with arguments naming Alice's sessions, through the real gateway's local API.
"""

from __future__ import annotations

import pytest

from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, running_gateway

ALICE_TEXT = "the vault code is 4512 and the spare key is under the blue pot"
ALICE_TITLE = "Alice vault plans"


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def _alice(gw, api) -> list[str]:
    """Alice's two sessions (the first titled); returns their ids."""
    await api.say("alice", ALICE_TEXT)
    await api.say("alice", f"/title {ALICE_TITLE}")
    first = await gw.db.routes.get("agent:main:api:dm:alice")
    await api.say("alice", "/new")
    await api.say("alice", "the second plan: " + ALICE_TEXT)
    second = await gw.db.routes.get("agent:main:api:dm:alice")
    return [first, second]


async def test_no_command_shows_mallory_anything_of_alices(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        alice_ids = await _alice(gw, api)
        secrets = [*alice_ids, ALICE_TITLE, "vault code", "blue pot"]
        arguments = ["", alice_ids[0], alice_ids[1][:-3], alice_ids[0][:4], ALICE_TITLE, "vault code 4512"]
        names = [name for name, _ in gw.commands.menu()]
        assert {"help", "new", "reset", "title", "status", "resume", "sessions", "stop", "compress", "search",
                "facts"} <= set(names)
        leaks = []
        for n, (name, arg) in enumerate((name, arg) for name in names for arg in arguments):
            mallory = f"mallory{n}"  # each probe from a fresh user with two sessions of her own
            await api.say(mallory, "hello, I am Mallory")
            await api.say(mallory, "/new")
            await api.say(mallory, "hello again")
            text = f"/{name} {arg}".strip()
            reply = await api.say(mallory, text)
            leaks += [(text, secret, reply) for secret in secrets if secret in reply and secret not in text]
        await api.close()
    assert leaks == []


async def test_not_found_is_one_wording_whether_or_not_the_session_exists(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        alice_ids = await _alice(gw, api)
        await api.say("mallory", "hello")
        replies = {ref: await api.say("mallory", f"/resume {ref}")
                   for ref in (alice_ids[0], "20991231_000000_deadbeef", ALICE_TITLE, "No such title")}
        mine = await api.say("mallory", f"/resume {alice_ids[0][:4]}")  # the "/resume 2026": hers alone match
        await api.close()
    assert {reply.replace(ref, "REF") for ref, reply in replies.items()} == {
        'No session of yours matches "REF". /resume alone lists yours.'}
    assert mine == "That is the current session."


async def test_resume_finds_a_users_own_session_by_prefix_and_title(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        alice_ids = await _alice(gw, api)
        assert (await api.say("alice", f"/resume {ALICE_TITLE}")).startswith(f'Resumed "{ALICE_TITLE}" ({alice_ids[0]},')
        assert (await api.say("alice", f"/resume {alice_ids[1][:-2]}")).startswith("Resumed “the second plan")
        both = await api.say("alice", f"/resume {alice_ids[0][:4]}")
        await api.close()
    assert both.startswith(f'More than one of your sessions matches "{alice_ids[0][:4]}": ')
    assert all(sid in both for sid in alice_ids)
