"""The official MCP conformance suite (@modelcontextprotocol/conformance) against our client's HTTP side:
each client scenario starts the suite's server, runs tests/conformance/client.py (the gateway's own
McpServer client) against it, and checks what the client did.

Installed by ``make mcp-conformance`` (``make test`` runs it): the suite and the Node 22 it needs (it
imports ``fs.globSync``, which Node 20 lacks), both from the npm registry, into ``.mcp-conformance/``.

The ``auth/*`` scenarios of the authorisation-code flow run too: the client signs in as the gateway
does (gateway.tools_mcp.oauth: discovery, PKCE, CIMD or registration, the callback), the browser
played by tests/conformance/client.py.  Not run: ``auth/client-credentials-jwt`` and
``auth/client-credentials-basic`` (an extension for machine clients with no person to sign in, which
the gateway does not offer).
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
    # OAuth: what each scenario checks beyond the flow every one of them checks (FLOW)
    "auth/metadata-default": {"client-registration", "prm-pathbased-requested"},
    "auth/metadata-var1": {"client-registration"},
    "auth/metadata-var2": {"client-registration"},
    "auth/metadata-var3": {"client-registration"},
    "auth/basic-cimd": {"cimd-client-id-used"},
    "auth/scope-from-www-authenticate": {"scope-from-www-authenticate"},
    "auth/scope-from-scopes-supported": {"scope-from-scopes-supported"},
    "auth/scope-omitted-when-undefined": {"scope-omitted-when-undefined"},
    "auth/scope-step-up": {"scope-step-up-initial", "scope-step-up-escalation"},
    "auth/scope-retry-limit": {"scope-retry-limit"},
    "auth/token-endpoint-auth-basic": {"resource-parameter-in-authorization", "resource-parameter-in-token"},
    "auth/token-endpoint-auth-post": {"resource-parameter-consistency"},
    "auth/token-endpoint-auth-none": {"resource-parameter-valid-uri"},
    "auth/pre-registration": {"pre-registration-auth"},
    "auth/2025-03-26-oauth-metadata-backcompat": {"authorization-server-metadata", "client-registration"},
    "auth/2025-03-26-oauth-endpoint-fallback": {"client-registration", "authorization-request", "token-request",
                                                "valid-bearer-token"},  # it checks no PKCE
    "auth/resource-mismatch": {"resource-mismatch-rejected"},
    "auth/offline-access-scope": {"sep-2207-offline-access-requested"},
    "auth/offline-access-not-supported": {"sep-2207-offline-access-not-requested"},
}
FLOW = {"authorization-request", "token-request", "pkce-code-challenge-sent", "pkce-s256-method-used",
        "pkce-verifier-matches-challenge"}  # every auth/* scenario that signs in checks these
# the client refuses the server's metadata before any sign-in; the fallback's server checks no PKCE
NO_SIGN_IN = {"auth/resource-mismatch", "auth/2025-03-26-oauth-endpoint-fallback"}


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
    wanted = SCENARIOS[scenario] | (FLOW if scenario.startswith("auth/") and scenario not in NO_SIGN_IN else set())
    assert wanted <= {c["id"] for c in checks if c["status"] == "SUCCESS"}, said[-3000:]
    assert process.returncode == 0, said[-3000:]
