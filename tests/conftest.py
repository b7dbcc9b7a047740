"""Shared fixtures: keep this file small; add a fixture only when two test files need it."""

from __future__ import annotations

import pytest

from state import SessionDB
from tests.marks import mark_from_what_they_use


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
    from tests.pgserver import started_or_skip

    yield from started_or_skip()


@pytest.fixture
def pg_url(pg_cluster):
    """The URL of an empty PostgreSQL database of this test's own, dropped afterwards."""
    url = pg_cluster.fresh_database()
    yield url
    pg_cluster.drop_database(url)


@pytest.fixture(scope="session")
def pg_template(pg_cluster):
    """The name of a database migrated to the current schema once, copied for each ``store`` test."""
    url = pg_cluster.fresh_database()
    SessionDB(url).close()
    return url.rsplit("/", 1)[1]


def pytest_generate_tests(metafunc):
    """A test using ``store`` (or ``store_target``) runs on SQLite and on PostgreSQL, unless marked
    ``@pytest.mark.sqlite_only("why")`` (WAL, file locks, PRAGMAs, FTS5: what only SQLite has)."""
    if "backend" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only")
        metafunc.parametrize("backend", ["sqlite"] if only else ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def backend(request):
    """``"sqlite"`` or ``"postgresql"`` (see pytest_generate_tests)."""
    return request.param


@pytest.fixture
def store_target(request, backend, home):
    """What to open a SessionDB on for this backend: $SWITCHBOARD_HOME/state.db, or the URL of a
    PostgreSQL database of this test's own (migrated already; dropped afterwards)."""
    if backend == "sqlite":
        yield home / "state.db"
        return
    cluster = request.getfixturevalue("pg_cluster")
    url = cluster.fresh_database(template=request.getfixturevalue("pg_template"))
    yield url
    cluster.drop_database(url)


@pytest.fixture
def store(store_target):
    """A SessionDB on each backend (see pytest_generate_tests), closed afterwards."""
    db = SessionDB(store_target)
    yield db
    db.close()


def pytest_collection_modifyitems(config, items):
    """Tests on PostgreSQL, tests that start processes and browser tests are ``slow``, marked from
    what they use (tests/marks.py); `make test-fast` runs ``-m "not slow"``."""
    mark_from_what_they_use(items)
