PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps, so `make run` never stands for the test tools and `make test` never undoes the runtime:
# .runtime is the gateway alone (`pip install -e .`), .installed is that plus the test extra.
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed

.PHONY: run setup test test-fast check bench clean systemd-tools postgresql-server browser mail-servers mcp-legacy \
	mcp-conformance

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(RUNTIME): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(RUNTIME) $(STAMP)

# The config `make run` starts with: $SWITCHBOARD_CONFIG, else the home's config.yaml (what
# `switchboard setup` writes, in $SWITCHBOARD_HOME or ~/.switchboard), else the checkout's example.
RUN_CONFIG = $${SWITCHBOARD_CONFIG:-$$(h="$${SWITCHBOARD_HOME:-$$HOME/.switchboard}"; \
	if [ -f "$$h/config.yaml" ]; then echo "$$h/config.yaml"; else echo config.example.yaml; fi)}

# The runtime alone, plus the extras the config needs and lacks (a postgresql:// store, OTEL_* traces).
run: $(RUNTIME)
	@config="$(RUN_CONFIG)" && echo "make run: $(BIN)/switchboard run --config $$config" && \
		extras=$$($(BIN)/switchboard config extras --config "$$config") && \
		{ [ -z "$$extras" ] || $(BIN)/pip install --quiet -e ".[$$extras]"; } && \
		exec $(BIN)/switchboard run --config "$$config"

# A guided set-up (the model, the platforms, the owner): writes ~/.switchboard/config.yaml and switchboard.env.
setup: $(RUNTIME)
	$(BIN)/switchboard setup

# pytest-xdist workers (4: many tests wait on daemons and timers more than they compute);
# `make test WORKERS=auto` is one per core, WORKERS=0 runs in one process.
WORKERS ?= 4

# Everything: in-process tests, PostgreSQL, real daemons and kill tests, the sandbox, chromium.
test: check systemd-tools postgresql-server browser mail-servers mcp-legacy mcp-conformance
	$(BIN)/python -m pytest -q -n $(WORKERS)

# The fast loop: what runs in-process (tests/marks.py marks the rest slow from what it uses).  Its tests
# wait on timers and fakes more than they compute, so twice the workers: 3 min 41 s at 4, under 3 min at 8.
FAST_WORKERS ?= 8
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(FAST_WORKERS)

# The linter and the type checker (settings in pyproject.toml); `make test` runs them first.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The unit-file tests run systemd-analyze and libseccomp; install them when we can (root, Debian).
systemd-tools:
	@command -v systemd-analyze >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq systemd libseccomp2 >/dev/null) || \
		echo "note: could not install systemd-analyze; the unit tests say they skipped and why"

# The PostgreSQL store tests start a throw-away cluster with initdb and pg_ctl; install the
# server when we can (root, Debian).  Elsewhere those tests say they skipped and why.
postgresql-server:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || \
		[ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) || \
		echo "note: could not install PostgreSQL; the PostgreSQL tests say they skipped and why"

# The dashboard's browser tests drive Debian's chromium through playwright (never a downloaded browser);
# install it when we can (root, Debian).
browser:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "note: could not install chromium; the browser tests say they skipped and why"

# The email tests start Dovecot (IMAP) from a config file they write; install it when we can (root, Debian).
# Elsewhere those tests say they skipped and why.  (SMTP is aiosmtpd, from the test extra.)
mail-servers:
	@command -v dovecot >/dev/null 2>&1 || [ -x /usr/sbin/dovecot ] || [ "$$(id -u)" != 0 ] || \
		! command -v apt-get >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq dovecot-imapd >/dev/null) || \
		echo "note: could not install Dovecot; the email tests against a real IMAP server say they skipped and why"

# A server on the legacy MCP revision (the SDK 1.x, in its own environment: ours has 2.x), which the
# tests start to prove the gateway still talks to servers not yet moved (tests/mcp_servers/legacy_server.py).
MCP_LEGACY := .venv-mcp1
$(MCP_LEGACY)/.installed:
	$(PY) -m venv $(MCP_LEGACY)
	$(MCP_LEGACY)/bin/pip install --quiet 'mcp>=1.20,<2'
	touch $@
mcp-legacy: $(MCP_LEGACY)/.installed

# The official MCP conformance suite (npm) with the Node 22 it needs (the npm package `node`, whose
# binary comes from the registry too), installed into a folder of the checkout; tests/test_mcp_conformance.py
# runs its client scenarios against our client.  Nothing is downloaded when the tests run.
MCP_CONFORMANCE := .mcp-conformance
$(MCP_CONFORMANCE)/.installed:
	@command -v npm >/dev/null 2>&1 || { echo "note: no npm; the conformance tests say they skipped and why"; exit 0; }; \
		mkdir -p $(MCP_CONFORMANCE) && cd $(MCP_CONFORMANCE) && \
		npm install --silent --no-audit --no-fund --no-save @modelcontextprotocol/conformance@0.1.16 node@22.23.3 && \
		touch .installed
mcp-conformance: $(MCP_CONFORMANCE)/.installed

bench: $(STAMP)
	for f in bench/*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) $(MCP_LEGACY) $(MCP_CONFORMANCE) *.egg-info .mypy_cache .ruff_cache
