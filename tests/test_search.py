"""Full-text search (state.search, SQLite's index state.search.fts5): dispatch, sanitising, results, index sync."""

from __future__ import annotations

import json
import sqlite3

import pytest

from state import SessionDB, search
from state.search import fts5

SESSIONS = """CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, user_name TEXT,
    session_key TEXT, model TEXT, model_config TEXT, system_prompt TEXT, parent_session_id TEXT,
    started_at REAL NOT NULL, ended_at REAL, end_reason TEXT, message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0, title TEXT)"""
MESSAGES = """CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL, content TEXT, tool_call_id TEXT,
    tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT,
    reasoning TEXT, reasoning_details TEXT, codex_reasoning_items TEXT, platform_message_id TEXT, pos INTEGER)"""


class Store:
    """A real SessionDB on either backend, plus, on SQLite, a plain connection to the same file for
    FTS5's own checks."""

    def __init__(self, target):
        self.target = target
        self.db = SessionDB(target)
        self.conn = None
        if self.db.backend == "sqlite":
            self.conn = sqlite3.connect(target, isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout = 10000")
        self.clock = 1000.0

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.db.close()

    def execute(self, sql, params=()):
        """An edit made outside the store's methods (another tool writing the database), on either backend."""
        return self.db._engine.write(lambda conn: conn.execute(sql, params).rowcount)

    def flush(self):
        """SQLite: index the messages waiting for their batch; PostgreSQL indexes each row as it is written."""
        if self.conn is not None:
            fts5.flush(self.conn)

    def session(self, sid, source="cli", model="m1"):
        self.db.sessions.create(sid, source, model=model)
        return sid

    def add(self, sid, role, content=None, tool_calls=None, tool_name=None):
        self.clock += 1
        return self.db.messages.append(sid, role, content, tool_calls=tool_calls, tool_name=tool_name,
                                      timestamp=self.clock)

    def search(self, query, **kw):
        return self.db.search.messages(query, **kw)

    def ids(self, query, **kw):
        return [hit["id"] for hit in self.search(query, **kw)]

    def assert_in_sync(self):
        """Index the pending tail, then let FTS5 compare both indexes with the text they index
        (PostgreSQL keeps its GIN indexes in the writing transaction: nothing to compare)."""
        if self.conn is None:
            return
        fts5.flush(self.conn)
        for table in ("messages_fts", "messages_fts_trigram"):
            self.conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")


@pytest.fixture
def store(store_target):
    """On SQLite and on PostgreSQL (tests/conftest.py: ``store_target``)."""
    s = Store(store_target)
    yield s
    s.close()


def call(name, **arguments):
    return [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]


# --- sanitize_query ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("docker deployment", '"docker" "deployment"'),
        ('"exact phrase" here', '"exact phrase" "here"'),
        ('say "unbalanced', '"say" "unbalanced"'),
        ("chat-send", '"chat-send"'),
        ("v1.2.3 config.yaml", '"v1.2.3" "config.yaml"'),
        ("deploy*", '"deploy"*'),
        ('"foo bar"*', '"foo bar"*'),
        ("***", ""),
        ("*deploy", '"deploy"'),
        ("python NOT java", '"python" NOT "java"'),
        ("docker OR kubernetes", '"docker" OR "kubernetes"'),
        ("hello AND", '"hello"'),
        ("AND OR NOT", ""),
        ("NOT hello", '"hello"'),
        ("a AND OR b", '"a" OR "b"'),
        ("docker and kubernetes", '"docker" "and" "kubernetes"'),
        ("NEAR(one two, 5)", '"one" "two" "5"'),
        ("^start col:value (group)", '"start" "col" "value" "group"'),
        ("C++ {x}", '"C" "x"'),
        ("!!! ... ???", ""),
        ('he said ""', '"he" "said"'),
        ("tab\there\x00nul", '"tab" "here" "nul"'),
        ("", ""),
    ],
)
def test_sanitize_query(raw, expected):
    assert search.sanitize_query(raw) == expected


