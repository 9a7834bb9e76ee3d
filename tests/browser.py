"""A real browser for the tests that open a saved report.html: headless Chromium through playwright, or a skip."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def find_browser():
    """Chromium and playwright, or a skip (a failure under CI=true, so CI cannot skip it silently)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [name for name, ok in (("chromium", exe), ("playwright", sync_playwright)) if not ok]
    if missing:
        why = f"{' and '.join(missing)} not installed (apt-get install chromium; pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the browser test cannot run: {why}")
        pytest.skip(why)
    return exe, sync_playwright


def visit(path: Path, look=lambda page: None, shot: Path | None = None) -> tuple[list[str], list[str]]:
    """Open a file in headless Chromium with every other request aborted; the requests tried and the errors."""
    exe, sync_playwright = find_browser()
    path = path.resolve()
    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})

            def block(route):  # the page itself is the only thing it may load
                if route.request.url == path.as_uri():
                    route.continue_()
                else:
                    requests.append(route.request.url)
                    route.abort()

            page.route("**/*", block)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            look(page)
            if shot is not None:
                page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return requests, errors
