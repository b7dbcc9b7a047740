"""WhatsApp's statuses (sent, delivered, read, failed) on the delivery record, as the operator sees them
in ``switchboard deliveries list``: through the whole daemon against tests/fakes/whatsapp.py, and at
the store on SQLite and PostgreSQL (late statuses never undo further ones; a deleted session takes its
receipts with it).

    .venv/bin/python -m pytest -q -n 0 tests/test_delivery_receipts.py
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import state
from gateway.cli.main import main
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.fakes.whatsapp import FakeWhatsApp
from tests.harness import eventually, gateway_config
from tests.platformkit.whatsapp import settings_for

ANN, BOB = "4915100000001", "4915100000002"


def deliveries(home, *args: str) -> str:
    result = CliRunner().invoke(main, ["deliveries", "list", "--home", str(home), *args])
    assert result.exit_code == 0, result.output
    return result.output


async def test_the_operator_sees_each_reply_delivered_read_or_failed_with_metas_reason(tmp_path):
    home = tmp_path / "home"
    async with FakeModel() as model, FakeWhatsApp() as wa:
        config = gateway_config(home, model.base_url, auth={"allowed_users": [f"whatsapp:{ANN}", f"whatsapp:{BOB}"]},
                                platforms={"whatsapp": settings_for(wa)})
        gw = Gateway(config, serve_api=True)
        await gw.start()
        try:
            wa.webhook_url = f"http://127.0.0.1:{gw.api.bound_port}/whatsapp/webhook"
            wa.text(ANN, "hello")
            wa.text(BOB, "hi there")
            await eventually(lambda: wa.texts_to(ANN) and wa.texts_to(BOB), 20, "both replies sent")
            [to_ann] = [m["id"] for m in wa.sent if m["to"] == ANN]
            [to_bob] = [m["id"] for m in wa.sent if m["to"] == BOB]
            assert "-" in deliveries(home, "--platform", "whatsapp")  # nothing reported yet

            # Meta's webhooks, each its own request: read may come before delivered, and a late
            # delivered must not undo it
            wa.status(to_ann, "sent", ANN)
            wa.status(to_ann, "read", ANN)
            wa.status(to_ann, "delivered", ANN)
            wa.status(to_bob, "failed", BOB, code=131026)
            await wa.drained()
        finally:
            await gw.stop(grace_seconds=5)
        assert all(d.status == 200 for d in wa.deliveries[-4:])  # each acknowledged only once kept

    shown = deliveries(home)
    [ann_line] = [line for line in shown.splitlines() if ANN in line]
    [bob_line] = [line for line in shown.splitlines() if BOB in line]
    assert " sent " in ann_line and " read " in ann_line and "delivered" not in ann_line
    assert " failed " in bob_line and "131026" in bob_line and "Message Undeliverable" in bob_line

    rows = json.loads(deliveries(home, "--json"))
    assert {r["chat_id"]: (r["status"], r["receipt"]) for r in rows} == {ANN: ("sent", "read"),
                                                                       BOB: ("sent", "failed")}
    assert "131026" in next(r["receipt_error"] for r in rows if r["chat_id"] == BOB)


async def test_a_reply_the_24_hour_window_refused_is_shown_failed_saying_why(tmp_path):
    home = tmp_path / "home"
    async with FakeModel(delay=1.5) as model, FakeWhatsApp() as wa:
        wa.window_seconds = 0.5  # the window closes while the model thinks (no template configured)
        config = gateway_config(home, model.base_url, auth={"allowed_users": [f"whatsapp:{ANN}"]},
                                platforms={"whatsapp": settings_for(wa)})
        gw = Gateway(config, serve_api=True)
        await gw.start()
        try:
            wa.webhook_url = f"http://127.0.0.1:{gw.api.bound_port}/whatsapp/webhook"
            wa.text(ANN, "hello")

            async def settled():
                return [r for r in await gw.db.receipts.deliveries() if r["status"] == "failed"]

            await eventually(settled, 20, "the reply recorded as failed")
        finally:
            await gw.stop(grace_seconds=5)
        assert wa.texts_to(ANN) == []
    [line] = [line for line in deliveries(home).splitlines() if ANN in line]
    assert " failed " in line and "24 hours" in line  # the reason, plainly (the rest of it in --json)
    [row] = json.loads(deliveries(home, "--json"))
    assert "131047" in row["error"] and "template_name" in row["error"]


async def test_signals_delivery_and_read_receipts_show_on_the_replies_too(tmp_path):
    from tests.fakes.signal_cli import FakeSignalCli

    home, carol = tmp_path / "home", "+4915100000003"
    async with FakeModel() as model, FakeSignalCli() as sc:
        config = gateway_config(home, model.base_url, auth={"allowed_users": [f"signal:{carol}"]},
                                platforms={"signal": {"account": sc.account, "http_url": sc.url}})
        gw = Gateway(config)
        await gw.start()
        try:
            sc.dm(carol, "hello")
            await eventually(lambda: [m for m in sc.sent if m["chat"] == carol], 20, "the reply sent")
            [stamp] = [m["timestamp"] for m in sc.sent if m["chat"] == carol]
            sc.receipt(carol, [stamp], read=True)
            sc.receipt(carol, [stamp])  # the delivery receipt, after the read one

            async def kept():
                return [r for r in await gw.db.receipts.deliveries(platform="signal") if r["receipt"] == "read"]

            await eventually(kept, 20, "the read receipt kept")
        finally:
            await gw.stop(grace_seconds=5)
    [line] = [line for line in deliveries(home, "--platform", "signal").splitlines() if carol in line]
    assert " sent " in line and " read " in line


async def test_a_status_the_store_cannot_keep_is_not_acknowledged_so_meta_sends_it_again(tmp_path):
    from adapters.whatsapp import WhatsAppAdapter, WhatsAppConfig
    from gateway.types import ChatRef, Receipt
    from tests.test_whatsapp import serving

    kept: list[Receipt] = []
    failures = iter([True])

    async def keep(receipt: Receipt) -> None:
        if next(failures, False):
            raise OSError("the store is busy")
        kept.append(receipt)

    async with FakeWhatsApp() as wa:
        adapter = WhatsAppAdapter(WhatsAppConfig(access_token=wa.token, phone_number_id=wa.phone_number_id,
                                                 app_secret=wa.app_secret, verify_token=wa.verify_token,
                                                 api_base_url=wa.base_url))
        adapter.report_receipts(keep)
        async with serving(adapter) as url:
            wa.webhook_url = url

            async def ignore(message) -> None:
                return None

            await adapter.start(ignore)
            try:
                wa.text(ANN, "hello")
                await wa.drained()
                [wamid] = (await adapter.send(ChatRef("whatsapp", ANN), "hi")).message_ids
                wa.status(wamid, "delivered", ANN)
                await wa.drained()
            finally:
                await adapter.stop()
        status_posts = [d.status for d in wa.deliveries][-2:]
    assert status_posts == [500, 200]  # refused while it could not be kept, then taken on Meta's retry
    assert [(r.message_id, r.status) for r in kept] == [(wamid, "delivered")]


# -- the store, on both engines


@pytest.fixture
def db(store):
    store.sessions.create("s1", "whatsapp")
    store.recovery.settle_inbox([], state.DeliveryRecord("d1", "whatsapp", ANN, text="two parts", kind="notice"),
                                session_id="s1")
    store.recovery.update_delivery("d1", sent_ids=["wamid.A", "wamid.B"], status="sent")
    return store


def test_a_receipt_only_moves_forward_and_a_reply_is_read_once_every_part_is(db):
    assert db.receipts.record("whatsapp", "wamid.A", "read", at=10.0)
    assert not db.receipts.record("whatsapp", "wamid.A", "delivered", at=11.0)  # late: kept as read
    [row] = db.receipts.deliveries(platform="whatsapp")
    assert (row["receipt"], row["receipts"]["wamid.A"]["status"]) == ("sent", "read")  # part B unreported
    db.receipts.record("whatsapp", "wamid.B", "delivered", at=12.0)
    assert db.receipts.deliveries(session_id="s1")[0]["receipt"] == "delivered"
    db.receipts.record("whatsapp", "wamid.B", "read", at=13.0)
    assert db.receipts.deliveries()[0]["receipt"] == "read"
    assert db.receipts.deliveries(platform="telegram") == []
    with pytest.raises(ValueError, match="sent, delivered, read, failed"):
        db.receipts.record("whatsapp", "wamid.A", "exploded")


def test_a_failed_part_fails_the_reply_with_its_reason_and_a_deleted_session_takes_its_receipts(db):
    db.receipts.record("whatsapp", "wamid.A", "read")
    db.receipts.record("whatsapp", "wamid.B", "failed", "error 131026: Message Undeliverable.")
    [row] = db.receipts.deliveries()
    assert (row["receipt"], row["receipt_error"]) == ("failed", "error 131026: Message Undeliverable.")
    assert db.sessions.delete("s1")
    assert db.receipts.of("whatsapp", ["wamid.A", "wamid.B"]) == {}
