"""The throw-away PostgreSQL cluster the store tests run against."""

from __future__ import annotations

import psycopg


def test_each_test_database_starts_empty_and_belongs_to_that_test_alone(pg_cluster, pg_url):
    other = pg_cluster.fresh_database()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE mine (x int)")
        with psycopg.connect(other) as conn:
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)
    finally:
        pg_cluster.drop_database(other)


def test_the_server_listens_on_loopback_and_asks_tcp_clients_for_a_password(pg_cluster):
    wrong = pg_cluster.url().replace(pg_cluster.password, "wrong")
    try:
        psycopg.connect(wrong).close()
    except psycopg.OperationalError as exc:
        assert "password authentication failed" in str(exc)
    else:
        raise AssertionError("a wrong password was accepted")
    with psycopg.connect(pg_cluster.url()) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
