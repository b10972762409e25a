"""The report in a real browser: Debian's headless ``chromium`` loads it offline, runs its script
without a console error, filters the matrix and takes a screenshot that is not blank. The layout is
measured at 1,400 and 1,000 px: the page never scrolls sideways, every impact status and reason is
on screen, unchanged configs come last and folded, and every version of the timeline is in view.

Skips (saying why) when no chromium is installed; ``.ci/run`` installs it where it can
(``apt-get install chromium``). ``KVPOLICY_CHROMIUM`` names another executable.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.report.browser import Browser, find_chromium, png_pixels
from tests.report.conftest import FLIP_ABSOLUTE

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium, or set KVPOLICY_CHROMIUM)"
)


@pytest.fixture(scope="module")
def page(tmp_path_factory, shared_report):
    # The page the impact test reads (the last upstream flip with the example configs, named by
    # absolute paths: the widest way to name them).
    code, text, _ = shared_report(*FLIP_ABSOLUTE)
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
    # The upstream change behind each decision, on hover (the rules table holds the full sources).
    assert re.search(r"\(#\d{4,6} \((described|reviewed|merged)", details["title"]), details["title"]


def test_the_console_check_sees_errors(tmp_path):
    # The checks above can fail: a page that logs an error and throws is reported as such.
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>x</title><script>console.error('broken'); null.x;</script>")
    with Browser(CHROMIUM, width=400, height=300, timeout_s=60) as browser:
        browser.open(bad)
        errors = browser.errors()
    assert any("console.error: broken" in e for e in errors)
    assert any(e.startswith("exception: TypeError") for e in errors)


# -- layout ------------------------------------------------------------------------------------------

WIDTHS = (1400, 1000)


@pytest.fixture
def width(browser, request):
    """The window resized to ``request.param`` px for one test, then back to 1,400."""
    browser.send("Emulation.setDeviceMetricsOverride", width=request.param, height=1000, deviceScaleFactor=1, mobile=False)
    assert browser.evaluate("window.innerWidth") == request.param
    yield request.param
    browser.send("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)


def measure(browser, script: str):
    """The JSON value a script (a function body) returns in the page."""
    return json.loads(browser.evaluate(f"JSON.stringify((() => {{ {script} }})())"))


@pytest.mark.parametrize("width", WIDTHS, indirect=True)
def test_the_page_never_scrolls_sideways(browser, width):
    # Opened as a reviewer opens them: every folded part of the page (the rules under each matrix,
    # the unchanged configs), the matrix cells excepted (they stay inside the matrix's own box).
    sizes = measure(browser, """
        const folded = Array.from(document.querySelectorAll('details')).filter(d => !d.closest('td') && !d.open);
        const wide = () => [document.documentElement.scrollWidth, document.body.scrollWidth];
        const closed = wide();
        folded.forEach(d => { d.open = true; });
        const opened = wide();
        folded.forEach(d => { d.open = false; });
        return {closed, opened, folded: folded.length};
    """)
    assert sizes["folded"] > 1
    assert max(sizes["closed"]) <= width, sizes
    assert max(sizes["opened"]) <= width, sizes


@pytest.mark.parametrize("width", WIDTHS, indirect=True)
def test_every_impact_status_and_reason_is_on_screen(browser, width):
    rows = measure(browser, """
        const table = document.querySelector('#impact table.impact');
        const box = table.parentElement;
        return {
          clipped: box.scrollWidth > box.clientWidth,
          rows: Array.from(table.querySelectorAll('tr[data-status]')).map(tr => {
            const status = tr.querySelector('td.status'), why = tr.lastElementChild;  // the reason, the last column
            status.scrollIntoView({block: 'center'});
            const s = status.getBoundingClientRect(), w = why.getBoundingClientRect();
            const hit = document.elementFromPoint(s.left + s.width / 2, s.top + s.height / 2);
            return {status: status.textContent, left: s.left, right: s.right, seen: status.contains(hit),
                    why_left: w.left, why_right: w.right, why_width: w.width};
          }),
        };
    """)
    assert not rows["clipped"], "the impact table scrolls inside its box"
    assert rows["rows"]
    for row in rows["rows"]:
        assert row["seen"], row  # not covered, not cut off
        assert 0 <= row["left"] < row["right"] <= width, row
        assert 0 <= row["why_left"] and row["why_right"] <= width and row["why_width"] >= 200, row


def test_unchanged_configs_come_last_and_folded(browser):
    seen = measure(browser, """
        const folded = document.getElementById('impact-unchanged');
        const rows = Array.from(document.querySelectorAll('#impact tr[data-status]'));
        const shown = rows.map(tr => ({status: tr.dataset.status, folded: folded.contains(tr),
                                       visible: tr.checkVisibility()}));
        folded.querySelector('summary').click();
        const opened = rows.filter(tr => folded.contains(tr)).map(tr => tr.checkVisibility());
        folded.open = false;
        return {shown, opened, summary: folded.querySelector('summary').textContent};
    """)
    statuses = [r["status"] for r in seen["shown"]]
    first_unchanged = statuses.index("unchanged")
    assert set(statuses[first_unchanged:]) == {"unchanged"}  # last
    assert all(r["folded"] == (r["status"] == "unchanged") for r in seen["shown"])
    assert not any(r["visible"] for r in seen["shown"] if r["folded"])  # collapsed: not shown
    assert all(r["visible"] for r in seen["shown"] if not r["folded"])
    assert seen["opened"] and all(seen["opened"])  # one click shows them
    assert seen["summary"].startswith("4 unchanged configs")


def _timeline_geometry(browser):
    return measure(browser, """
        const box = document.querySelector('#timeline .timeline-box');
        const b = box.getBoundingClientRect();
        const rect = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        return {
          box: [b.left, b.top, b.right, b.bottom], overflow: getComputedStyle(box).overflowX,
          scroll: [box.scrollWidth, box.clientWidth],
          page: document.documentElement.scrollWidth, window: window.innerWidth,
          listed: document.querySelectorAll('#timeline ol.versions > li').length,
          dots: Array.from(box.querySelectorAll('circle')).map(rect),
          labels: Array.from(box.querySelectorAll('text.v')).map(e => [e.textContent, ...rect(e)]),
        };
    """)


def _inside(rect, box):
    return box[0] <= rect[0] and rect[2] <= box[2] and box[1] <= rect[1] and rect[3] <= box[3]


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("width", WIDTHS, indirect=True)
def test_the_timeline_shows_every_version(browser, width):
    import kvpolicy

    browser.evaluate("document.getElementById('timeline').scrollIntoView()")
    seen = _timeline_geometry(browser)
    versions = kvpolicy.load().versions()
    assert seen["listed"] == len(seen["dots"]) == len(versions)
    assert [label[0] for label in seen["labels"]] == versions
    # All in view at once where the window holds them (the page says 15 versions fit 1,000 px):
    # no dot or label hides past the box's edge. A longer history scrolls inside its own box, never
    # the page (the test below scrolls it to the last version).
    if seen["scroll"][0] <= seen["scroll"][1]:
        for rect in seen["dots"] + [label[1:] for label in seen["labels"]]:
            assert _inside(rect, seen["box"]), (rect, seen["box"])
    else:
        assert width < 1400 and len(versions) > 15, (width, len(versions), seen["scroll"])
        assert seen["overflow"] in ("auto", "scroll") and seen["page"] <= seen["window"], seen
    labels = [label[1:] for label in seen["labels"]]
    assert not [(i, j) for i in range(len(labels)) for j in range(i) if _overlap(labels[i], labels[j])]


def test_a_longer_history_scrolls_inside_its_own_box(tmp_path):
    # Twice the shipped history: more than a 1,000 px window holds. The timeline box scrolls; the
    # page does not, and the last version is reached by scrolling the box.
    import kvpolicy
    from kvpolicy.report.page import _timeline
    from kvpolicy.report.assets import stylesheet

    sets = [kvpolicy.load(version=v) for v in kvpolicy.load().versions()] * 2
    page = tmp_path / "timeline.html"
    page.write_text(f"<!doctype html><meta charset=utf-8><style>{stylesheet(2)}</style><main>"
                    f"{_timeline(sets, sets[-1], sets[-2])}</main>", encoding="utf-8")
    with Browser(CHROMIUM, width=1000, height=600, timeout_s=60) as browser:
        browser.open(page)
        before = _timeline_geometry(browser)
        browser.evaluate("(() => { const b = document.querySelector('.timeline-box'); b.scrollLeft = b.scrollWidth; })()")
        after = _timeline_geometry(browser)
        assert browser.errors() == []
    assert len(before["dots"]) == len(sets)
    assert before["page"] <= before["window"] == 1000
    assert before["overflow"] == "auto" and before["scroll"][0] > before["scroll"][1]
    assert _inside(before["dots"][0], before["box"]) and not _inside(before["dots"][-1], before["box"])
    assert _inside(after["dots"][-1], after["box"])
    labels = [label[1:] for label in before["labels"]]
    assert not [(i, j) for i in range(len(labels)) for j in range(i) if _overlap(labels[i], labels[j])]
