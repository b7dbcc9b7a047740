"""PostgreSQL's placeholder translation: what it rewrites it rewrites right, and what it cannot read
safely (comments, dollar-quoted bodies, E'' strings, jsonb's ``?`` operator) it refuses, never guesses."""

import pytest
from hypothesis import given, settings, strategies as st

from state._pg import UnsafeSql, translate

# Plain SQL text that cannot start or end a construct of its own (no quote, comment, dollar or '?').
_TEXT = st.text(alphabet="abcdxyz0123456789 ,()=<>+*%_\n", max_size=12).map(lambda t: f" {t} ")
_INSIDE = st.text(alphabet="ab ?%-$:E\\/*\"", max_size=10)  # what a quoted string may hold: any of the tricky ones

SAFE_PIECES = st.one_of(
    _TEXT.map(lambda t: (t, t.replace("%", "%%"))),
    st.just((" = ?", " = %s")),
    st.just((" LIMIT ?", " LIMIT %s")),
    st.just((" IN (?, ?)", " IN (%s, %s)")),
    _INSIDE.map(lambda t: t.replace("'", "")).map(lambda t: (f" '{t}'", f" '{t.replace('%', '%%')}'")),
    _INSIDE.map(lambda t: t.replace('"', "")).map(lambda t: (f' "{t}"', f' "{t.replace("%", "%%")}"')),
    st.just((" 'it''s?'", " 'it''s?'")),
)
REFUSED = st.sampled_from([
    " -- who? ",
    " /* a ? */ ",
    " $$ SELECT ? $$ ",
    " $body$ ? $body$ ",
    " E'it\\'s ?' ",
    " data ? 'key' ",
    " data ?| ? ",
    " (a) ? 'k' ",
    " 'x' ? 'k' ",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(SAFE_PIECES, max_size=12))
def test_placeholders_outside_quotes_become_psycopg_ones_and_nothing_else_changes(pieces):
    sql = "SELECT 1" + "".join(text for text, _ in pieces)
    assert translate(sql) == "SELECT 1" + "".join(expected for _, expected in pieces)


@pytest.mark.slow  # 300 examples (about 9 s): make test runs it, make test-fast leaves it out
@settings(max_examples=300, deadline=None)
@given(st.lists(SAFE_PIECES, max_size=6), REFUSED, st.lists(SAFE_PIECES, max_size=6))
def test_what_the_scanner_cannot_read_safely_is_refused(before, refused, after):
    prefix = "SELECT 1" + "".join(t for t, _ in before)
    with pytest.raises(UnsafeSql) as caught:
        translate(prefix + refused + "".join(t for t, _ in after))
    assert len(prefix) < caught.value.at < len(prefix) + len(refused)  # refused where the construct is


def test_the_refusals_say_what_and_what_to_do():
    with pytest.raises(UnsafeSql, match=r"a '--' comment \(take it out of the SQL\) at character 13"):
        translate("SELECT ? + 1 -- the answer?")
    with pytest.raises(UnsafeSql, match=r"jsonb_exists\(\)"):
        translate("SELECT id FROM t WHERE tags ? 'urgent' AND id > ?")
    with pytest.raises(UnsafeSql, match="dollar-quoted body"):
        translate("DO $$ BEGIN PERFORM ?; END $$")
    with pytest.raises(UnsafeSql, match=r"E'...' string"):
        translate("SELECT E'\\x3f', ?")


def test_what_only_looks_like_a_refused_construct_is_translated():
    # an 'e' ending a name is no E'' string, a '$' inside a name no dollar quote, '-' and '/' no comment
    assert translate("SELECT * FROM t WHERE name = ? AND type='x' AND a$b = ?") == \
        "SELECT * FROM t WHERE name = %s AND type='x' AND a$b = %s"
    assert translate("SELECT a - ?, b / ? FROM t WHERE c NOT IN (?) OR d IS ?") == \
        "SELECT a - %s, b / %s FROM t WHERE c NOT IN (%s) OR d IS %s"
