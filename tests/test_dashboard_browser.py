"""The dashboard in a real browser: Debian's chromium, headless, driven by playwright.

It logs in, searches, opens a transcript, runs a cron job now and approves a pairing, and saves a
screenshot of each page under tests/artifacts/ (not committed) for a person to look at.  The page's
own script (the health panel's refresh) runs under the real Content-Security-Policy; any console
error (a refused script, a failed load) or dialog (an escaped payload that ran after all) fails.

Never a downloaded browser: ``executable_path`` is Debian's ``/usr/bin/chromium``, which ``make test``
installs when it runs as root; without it these tests skip and say so.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.harness import eventually
from tests.test_dashboard import JOB, TOKEN, base, dashboard, model, seed  # noqa: F401 - model is a fixture

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent / "artifacts"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"Debian's chromium is not installed at {CHROMIUM}: `make test` installs it when run as root "
           "(or: apt-get install chromium)")


@pytest.fixture
async def browser():
    async with playwright_api.async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            yield chromium
        finally:
            await chromium.close()


class Watched:
    """A page whose console errors, page errors and dialogs are collected (each one fails the test)."""

    def __init__(self, page):
        self.page = page
        self.problems: list[str] = []
        self.refused: list[tuple[int, str]] = []  # responses of 400 or more: (status, path)
        page.on("console", self._console)
        page.on("response", lambda r: self.refused.append((r.status, r.url.split("/", 3)[3])) if r.status >= 400 else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("dialog", self._dialog)

    def _console(self, message) -> None:
        if message.type == "error" and not message.text.startswith("Failed to load resource"):  # those: self.refused
            self.problems.append(f"console {message.type}: {message.text}")

    async def _dialog(self, dialog) -> None:
        self.problems.append(f"a dialog opened: {dialog.message}")
        await dialog.dismiss()

    async def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        await self.page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


async def test_an_operator_logs_in_searches_reads_runs_a_job_and_approves_a_pairing(tmp_path, model, browser):  # noqa: F811
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        watched = Watched(await context.new_page())
        page = watched.page
        root = base(gw)

        # not logged in: the log-in form, whatever page was asked for
        await page.goto(root + "/ui/sessions")
        assert page.url == root + "/ui/login"
        await watched.shot("login")
        await page.fill("#token", "not the token")
        await page.click("button[type=submit]")
        assert "That is not the API token." in await page.inner_text("[role=alert]")
        await page.fill("#token", TOKEN)
        await page.click("button[type=submit]")
        assert page.url == root + "/ui/"
        assert TOKEN not in page.url and TOKEN not in await page.content()
        cookies = await context.cookies()
        assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [("switchboard_ui", True, "Strict")]
        assert await page.inner_text("h1") == "Health"
        await watched.shot("health")

        # the health panel refreshes itself (the page's script, allowed by the CSP)
        await gw.db.dead_letters.add(platform="slack", event_id="EvLate", payload="{}", message=None,
                                    error="handler failed")
        await page.wait_for_selector("text=EvLate", timeout=15_000)

        # search: highlighted snippets; the hostile message is shown as text
        await page.click("nav >> text=Sessions")
        await page.fill("input[name=q]", "needle")
        await page.click("form.filters button[type=submit]")
        marks = await page.locator("#hits mark").all_inner_texts()
        assert marks and all(m.lower() == "needle" for m in marks)
        # a conversation is one row: the hostile message is its other match; a search for it alone shows it
        assert "and 1 more match" in await page.inner_text("#hits")
        await page.fill("input[name=q]", "hello")
        await page.click("form.filters button[type=submit]")
        assert await page.locator("img[src=x]").count() == 0
        assert "<img src=x onerror=alert(1)>" in await page.inner_text("#hits")
        await watched.shot("search")

        # a search the parser cannot read finds nothing, and says so
        await page.fill("input[name=q]", '"unclosed AND (')
        await page.click("form.filters button[type=submit]")
        assert await page.inner_text("#no-matches") == "No matches."

        # a transcript, with its lineage and the compression summary
        await page.goto(root + "/ui/sessions?q=Porto")
        await page.click("#hits a")
        assert await page.inner_text("h1") == "Trip planning #2"
        assert "parent Trip planning" in await page.inner_text("#lineage")
        assert "They want three days in Lisbon in May." in await page.inner_text("#summary")
        await watched.shot("transcript")
        await page.goto(root + "/ui/sessions/s-evil")
        assert await page.inner_text("h1") == "<script>alert('title')</script>"
        await watched.shot("transcript-hostile")

        # cron: run now; the run shows in the job's history, running, and changes there by itself when it ends
        await page.click("nav >> text=Cron")
        await watched.shot("cron")
        model.delay = 1.5  # the model takes its time: the page shows the run still running
        await page.click("#jobs >> text=Run now")
        assert "Started run #" in await page.inner_text("#started")
        assert "running" in await page.inner_text("#runs")
        model.delay = 0
        run = (await gw.db.cron.list_runs("digest"))[0]
        await eventually(lambda: _ended(gw, run["id"]), 10, "the cron run to end")
        await page.wait_for_selector("#runs >> text=kept in the store (local)", timeout=10_000)  # no reload
        await watched.shot("cron-run")

        # pairing: the stranger's code, approved with one press
        await page.click("nav >> text=Pairing")
        assert "ABCD2345" in await page.inner_text("#pending")
        await watched.shot("pairing")
        await page.click("#pending >> text=Approve")
        assert "Approved telegram:999" in await page.inner_text("#approved-now")
        assert await gw.db.pairing.is_approved("telegram", "999")
        await watched.shot("pairing-approved")

        # usage: the chart of the days (inline SVG, no script) and one row per model
        for hours_ago, purpose, tokens in ((30, "turn", 1200), (30, "compression", 800), (2, "turn", 600)):
            await gw.db.usage.record_call({"at": time.time() - hours_ago * 3600, "purpose": purpose, "model": "gpt-x",
                                           "outcome": "ok", "prompt_tokens": tokens, "completion_tokens": 100,
                                           "cost": tokens / 1e5})
        await page.click("nav >> text=Usage")
        await page.select_option("select[name=by]", "purpose")
        await page.fill("input[name=days]", "7")
        await page.click("form.filters button[type=submit]")
        assert await page.locator("svg.usage-chart g.day").count() == 7
        assert await page.locator("svg.usage-chart rect.segment").count() >= 2
        assert "compression" in await page.inner_text("#usage")
        await watched.shot("usage")

        # unknown ids: the 404 page
        response = await page.goto(root + "/ui/sessions/no-such-session")
        assert response.status == 404 and "404 · Not found" in await page.inner_text("h1")

        # logging out: back to the form, and the pages are closed again
        await page.goto(root + "/ui/")
        await page.click("text=Log out")
        assert page.url == root + "/ui/login"
        await page.goto(root + "/ui/pairing")
        assert page.url == root + "/ui/login"
        await context.close()
        assert watched.problems == []
        # the wrong token and the unknown session; no other page, script or image was refused
        assert watched.refused == [(401, "ui/login"), (404, "ui/sessions/no-such-session")]


async def test_a_framing_page_cannot_show_the_dashboard(tmp_path, model, browser):  # noqa: F811
    async with dashboard(tmp_path, model, token=None) as gw:
        await seed(gw)
        page = await browser.new_page()
        async with page.expect_console_message(lambda m: "frame" in m.text.lower(), timeout=15_000) as said:
            await page.set_content(f'<iframe id="f" src="{base(gw)}/ui/sessions"></iframe>')
        message = (await said.value).text
        assert "frame-ancestors" in message and "blocked" in message, message
        assert await page.frame_locator("#f").locator("text=Trip planning").count() == 0
        await page.close()


async def _ended(gw, run_id: int) -> bool:
    return (await gw.db.cron.get_run(run_id))["status"] != "running"


MARKDOWN_ANSWER = (
    "Here is **the plan**, with `make run` first:\n\n"
    "```python\nfor attempt in range(3):  # a long line that is wider than any phone screen, so its block scrolls\n"
    "    deploy(attempt)\n```\n\n"
    "| step | what it does on the machine, at some length | where |\n|---|---|---|\n"
    "| 1 | installs every package and starts the daemon | /srv/switchboard/a/rather/long/path/name |\n\n"
    "- one\n- two, see [the docs](https://example.com/docs)\n\n"
    "<script>alert('md')</script> ![a tracking pixel](https://tracker.example/p.png)")
PHONE = {"width": 390, "height": 844}


async def test_on_a_phone_nothing_runs_off_the_page_and_the_header_keeps_its_height(tmp_path, model, browser):  # noqa: F811
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        long_id = "s-" + "0123456789abcdef" * 3
        await gw.db.sessions.create(long_id, "telegram", user_id="12345678901234567890", user_name="Ann",
                                   title="A session with a title long enough to wrap on a phone screen")
        await gw.db.messages.append(long_id, "user", "how do I deploy it?")
        await gw.db.messages.append(long_id, "assistant", MARKDOWN_ANSWER)
        await gw.cron.run_job("digest")
        await gw.db.usage.record_call({"at": time.time() - 60, "purpose": "turn", "model": "a-model-with-a-long-name-v2",
                                       "platform": "telegram", "user_id": "12345678901234567890", "outcome": "ok",
                                       "prompt_tokens": 123456, "completion_tokens": 7890, "cost": 1.25})
        context = await browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
        watched = Watched(await context.new_page())
        page = watched.page
        root = base(gw)

        async def measure(name: str) -> dict:
            await watched.shot(f"phone-{name}")
            return await page.evaluate("""() => {
                const header = document.querySelector("header.top").getBoundingClientRect();
                return {scroll: document.documentElement.scrollWidth, width: window.innerWidth,
                        header: header.height, headerWidth: header.width};
            }""")

        await page.goto(root + "/ui/login")
        before = await measure("login")
        assert before["width"] == 390 and before["scroll"] <= 390, before
        await page.fill("#token", TOKEN)
        await page.click("button[type=submit]")
        assert page.url == root + "/ui/"
        pages = {"health": "/ui/", "sessions": "/ui/sessions", "search": "/ui/sessions?q=needle",
                 "transcript": f"/ui/sessions/{long_id}", "transcript-hostile": "/ui/sessions/s-evil",
                 "cron": "/ui/cron", "cron-job": "/ui/cron/digest", "usage": "/ui/usage?days=7&by=user",
                 "pairing": "/ui/pairing"}
        for name, path in pages.items():
            await page.goto(root + path)
            found = await measure(name)
            # the page is never wider than the screen (a wide table scrolls in its own box) ...
            assert found["scroll"] <= 390, (name, found)
            # ... and the header spans it, as high as before the log-in, with the menu and Log out in it
            assert found["headerWidth"] == 390 and found["header"] == before["header"], (name, found, before)
        assert await page.locator("header.top >> text=Log out").is_visible()

        # the transcript: Markdown rendered, code in a monospace font, nothing of the raw HTML run or loaded
        await page.goto(root + f"/ui/sessions/{long_id}")
        assert await page.inner_text(".message.assistant strong") == "the plan"
        font = await page.evaluate("getComputedStyle(document.querySelector('.md pre code')).fontFamily")
        assert "monospace" in font, font
        assert "deploy(attempt)" in await page.inner_text(".md pre")
        assert await page.locator(".md table td", has_text="installs every package").count() == 1
        assert await page.locator(".message img").count() == 0
        assert await page.get_attribute(".md a >> text=a tracking pixel", "href") == "https://tracker.example/p.png"
        assert "<script>alert('md')</script>" in await page.inner_text(".message.assistant")
        await context.close()
        assert watched.problems == []
        assert watched.refused == []


async def test_turning_a_budget_off_or_resetting_it_asks_first_and_cancel_changes_nothing(tmp_path, browser):
    from tests.fakes.model_server import FakeModel
    from tests.harness import running_gateway

    async with FakeModel() as fake, running_gateway(
            tmp_path, fake, ui={"enabled": True}, api={"token": TOKEN},
            budgets={"rules": [{"scope": "gateway", "period": "month", "cost": 10}]}) as gw:
        page = await browser.new_page()
        asked: list[str] = []

        async def answer(dialog) -> None:
            asked.append(dialog.message)
            await (dialog.accept() if len(asked) > 1 else dialog.dismiss())  # Cancel first, then OK

        page.on("dialog", answer)
        root = base(gw)
        await page.goto(root + "/ui/login")
        await page.fill("#token", TOKEN)
        await page.click("button[type=submit]")
        await page.goto(root + "/ui/budgets")
        await page.click("button:has-text('Turn off')")
        await page.goto(root + "/ui/budgets")  # nothing was sent: the rule is still there
        assert [s.rule.name for s in await gw.services.budgets.listing()] == ["gateway/month/cost"]
        await page.click("button:has-text('Turn off')")
        await eventually(lambda: page.url.startswith(root + "/ui/budgets?"), 10, "the rule turned off")
        assert asked == ["Turn off the rule gateway/month/cost? Nothing it limits is limited until it is set again."] * 2
        assert [s.rule.name for s in await gw.services.budgets.listing()] == []
        await page.close()


async def test_on_a_phone_every_action_button_is_on_screen_and_the_chart_text_is_readable(tmp_path, model, browser):  # noqa: F811
    from tests.harness import running_gateway

    async with running_gateway(tmp_path, model, ui={"enabled": True}, api={"token": TOKEN}, cron={"jobs": [JOB]},
                               budgets={"rules": [{"scope": "gateway", "period": "month", "cost": 10}]}) as gw:
        await seed(gw)
        await gw.db.pairing.request("telegram", "31337", "Ann", "WXYZ2345", now=time.time(), ttl=3600, max_pending=3)
        await gw.db.pairing.approve("telegram", "WXYZ2345")
        await gw.db.usage.record_call({"at": time.time() - 60, "purpose": "turn", "model": "gpt-x", "outcome": "ok",
                                       "prompt_tokens": 1200, "completion_tokens": 100, "cost": 0.01})
        context = await browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
        watched = Watched(await context.new_page())
        page = watched.page
        root = base(gw)
        await page.goto(root + "/ui/login")
        await page.fill("#token", TOKEN)
        await page.click("button[type=submit]")
        # each button, scrolled to vertically as a thumb would, is wholly on the screen and not hidden by its box
        where = """(selector) => [...document.querySelectorAll(selector)].map(b => {
            b.scrollIntoView({block: "center", inline: "nearest"});
            document.querySelectorAll(".scroll").forEach(s => { s.scrollLeft = 0; });  // no sideways swipe
            const r = b.getBoundingClientRect();
            const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
            return {text: b.innerText, left: r.left, right: r.right, shown: hit === b || b.contains(hit)};
        })"""
        for path, selector, texts in (("/ui/pairing", "#pending button, #approved button", ["Approve", "Revoke"]),
                                      ("/ui/budgets", "#budgets button", ["Set", "Reset spent", "Turn off"]),
                                      ("/ui/cron", "#jobs button", ["Run now", "Pause"])):
            await page.goto(root + path)
            await watched.shot("phone-actions" + path.replace("/", "-"))
            buttons = await page.evaluate(where, selector)
            assert [b["text"] for b in buttons] == texts, (path, buttons)
            for b in buttons:
                assert b["left"] >= 0 and b["right"] <= 390 and b["shown"], (path, b)
            assert await page.evaluate("document.documentElement.scrollWidth") <= 390, path
        # the chart's labels are at least 10 px tall on the screen (the chart scrolls in its box instead)
        await page.goto(root + "/ui/usage?days=7")
        await watched.shot("phone-usage-chart")
        sizes = await page.evaluate("""() => {
            const svg = document.querySelector("svg.usage-chart");
            const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
            return [...svg.querySelectorAll("text")].map(t => parseFloat(getComputedStyle(t).fontSize) * scale);
        }""")
        assert sizes and min(sizes) >= 10, sizes
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        await context.close()
        assert watched.problems == []
