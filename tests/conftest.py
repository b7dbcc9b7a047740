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
