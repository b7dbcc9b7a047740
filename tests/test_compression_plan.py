"""Compression without the store: token estimates, the trigger, what is kept, fitting a prompt."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from compression import (
    DEFAULT_CONTEXT_LENGTH,
    IMAGE_TOKENS,
    context_length_for,
    estimate_tokens,
    fit_to_window,
    make_summary_message,
    plan,
    prompt_tokens,
    should_compress,
)
from compression.planning import expected_tokens_after, summary_frame_tokens, summary_target


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def tool_call(call_id: str, name: str = "search", args: str = '{"q": "x"}') -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
    }


def tool_result(call_id: str, text: str = "result") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def chat(turns: int, size: int = 40) -> list[dict]:
    out = []
    for i in range(turns):
        out.append(user(f"question {i} " + "q" * size))
        out.append(assistant(f"answer {i} " + "a" * size))
    return out


# --- estimates -----------------------------------------------------------------


def test_estimate_errs_high_for_english_text():
    text = "The quick brown fox jumps over the lazy dog. " * 100  # ~1,000 real tokens
    assert estimate_tokens([user(text)]) >= len(text) / 3.5


def test_cjk_counts_about_one_token_per_character():
    assert estimate_tokens([user("你好世界" * 100)]) >= 400
    assert estimate_tokens([user("こんにちは" * 100)]) >= 500


def test_tool_calls_images_and_ids_are_counted():
    bare = estimate_tokens([{"role": "assistant", "content": None}])
    with_call = estimate_tokens([tool_call("call_1", args='{"path": "' + "p" * 700 + '"}')])
    assert with_call >= bare + 200
    image = {"role": "user", "content": [{"type": "text", "text": "what is this"},
                                         {"type": "image_url", "image_url": {"url": "data:..."}}]}
    assert estimate_tokens([image]) >= IMAGE_TOKENS


def test_prompt_tokens_start_from_the_reported_usage():
    messages = chat(10)
    new = [user("one more " * 50)]
    assert prompt_tokens(messages + new, reported_prompt_tokens=5_000, reported_message_count=20) == (
        5_000 + estimate_tokens(new)
    )
    # A report about more messages than there are (the prompt was split since) is ignored.
    assert prompt_tokens(messages, reported_prompt_tokens=5_000, reported_message_count=99) == estimate_tokens(
        messages
    )
    assert prompt_tokens(messages) == estimate_tokens(messages)


# --- the context window and the trigger --------------------------------------------


def test_context_length_configured_then_table_then_default_with_warning():
    assert context_length_for("gpt-4o", 50_000) == (50_000, None)
    assert context_length_for("gpt-4o", None) == (128_000, None)
    assert context_length_for("openai/gpt-4o-mini", None) == (128_000, None)
    assert context_length_for("gpt-4-0613", None) == (8_192, None)
    assert context_length_for("llama3.1:8b", None) == (131_072, None)
    assert context_length_for("meta-llama/Llama-3.3-70B-Instruct", None) == (131_072, None)
    length, warning = context_length_for("my-local-finetune", None)
    assert length == DEFAULT_CONTEXT_LENGTH
    assert "my-local-finetune" in warning and "model.context_length" in warning


@pytest.mark.parametrize("bad", [0, 100, -5, "big", 12.5, True])
def test_a_bad_configured_context_length_says_what_to_set(bad):
    with pytest.raises(ValueError, match="model.context_length"):
        context_length_for("gpt-4o", bad)


def test_compression_triggers_at_the_threshold_and_not_below():
    assert should_compress(7_500, 10_000, 0.75)
    assert should_compress(9_000, 10_000, 0.75)
    assert not should_compress(7_499, 10_000, 0.75)
    assert not should_compress(7_999, 10_000, 0.8)
    with pytest.raises(ValueError, match="threshold"):
        should_compress(1, 10, 1.5)


# --- what is kept ----------------------------------------------------------------


def test_a_short_conversation_is_not_compressed():
    assert plan(chat(4)[:-1], context_length=1_000) is None  # 7 messages
    assert plan(chat(4) + [user("x")][:0], context_length=1_000) is None  # 8 messages
    assert plan(chat(5)[:9], context_length=1_000) is None  # head 3 + tail 6 = 9: nothing between
    p = plan(chat(5), context_length=1_000)  # 10 messages: one to summarize
    assert p is not None and len(p.middle) == 1


def test_head_middle_and_tail_cover_the_conversation_in_order():
    messages = chat(30)
    p = plan(messages, context_length=4_000)
    assert list(p.head) == messages[:3]
    assert list(p.head) + list(p.middle) + list(p.tail) == messages
    assert len(p.tail) >= 6
    assert p.previous_summary is None
    assert p.tokens_before == estimate_tokens(messages)
    assert p.middle_tokens == estimate_tokens(p.middle)
    assert p.messages_before == len(messages)


def test_the_tail_is_up_to_six_messages_fewer_when_the_budget_says_so():
    messages = chat(40)
    assert len(plan(messages, context_length=500).tail) == 6  # no budget: the last six
    assert len(plan(messages, context_length=20_000).tail) == 6  # never more
    budget = 3 * 50 + 4 * 50 + 200  # head, four of the tail's messages, frame and summary, roughly
    p = plan(messages, context_length=4_000, max_tokens_after=budget)
    assert 1 <= len(p.tail) < 6 and p.tail[0]["role"] == "assistant" or p.tail[0]["role"] == "user"
    assert expected_tokens_after(p) <= budget
    # the newest user message is always kept, and the head gives way before it
    tight = plan(messages, context_length=4_000, max_tokens_after=200)
    assert tight.tail[-2:] == tuple(messages[-2:]) and len(tight.head) < 3
    assert list(tight.head) + list(tight.middle) + list(tight.tail) == messages


def test_the_summary_gets_the_room_the_head_and_tail_leave():
    messages = chat(40)
    roomy = plan(messages, context_length=4_000, max_tokens_after=10_000)
    assert roomy.summary_tokens == summary_target(roomy.middle_tokens)  # its usual target
    kept = estimate_tokens(roomy.head) + estimate_tokens(roomy.tail)
    squeezed = plan(messages, context_length=4_000, max_tokens_after=kept + summary_frame_tokens() + 150)
    assert squeezed.summary_tokens == 150 and expected_tokens_after(squeezed) == kept + summary_frame_tokens() + 150


def test_system_messages_stay_on_top_of_the_head():
    messages = [{"role": "system", "content": "You are helpful."}] + chat(20)
    p = plan(messages, context_length=2_000)
    assert list(p.head) == messages[:4]


def test_tail_never_starts_with_a_tool_result():
    messages = chat(10) + [user("look it up"), tool_call("c1"), tool_result("c1"), tool_result("c1b"),
                           tool_result("c1c"), assistant("found"), user("thanks"), assistant("welcome"), user("bye")]
    # the last six would start at the second tool result: the tail is up to six, so it starts after the group
    p = plan(messages, context_length=100)
    assert p.tail[0]["role"] != "tool"
    assert p.tail[0] == assistant("found") and len(p.tail) == 4
    assert p.middle[-4:] == (tool_call("c1"), tool_result("c1"), tool_result("c1b"), tool_result("c1c"))


def test_head_is_extended_over_the_results_of_its_tool_call():
    messages = [user("start"), assistant("ok"), tool_call("c1"), tool_result("c1"), tool_result("c2")] + chat(10)
    p = plan(messages, context_length=1_000)
    assert list(p.head) == messages[:5]
    assert p.middle[0]["role"] == "user"


def test_previous_summary_is_found_and_not_summarized_again():
    head = chat(2)[:3]
    summary = make_summary_message("Goals: ship v2. Facts: port 8443.", head[-1])
    messages = head + [summary] + chat(12)
    p = plan(messages, context_length=1_000)
    assert list(p.head) == head
    assert p.previous_summary == "Goals: ship v2. Facts: port 8443."
    assert summary not in p.middle
    assert p.messages_before == len(messages)


def test_only_a_previous_summary_between_head_and_tail_is_nothing_to_gain():
    head = chat(2)[:3]
    messages = head + [make_summary_message("s", head[-1])] + chat(3)
    assert plan(messages, context_length=1_000) is None


def _conversations():
    unit = st.one_of(
        st.builds(lambda n: [user("u" * n)], st.integers(1, 300)),
        st.builds(lambda n: [assistant("a" * n)], st.integers(1, 300)),
        st.builds(
            lambda k, n: [tool_call("c")] + [tool_result(f"c{j}", "r" * n) for j in range(k)],
            st.integers(1, 3),
            st.integers(1, 300),
        ),
    )
    return st.lists(unit, min_size=1, max_size=40).map(lambda units: [m for u in units for m in u])


def _groups_intact(parts: list[list[dict]]) -> bool:
    for part in parts:
        if part and part[0]["role"] == "tool":
            return False
        if part and part[-1].get("tool_calls"):
            return False  # a call whose results went to the next part
    return True


@settings(max_examples=300, deadline=None)
@given(_conversations(), st.sampled_from([1_000, 8_000, 128_000]), st.integers(0, 4), st.integers(1, 8),
       st.one_of(st.none(), st.integers(100, 5_000)))
def test_tool_calls_are_never_separated_from_their_results(messages, context_length, head, max_tail, budget):
    # Conversations the agent writes end with an answer, never with a bare tool call.
    messages = messages + [assistant("done")]
    p = plan(messages, context_length=context_length, head=head, max_tail=max_tail, max_tokens_after=budget)
    if p is None:
        return
    parts = [list(p.head), list(p.middle), list(p.tail)]
    assert sum(parts, []) == messages
    assert p.middle and p.tail
    if len(p.tail) > max_tail:  # only for the newest request (a run of user messages) and what answers it
        roles = [m["role"] for m in p.tail]
        first_other = next((i for i, r in enumerate(roles) if r != "user"), len(roles))
        assert roles[0] == "user" and "user" not in roles[first_other:]
    assert _groups_intact(parts[1:]) and (not p.head or not p.head[-1].get("tool_calls"))


# --- fitting a prompt that cannot be compressed --------------------------------------


def test_fit_to_window_leaves_a_prompt_that_fits_alone():
    messages = chat(3)
    assert fit_to_window(messages, 10_000) == (messages, 0)


def test_fit_to_window_drops_whole_old_turns_and_keeps_head_and_last_turn():
    big = "z" * 3_500  # ~1,000 tokens each
    messages = [
        {"role": "system", "content": "sys"},
        user("first"), assistant("hello"), user("second " + big),
        assistant("reply " + big),
        user("third " + big), tool_call("c1"), tool_result("c1", big), assistant("done"),
        user("now this"),
    ]
    original = [dict(m) for m in messages]
    fitted, dropped = fit_to_window(messages, 2_500)
    assert messages == original  # the caller's list is not trimmed
    assert fitted[:4] == messages[:4]  # system + first three
    assert fitted[-1] == user("now this")
    assert dropped == 5  # "reply", and the third turn with its tool call and result
    assert all(m["role"] != "tool" for m in fitted)
    assert estimate_tokens(fitted) <= 2_500


def test_fit_to_window_never_drops_the_turn_being_answered():
    messages = chat(2)[:3] + [user("huge " + "h" * 35_000)]
    fitted, dropped = fit_to_window(messages, 1_000)
    assert fitted == messages and dropped == 0


def test_fit_to_window_keeps_the_summary_of_a_compressed_conversation():
    head = chat(2)[:3]
    summary = make_summary_message("Facts: everything that matters.", head[-1])
    messages = head + [summary] + chat(10, size=2_000) + [user("go on")]
    fitted, dropped = fit_to_window(messages, 3_000)
    assert fitted[:4] == head + [summary]
    assert dropped > 0 and fitted[-1] == user("go on")


@settings(max_examples=200, deadline=None)
@given(_conversations(), st.integers(200, 20_000))
def test_fit_to_window_never_orphans_a_tool_result(messages, window):
    messages = [user("start")] + messages + [user("the question")]
    messages = [{**m, "n": i} for i, m in enumerate(messages)]  # every message distinct
    fitted, dropped = fit_to_window(messages, window)
    assert len(fitted) == len(messages) - dropped
    assert fitted[:3] == messages[:3] and fitted[-1] == messages[-1]
    for i, m in enumerate(fitted):
        if m["role"] == "tool":
            j = i - 1
            while fitted[j]["role"] == "tool":
                j -= 1
            assert fitted[j].get("tool_calls")
    # one contiguous run of whole turns was cut out
    k = next((i for i, (a, b) in enumerate(zip(fitted, messages, strict=False)) if a != b), len(fitted))
    assert fitted[k:] == messages[k + dropped:]
    assert dropped == 0 or messages[k + dropped]["role"] == "user"