def test_sanitize_keeps_at_most_max_terms():
    assert search.sanitize_query(" ".join(f"w{i}" for i in range(100))).count('"') == 2 * search.MAX_TERMS


# --- what a search returns -----------------------------------------------------


def test_result_shape_with_context(store):
    s = store.session("s1", source="telegram", model="gpt-x")
    store.add(s, "user", "how do I restart the docker daemon?")
    hit_id = store.add(s, "assistant", "Run systemctl restart docker and check the logs.")
    store.add(s, "user", "x" * 300)
    assert store.search("systemctl") == [
        {
            "id": hit_id,
            "session_id": "s1",
            "role": "assistant",
            "timestamp": 1002.0,
            "snippet": "Run >>>systemctl<<< restart docker and check the logs.",
            "context": [
                {"id": hit_id - 1, "role": "user", "content": "how do I restart the docker daemon?"},
                {"id": hit_id + 1, "role": "user", "content": "x" * 200},
            ],
            "source": "telegram",
            "model": "gpt-x",
            "session_started": store.db.sessions.get("s1").started_at,
        }
    ]


def test_context_stays_inside_the_session(store):
    a, b = store.session("a"), store.session("b")
    store.add(a, "user", "alpha one")
    only = store.add(b, "user", "lonely needle")
    store.add(a, "user", "alpha two")
    assert store.search("needle")[0]["context"] == []
    assert only


def test_words_in_tool_calls_and_tool_name_are_found_but_json_keys_are_not(store):
    s = store.session("s1")
    call_id = store.add(s, "assistant", None, tool_calls=call("web_search", query="zebrafish habitat"))
    result_id = store.add(s, "tool", "3 results", tool_name="web_search")
    assert store.ids("zebrafish") == [call_id]
    assert sorted(store.ids("web_search")) == [call_id, result_id]
    assert store.ids("arguments") == []
    assert store.ids("function") == []
    assert ">>>zebrafish<<<" in store.search("zebrafish")[0]["snippet"]


def test_malformed_tool_calls_do_not_break_writes_or_search(store):
    s = store.session("s1")
    store.add(s, "assistant", None, tool_calls="not json at all {")
    store.add(s, "assistant", None, tool_calls=json.dumps(["plain", 3, {"function": {"name": "calc",
                                                                                     "arguments": {"x": "ocelot"}}}]))
    assert len(store.ids("json")) == 1
    assert len(store.ids("ocelot")) == 1
    store.assert_in_sync()


def test_hyphenated_and_dotted_terms(store):
    s = store.session("s1")
    hyph = store.add(s, "user", "the chat-send tool failed")
    dot = store.add(s, "user", "upgrade to v1.2.3 today")
    store.add(s, "user", "chat about how to send it")
    assert store.ids("chat-send") == [hyph]
    assert store.ids("v1.2.3") == [dot]


def test_phrase_prefix_and_boolean_queries(store):
    s = store.session("s1")
    refused = store.add(s, "tool", "error: connection refused by host")
    reset = store.add(s, "tool", "connection reset, request refused")
    deployed = store.add(s, "user", "we deployed yesterday")
    assert store.ids('"connection refused"') == [refused]
    assert store.ids("deploy*") == [deployed]
    assert sorted(store.ids("connection refused")) == [refused, reset]
    assert store.ids("connection NOT reset") == [refused]
    assert sorted(store.ids("yesterday OR host")) == [refused, deployed]


def test_cjk_long_query_found_inside_a_sentence(store):
    s = store.session("s1")
    hit = store.add(s, "user", "我们昨天讨论了记忆断裂的问题，需要修复")
    store.add(s, "user", "记忆很好，没有断裂")
    assert store.ids("记忆断裂") == [hit]
    assert store.search("记忆断裂")[0]["snippet"] == "我们昨天讨论了>>>记忆断裂<<<的问题，需要修复"


def test_cjk_two_and_one_character_queries(store):
    s = store.session("s1")
    first = store.add(s, "user", "数据库断裂了")
    second = store.add(s, "assistant", "请检查断裂的原因")
    store.add(s, "user", "nothing chinese here")
    assert store.ids("断裂") == [second, first]  # LIKE path: newest first
    assert store.search("断裂")[0]["snippet"] == "请检查>>>断裂<<<的原因"
    assert store.ids("库") == [first]


