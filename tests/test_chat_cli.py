"""`switchboard chat`: the terminal session through the same router, and the recap on resume."""

import asyncio
import io
import os
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import state
from gateway.cli.chat import recap, run_chat
from gateway.errors import SwitchboardError
from state import SessionDB
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import eventually, gateway_config
from tests.ptykit import CTRL_C, CTRL_D, Terminal


def lines(*items):
    it = iter(items)

    def read():
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read


def console():
    return Console(file=io.StringIO(), width=120, color_system=None, record=True)


async def test_chat_then_continue_shows_the_recap(tmp_path):
    async with FakeModel() as model:
        cfg = gateway_config(tmp_path / "home", model.base_url)
        first = console()
        await run_chat(cfg, interactive=True, console=first, read_line=lines(*[f"question {i}" for i in range(12)], "/title Terminal work"))
        out = first.export_text()
        assert "echo: question 0 | turns: 1 | first: question 0" in out
        assert "Session title set: Terminal work" in out
        assert "switchboard chat -r" in out

        second = console()
        await run_chat(cfg, continue_="Terminal work", interactive=True, console=second, read_line=lines("one more"))
        out = second.export_text()
    assert "Previous conversation: Terminal work" in out
    assert "... 4 earlier messages ..." in out  # 12 exchanges, the last 10 shown
    assert "● You: question 11" in out
    assert "echo: one more | turns: 13 | first: question 0" in out


def test_recap_truncates_and_collapses_tool_calls():
    messages = [state.StoredMessage(i, "s1", **fields) for i, fields in enumerate([
        {"role": "system", "content": "hidden system note"},
        {"role": "user", "content": "u" * 400},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "function": {"name": "web_search", "arguments": "{}"}},
            {"id": "2", "function": {"name": "terminal", "arguments": "{}"}}]},
        {"role": "tool", "content": "tool output hidden", "tool_call_id": "1"},
        {"role": "assistant", "content": "line1\nline2\nline3\nline4"},
    ], 1)]
    text = recap(messages).plain
    assert "hidden system note" not in text and "tool output hidden" not in text
    assert "u" * 300 + " …" in text and "u" * 301 not in text
    assert "[2 tool calls: web_search, terminal]" in text
    assert "line3 …" in text and "line4" not in text


async def _chat(cfg, *said, **how):
    out = console()
    await run_chat(cfg, interactive=True, console=out, read_line=lines(*said), **how)
    return out.export_text()


async def test_plain_chat_starts_a_new_session_and_c_continues_the_last_active_one(tmp_path):
    async with FakeModel() as model:
        cfg = gateway_config(tmp_path / "home", model.base_url)
        await _chat(cfg, "first topic", "/title Alpha")
        again = await _chat(cfg, "second topic", "/title Beta")
        assert "echo: second topic | turns: 1 | first: second topic" in again  # not a continuation of Alpha
        await _chat(cfg, "back to alpha", resume="Alpha")  # Alpha is now the most recently active
        out = await _chat(cfg, "and more", continue_="")
    assert "Previous conversation: Alpha" in out
    assert "echo: and more | turns: 3 | first: first topic" in out


async def test_chat_never_continues_another_surfaces_session_unless_given_its_id(tmp_path):
    async with FakeModel() as model:
        cfg = gateway_config(tmp_path / "home", model.base_url)
        await _chat(cfg, "my own words", "/title Mine")
        with SessionDB(cfg.db_path) as db:
            db.sessions.create("20990101_000000_a9a9a9a9", "api", user_id="someone", title="Their talk")
            db.messages.append("20990101_000000_a9a9a9a9", "user", "an API user's secret")
        out = await _chat(cfg, "hello again", continue_="")
        assert "Previous conversation: Mine" in out and "secret" not in out
        for how in ({"resume": "Their talk"}, {"continue_": "Their talk"}, {"resume": "20990101"}):
            with pytest.raises(SwitchboardError, match="not one of this terminal's.*chat -r 20990101_000000_a9a9a9a9"):
                await _chat(cfg, "x", **how)
        out = await _chat(cfg, "by id", resume="20990101_000000_a9a9a9a9")
    assert "Previous conversation: Their talk" in out and "an API user's secret" in out


