"""The analytics pages in a real browser: Playwright driving Debian's Chromium against
pytest-django's live server, on the traffic of test_views, with tests/e2e's tabs (signed in,
console errors collected, axe-core's check).

Without Chromium they skip and say so, except where TOOLGATE_REQUIRE_SERVICES=1 (CI), where they
fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connections
from playwright.sync_api import Browser, sync_playwright

from approvals.services import confirmation_reject
from orders.models import Order
from tests.analytics.test_views import Clock, Traffic, calls_where, record_traffic
from tests.conftest import MakeAgent, require_service
from tests.e2e import conftest as e2e
from tests.e2e.conftest import CHROMIUM, MakeBrowserUser, OpenTab, Tab

# With the reviewers' browser tests under `-m browser`.
pytestmark = pytest.mark.browser

# tests/e2e's fixtures, for this module's tests: signed-in tabs that collect console errors and
# run axe-core, and users with the tabs' password. They open this module's `browser`.
open_tab = e2e.open_tab
browser_user = e2e.browser_user

CHARTS = (
    "rejection_over_time",
    "recovery_by_tool",
    "stuck_by_tool",
    "confirmation_outcomes",
    "decision_times",
)


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    """tests/e2e's browser, which also closes the connection the test's own reads got."""
    require_service(
        Path(CHROMIUM).is_file(),
        f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium, or set "
        "TOOLGATE_CHROMIUM); they were skipped",
    )
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()
        # While Playwright runs, Django gives the test's own reads a connection of their own:
        # left open, it would keep the test database on PostgreSQL from being dropped.
        connections.close_all()


def drawn_charts(tab: Tab) -> dict[str, dict[str, Any]]:
    """What each chart on the page holds once drawn: its labels and, per dataset, its label
    and values."""
    tab.page.wait_for_function(
        """() => document.querySelectorAll('canvas[data-drawn=true]').length
            === document.querySelectorAll('canvas[data-chart]').length"""
    )
    drawn: dict[str, dict[str, Any]] = tab.page.evaluate(
        """() => Object.fromEntries(Object.entries(window.analyticsCharts).map(
            ([name, chart]) => [name, {
                labels: chart.data.labels,
                datasets: chart.data.datasets.map((d) => ({label: d.label, data: d.data})),
                drawnBars: chart.getDatasetMeta(0).data.length,
            }]))"""
    )
    return drawn


def click_bar(tab: Tab, chart: str, series: str, index: int) -> None:
    """Click one bar of a chart, where the reader would."""
    tab.page.locator(f"canvas[data-chart={chart}]").scroll_into_view_if_needed()
    point = tab.page.evaluate(
        """([name, label, index]) => {
            const chart = window.analyticsCharts[name];
            const dataset = chart.data.datasets.findIndex((d) => d.label === label);
            const bar = chart.getDatasetMeta(dataset).data[index].getCenterPoint();
            const box = chart.canvas.getBoundingClientRect();
            return {x: box.left + bar.x, y: box.top + bar.y};
        }""",
        [chart, series, index],
    )
    with tab.page.expect_navigation():
        tab.page.mouse.click(point["x"], point["y"])


def listed_calls(tab: Tab) -> set[str]:
    ids = tab.page.locator("li.an-call").evaluate_all("items => items.map((i) => i.id)")
    return {str(item).removeprefix("call-") for item in ids}


@pytest.fixture
def decided_traffic(
    browser_user: MakeBrowserUser,
    make_agent: MakeAgent,
    monkeypatch: pytest.MonkeyPatch,
    orders: dict[str, Order],
) -> Traffic:
    """test_views' traffic sent ten minutes ago, its held call rejected by a reviewer now:
    every chart has data, the time to decision too."""
    clock = Clock(monkeypatch)
    clock.now -= timedelta(minutes=10)
    traffic = record_traffic(make_agent, clock)
    confirmation_reject(
        confirmation_id=traffic.held.pk,
        reviewer=browser_user("rita", "reviewers"),
        reason="The parcel is on its way back.",
    )
    browser_user("max", "managers")
    return traffic


def test_a_manager_sees_every_chart_drawn_with_data(
    decided_traffic: Traffic, open_tab: OpenTab
) -> None:
    tab = open_tab("max")

    tab.page.goto("/analytics/")

    charts = drawn_charts(tab)
    assert sorted(charts) == sorted(CHARTS)
    for name, chart in charts.items():
        assert chart["drawnBars"] == len(chart["labels"]) > 0, name
        assert any(value for dataset in chart["datasets"] for value in dataset["data"]), name
    assert charts["confirmation_outcomes"]["labels"] == ["rejected"]
    assert charts["decision_times"]["labels"] == ["all held calls", "rita"]
    # The figures are one click away, as a table, once the charts are drawn.
    assert tab.page.locator("details.an-data[open]").count() == 0
    tab.check_accessibility()


def test_a_bar_leads_to_the_calls_behind_it(decided_traffic: Traffic, open_tab: OpenTab) -> None:
    tab = open_tab("max")
    tab.page.goto("/analytics/")
    series = drawn_charts(tab)["rejection_over_time"]["datasets"]
    values = next(d["data"] for d in series if d["label"] == "INVALID_ARGUMENTS")
    their_hour = next(index for index, value in enumerate(values) if value)

    click_bar(tab, "rejection_over_time", "INVALID_ARGUMENTS", their_hour)

    assert urlsplit(tab.page.url).path == "/analytics/calls/"
    assert parse_qs(urlsplit(tab.page.url).query)["code"] == ["INVALID_ARGUMENTS"]
    assert listed_calls(tab) == calls_where(code="INVALID_ARGUMENTS", session_id__in=["s-1", "s-2"])
    tab.check_accessibility()


def test_a_filter_change_is_in_the_url_and_the_charts(
    decided_traffic: Traffic, open_tab: OpenTab
) -> None:
    tab = open_tab("max")
    tab.page.goto("/analytics/")
    assert drawn_charts(tab)["recovery_by_tool"]["labels"] == ["get_order", "refund_order"]

    with tab.page.expect_navigation():
        tab.page.get_by_label("Tool", exact=True).select_option("refund_order")

    assert parse_qs(urlsplit(tab.page.url).query) == {"range": ["24h"], "tool": ["refund_order"]}
    assert drawn_charts(tab)["recovery_by_tool"]["labels"] == ["refund_order"]
    with tab.page.expect_navigation():
        tab.page.get_by_label("Last 7 days").check()
    assert parse_qs(urlsplit(tab.page.url).query) == {"range": ["7d"], "tool": ["refund_order"]}
    assert tab.page.get_by_label("Tool", exact=True).input_value() == "refund_order"


def test_the_other_pages_pass_the_accessibility_check(
    decided_traffic: Traffic, open_tab: OpenTab
) -> None:
    tab = open_tab("max")
    call_id = next(iter(calls_where(code="CONFIRMATION_REQUIRED")))

    for path in (
        "/analytics/calls/?outcome=rejected",
        f"/analytics/calls/{call_id}/",
        f"/analytics/sessions/{decided_traffic.shop.pk}/s-1/",
        "/analytics/?since=2024-01-01&until=2024-01-02",
    ):
        response = tab.page.goto(path)

        assert response is not None and response.status == 200, path
        tab.check_accessibility()


def test_a_reviewer_who_is_not_a_manager_is_refused(
    decided_traffic: Traffic, open_tab: OpenTab
) -> None:
    tab = open_tab("rita")

    tab.goto_refused("/analytics/")

    assert "for members of the 'managers' group" in tab.page.content()


def test_the_what_if_shows_its_table_for_a_draft(
    decided_traffic: Traffic, open_tab: OpenTab
) -> None:
    tab = open_tab("max")
    tab.page.goto(f"/analytics/what-if/?agent={decided_traffic.shop.pk}")
    table = tab.page.get_by_role("table").first
    assert "Held for one reviewer" in table.inner_text()

    # In the currency's major units: 200.00 BRL.
    tab.page.get_by_label("Auto-approve below (BRL)").fill("200")
    with tab.page.expect_navigation():
        tab.page.get_by_role("button", name="Judge again").click()

    assert parse_qs(urlsplit(tab.page.url).query)["BRL_auto_approve_below"] == ["200"]
    rows = {
        row.locator("th").inner_text(): row.locator("td").all_inner_texts()
        for row in tab.page.locator("table").first.locator("tbody tr").all()
    }
    # The held 90.00 would have been auto-executed: one call moves, with its example.
    assert rows["Held for one reviewer"][0] == "1" and rows["Held for one reviewer"][2] == "0"
    assert rows["Auto-executed"][0] == "1" and rows["Auto-executed"][2] == "2"
    heading = tab.page.get_by_role("heading", name="Held for one reviewer")
    assert "Auto-executed: 1 call" in heading.inner_text()
    tab.check_accessibility()