def test_cjk_in_tool_call_arguments_escaped_as_ascii_json(store):
    s = store.session("s1")
    hit = store.add(s, "assistant", None, tool_calls=json.dumps(call("search", q="查询记忆断裂日志")))
    assert "\\u" in store.db.messages.get(s)[0].tool_calls[0]["function"]["arguments"]
    assert store.ids("记忆断裂") == [hit]
    assert store.ids("日志") == [hit]


def test_mixed_cjk_queries_need_every_term(store):
    s = store.session("s1")
    both = store.add(s, "user", "AI 模型的记忆断裂")
    store.add(s, "user", "模型的记忆断裂")
    tested = store.add(s, "user", "记忆断裂测试 AI")
    assert sorted(store.ids("记忆断裂 AI")) == [both, tested]
    assert store.ids("记忆断裂 AI NOT 测试") == [both]
    assert store.ids("记忆断裂 NOT 测试 NOT 模型") == []


def test_cjk_is_case_insensitive_for_latin_terms(store):
    s = store.session("s1")
    hit = store.add(s, "user", "Docker 容器启动失败")
    assert store.ids("docker 容器启动") == [hit]
    assert store.ids("DOCKER") == [hit]


def test_a_cjk_term_holding_latin_letters_matches_them_in_any_case(store):
    s = store.session("s1")
    hit = store.add(s, "user", "用Docker容器部署")
    store.add(s, "user", "用Podman容器部署")
    assert store.ids("docker容器") == [hit]
    assert store.ids("DOCKER容器部署") == [hit]
    assert store.ids("R容") == [hit]  # one or two CJK characters: the substring scan folds case too


def test_filters(store):
    cli, tg = store.session("c", source="cli"), store.session("t", source="telegram")
    dc = store.session("d", source="discord")
    u_cli = store.add(cli, "user", "shared word")
    a_tg = store.add(tg, "assistant", "shared word")
    u_dc = store.add(dc, "user", "shared word")
    assert store.ids("shared", source_filter=["cli"]) == [u_cli]
    assert store.ids("shared", source_filter="telegram") == [a_tg]
    assert sorted(store.ids("shared", exclude_sources=["telegram", "discord"])) == [u_cli]
    assert sorted(store.ids("shared", role_filter=["user"])) == [u_cli, u_dc]
    assert store.ids("shared", role_filter=["user"], exclude_sources=["cli"]) == [u_dc]
    # the CJK paths honour the filters too
    zh_cli = store.add(cli, "user", "记忆断裂")
    store.add(tg, "user", "记忆断裂")
    assert store.ids("记忆断裂", source_filter=["cli"]) == [zh_cli]
    assert store.ids("断裂", source_filter=["cli"]) == [zh_cli]


def test_limit(store):
    s = store.session("s1")
    for i in range(30):
        store.add(s, "user", f"repeat {i}")
    assert len(store.search("repeat")) == 20
    assert len(store.search("repeat", limit=5)) == 5
    assert store.search("repeat", limit=0) == []
    assert len(store.search("断", limit=3)) == 0


# --- ranking -----------------------------------------------------------------


def test_best_match_first_then_newest(store):
    s = store.session("s1")
    weak = store.add(s, "user", "the kernel panicked after a long and winding upgrade of many packages")
    strong = store.add(s, "user", "kernel kernel kernel")
    tie_old = store.add(s, "user", "kernel bug")
    tie_new = store.add(s, "user", "kernel bug")
    assert store.ids("kernel") == [strong, tie_new, tie_old, weak]


def test_ranking_only_looks_at_the_most_recent_window(store, monkeypatch):
    monkeypatch.setattr(search, "RANK_WINDOW", 3)
    s = store.session("s1")
    best_but_old = store.add(s, "user", "orca orca orca")
    recent = [store.add(s, "user", f"an orca was seen near the pier number {i}") for i in range(3)]
    got = store.ids("orca", limit=3)
    assert best_but_old not in got
    assert sorted(got) == recent
    monkeypatch.setattr(search, "RANK_WINDOW", 4)
    assert store.ids("orca", limit=3)[0] == best_but_old


