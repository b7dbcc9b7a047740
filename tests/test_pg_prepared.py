"""PostgreSQL prepares the statements the store runs often (server-side binding); a schema change by
another process (a newer instance migrating) never breaks a call that had its statement prepared."""

from __future__ import annotations

import psycopg

from state import SessionDB


def test_a_table_changing_shape_under_a_prepared_statement_is_planned_again(pg_url):
    db = SessionDB(pg_url)
    try:
        db.dead_letters.add(platform="telegram", event_id="e1", payload="{}", message=None, error="boom")
        for _ in range(8):  # past psycopg's threshold (5): the statement is prepared on the connection
            assert [row["event_id"] for row in db.dead_letters.list(status=None)] == ["e1"]
        with psycopg.connect(pg_url, autocommit=True) as other:  # another instance adds a column
            other.execute("ALTER TABLE dead_letters ADD COLUMN noted_by text")
        letters = db.dead_letters.list(status=None)
        assert [row["event_id"] for row in letters] == ["e1"]
        assert "noted_by" in letters[0]
    finally:
        db.close()
