"""tools.mcp_servers: one transport per server, names that keep <server>__<tool> unambiguous, secrets hidden."""

from __future__ import annotations

import pytest

from gateway.config import config_from_dict
from gateway.errors import ConfigError


def _tools(servers: dict, env: dict | None = None):
    return config_from_dict({"home": "/tmp/sb-mcp-config", "tools": {"mcp_servers": servers}}, env=env or {})


def test_a_stdio_and_an_http_server_with_their_defaults():
    cfg = _tools({"files": {"command": "python3", "args": ["-m", "srv"], "env": {"TOKEN": "tok-123456789"},
                            "allow": ["files__read_*"]},
                  "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer abcdefgh12"}}})
    files, web = cfg.tools.mcp_servers["files"], cfg.tools.mcp_servers["web"]
    assert (files.command, files.args, dict(files.env), files.allow) == ("python3", ("-m", "srv"),
                                                                         {"TOKEN": "tok-123456789"}, ("files__read_*",))
    assert (web.url, web.allow, web.timeout_seconds, web.max_output_bytes, web.max_concurrent_calls) == (
        "http://127.0.0.1:9/mcp", (), 60.0, 32768, 4)
    assert sorted(cfg.secrets()) == ["Bearer abcdefgh12", "tok-123456789"]
    shown = cfg.redacted()["tools"]["mcp_servers"]
    assert shown["files"]["env"] == {"TOKEN": "***"} and shown["web"]["headers"] == {"Authorization": "***"}
    assert "tok-123456789" not in repr(cfg) and "abcdefgh12" not in repr(cfg)


@pytest.mark.parametrize("servers, says", [
    ({"a__b": {"command": "x"}}, 'MCP server name "a__b" must be'),
    ({"a": {}}, "set either command (a stdio server) or url"),
    ({"a": {"command": "x", "url": "http://h/mcp"}}, "set either command (a stdio server) or url"),
    ({"a": {"url": "http://h/mcp", "env": {"A": "1"}}}, "args, cwd and env are for stdio servers"),
    ({"a": {"command": "x", "env": {"1A": "x"}}}, "'1A' is not an environment variable name"),
    ({"a": {"command": "x", "timeout_seconds": 0}}, "tools.mcp_servers.a.timeout_seconds"),
])
def test_mistakes_say_what_to_fix(servers, says):
    with pytest.raises(ConfigError) as err:
        _tools(servers)
    assert says in str(err.value)