# --- the index stays in sync --------------------------------------------------


def test_update_and_delete_keep_both_indexes_in_sync(store):
    s = store.session("s1")
    mid = store.add(s, "user", "original words 原来的内容")
    store.execute("UPDATE messages SET content = $1 WHERE id = $2", ("replacement 新的内容文字", mid))
    assert store.ids("original") == []
    assert store.ids("原来的") == []
    assert store.ids("replacement") == [mid]
    assert store.ids("新的内容") == [mid]
    # an English message that gains CJK moves into the trigram index, and back out
    store.execute("UPDATE messages SET content = 'plain english' WHERE id = $1", (mid,))
    assert store.ids("新的内容") == []
    store.assert_in_sync()
    store.execute("DELETE FROM messages WHERE id = $1", (mid,))
    assert store.ids("plain") == []
    store.assert_in_sync()


@pytest.mark.sqlite_only("FTS5's trigram index and its batches")
def test_only_cjk_messages_enter_the_trigram_index(store):
    s = store.session("s1")
    store.add(s, "user", "english only")
    zh = store.add(s, "user", "中文内容")
    store.add(s, "assistant", None)
    assert fts5.flush(store.conn) == 3
    assert store.conn.execute("SELECT id FROM messages_fts_trigram_docsize").fetchall() == [(zh,)]
    assert store.conn.execute("SELECT count(*) FROM messages_fts_docsize").fetchone() == (2,)


@pytest.mark.sqlite_only("FTS5's rebuild of its own tables")
def test_rebuild_restores_a_damaged_index(store):
    s = store.session("s1")
    keep = store.add(s, "user", "persistent memory 持久的记忆")
    fts5.flush(store.conn)
    store.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('delete-all')")
    store.conn.execute("INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES ('delete-all')")
    assert store.ids("persistent") == []
    fts5.rebuild(store.conn)
    assert store.ids("persistent") == [keep]
    assert store.ids("持久的记忆") == [keep]
    store.assert_in_sync()


def test_install_is_idempotent_and_replaces_the_seed_index(tmp_path):
    conn = sqlite3.connect(tmp_path / "seed.db", isolation_level=None)
    conn.execute(SESSIONS)
    conn.execute(MESSAGES)
    # the seed's single external-content table and its triggers
    conn.execute("CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id)")
    conn.execute("""CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END""")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)")
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'old 旧的消息内容', 1)")
    conn.execute("BEGIN IMMEDIATE")
    fts5.install(conn)
    conn.execute("COMMIT")
    assert fts5.installed_version(conn) == fts5.INDEX_VERSION
    assert [h["id"] for h in search.search_messages(conn, "old")] == [1]
    assert [h["id"] for h in search.search_messages(conn, "旧的消息")] == [1]
    before = conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
    fts5.install(conn)
    assert conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall() == before
    changes = conn.total_changes
    fts5.install(conn)
    assert conn.total_changes == changes
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'new', 2)")
    assert [h["id"] for h in search.search_messages(conn, "new")] == [2]


# --- batched indexing: the newest messages wait for their batch, search still sees them --------


def _indexed(store):
    return [r[0] for r in store.conn.execute("SELECT id FROM messages_fts_docsize ORDER BY id")]


@pytest.mark.sqlite_only("FTS5's batched indexing")
def test_appends_are_indexed_in_batches_and_found_before_and_after(store):
    s = store.session("s1")
    ids = [store.add(s, "user", f"walrus number{i} 海象编号{i:03d}") for i in range(3 * fts5.INDEX_BATCH + 5)]
    indexed = _indexed(store)
    assert indexed == ids[: len(indexed)]  # a prefix: everything up to the mark
    assert len(ids) - len(indexed) < fts5.INDEX_BATCH  # at most one batch waits
    assert len(indexed) >= 3 * fts5.INDEX_BATCH - 1
    assert sorted(store.ids("walrus", limit=1000)) == ids
    assert sorted(store.ids("海象编号", limit=1000)) == ids
    assert store.ids(f"number{len(ids) - 1}") == [ids[-1]]  # waiting in the tail
    assert store.ids("number0") == [ids[0]]  # in the index
    assert store.search("海象编号004")[0]["snippet"] == "walrus number4 >>>海象编号004<<<"
    last = store.search(f"number{len(ids) - 1}")[0]
    assert last["snippet"] == f"walrus >>>number{len(ids) - 1}<<< 海象编号{len(ids) - 1:03d}"
    store.assert_in_sync()


