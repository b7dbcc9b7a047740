"""Shared fixtures: keep this file small; add a fixture only when two test files need it."""

from __future__ import annotations

import pytest

from state import SessionDB


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private SWITCHBOARD_HOME (never the real ~/.switchboard)."""
    path = tmp_path / "home"
    monkeypatch.setenv("SWITCHBOARD_HOME", str(path))
    return path


@pytest.fixture
def db(home):
    """A SessionDB at $SWITCHBOARD_HOME/state.db, closed afterwards."""
    store = SessionDB()
    yield store
    store.close()


@pytest.fixture(scope="session")
def pg_cluster():
    """A throw-away PostgreSQL server for the whole test session (tests/pgserver.py).

    Skips, with the reason, where no PostgreSQL server can be started; nothing else skips.
    """
    from tests.pgserver import PgCluster, why_unavailable

    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = PgCluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster):
    """The URL of an empty PostgreSQL database of this test's own, dropped afterwards."""
    url = pg_cluster.fresh_database()
    yield url
    pg_cluster.drop_database(url)
