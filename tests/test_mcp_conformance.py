"""The official MCP conformance suite (@modelcontextprotocol/conformance) against our client's HTTP side:
each client scenario starts the suite's server, runs tests/conformance/client.py (the gateway's own
McpServer client) against it, and checks what the client did.

Installed by ``make mcp-conformance`` (``make test`` runs it): the suite and the Node 22 it needs (it
imports ``fs.globSync``, which Node 20 lacks), both from the npm registry, into ``.mcp-conformance/``.

Not run: the ``auth/*`` scenarios, which need OAuth (authorisation-server discovery, PKCE, client
registration; issue #41 item 2, not built yet): against them the client gets a 401 and stops.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / ".mcp-conformance" / "node_modules"
NODE = SUITE / ".bin" / "node"
CLI = SUITE / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

pytestmark = [pytest.mark.processes, pytest.mark.slow,
              pytest.mark.skipif(not (NODE.exists() and CLI.exists()),
                                 reason=f"the conformance suite is not installed at {SUITE} (run `make mcp-conformance`)")]

SCENARIOS = {  # scenario: the checks it must report as passed
    "initialize": {"mcp-client-initialization"},
    "tools_call": {"tool-add-numbers"},
    "elicitation-sep1034-client-defaults": {
        "client-elicitation-sep1034-string-default", "client-elicitation-sep1034-integer-default",
        "client-elicitation-sep1034-number-default", "client-elicitation-sep1034-enum-default",
        "client-elicitation-sep1034-boolean-default"},
    "sse-retry": {"client-sse-graceful-reconnect", "client-sse-retry-timing", "client-sse-last-event-id"},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_the_conformance_scenario_passes(scenario, tmp_path):
    command = f"{sys.executable} -m tests.conformance.client"
    process = await asyncio.create_subprocess_exec(
        str(NODE), str(CLI), "client", "--command", command, "--scenario", scenario, "--timeout", "60000",
        "-o", str(tmp_path), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    said = output.decode(errors="replace")
    [checks_file] = tmp_path.rglob("checks.json")
    checks = json.loads(checks_file.read_text())
    failed = [c for c in checks if c["status"] in ("FAILURE", "WARNING")]
    assert not failed, (failed, said[-3000:])
    assert SCENARIOS[scenario] <= {c["id"] for c in checks if c["status"] == "SUCCESS"}, said[-3000:]
    assert process.returncode == 0, said[-3000:]
