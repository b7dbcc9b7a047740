"""What a budget is charged for a call that failed: nothing when it never reached a model (a refused
connection, an HTTP error answer such as a 429 or a 500 without usage), what the model reported when it
answered.  Through the real daemon and the real openai client, along a fallback chain of fake model
servers in an outage: a closed port, one answering 500, one answering 429 with a long Retry-After."""

from __future__ import annotations

from gateway.budgets import period_key
from tests.fakes.model_server import Fail, FakeModel
from tests.harness import ApiClient, running_gateway
from tests.test_model_fallback import Refusing, answering, chain, closed_port, ledger, named


async def test_an_outage_through_the_fallback_chain_charges_only_the_call_that_answered(tmp_path):
    async with FakeModel() as busy, FakeModel() as limited, FakeModel() as good:
        busy.script(*[Fail(500)] * 4)
        limited.script(Fail(429, retry_after=10))  # past max_wait_seconds: on to the next at once
        answering(good, "answered by the last one")
        models = {"busy": named(busy, "m-busy"), "limited": named(limited, "m-limited"), "good": named(good, "m-good")}
        async with running_gateway(tmp_path, Refusing(closed_port()), models=models,
                                   budgets={"rules": [{"scope": "user:api:ann", "period": "day", "tokens": 100_000}]},
                                   **chain("busy", "limited", "good")) as gw:
            api = ApiClient(gw)
            try:
                assert await api.say("ann", "hello " * 200) == "answered by the last one"
            finally:
                await api.close()
            rows = await ledger(gw, 4)
            await gw.services.usage.drain()
            day = period_key("day", gw.services.budgets.clock(), gw.config.tzinfo)
            spent = await gw.db.budgets.spent(["user:api:ann", "gateway"], [day])
            (state,) = await gw.services.budgets.states(("user:api:ann",))
    charged = {r["model"]: (r["outcome"], r["prompt_tokens"] + r["completion_tokens"], r["estimated"]) for r in rows}
    answered = charged.pop("m-good")
    assert answered[0] == "ok" and answered[1] > 200 and answered[2] == 0, "what the model reported"
    assert charged == {"m-primary": ("failed", 0, 0), "m-busy": ("failed", 0, 0), "m-limited": ("failed", 0, 0)}
    assert spent[("user:api:ann", day)] == (0.0, answered[1]), "the budget holds only the answered call"
    assert state.used == answered[1]
