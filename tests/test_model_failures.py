"""What the user sees when the model cannot answer, and messages larger than the context window.

The real gateway (router, turn, model client) through its local API, against the fake model server.
"""

from __future__ import annotations

import pytest

from compression import estimate_text_tokens
from gateway.oversize import shorten_oversized
from tests.fakes.model_server import Fail, FakeModel, NoChoice, refusal
from tests.harness import ApiClient, running_gateway

API_KEY = "sk-test-not-a-secret-0000"  # the harness's model.api_key
COMPRESS_LINE = ("This conversation no longer fits the model's context window (the model refused it as too long). "
                 "Your message is saved. Send /compress to summarize the conversation so far, or /new to start a fresh one.")


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def _last_user(messages: list[dict]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


async def test_a_message_larger_than_the_window_is_answered_and_the_session_keeps_working(tmp_path, model):
    model.context_limit = 32768  # the window the gateway is configured with (tests/harness.py)
    model.responder = lambda messages: f"read {len(_last_user(messages)):,} characters"
    huge = "".join(f"log line {n:06d}: disk usage nominal, nothing to report\n" for n in range(3800))
    assert len(huge) > 200_000
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        raw = await api.client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": huge}], extra_headers={"X-Session-Key": "k"})
        answer, notice = raw.parse().choices[0].message.content, raw.headers["X-Switchboard-Notice"]
        second = await api.say("k", "and what was on the first line?")
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    # the notice comes beside the answer (a header), not in it
    assert notice.startswith(f"Your message is {len(huge):,} characters long, more than the model can read at once: "
                             "it is saved whole, but the model sees only its beginning and end (")
    assert answer.startswith("read ") and len(model.requests) == 2  # answered at once, nothing refused or retried
    sent = _last_user(model.requests[0].messages)
    assert sent.startswith("log line 000000") and sent.rstrip().endswith("log line 003799: disk usage nominal, nothing to report")
    assert "characters are left out here: the whole message is too long for the model's context window" in sent
    # the next message is answered, the big one still cut down in its prompt, and the user is not told again
    assert second == "read 31 characters"
    assert any("left out here" in m["content"] for m in model.requests[1].messages if m["role"] == "user")
    assert [(m.role, len(m.content)) for m in stored][0] == ("user", len(huge))  # stored whole


async def test_a_context_length_refusal_that_names_no_window_suggests_compress_or_new_and_is_not_retried(
        tmp_path, model):
    model.script(Fail(400, message="Prompt is too long.", type="invalid_request_error", code="context_length_exceeded"))
    async with running_gateway(tmp_path, model) as gw:  # the gateway believes the window is 32768
        api = ApiClient(gw)
        answer = await api.failure("k", "x" * 8000)
        await api.close()
    assert answer == (400, COMPRESS_LINE)
    assert len(model.requests) == 1


@pytest.mark.parametrize("said", [
    None,  # OpenAI: code context_length_exceeded and the words (the fake's own answer)
    "This model's maximum context length is 1000 tokens. However, you requested 2100 tokens.",  # vLLM: words only
])
async def test_a_context_length_refusal_naming_the_window_is_learned_and_the_turn_fitted_and_retried_once(
        tmp_path, model, said):
    model.context_limit = 1000
    if said is not None:
        model.script(Fail(400, message=said, type="BadRequestError"))
    async with running_gateway(tmp_path, model) as gw:  # the gateway believes the window is 32768
        api = ApiClient(gw)
        answer = await api.say("k", "x" * 8000)
        again = await api.say("k", "and now?")
        windows = gw.health()["models"]["default"]
        await api.close()
    assert answer.startswith("echo: xxxx") and "left out here" in answer  # the message cut to the window
    assert len(model.requests) == 3  # refused, fitted and answered; the next turn fitted at once
    assert again.startswith("echo: and now?")
    assert windows["learned"] == 1000 and windows["fix"].startswith("set model.context_length: 1000")


@pytest.mark.parametrize("status,line", [
    (401, "The model endpoint refused the API key (401): check model.api_key in the config. Your message is saved."),
    (403, "The model endpoint refused access to the model (403): check that model.api_key may use model.name. "
          "Your message is saved."),
    (404, "The model endpoint does not know the model (404): check model.name and model.base_url. "
          "Your message is saved."),
])
async def test_a_refused_request_says_what_to_fix_and_is_not_retried(tmp_path, model, status, line):
    model.script(refusal(status))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        answer = await api.failure("k", "hello")
        again = await api.say("k", "hello again")  # once fixed (here: the fake answers again), the chat goes on
        await api.close()
    assert answer == (502, line) and API_KEY not in answer[1]
    assert again.startswith("echo: hello again | turns: 2")
    assert len(model.requests) == 2  # one call per message: the refusal was not retried


@pytest.mark.parametrize("text", ["word " * 40_000, "長い文章です。" * 20_000, "ascii then " * 8_000 + "漢字" * 30_000])
def test_a_cut_message_fits_and_is_not_cut_again(text):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "user", "content": text}]
    once = shorten_oversized(history, 4_000)
    twice = shorten_oversized(once.messages, 4_000)
    assert estimate_text_tokens(once.messages[-1]["content"]) <= 4_000
    assert once.messages[:2] == history[:2] and len(once.notices) == 1
    assert twice.messages == once.messages and twice.notices == ()
    assert history[-1]["content"] == text  # the caller's history (the stored one) is left whole


async def test_an_answer_without_any_choice_gets_the_user_a_clear_line_and_the_next_message_works(tmp_path, model):
    model.script(NoChoice())
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        broken = await api.failure("k", "hello?")
        fine = await api.say("k", "and now?")
        await api.close()
    assert broken[0] == 503 and broken[1] == ("The model is unavailable right now (the model endpoint answered without a choice: check "
                      "model.base_url). Your message is saved; send another message to try again.")
    assert fine.startswith("echo: and now? | turns: 2")
