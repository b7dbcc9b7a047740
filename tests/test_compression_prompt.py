"""The summarizer's request: structure, focus, earlier summary, redaction, target length; the summary message."""

from __future__ import annotations

from compression import (
    SUMMARY_MARKER,
    build_summary_request,
    is_summary,
    make_summary_message,
    plan,
    redact,
    summary_text,
)
from compression.prompt import SUMMARY_MAX_TOKENS, SUMMARY_MIN_TOKENS, target_summary_tokens


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def conversation(middle: list[dict]) -> list[dict]:
    head = [user("HEAD-ONE"), assistant("HEAD-TWO"), user("HEAD-THREE")]
    tail = [assistant("TAIL-1"), user("TAIL-2"), assistant("TAIL-3"), user("TAIL-4"), assistant("TAIL-5"),
            user("TAIL-6")]
    return head + middle + tail


def request_text(messages: list[dict], focus: str | None = None) -> tuple[str, str]:
    p = plan(messages, context_length=100)
    system, body = build_summary_request(p, focus=focus)
    assert system["role"] == "system" and body["role"] == "user"
    return system["content"], body["content"]


def test_the_request_holds_the_middle_only_with_the_structured_instructions():
    middle = [assistant("MIDDLE-A"), user("please deploy to /srv/app on port 8443"),
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls /srv"}'}}]},
              {"role": "tool", "tool_call_id": "c1", "tool_name": "shell", "content": "app.py"}]
    system, body = request_text(conversation(middle))
    for kept in ("MIDDLE-A", "/srv/app", "8443", "shell", "ls /srv", "app.py"):
        assert kept in body
    for elsewhere in ("HEAD-ONE", "HEAD-THREE", "TAIL-1", "TAIL-6"):
        assert elsewhere not in body
    for section in ("verbatim", "Goals", "Constraints and preferences", "Decisions", "Facts",
                    "Completed work", "Open questions", "Remaining work"):
        assert section in system
    assert "language the user writes in" in system
    assert "EARLIER SUMMARY" not in body and "FOCUS" not in body


def test_focus_steers_the_summary():
    _, body = request_text(conversation([assistant("x"), user("y")]), focus="the database migration")
    assert "FOCUS" in body and "the database migration" in body


def test_an_earlier_summary_is_given_to_be_updated():
    head = [user("HEAD-ONE"), assistant("HEAD-TWO"), user("HEAD-THREE")]
    earlier = make_summary_message("Facts: the staging host is stg-7.example.net", head[-1])
    messages = head + [earlier] + [user("m1"), assistant("m2")] + conversation([])[3:]
    _, body = request_text(messages)
    assert "EARLIER SUMMARY" in body and "stg-7.example.net" in body
    assert "updated summary" in body
    assert body.count(SUMMARY_MARKER) == 0  # the text, not the stored message wrapper


def test_secrets_never_reach_the_summarizer():
    secrets = {
        "sk-proj-abcdefghijklmnopqrstuvwxyz012345": "my key is sk-proj-abcdefghijklmnopqrstuvwxyz012345",
        "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789": "token ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 for CI",
        "xoxb-1234567890-abcdefghijklmnop": "slack xoxb-1234567890-abcdefghijklmnop",
        "hunter2!": "db password: hunter2!",
        "correcthorse": "my password is correcthorse",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U":
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
            "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "s3cr3tpw": "connect to postgres://app:s3cr3tpw@db.internal:5432/prod",
    }
    middle = [user(text) for text in secrets.values()] + [assistant("noted")]
    _, body = request_text(conversation(middle), focus="keep sk-abcdefghijklmnopqrstuvwx out too")
    for secret in list(secrets) + ["sk-abcdefghijklmnopqrstuvwx"]:
        assert secret not in body
    assert body.count("[REDACTED]") >= len(secrets) + 1
    # what is not secret survives
    assert "db.internal:5432/prod" in body and "postgres://app:" in body


def test_redaction_leaves_ordinary_text_alone():
    text = "max_tokens: 4000, author: Jane, see https://example.com/a?b=1 and /home/u/notes.txt at 12:30"
    assert redact(text) == text


def test_target_length_is_a_fifth_of_what_is_replaced_within_bounds():
    small = plan(conversation([assistant("x"), user("y")]), context_length=100)
    assert target_summary_tokens(small) == SUMMARY_MIN_TOKENS
    middle = [user("w" * 17_500), assistant("v" * 17_500)]  # ~10,000 tokens
    medium = plan(conversation(middle), context_length=100)
    assert target_summary_tokens(medium) == round(medium.middle_tokens * 0.2)
    huge = plan(conversation([user("w" * 350_000), assistant("v")]), context_length=100)
    assert target_summary_tokens(huge) == SUMMARY_MAX_TOKENS
    _, body = request_text(conversation(middle))
    assert f"about {target_summary_tokens(medium):,} tokens" in body


def test_a_huge_message_is_clipped_in_the_transcript():
    _, body = request_text(conversation([user("BEGIN" + "x" * 100_000 + "END"), assistant("ok")]))
    assert "BEGIN" in body and "END" in body
    assert "characters left out" in body
    assert len(body) < 20_000


def test_summary_message_is_recognizable_and_alternates_roles():
    after_user = make_summary_message("the summary", user("hi"))
    assert after_user["role"] == "assistant"
    after_assistant = make_summary_message("the summary", assistant("hi"))
    assert after_assistant["role"] == "user"
    assert after_user["content"].startswith(SUMMARY_MARKER + "\n")
    assert is_summary(after_user) and is_summary(after_assistant)
    assert summary_text(after_user) == "the summary"
    assert not is_summary(user("a normal message mentioning " + SUMMARY_MARKER))
    assert not is_summary({"role": "tool", "content": SUMMARY_MARKER})
