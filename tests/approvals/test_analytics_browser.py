"""The analytics pages in a real browser: Playwright driving Debian's Chromium against
pytest-django's live server, on the traffic of test_analytics.

No browser is downloaded: the tests use /usr/bin/chromium (TOOLGATE_CHROMIUM elsewhere). Without
it they skip and say so, except where TOOLGATE_REQUIRE_SERVICES=1 (CI), where they fail. axe-core
is vendored for the tests under tests/e2e/vendor/ and never served by the site.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, sync_playwright
from pytest_django.live_server_helper import LiveServer

from approvals.services import confirmation_reject
from orders.models import Order
from tests.approvals.test_analytics import Clock, Traffic, calls_where, record_traffic
from tests.conftest import MakeAgent, require_service

CHROMIUM = os.environ.get("TOOLGATE_CHROMIUM", "/usr/bin/chromium")
AXE = Path(__file__).parent.parent / "e2e" / "vendor" / "axe-core" / "4.14.1" / "axe.min.js"
PASSWORD = "browser-pw"
# The impacts axe-core grades as serious or worse: any of them fails a page.
FAILING_IMPACTS = ("serious", "critical")
CHARTS = (
    "rejection_over_time",
    "recovery_by_tool",
    "stuck_by_tool",
    "confirmation_outcomes",
    "decision_times",
)


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    require_service(
        Path(CHROMIUM).is_file(),
        f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium, or set "
        "TOOLGATE_CHROMIUM); they were skipped",
    )
    # Playwright's sync API keeps an event loop running in this thread, and Django refuses
    # database calls from a thread with a running loop; the test's own calls are plain
    # synchronous code, so they are allowed while the browser runs.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()
        # While Playwright runs, Django gives the test's own reads a connection of their own:
        # left open, it would keep the test database on PostgreSQL from being dropped.
        connections.close_all()


@dataclass
class Tab:
    """One signed-in browser tab, and the errors its pages logged."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def check_accessibility(self) -> None:
        """axe-core's check of the page as it is: no serious or critical violation."""
        self.page.add_script_tag(path=str(AXE))
        violations: list[dict[str, Any]] = self.page.evaluate(
            """async (failing) => {
                const results = await axe.run(document, {resultTypes: ["violations"]});
                return results.violations
                    .filter((v) => failing.includes(v.impact))
                    .map((v) => ({id: v.id, impact: v.impact, help: v.help,
                                  nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" "))}));
            }""",
            list(FAILING_IMPACTS),
        )
        assert violations == [], f"{self.page.url}: {violations}"

    def charts(self) -> dict[str, dict[str, Any]]:
        """What each drawn chart holds: its labels and, per dataset, its label and values."""
        self.page.wait_for_function(
            """() => document.querySelectorAll('canvas[data-drawn=true]').length
                === document.querySelectorAll('canvas[data-chart]').length"""
        )
        drawn: dict[str, dict[str, Any]] = self.page.evaluate(
            """() => Object.fromEntries(Object.entries(window.analyticsCharts).map(
                ([name, chart]) => [name, {
                    labels: chart.data.labels,
                    datasets: chart.data.datasets.map((d) => ({label: d.label, data: d.data})),
                    drawnBars: chart.getDatasetMeta(0).data.length,
                }]))"""
        )
        return drawn

    def click_bar(self, chart: str, series: str, index: int) -> None:
        """Click one bar of a chart, where the reader would."""
        self.page.locator(f"canvas[data-chart={chart}]").scroll_into_view_if_needed()
        point = self.page.evaluate(
            """([name, label, index]) => {
                const chart = window.analyticsCharts[name];
                const dataset = chart.data.datasets.findIndex((d) => d.label === label);
                const bar = chart.getDatasetMeta(dataset).data[index].getCenterPoint();
                const box = chart.canvas.getBoundingClientRect();
                return {x: box.left + bar.x, y: box.top + bar.y};
            }""",
            [chart, series, index],
        )
        with self.page.expect_navigation():
            self.page.mouse.click(point["x"], point["y"])

    def listed_calls(self) -> set[str]:
        ids = self.page.locator("li.an-call").evaluate_all("items => items.map((i) => i.id)")
        return {str(item).removeprefix("call-") for item in ids}

    def check_console(self) -> None:
        assert self.errors == [], f"{self.page.url}: {self.errors}"


OpenTab = Callable[..., Tab]


@pytest.fixture
def open_tab(browser: Browser, live_server: LiveServer) -> Iterator[OpenTab]:
    """A new browser (own cookies) on the live server, signed in as the given user."""
    contexts = []
    tabs: list[Tab] = []

    def open_(username: str) -> Tab:
        context = browser.new_context(base_url=live_server.url, locale="en-US")
        contexts.append(context)
        tab = Tab(context.new_page())
        tabs.append(tab)

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                tab.errors.append(f"{message.location.get('url', '')}: {message.text}")

        def on_page_error(error: Error) -> None:
            tab.errors.append(str(error))

        tab.page.on("console", on_console)
        tab.page.on("pageerror", on_page_error)
        tab.page.goto("/accounts/login/")
        tab.page.get_by_label("Username").fill(username)
        tab.page.get_by_label("Password").fill(PASSWORD)
        tab.page.get_by_role("button", name="Log in").click()
        tab.page.wait_for_load_state()
        return tab

    yield open_
    for context in contexts:
        context.close()
    # No page of any test logs an error in the browser's console.
    for tab in tabs:
        tab.check_console()


def browser_user(username: str, *groups: str) -> User:
    user = User.objects.create_user(username, password=PASSWORD)
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


@pytest.fixture
def decided_traffic(
    transactional_db: None,
    make_agent: MakeAgent,
    monkeypatch: pytest.MonkeyPatch,
    orders: dict[str, Order],
) -> Traffic:
    """test_analytics' traffic sent ten minutes ago, its held call rejected by a reviewer now:
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

    charts = tab.charts()
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
    series = tab.charts()["rejection_over_time"]["datasets"]
    values = next(d["data"] for d in series if d["label"] == "INVALID_ARGUMENTS")
    their_hour = next(index for index, value in enumerate(values) if value)

    tab.click_bar("rejection_over_time", "INVALID_ARGUMENTS", their_hour)

    assert urlsplit(tab.page.url).path == "/analytics/calls/"
    assert parse_qs(urlsplit(tab.page.url).query)["code"] == ["INVALID_ARGUMENTS"]
    assert tab.listed_calls() == calls_where(
        code="INVALID_ARGUMENTS", session_id__in=["s-1", "s-2"]
    )
    tab.check_accessibility()


def test_a_filter_change_is_in_the_url_and_the_charts(
    decided_traffic: Traffic, open_tab: OpenTab
) -> None:
    tab = open_tab("max")
    tab.page.goto("/analytics/")
    assert tab.charts()["recovery_by_tool"]["labels"] == ["get_order", "refund_order"]

    with tab.page.expect_navigation():
        tab.page.get_by_label("Tool", exact=True).select_option("refund_order")

    assert parse_qs(urlsplit(tab.page.url).query) == {"range": ["24h"], "tool": ["refund_order"]}
    assert tab.charts()["recovery_by_tool"]["labels"] == ["refund_order"]
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

    response = tab.page.goto("/analytics/")

    assert response is not None and response.status == 403
    # The browser logs the refused document itself; nothing else may be logged.
    tab.errors = [error for error in tab.errors if "403" not in error]
