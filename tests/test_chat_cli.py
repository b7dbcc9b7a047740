"""`switchboard chat`: the terminal session through the same router, and the recap on resume."""

import io

from rich.console import Console

from gateway.chat import recap, run_chat
from tests.fakes.model_server import FakeModel
from tests.harness import gateway_config


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
        await run_chat(cfg, console=first, read_line=lines(*[f"question {i}" for i in range(12)], "/title Terminal work"))
        out = first.export_text()
        assert "echo: question 0 | turns: 1 | first: question 0" in out
        assert "Session title set: Terminal work" in out
        assert "switchboard chat -r" in out

        second = console()
        await run_chat(cfg, continue_="Terminal work", console=second, read_line=lines("one more"))
        out = second.export_text()
    assert "Previous conversation: Terminal work" in out
    assert "... 4 earlier messages ..." in out  # 12 exchanges, the last 10 shown
    assert "● You: question 11" in out
    assert "echo: one more | turns: 13 | first: question 0" in out


def test_recap_truncates_and_collapses_tool_calls():
    messages = [
        {"role": "system", "content": "hidden system note"},
        {"role": "user", "content": "u" * 400},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "function": {"name": "web_search", "arguments": "{}"}},
            {"id": "2", "function": {"name": "terminal", "arguments": "{}"}}]},
        {"role": "tool", "content": "tool output hidden", "tool_call_id": "1"},
        {"role": "assistant", "content": "line1\nline2\nline3\nline4"},
    ]
    text = recap(messages).plain
    assert "hidden system note" not in text and "tool output hidden" not in text
    assert "u" * 300 + " …" in text and "u" * 301 not in text
    assert "[2 tool calls: web_search, terminal]" in text
    assert "line3 …" in text and "line4" not in text
