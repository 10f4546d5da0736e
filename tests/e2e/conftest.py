"""Browser tests: Playwright driving Debian's Chromium against pytest-django's live server.

No browser is downloaded: the tests use /usr/bin/chromium (TOOLGATE_CHROMIUM elsewhere), which
.ci/run installs. Without it they skip and say so, except where TOOLGATE_REQUIRE_SERVICES=1 (CI),
where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, sync_playwright
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from tests.conftest import require_service

CHROMIUM = os.environ.get("TOOLGATE_CHROMIUM", "/usr/bin/chromium")
AXE = Path(__file__).parent / "vendor" / "axe-core" / "4.14.1" / "axe.min.js"
PASSWORD = "browser-pw"
# The impacts axe-core grades as serious or worse: any of them fails a page.
FAILING_IMPACTS = ("serious", "critical")


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    require_service(
        Path(CHROMIUM).is_file(),
        f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium, or set "
        "TOOLGATE_CHROMIUM); they were skipped",
    )
    # Playwright's sync API keeps an event loop running in this thread, and Django refuses
    # database calls from a thread with a running loop. The test's own calls are plain
    # synchronous code, so they are allowed for as long as the browser runs, and no longer: a
    # browser per test (a second to start) keeps the other tests' checks intact.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()
        # While Playwright runs, Django gives the test's own reads a connection of their own:
        # left open, it would keep the test database on PostgreSQL from being dropped.
        connections.close_all()


@pytest.fixture(autouse=True)
def _quiet_queue(settings: Settings) -> None:
    # The queue reloads itself only where a test waits for it: on SQLite the live server shares
    # the test's connection, and a reload must not run while the test writes.
    settings.TOOLGATE_QUEUE_REFRESH_SECONDS = 3600


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

    def goto_refused(self, path: str) -> None:
        """Open a page the user may not see: a 403, which the browser logs as an error of the
        document itself (and only that is forgiven)."""
        response = self.page.goto(path)
        assert response is not None and response.status == 403
        self.errors = [
            error for error in self.errors if not error.startswith(f"{response.url}: Failed")
        ]

    def check_console(self) -> None:
        assert self.errors == [], f"{self.page.url}: {self.errors}"


OpenTab = Callable[..., Tab]


@pytest.fixture
def open_tab(browser: Browser, live_server: LiveServer) -> Iterator[OpenTab]:
    """A new browser (own cookies) on the live server, signed in as the given user if any; the
    time zone is São Paulo's, so that pages must show the browser's zone, not UTC."""
    contexts = []
    tabs: list[Tab] = []

    def open_(username: str | None = None) -> Tab:
        context = browser.new_context(
            base_url=live_server.url, timezone_id="America/Sao_Paulo", locale="en-US"
        )
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
        if username is not None:
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


MakeBrowserUser = Callable[..., User]


@pytest.fixture
def browser_user(transactional_db: None) -> MakeBrowserUser:
    def make(username: str, *groups: str, **fields: Any) -> User:
        user = User.objects.create_user(username, password=PASSWORD, **fields)
        for name in groups:
            user.groups.add(Group.objects.get_or_create(name=name)[0])
        return user

    return make
