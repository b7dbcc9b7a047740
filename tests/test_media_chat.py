"""`switchboard chat`'s /attach PATH: the file goes with the next message, kept like a platform's."""

from __future__ import annotations

import io

from rich.console import Console

from gateway.cli.chat import run_chat
from tests.fakes import files
from tests.fakes.model_server import FakeModel
from tests.harness import gateway_config


def _lines(*items):
    it = iter(items)

    def read():
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read


async def test_attach_sends_a_file_with_the_next_message_and_says_what_went_wrong(tmp_path):
    pdf = tmp_path / "minutes.pdf"
    pdf.write_bytes(files.pdf("The board approved the bakery"))
    fake = tmp_path / "holiday.png"
    fake.write_bytes(b"not a picture at all")
    out = Console(file=io.StringIO(), width=200, color_system=None, record=True)
    async with FakeModel() as model:
        cfg = gateway_config(tmp_path / "home", model.base_url, model={"vision": True},
                             media={"max_bytes": {"image": 1_000, "document": 100_000}})
        big = tmp_path / "huge.jpg"
        big.write_bytes(b"\xff\xd8\xff" + b"x" * 2_000)
        await run_chat(cfg, interactive=True, console=out, read_line=_lines(
            f"/attach {tmp_path / 'missing.pdf'}", f"/attach {big}", f"/attach {pdf}", "what was decided?",
            f"/attach {fake}", "and this?"))
    text = out.export_text()
    assert f"cannot attach {tmp_path / 'missing.pdf'}: no such file" in text
    assert "cannot attach huge.jpg: 2,003 bytes is more than the 1,000 an image may have (media.max_bytes)" in text
    assert "Attached minutes.pdf (document, " in text and "it goes with your next message." in text
    first, second = model.requests
    sent = first.messages[-1]["content"]
    assert "what was decided?\n[attached document: minutes.pdf]\n[document minutes.pdf:]\n" \
           "The board approved the bakery\n[end of minutes.pdf]" in sent
    assert "holiday.png is not a picture" in text  # one clear line, and the turn went on
    assert "echo: and this?" in text and second.messages[-1]["content"].startswith("and this?")