async def test_continue_with_no_terminal_session_says_it_starts_a_new_one(tmp_path):
    async with FakeModel() as model:
        cfg = gateway_config(tmp_path / "home", model.base_url)
        out = await _chat(cfg, "hi", continue_="")
    assert "No earlier terminal session to continue: this is a new one." in out
    assert "echo: hi | turns: 1" in out


async def test_a_model_server_that_refuses_the_connection_is_not_called_a_timeout(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = gateway_config(tmp_path / "home", f"http://127.0.0.1:{port}/v1",
                         model={"max_retries": 0, "retry_total_seconds": 1})
    out = await _chat(cfg, "hello")
    assert "connection refused" in out and "timed out" not in out


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_warnings_go_to_a_file_not_between_the_prompt_and_the_typing(tmp_path):
    from click.testing import CliRunner

    from gateway.cli.main import main

    home = tmp_path / "home"
    config = tmp_path / "c.yaml"
    config.write_text(f"home: {home}\nmodel:\n  base_url: http://127.0.0.1:{_closed_port()}/v1\n  name: my-local-model\n"
                      "  max_retries: 1\n  retry_total_seconds: 2\n", encoding="utf-8")
    for _ in range(2):
        result = CliRunner().invoke(main, ["chat", "--config", str(config)], input="hello\n")
        assert result.exit_code == 1, result.output  # piped, a turn without an answer is a failure
        assert "The model is unavailable right now (connection refused)" in result.stdout
        assert "WARNING" not in result.output and "retry 1" not in result.output
        assert f"(warnings from this chat are in {home / 'chat.log'})" in result.stderr
    logged = (home / "chat.log").read_text(encoding="utf-8")
    assert logged.count("model call to default failed (connection refused), retry 1") == 2
    assert "context length" not in logged  # said by config check, doctor and the daemon, not at every chat


async def test_the_answer_streams_into_the_terminal_after_a_spinner_and_is_printed_whole(tmp_path):
    answer = ("Streaming shows the answer as the model writes it, so a long reply does not keep the user "
              "waiting in front of an empty screen for half a minute.")
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=200, height=20, color_system=None)
    async with FakeModel(delay=0.5) as model:  # each model call waits half a second before its first token
        model.script(ToolCall("session_search", {"query": "streaming"}), Reply(answer))
        model.stream_chunk_chars, model.stream_interval = 10, 0.1  # the answer over about 1.4 s
        cfg = gateway_config(tmp_path / "home", model.base_url)
        chat = asyncio.create_task(run_chat(cfg, interactive=True, console=terminal, read_line=lines("tell me about streaming")))
        await eventually(lambda: "thinking…" in screen.getvalue(), what="the spinner before the first token")
        assert not [r for r in model.requests if r.answered is not None]  # before the model's first answer
        await eventually(lambda: "searching past sessions…" in screen.getvalue(), what="the tool's status line")
        await eventually(lambda: "Streaming shows the" in screen.getvalue(), what="the first words")
        assert model.requests[1].answered is None  # shown while the model was still writing
        assert answer not in screen.getvalue()
        await chat
    shown = screen.getvalue()
    # the live view is erased (its last line cleared) and the answer printed whole in its place
    after_live = shown.rsplit("\x1b[2K", 1)[1]
    assert after_live.startswith(f"{answer}\nSession ") and after_live.count(answer) == 1


async def test_c_continues_the_session_the_user_resumed_not_the_empty_one_new_made(tmp_path):
    async with FakeModel() as model:
        cfg = gateway_config(tmp_path / "home", model.base_url)
        await _chat(cfg, "first topic", "/title Alpha")
        left = await _chat(cfg, "/new", "/resume Alpha")  # back in Alpha when they leave
        with SessionDB(cfg.db_path) as db:
            alpha = db.sessions.resolve_id("Alpha")
        assert f"Continue with: switchboard chat -r {alpha}" in left
        out = await _chat(cfg, "and more", continue_="")
    assert "Previous conversation: Alpha" in out
    assert "echo: and more | turns: 2 | first: first topic" in out


# --- the real `switchboard chat` at a terminal (a pseudo-terminal) and in a pipe ---------------------------

