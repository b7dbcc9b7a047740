"""The Usage page's chart (gateway.charts.usage_svg): an inline SVG a reader sees as one bar per day,
stacked by purpose, and the cost per day below; parsed here as XML, as a browser would."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

from gateway.charts import PURPOSE_COLORS, usage_svg
from gateway.insights import DailyChart, daily_chart, from_summary, window
from state import SessionDB

NS = {"svg": "http://www.w3.org/2000/svg"}
EVIL = '<script>alert("x")</script>&"><img onerror=alert(1)>'


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def days_of(root: ET.Element) -> list[ET.Element]:
    return root.findall(".//svg:g[@class='day']", NS)


def text(element: ET.Element, path: str) -> str:
    found = element.find(path, NS)
    assert found is not None, path
    return "".join(found.itertext())


def test_one_bar_per_day_one_segment_per_purpose_with_its_tokens_and_the_days_cost():
    chart = DailyChart(dates=["2026-11-01", "2026-11-02", "2026-11-03"],
                       tokens={"turn": [1_200, 0, 3_000], "tool_loop": [300, 0, 1_000], "cron": [0, 0, 500]},
                       cost=[0.0123, 0.0, 0.5], calls=[4, 0, 9], unpriced_calls=[0, 0, 2])
    root = parse(usage_svg(chart, title="Model calls, last 3 days"))
    assert text(root, "svg:title") == "Model calls, last 3 days"
    days = days_of(root)
    assert [d.get("data-date") for d in days] == chart.dates
    seen = {}
    for day in days:
        segments = day.findall("svg:rect[@class='segment']", NS)
        seen[day.get("data-date")] = [(s.get("data-purpose"), text(s, "svg:title")) for s in segments]
        heights = {s.get("data-purpose"): float(s.get("height")) for s in segments}
        ys = [float(s.get("y")) for s in segments]
        assert ys == sorted(ys, reverse=True)  # stacked: each segment above the one before
        for purpose, height in heights.items():  # heights in proportion to the tokens
            tokens = chart.tokens[purpose][chart.dates.index(day.get("data-date"))]
            assert abs(height / heights["turn"] - tokens / chart.tokens["turn"][chart.dates.index(
                day.get("data-date"))]) < 0.01
        assert all(s.get("fill") == PURPOSE_COLORS[s.get("data-purpose")] for s in segments)
    assert seen == {
        "2026-11-01": [("turn", "turn on 2026-11-01: 1,200 tokens"),
                       ("tool_loop", "tool_loop on 2026-11-01: 300 tokens")],
        "2026-11-02": [],  # nothing that day: an empty slot
        "2026-11-03": [("turn", "turn on 2026-11-03: 3,000 tokens"), ("tool_loop", "tool_loop on 2026-11-03: 1,000 tokens"),
                       ("cron", "cron on 2026-11-03: 500 tokens")],
    }
    assert [text(d, "svg:title") for d in days] == [
        "2026-11-01: 1,500 tokens, $0.0123", "2026-11-02: 0 tokens, $0.00",
        "2026-11-03: 4,500 tokens, $0.5000 + 2 call(s) with no price"]
    costs = [d.find("svg:rect[@class='cost']", NS) for d in days]
    assert [text(c, "svg:title") for c in costs] == [
        "2026-11-01: $0.0123", "2026-11-02: $0.00", "2026-11-03: $0.5000 + 2 call(s) with no price"]
    assert float(costs[2].get("height")) > float(costs[0].get("height")) > float(costs[1].get("height")) == 0
    legend = [text(item, "svg:text") for item in root.findall(".//svg:g[@class='legend-item']", NS)]
    assert legend == ["turn", "tool_loop", "cron"]
    labels = [t.text for t in root.findall(".//svg:text[@class='date']", NS)]
    assert labels == ["11-01", "11-02", "11-03"]


def test_every_label_is_escaped_and_nothing_runs():
    chart = DailyChart(dates=["2026-11-01"], tokens={EVIL: [10]}, cost=[0.0], calls=[1], unpriced_calls=[1])
    svg = usage_svg(chart, title=EVIL)
    root = parse(svg)
    assert "<script" not in svg and "<img" not in svg
    assert not [e for e in root.iter() if e.tag.endswith("script") or e.tag.endswith("foreignObject")]
    assert not [name for e in root.iter() for name in e.attrib if name.lower().startswith("on")]
    assert text(root, "svg:title") == EVIL
    (segment,) = root.findall(".//svg:rect[@class='segment']", NS)
    assert segment.get("data-purpose") == EVIL and text(segment, "svg:title") == f"{EVIL} on 2026-11-01: 10 tokens"
    assert [text(i, "svg:text") for i in root.findall(".//svg:g[@class='legend-item']", NS)] == [EVIL]
    # no call had a price: no cost bars, and the chart says so
    assert root.findall(".//svg:rect[@class='cost']", NS) == []
    assert text(root, ".//svg:text[@class='no-price']").startswith("cost: no price")


def test_an_empty_window_says_so():
    chart = DailyChart(dates=["2026-11-01", "2026-11-02"], tokens={}, cost=[0.0, 0.0], calls=[0, 0],
                       unpriced_calls=[0, 0])
    root = parse(usage_svg(chart))
    assert days_of(root) == []
    assert text(root, ".//svg:text[@class='empty']") == "No model calls in these days."


def test_the_chart_of_a_ledger_has_its_days_purposes_and_costs(tmp_path):
    now = time.time()
    since, dates = window(3, now)
    with SessionDB(tmp_path / "state.db") as db:
        for purpose, at, tokens, cost in (("turn", since + 3_600, 100, 0.25), ("turn", now - 1, 40, None),
                                          ("compression", now - 1, 60, 0.5), ("cron", since + 3_600, 7, 0.125)):
            db.usage.record_call({"at": at, "purpose": purpose, "model": "m", "outcome": "ok",
                                  "prompt_tokens": tokens, "cost": cost})
        chart = daily_chart(from_summary(db.usage.summary(since, "purpose"), dates),
                            from_summary(db.usage.summary(since, "day"), dates))
    root = parse(usage_svg(chart))
    days = {d.get("data-date"): d for d in days_of(root)}
    assert list(days) == dates
    assert [s.get("data-purpose") for s in days[dates[0]].findall("svg:rect[@class='segment']", NS)] == ["turn", "cron"]
    assert days[dates[1]].findall("svg:rect[@class='segment']", NS) == []
    assert [text(s, "svg:title") for s in days[dates[2]].findall("svg:rect[@class='segment']", NS)] == [
        f"turn on {dates[2]}: 40 tokens", f"compression on {dates[2]}: 60 tokens"]
    assert text(days[dates[0]], "svg:title") == f"{dates[0]}: 107 tokens, $0.3750"
    assert text(days[dates[2]], "svg:title") == f"{dates[2]}: 100 tokens, $0.5000 + 1 call(s) with no price"
