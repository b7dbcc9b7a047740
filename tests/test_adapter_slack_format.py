"""Markdown -> Slack mrkdwn, Slack text -> plain, and event shapes (pure functions)."""

from __future__ import annotations

import pytest

from adapters.slack import to_mrkdwn, to_plain
from adapters.slack.events import clean_text, is_from_bot, shape_of
from gateway.types import ChatType


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __also__", "*bold* and *also*"),
        ("*italic* and _italic_", "_italic_ and _italic_"),
        ("~~gone~~", "~gone~"),
        ("see [the docs](https://ex.com/a?b=1&c=2)", "see <https://ex.com/a?b=1&amp;c=2|the docs>"),
        ("![diagram](https://ex.com/d.png)", "<https://ex.com/d.png|diagram>"),
        ("# Title", "*Title*"),
        ("### A **bold** heading ###", "*A bold heading*"),
        ("- one\n* two\n  + nested", "• one\n• two\n  • nested"),
        ("> quoted **text**", "> quoted *text*"),
        ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
        ("`**not bold** <x>`", "`**not bold** &lt;x&gt;`"),
        ("```python\nif a < b and **c**:\n    pass\n```", "```\nif a &lt; b and **c**:\n    pass\n```"),
        ("2 * 3 * 4", "2 * 3 * 4"),
        ("snake_case_name stays", "snake_case_name stays"),
    ],
)
def test_markdown_to_mrkdwn(markdown, mrkdwn):
    assert to_mrkdwn(markdown) == mrkdwn


def test_unclosed_fence_escapes_to_the_end_and_is_closed():
    # An unclosed fence runs to the end (CommonMark), and is closed so Slack shows it as code, not as "```".
    assert to_mrkdwn("```\n**x** <y>") == "```\n**x** &lt;y&gt;\n```"


@pytest.mark.parametrize(
    ("slack", "plain"),
    [
        ("see <https://ex.com|the docs>", "see the docs (https://ex.com)"),
        ("<https://ex.com>", "https://ex.com"),
        ("<mailto:a@b.c|a@b.c>", "a@b.c (mailto:a@b.c)"),
        ("in <#C123|general>", "in #general"),
        ("hey <!here> and <@U2>", "hey @here and @U2"),
        ("a &lt;b&gt; &amp;amp;", "a <b> &amp;"),
    ],
)
def test_slack_text_to_plain(slack, plain):
    assert to_plain(slack) == plain


def test_clean_text_strips_only_the_bots_mention():
    assert clean_text("<@UBOT> ask <@U2> about it", "UBOT") == "ask @U2 about it"
    assert clean_text("thanks <@UBOT|switchboard>!", "UBOT") == "thanks !"


def test_shapes():
    dm = shape_of({"channel": "D1", "ts": "1.1", "channel_type": "im"}, reply_in_thread=True)
    assert (dm.chat_type, dm.chat_id, dm.thread_id, dm.message_id) == (ChatType.DM, "D1", None, "1.1")
    top = shape_of({"channel": "C1", "ts": "1.2", "channel_type": "channel"}, reply_in_thread=True)
    assert (top.chat_type, top.thread_id, top.in_thread) == (ChatType.THREAD, "1.2", False)
    flat = shape_of({"channel": "C1", "ts": "1.2", "channel_type": "channel"}, reply_in_thread=False)
    assert (flat.chat_type, flat.thread_id) == (ChatType.CHANNEL, None)
    mpim = shape_of({"channel": "G1", "ts": "1.2", "channel_type": "mpim"}, reply_in_thread=False)
    assert mpim.chat_type is ChatType.GROUP
    reply = shape_of({"channel": "C1", "ts": "1.3", "thread_ts": "1.2"}, reply_in_thread=False)
    assert (reply.chat_type, reply.thread_id, reply.in_thread) == (ChatType.THREAD, "1.2", True)
    assert shape_of({"channel": "C1"}, reply_in_thread=True) is None
    assert shape_of({"channel": 5, "ts": "1"}, reply_in_thread=True) is None


def test_bot_detection():
    assert is_from_bot({"user": "UBOT"}, "UBOT", "BBOT")
    assert is_from_bot({"user": "U9", "bot_id": "B9"}, "UBOT", "BBOT")
    assert is_from_bot({"subtype": "bot_message"}, "UBOT", "BBOT")
    assert not is_from_bot({"user": "U1"}, "UBOT", "BBOT")