SWITCHBOARD = Path(sys.executable).parent / "switchboard"
LONG_ANSWER = " ".join(f"word{i}" for i in range(300))


def _config_file(tmp_path, model) -> Path:
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "model": {
        "base_url": model.base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000",
        "context_length": 32768}}), encoding="utf-8")
    return path


def _env(tmp_path) -> dict[str, str]:
    (tmp_path / "user").mkdir(exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "user"), "LANG": "C.UTF-8", "USER": "tester"}


def _stored(tmp_path) -> tuple[str, list[state.StoredMessage]]:
    with SessionDB(tmp_path / "home" / "state.db") as db:
        session = db.sessions.list_rich(source="cli", limit=1)[0]["id"]
        return session, db.messages.get(session)


async def test_ctrl_c_stops_the_answer_marked_stopped_and_a_second_ctrl_c_leaves_with_the_hint(tmp_path):
    async with FakeModel() as model:
        model.script(Reply(LONG_ANSWER))
        model.stream_chunk_chars, model.stream_interval = 6, 0.05  # about 20 s for the whole answer
        term = Terminal([str(SWITCHBOARD), "chat", "--config", str(_config_file(tmp_path, model))], env=_env(tmp_path))
        try:
            await eventually(lambda: "› " in term.text(), timeout=30, what=term.text)
            term.type("tell me everything\r")
            await eventually(lambda: "word5 " in term.text(), timeout=30, what=term.text)
            term.type(CTRL_C)
            await eventually(lambda: "(stopped)" in term.text(), timeout=10, what=term.text)
            await eventually(lambda: term.text().rstrip().endswith("›"), timeout=10, what=term.text)
            assert term.proc.poll() is None  # the chat goes on
            shown = term.text().split("tell me everything", 1)[1]
            assert "word0 word1 word2" in shown and "word299" not in shown
            session, messages = _stored(tmp_path)
            last = messages[-1]
            assert (last.role, last.finish_reason) == ("assistant", "stopped")
            partial = last.content.removesuffix("\n\n_(stopped)_")
            assert last.content.endswith("\n\n_(stopped)_") and partial.startswith("word0 word1 word2")
            assert LONG_ANSWER.startswith(partial) and len(partial) < len(LONG_ANSWER)  # as far as it got
            assert partial in shown.replace("\n", " ")  # what was shown is what is stored

            model.stream_interval = 0
            term.type("and now?\r")  # the next message is answered as usual
            await eventually(lambda: "echo: and now? | turns: 2 | first: tell me everything\n" in term.text(),
                             timeout=30, what=term.text)
            await eventually(lambda: term.text().rstrip().endswith("›"), timeout=10, what=term.text)
            term.type(CTRL_C)  # at the prompt: leave
            assert await asyncio.to_thread(term.wait) == 0
        finally:
            term.close()
    assert term.text().rstrip().endswith(f"Session {session} saved. Continue with: switchboard chat -r {session}")


async def test_ctrl_c_before_the_first_words_stops_and_keeps_the_message(tmp_path):
    async with FakeModel(delay=30) as model:  # the model thinks for half a minute
        term = Terminal([str(SWITCHBOARD), "chat", "--config", str(_config_file(tmp_path, model))], env=_env(tmp_path))
        try:
            await eventually(lambda: "› " in term.text(), timeout=30, what=term.text)
            term.type("a hard question\r")
            await eventually(lambda: "thinking…" in term.text(), timeout=30, what=term.text)
            term.type(CTRL_C)
            await eventually(lambda: "(stopped before the answer began; your message is saved)" in term.text(),
                             timeout=10, what=term.text)
            await eventually(lambda: term.text().rstrip().endswith("›"), timeout=10, what=term.text)
            assert term.proc.poll() is None
            _, messages = _stored(tmp_path)
            assert [(m.role, m.content) for m in messages] == [("user", "a hard question")]
            term.type(CTRL_D)
            assert await asyncio.to_thread(term.wait) == 0
        finally:
            term.close()


