"""Benchmark: a large upload through the wizard's page in Chromium, with the browser's and the web process's memory.

Conch comes up as `bench/time_to_serve.py` brings it up (a `python -m conch.web` web process and a Celery worker on
the embedded defaults: SQLite, kombu's filesystem broker, folder storage, in a scratch CONCH_VAR_DIR). Folder
storage is the heavier case for the web process: every part comes through it (with S3 storage the parts go to the
bucket and the web process only signs). Playwright drives Debian's Chromium (/usr/bin/chromium): sign in, register
a model, choose a --size-mib file of random bytes (after ONNX's first two) on the upload page (by path: the test
process never reads it), and wait until the page moves on to the build page, i.e. the worker has checked the stored
object's size and sha256 and made the version. (The build that follows fails at once: random bytes are no ONNX
model; it is not timed.)

Every 100 ms the RSS of the browser's processes (the Chromium processes under this script) and of the web process
(the web server's main process and workers) is sampled. Growth = peak during the upload - RSS once the upload page
has loaded.
The page's progress line is timestamped in the page, splitting the time into the browser's sha256 (hash-wasm,
read through one reused 2 MiB buffer) and sending the parts (8 MiB parts, 3 at a time, or bigger past 10,000 parts).

Target (issue 8): both memories flat while 2 GiB go through. Ends with one machine-readable line:
  browser_upload: size_mib=<n> seconds=<choose -> build page> hash_seconds=<sha256 in the page>
    send_mib_per_s=<parts sent / their time> browser_rss_growth_mib=<…> web_rss_growth_mib=<…>
Run: .venv/bin/python bench/browser_upload.py [--size-mib 2048]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from time_to_serve import TEAM, Conch  # noqa: E402  (bench/ on sys.path)
from upload import make_file  # noqa: E402  (random bytes that open like an ONNX file, as the page checks)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MIB = 1024 * 1024


def tree_rss(root: psutil.Process, keep=lambda process: True) -> int:
    """Sum of the RSS of `root` and its descendants that `keep` accepts, in bytes (gone processes count 0)."""
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            if keep(process):
                total += process.memory_info().rss
        except psutil.Error:
            pass
    return total


def is_browser(process: psutil.Process) -> bool:
    return "chrom" in process.name()


class Sampler:
    """Samples the browser's and the web process's RSS every `interval_s` seconds in a thread; keeps the peaks."""

    def __init__(self, web: psutil.Process, interval_s: float = 0.1) -> None:
        self.me = psutil.Process()
        self.web = web
        self.interval_s = interval_s
        self.peak_browser = self.peak_web = 0
        self.samples: list[tuple[float, int, int]] = []  # (wall clock s, browser RSS, web RSS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> tuple[int, int]:
        return tree_rss(self.me, is_browser), tree_rss(self.web)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            browser, web = self.now()
            self.samples.append((time.time(), browser, web))
            self.peak_browser = max(self.peak_browser, browser)
            self.peak_web = max(self.peak_web, web)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the upload to finish")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="conch-bench-browser-") as tmp:
        tmp_path = Path(tmp)
        path = tmp_path / "large.onnx"
        make_file(path, args.size_mib * MIB)
        conch = Conch(tmp_path / "var", warm_verify=False, broker_poll=None, concurrency=1)
        password = secrets.token_urlsafe(16)
        try:
            conch.start()
            conch.manage(
                "shell",
                "-c",
                "from django.contrib.auth import get_user_model; "
                f"u = get_user_model().objects.get(username='bench'); u.set_password('{password}'); u.save()",
            )
            web = psutil.Process(conch.procs["web"].pid)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(base_url=conch.url, viewport={"width": 1280, "height": 800})
                page.goto("/accounts/login/")
                page.get_by_label("Username").fill("bench")
                page.get_by_label("Password").fill(password)
                page.get_by_role("button", name="Log in").click()
                page.wait_for_url(f"{conch.url}/")
                page.goto("/wizard/")
                page.get_by_label("Name").fill(f"large-{os.getpid()}")
                page.get_by_test_id("wizard-next").click()
                page.wait_for_url("**/upload/")
                page.evaluate(
                    """() => {
                        window.progressSeen = [];
                        const line = document.querySelector('[data-testid=upload-progress]');
                        new MutationObserver(() => window.progressSeen.push([Date.now(), line.textContent]))
                            .observe(line, {childList: true, subtree: true});
                    }"""
                )
                time.sleep(1)
                sampler = Sampler(web)
                base_browser, base_web = sampler.now()
                with sampler, _say_what_the_page_shows_on_failure(page):
                    started = time.monotonic()
                    page_started = page.evaluate("Date.now()")
                    with page.expect_navigation(url="**/build/", timeout=args.timeout * 1000):
                        page.get_by_test_id("upload-file-input").set_input_files(str(path))
                        page.wait_for_function(
                            "window.progressSeen.some(([, text]) => text.startsWith('All parts sent'))",
                            timeout=args.timeout * 1000,
                            polling=500,
                        )
                        seen = page.evaluate("window.progressSeen")
                    seconds = time.monotonic() - started
                browser.close()
        finally:
            conch.stop()

    hashed = [at for at, text in seen if text.startswith("Computing the checksum")]
    sending = [at for at, text in seen if " parts" in text and not text.startswith("Computing")]
    sent_at = next(at for at, text in seen if text.startswith("All parts sent"))
    hash_seconds = ((hashed[-1] - page_started) / 1000) if hashed else 0.0
    send_seconds = (sent_at - sending[0]) / 1000 if sending else float("nan")
    hash_end_s = (hashed[-1] if hashed else page_started) / 1000
    hash_peak = max((b for at, b, _ in sampler.samples if at <= hash_end_s), default=base_browser)
    send_peak = max((b for at, b, _ in sampler.samples if at > hash_end_s), default=base_browser)
    browser_growth = (sampler.peak_browser - base_browser) / MIB
    web_growth = (sampler.peak_web - base_web) / MIB
    print(f"team {TEAM}, {args.size_mib} MiB of random bytes, folder storage (every part through the web process)")
    print(f"browser RSS: {base_browser / MIB:.0f} MiB at rest, peak {sampler.peak_browser / MIB:.0f} MiB")
    print(f"browser RSS peak while hashing {hash_peak / MIB:.0f} MiB, while sending {send_peak / MIB:.0f} MiB")
    print(f"web RSS:     {base_web / MIB:.0f} MiB at rest, peak {sampler.peak_web / MIB:.0f} MiB")
    print(f"sha256 in the page {hash_seconds:.1f} s; parts sent in {send_seconds:.1f} s; total {seconds:.1f} s")
    print(
        f"browser_upload: size_mib={args.size_mib} seconds={seconds:.1f} hash_seconds={hash_seconds:.1f} "
        f"send_mib_per_s={args.size_mib / send_seconds:.0f} browser_rss_growth_mib={browser_growth:.0f} "
        f"web_rss_growth_mib={web_growth:.0f}"
    )


@contextlib.contextmanager
def _say_what_the_page_shows_on_failure(page):
    """On an exception (a timeout), print the upload page's progress line and error before it propagates."""
    try:
        yield
    except Exception:
        for selector in ("[data-testid=upload-progress]", "#upload-error"):
            try:
                print(f"page {selector}: {page.locator(selector).inner_text(timeout=2000)!r}", file=sys.stderr)
            except Exception as error:  # the page itself is gone
                print(f"page {selector}: unreadable ({error})", file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
