"""The report in a real browser: Debian's headless ``chromium`` loads it offline, runs its script
without a console error, filters the matrix and takes a screenshot that is not blank.

Skips (saying why) when no chromium is installed; ``.ci/run`` installs it where it can
(``apt-get install chromium``). ``KVPOLICY_CHROMIUM`` names another executable.
"""

from __future__ import annotations

import json

import pytest

from tests.report.browser import Browser, find_chromium, png_pixels
from tests.report.conftest import FLIP

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium, or set KVPOLICY_CHROMIUM)"
)


@pytest.fixture(scope="module")
def page(tmp_path_factory, shared_report):
    # The page the impact test reads (the last upstream flip with the example configs).
    code, text, _ = shared_report(*FLIP)
    assert code == 0
    out = tmp_path_factory.mktemp("report") / "report.html"
    out.write_text(text, encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def browser(page):
    with Browser(CHROMIUM, width=1400, height=1000, timeout_s=60) as opened:
        opened.open(page)
        yield opened


def test_page_loads_offline_without_console_errors(browser):
    assert browser.errors() == []
    # Only the file itself: no stylesheet, font, script or image from anywhere.
    assert browser.requests and all(url.startswith("file://") for url in browser.requests), browser.requests
    assert browser.evaluate("document.title").startswith("kvpolicy report: 2026.08.11")


def test_screenshot_is_not_blank(browser, tmp_path):
    data = browser.screenshot(tmp_path / "report.png")
    width, height, rows = png_pixels(data)
    assert (width, height) == (1400, 1000)
    pixels = [row[i:i + 3] for row in rows[::4] for i in range(0, len(row), 12)]
    colours = set(pixels)
    non_white = sum(1 for p in pixels if p != b"\xff\xff\xff")
    assert len(colours) > 20, "the page rendered in a handful of colours: blank?"
    assert non_white / len(pixels) > 0.05


def test_version_selector_and_filters_work(browser):
    visible = "Array.from(document.querySelectorAll('.version-matrix')).filter(e => !e.hidden).map(e => e.dataset.version)"
    assert browser.evaluate(visible) == ["2026.08.24"]
    browser.evaluate(
        "(() => { const s = document.getElementById('version-select'); s.value = s.options[0].value;"
        " s.dispatchEvent(new Event('change')); })()"
    )
    assert browser.evaluate(visible) == ["2026.07.09"]
    browser.evaluate(
        "(() => { const s = document.getElementById('version-select');"
        " s.value = Array.from(s.options).find(o => o.text.startsWith('2026.08.24')).value;"
        " s.dispatchEvent(new Event('change'));"
        " const f = document.getElementById('arch-filter'); f.value = 'llama'; f.dispatchEvent(new Event('input')); })()"
    )
    rows = browser.evaluate(
        "Array.from(document.querySelectorAll('.version-matrix:not([hidden]) table.matrix > tbody > tr'))"
        ".filter(r => !r.hidden).map(r => r.dataset.arch)"
    )
    assert rows == ["LlamaForCausalLM"]
    browser.evaluate(
        "(() => { const f = document.getElementById('arch-filter'); f.value = ''; f.dispatchEvent(new Event('input'));"
        " const c = document.getElementById('only-failing'); c.checked = true; c.dispatchEvent(new Event('change')); })()"
    )
    failing = browser.evaluate(
        "Array.from(document.querySelectorAll('.version-matrix:not([hidden]) table.matrix > tbody > tr')).filter(r => !r.hidden)"
        ".map(r => r.dataset.fails)"
    )
    assert failing and set(failing) == {"1"}
    assert browser.errors() == []


def test_a_cell_opens_to_its_rules_and_sources(browser):
    details = json.loads(browser.evaluate(
        "(() => { const c = document.querySelector('.version-matrix:not([hidden]) td.cell.fails');"
        " c.querySelector('details').open = true; const r = c.querySelector('ul.why');"
        " return JSON.stringify({visible: r.getBoundingClientRect().height > 0, text: r.textContent, title: c.title}); })()"
    ))
    assert details["visible"]
    assert "python-requires-nixl" in details["text"]
    assert "TensorRT-LLM" in details["title"]  # the upstream source, on hover


def test_the_console_check_sees_errors(tmp_path):
    # The checks above can fail: a page that logs an error and throws is reported as such.
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>x</title><script>console.error('broken'); null.x;</script>")
    with Browser(CHROMIUM, width=400, height=300, timeout_s=60) as browser:
        browser.open(bad)
        errors = browser.errors()
    assert any("console.error: broken" in e for e in errors)
    assert any(e.startswith("exception: TypeError") for e in errors)