@pytest.mark.sqlite_only("FTS5's batch mark")
def test_edits_and_deletes_on_both_sides_of_the_mark(store):
    s = store.session("s1")
    ids = [store.add(s, "user", f"otter {i}") for i in range(fts5.INDEX_BATCH + 4)]
    upto = fts5._indexed_upto(store.conn)
    indexed, pending = ids[0], ids[-1]
    assert indexed <= upto < pending
    for mid in (indexed, pending):
        store.conn.execute("UPDATE messages SET content = 'beaver 河狸的家' WHERE id = $1", (mid,))
    assert sorted(store.ids("beaver")) == [indexed, pending]
    assert sorted(store.ids("河狸的家")) == [indexed, pending]
    store.conn.execute("DELETE FROM messages WHERE id IN ($1, $2)", (ids[1], ids[-2]))
    assert len(store.ids("otter", limit=100)) == len(ids) - 4
    store.assert_in_sync()
    assert sorted(store.ids("beaver")) == [indexed, pending]


@pytest.mark.sqlite_only("FTS5's batch mark")
def test_an_explicit_old_id_is_indexed_at_once(store):
    s = store.session("s1")
    for i in range(fts5.INDEX_BATCH + 2):
        store.add(s, "user", f"filler {i}")
    store.conn.execute("DELETE FROM messages WHERE id = 3")
    store.conn.execute("INSERT INTO messages (id, session_id, role, content, timestamp) VALUES (3, $1, 'user', 'restored heron', 1)", (s,))
    assert 3 in _indexed(store)
    assert store.ids("heron") == [3]
    store.assert_in_sync()


@pytest.mark.sqlite_only("FTS5's pending tail")
def test_tail_and_index_are_ranked_together(store):
    s = store.session("s1")
    weak = store.add(s, "user", "lynx seen far away across the valley on a grey and windy morning")
    for i in range(fts5.INDEX_BATCH):
        store.add(s, "user", f"filler {i}")
    strong = store.add(s, "user", "lynx lynx")
    assert weak <= fts5._indexed_upto(store.conn) < strong
    assert store.ids("lynx") == [strong, weak]
    assert store.ids("lynx", role_filter=["assistant"]) == []


@pytest.mark.sqlite_only("FTS5's pending tail on a query-only SQLite connection")
def test_a_query_only_reader_sees_the_tail(store):
    s = store.session("s1")
    mid = store.add(s, "user", "pending pelican 鹈鹕在等待")
    reader = sqlite3.connect(store.target)
    reader.execute("PRAGMA query_only = ON")
    try:
        assert [h["id"] for h in search.search_messages(reader, "pelican")] == [mid]
        assert [h["id"] for h in search.search_messages(reader, "鹈鹕在等待")] == [mid]
        assert [h["id"] for h in search.search_messages(reader, "鹈鹕")] == [mid]
    finally:
        reader.close()


