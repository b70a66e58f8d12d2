"""Browser tests of the console: a real Conch web server (pytest-django's `live_server`, a thread of this process
serving the test database, static files through WhiteNoise) driven by Playwright with Debian's Chromium.

Fixtures:
- `chromium`: one Chromium for the package's browser tests.
- `console_browser`: a `ConsoleBrowser`; `.page_for(user)` opens a signed-in page (1280x800) on the live server.
- `page`: such a page for `alice` (a developer of team acme, `tests.conftest.alice`).
- `screenshot`: `screenshot(page, "name")` writes `var/screenshots/name.png` (the repository's var/, kept after
  the run) and returns its path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1280, "height": 800}
SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


class ConsoleBrowser:
    """Chromium driven by Playwright against `url` (the live server); each page has its own browser context."""

    def __init__(self, browser, url: str) -> None:
        self.browser = browser
        self.url = url
        self._contexts: list = []

    def page_for(self, user=None, *, viewport: dict[str, int] | None = None):
        """A new page (its own cookies) signed in as `user` (Django's session cookie, no form), or anonymous."""
        context = self.browser.new_context(viewport=viewport or VIEWPORT, base_url=self.url)
        context.set_default_timeout(15_000)
        self._contexts.append(context)
        if user is not None:
            client = Client()
            client.force_login(user)
            cookie = client.cookies[settings.SESSION_COOKIE_NAME]
            context.add_cookies([{"name": cookie.key, "value": cookie.value, "url": self.url}])
        return context.new_page()

    def close(self) -> None:
        for context in self._contexts:
            context.close()


@pytest.fixture(scope="package")
def chromium():
    """Chromium (headless) driven by Playwright, started once for the browser tests of this package and stopped
    after its last test; each test gets browser contexts of its own (`console_browser`)."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`apt-get install chromium`; .ci/run does)")
    # Playwright's sync API keeps an asyncio loop on this thread from its start to its stop, so Django sees a running
    # loop in every test (and fixture teardown: the database flush) until then. The tests' ORM calls are still plain
    # synchronous code, so Django's guard against ORM use inside a loop is lifted for as long as Playwright runs.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        playwright = sync_playwright().start()
        try:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
        finally:
            playwright.stop()


@pytest.fixture
def console_browser(chromium, live_server) -> Iterator[ConsoleBrowser]:
    """The package's Chromium and the live server; the pages a test opens (their contexts) are closed after it."""
    console = ConsoleBrowser(chromium, live_server.url)
    try:
        yield console
    finally:
        console.close()


@pytest.fixture
def page(console_browser, alice):
    """A page signed in as alice (developer of acme)."""
    return console_browser.page_for(alice.user)


@pytest.fixture
def screenshot():
    """`screenshot(page, name)`: a full-page PNG at var/screenshots/<name>.png; returns the path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
