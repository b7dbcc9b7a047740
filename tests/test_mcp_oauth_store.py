"""The MCP sign-ins' store (``db.mcp_auth``, schema v37) on both engines, and the key that seals them."""

from __future__ import annotations

import os
import stat

import pytest

from gateway.tools_mcp.vault import KEY_FILE, Vault, VaultError

NOW = 1_800_000_000.0


def _flow(**over) -> dict:
    return {"state_hash": "aa" * 32, "server": "docs", "principal": "telegram:1", "platform": "telegram",
            "chat_id": "1", "thread_id": None, "data": "sealed", "created_at": NOW, "expires_at": NOW + 900, **over}


def test_tokens_are_kept_per_server_principal_and_kind_and_dropped_alone(store):
    store.mcp_auth.put("docs", "telegram:1", "tokens", "t1", expires_at=NOW + 60, now=NOW)
    store.mcp_auth.put("docs", "telegram:2", "tokens", "t2", now=NOW + 1)
    store.mcp_auth.put("docs", "", "client", "c", now=NOW)
    store.mcp_auth.put("docs", "telegram:1", "tokens", "t1-refreshed", now=NOW + 2)  # replaced, not added
    assert store.mcp_auth.get("docs", "telegram:1", "tokens") == "t1-refreshed"
    assert store.mcp_auth.principals("docs") == ["telegram:1", "telegram:2"]  # the newest first
    assert store.mcp_auth.get("other", "telegram:1", "tokens") is None
    assert store.mcp_auth.drop("docs", "telegram:2") == 1
    assert store.mcp_auth.principals("docs") == ["telegram:1"]
    assert store.mcp_auth.get("docs", "", "client") == "c"  # a sign-out leaves the registration
    assert store.mcp_auth.drop("docs", None) == 1 and store.mcp_auth.principals("docs") == []
    with pytest.raises(ValueError, match="kind must be one of"):
        store.mcp_auth.put("docs", "x", "secrets", "s", now=NOW)


def test_a_flow_is_taken_once_and_never_after_it_ran_out(store):
    store.mcp_auth.add_flow(_flow())
    store.mcp_auth.add_flow(_flow(state_hash="bb" * 32, expires_at=NOW + 10))
    assert store.mcp_auth.take_flow("aa" * 32, now=NOW + 1)["principal"] == "telegram:1"
    assert store.mcp_auth.take_flow("aa" * 32, now=NOW + 1) is None  # a replayed callback finds nothing
    assert store.mcp_auth.take_flow("bb" * 32, now=NOW + 11) is None  # ran out (and is gone)
    assert store.mcp_auth.take_flow("bb" * 32, now=NOW) is None
    store.mcp_auth.add_flow(_flow(state_hash="cc" * 32, created_at=NOW + 1000, expires_at=NOW + 1900))
    # adding a flow clears those that ran out: nothing stale stays in the store
    assert store.mcp_auth.take_flow("aa" * 32, now=NOW) is None


def test_the_key_is_made_once_readable_by_its_owner_alone_and_refuses_what_it_did_not_seal(tmp_path):
    vault = Vault.open(tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    sealed = vault.seal({"access_token": "at-secret-1234"})
    assert "at-secret-1234" not in sealed and "at-secret" not in repr(vault)
    assert Vault.open(tmp_path).unseal(sealed) == {"access_token": "at-secret-1234"}  # the same key again
    os.chmod(path, 0o644)
    Vault.open(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # closed again
    tampered = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    with pytest.raises(VaultError, match="could not be opened"):
        vault.unseal(tampered)
    other = tmp_path / "other"
    with pytest.raises(VaultError):
        Vault.open(other).unseal(sealed)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / KEY_FILE).write_text("not a key")
    with pytest.raises(VaultError, match="does not hold a key"):
        Vault.open(tmp_path / "bad")


async def test_two_instances_refreshing_one_rotating_token_keep_the_sign_in(tmp_path):
    """Two gateways on one store (a cluster, or the daemon and the CLI): the first refresh rotates the
    refresh token, so the second one's is refused; it takes the rotated one from the store instead of
    signing the person out."""
    import time
    from urllib.parse import parse_qs, urlparse

    import httpx

    import state
    from gateway.tools_mcp.oauth import OAuthSettings, ServerAuth, state_hash
    from tests.mcp_servers.oauth_server import oauth_servers

    now = [time.time()]
    db = state.AsyncSessionDB(state.SessionDB(tmp_path / "state.db"))
    settings = OAuthSettings(redirect_uri="http://127.0.0.1:9/mcp/oauth/callback")
    try:
        async with oauth_servers(access_seconds=3600) as servers:
            first, second = (ServerAuth("docs", servers.mcp_url, "per_user", (), settings, db, Vault.open(tmp_path),
                                        clock=lambda: now[0]) for _ in range(2))
            link = await first.begin("telegram:1")
            async with httpx.AsyncClient() as http:
                back = (await http.get(link, headers={"X-Signed-In-As": "ann"})).headers["location"]
            query = {k: v[0] for k, v in parse_qs(urlparse(back).query).items()}
            await first.complete(await db.mcp_auth.take_flow(state_hash(query["state"]), now=now[0]),
                                 query["code"], None)
            began = now[0]
            now[0] = began + 3470  # 130 s left: not refreshed yet; the second keeps what it read (30 s)
            stale = await second.token("telegram:1")
            now[0] = began + 3490  # 110 s left: the first refreshes (and the server rotates the refresh token)
            fresh = await first.token("telegram:1")
            assert servers.provider.refreshed == 1 and fresh not in (None, stale)
            now[0] = began + 3495  # the second, from what it keeps, refreshes with the rotated-away token
            taken = await second.token("telegram:1")  # refused: the store's newer one is taken
            assert taken == fresh and servers.provider.subjects()[taken] == "ann"
            assert servers.provider.refreshed == 1
            assert await db.mcp_auth.get("docs", "telegram:1", "tokens") is not None  # still signed in
    finally:
        await db.close()