@pytest.mark.sqlite_only("FTS5's pending tail")
@pytest.mark.parametrize("query", ["marmot", "marm*", '"alpine marmot"', "marmot burrow", "土拨鼠洞穴"])
def test_pending_messages_rank_as_they_will_once_indexed(store, query):
    s = store.session("s1")
    texts = [
        "marmot", "an alpine marmot near the burrow", "marmot marmot burrow 土拨鼠洞穴",
        "the alpine marmot whistles while another alpine marmot digs a deep burrow 土拨鼠洞穴 土拨鼠洞穴",
        "marmots and more marmots, a marmot colony, 土拨鼠洞穴在山上",
        "a long message about hiking in the mountains where at some point an alpine marmot appeared",
    ]
    for i in range(2 * fts5.INDEX_BATCH):  # an index with some statistics
        store.add(s, "user", f"filler line {i} about mountains and burrow entrances" + (" marmot" if i % 7 == 0 else ""))
    fts5.flush(store.conn)
    for text in texts:
        store.add(s, "user", text)
    assert fts5._indexed_upto(store.conn) < store.conn.execute("SELECT max(id) FROM messages").fetchone()[0]
    before = store.ids(query, limit=50)
    fts5.flush(store.conn)
    assert store.ids(query, limit=50) == before


@pytest.mark.sqlite_only("compares with FTS5's own bm25()")
@pytest.mark.parametrize("query", ["marmot", "alpine marmot", '"alpine marmot"', "marm*", "burrow OR colony",
                                   "marmot NOT alpine", "土拨鼠洞穴"])
def test_ranking_is_fts5_bm25(store, query):
    """Below DF_SAMPLE matches, our scores order messages exactly as FTS5's own bm25() does."""
    s = store.session("s1")
    texts = [
        "marmot", "an alpine marmot near the burrow", "marmot marmot burrow 土拨鼠洞穴", "a marmot colony",
        "the alpine marmot whistles while another alpine marmot digs a deep burrow 土拨鼠洞穴 土拨鼠洞穴",
        "marmots and more marmots, a marmot colony, 土拨鼠洞穴在山上", "Marmot! MARMOT? marmot.",
        "a long message about hiking in the mountains where at some point an alpine marmot appeared",
    ]
    for i in range(3 * fts5.INDEX_BATCH):
        store.add(s, "user", texts[i % len(texts)] + f" filler{i}" + " word" * (i % 5))
    fts5.flush(store.conn)
    trigram = search.is_cjk(query)
    table = "messages_fts_trigram" if trigram else "messages_fts"
    expected = [r[0] for r in store.conn.execute(
        f"SELECT rowid FROM {table} WHERE {table} MATCH $1 ORDER BY bm25({table}), rowid DESC",
        (search.sanitize_query(query),),
    )]
    assert len(expected) > 10
    assert store.ids(query, limit=100) == expected


def test_short_terms_with_cjk_only_excluded_still_find_english_messages(store):
    s = store.session("s1")
    english = store.add(s, "user", "ok go")
    store.add(s, "user", "ok 库存")
    store.flush()
    pending = store.add(s, "user", "go ok")
    assert store.ids("ok NOT 库") == [pending, english]
    assert store.ids("ok 库") == [english + 1]


def _append_many(path, worker, n):
    with SessionDB(path) as db:
        db.sessions.create(f"w{worker}", "cli")
        for i in range(n):
            db.messages.append(f"w{worker}", "user", f"parallel kestrel {worker} {i} 并行写入测试")


def test_concurrent_writers_keep_the_batches_whole(store):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(store.target, w, 60)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(store.ids("kestrel", limit=1000)) == 180
    assert len(store.ids("并行写入测试", limit=1000)) == 180
    assert len(store.ids('"kestrel 2"', limit=1000)) == 60
    store.assert_in_sync()


@pytest.mark.sqlite_only("FTS5's optimize and rebuild")
def test_optimize_and_rebuild_change_no_answer(store):
    s = store.session("s1")
    for i in range(fts5.INDEX_BATCH * 2 + 3):
        store.add(s, "user", f"heron {i} 苍鹭在河边" if i % 2 else f"egret {i}")
    before = {q: store.ids(q, limit=100) for q in ("heron", "egret", "苍鹭在河边", "heron 7")}
    fts5.optimize(store.conn)
    assert {q: store.ids(q, limit=100) for q in before} == before
    fts5.rebuild(store.conn)
    assert fts5._indexed_upto(store.conn) == store.conn.execute("SELECT max(id) FROM messages").fetchone()[0]
    assert {q: store.ids(q, limit=100) for q in before} == before
    store.assert_in_sync()