async def test_ctrl_d_at_the_prompt_leaves_with_the_hint(tmp_path):
    async with FakeModel() as model:
        term = Terminal([str(SWITCHBOARD), "chat", "--config", str(_config_file(tmp_path, model))], env=_env(tmp_path))
        try:
            await eventually(lambda: "› " in term.text(), timeout=30, what=term.text)
            term.type("hi\r")
            await eventually(lambda: "echo: hi | turns: 1" in term.text(), timeout=30, what=term.text)
            term.type(CTRL_D)
            assert await asyncio.to_thread(term.wait) == 0
        finally:
            term.close()
    session, _ = _stored(tmp_path)
    assert term.text().rstrip().endswith(f"Continue with: switchboard chat -r {session}")


async def test_piped_chat_prints_the_answers_only(tmp_path):
    question = ("a long question " * 8).strip()  # longer than 80 columns: never wrapped
    async with FakeModel() as model:
        proc = await asyncio.create_subprocess_exec(
            str(SWITCHBOARD), "chat", "--config", str(_config_file(tmp_path, model)), env=_env(tmp_path),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = (b.decode() for b in await proc.communicate(f"{question}\nsecond\n".encode()))
    assert proc.returncode == 0, err
    first = question
    assert out == f"echo: {first} | turns: 1 | first: {first}\necho: second | turns: 2 | first: {first}\n"
    session, _ = _stored(tmp_path)
    assert err == f"Session {session} saved. Continue with: switchboard chat -r {session}\n"


async def test_questions_from_a_file_are_answered_too(tmp_path):
    questions = tmp_path / "questions.txt"
    questions.write_text("hello from a file\n", encoding="utf-8")  # a regular file, which epoll cannot wait on
    async with FakeModel() as model:
        with questions.open("rb") as stdin:
            proc = await asyncio.create_subprocess_exec(
                str(SWITCHBOARD), "chat", "--config", str(_config_file(tmp_path, model)), env=_env(tmp_path),
                stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = (b.decode() for b in await proc.communicate())
    assert proc.returncode == 0, err
    assert out == "echo: hello from a file | turns: 1 | first: hello from a file\n"


async def _piped(tmp_path, model_url: str, lines_in: str) -> tuple[int, str, str]:
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "model": {
        "base_url": model_url, "name": "fake-model", "context_length": 32768, "max_retries": 0}}), encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        str(SWITCHBOARD), "chat", "--config", str(path), env=_env(tmp_path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = (b.decode() for b in await proc.communicate(lines_in.encode()))
    assert proc.returncode is not None
    return proc.returncode, out, err


async def test_a_piped_chat_whose_turn_failed_exits_1(tmp_path):
    code, out, err = await _piped(tmp_path, "http://127.0.0.1:9/v1", "hello?\n")
    assert code == 1, (out, err)
    assert "model" in out.lower() and "echo:" not in out  # the line saying why stands in for the answer


async def test_a_piped_chat_of_commands_leaves_no_empty_session_and_stream_says_what_is_true(tmp_path):
    async with FakeModel() as model:
        code, out, err = await _piped(tmp_path, model.base_url, "/help\n/stream\n")
    assert code == 0, err
    assert "The terminal chat shows replies as they are written" in out
    assert "platforms.cli" not in out and "streaming is off" not in out
    assert "saved" not in err  # no session to continue
    with SessionDB(tmp_path / "home" / "state.db") as db:
        assert db.sessions.list_rich(source="cli", limit=5) == []


async def test_markdown_in_an_answer_is_drawn_in_the_terminal_not_printed_raw(tmp_path):
    request = ("The agent wants to run **demo__write_note** with:\n\n```json\n{\"path\": \"a.txt\"}\n```\n\n"
               "**Approve** runs exactly this call: `/approve 1`")
    async with FakeModel() as model:
        model.script(Reply(request), Reply(request))
        cfg = gateway_config(tmp_path / "home", model.base_url)
        screen = console()
        await run_chat(cfg, interactive=True, console=screen, read_line=lines("write a note"))
        out = screen.export_text()
        piped = console()
        await run_chat(cfg, interactive=False, console=piped, read_line=lines("again"))
    assert "demo__write_note" in out and '"path": "a.txt"' in out
    assert "**" not in out and "```" not in out and "/approve 1" in out
    assert "**demo__write_note**" in piped.export_text()  # piped, the text stays as written, for scripts
