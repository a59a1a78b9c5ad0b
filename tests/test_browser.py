"""``tests/browser.py``, the harness report tests open pages with: a real headless Chromium must
report a page's headings, its console errors, failed loads and whether anything was drawn.

Without a browser the tests that need one skip; ``HORIZON_CHROMIUM=/nonexistent`` shows that
path on a machine that has one. The last two tests stand in a script for Chromium and run
everywhere: a browser that dies or hangs must fail with its reason and leave nothing behind.
"""

from __future__ import annotations

import base64
import io
import tempfile
import time
from pathlib import Path

import pytest
from browser import VIEWPORT_HEIGHT, BrowserError, find_chromium, render_page
from PIL import Image

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium: install the 'chromium' package (make test does, as root with apt-get) "
    "or point $HORIZON_CHROMIUM at a Chromium or Chrome binary",
)


def write_page(folder: Path, body: str) -> Path:
    """A self-contained HTML file in ``folder`` whose body is ``body``."""
    page = folder / "page.html"
    page.write_text(
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>test</title></head>'
        f"<body>{body}</body></html>\n",
        encoding="utf-8",
    )
    return page


def png_data_uri() -> str:
    """A 240 x 120 PNG, a blue band on orange, as a data: URI."""
    image = Image.new("RGB", (240, 120), (255, 140, 0))
    image.paste((30, 60, 200), (0, 40, 240, 80))
    encoded = io.BytesIO()
    image.save(encoded, format="PNG")
    return "data:image/png;base64," + base64.b64encode(encoded.getvalue()).decode("ascii")


@needs_chromium
def test_a_page_with_headings_and_an_image_renders_cleanly(tmp_path):
    page = write_page(
        tmp_path,
        f'<h1>Training</h1><p>Loss fell.</p><img src="{png_data_uri()}" alt="loss">'
        "<h2>Counterfactual evaluation</h2>",
    )

    rendered = render_page(page, screenshot=tmp_path / "page.png", width=800)

    assert rendered.headings == ["Training", "Counterfactual evaluation"]
    assert rendered.console_errors == []
    assert rendered.non_blank
    with Image.open(rendered.screenshot) as screenshot:
        assert screenshot.format == "PNG"
        assert screenshot.size == (800, rendered.height)


@needs_chromium
def test_console_error_is_reported(tmp_path):
    page = write_page(tmp_path, '<h1>Report</h1><script>console.error("boom")</script>')

    errors = render_page(page, screenshot=tmp_path / "page.png").console_errors

    assert len(errors) == 1 and "boom" in errors[0] and "page.html" in errors[0], errors


@needs_chromium
def test_an_uncaught_exception_is_reported(tmp_path):
    page = write_page(tmp_path, '<h1>Report</h1><script>throw new Error("bad")</script>')

    errors = render_page(page, screenshot=tmp_path / "page.png").console_errors

    assert len(errors) == 1 and "Error: bad" in errors[0], errors


@needs_chromium
def test_an_image_that_fails_to_load_is_reported(tmp_path):
    """Chromium reports a missing file: image as a Log entry from the network (it also sends
    Network.loadingFailed, which the harness does not need)."""
    page = write_page(tmp_path, '<h1>Report</h1><img src="missing.png" alt="chart">')

    errors = render_page(page, screenshot=tmp_path / "page.png").console_errors

    assert len(errors) == 1 and "missing.png" in errors[0], errors


@needs_chromium
def test_a_blank_page_is_blank(tmp_path):
    page = write_page(tmp_path, "")

    rendered = render_page(page, screenshot=tmp_path / "page.png", width=640)

    assert not rendered.non_blank
    assert rendered.headings == [] and rendered.console_errors == []


def fake_browser(folder: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``render_page`` start a shell script instead of Chromium, with its scratch folders
    under ``folder`` so that the test can see they are gone."""
    binary = folder / "fake-chromium"
    binary.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    binary.chmod(0o755)
    monkeypatch.setenv("HORIZON_CHROMIUM", str(binary))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


def test_a_browser_that_dies_is_an_error_quoting_its_stderr(tmp_path, monkeypatch):
    fake_browser(tmp_path, 'echo "cannot open display" >&2\nexit 3', monkeypatch)

    with pytest.raises(BrowserError, match="exited with status 3") as failure:
        render_page(write_page(tmp_path, ""), screenshot=tmp_path / "page.png")

    assert "Target.createTarget" in str(failure.value)
    assert "cannot open display" in str(failure.value)
    assert not list(tmp_path.glob("horizon-chromium-*"))


def test_a_browser_that_hangs_times_out_and_is_killed(tmp_path, monkeypatch):
    fake_browser(tmp_path, "exec sleep 60", monkeypatch)
    started = time.monotonic()

    with pytest.raises(BrowserError, match=r"timed out after 1 s waiting for the answer to"):
        render_page(write_page(tmp_path, ""), screenshot=tmp_path / "page.png", timeout=1)

    assert time.monotonic() - started < 10
    assert not list(tmp_path.glob("horizon-chromium-*"))


@needs_chromium
def test_a_report_page_opens_with_its_verdict_on_the_first_screen(tmp_path):
    """Issue 34: the report's answer was 2,300 pixels down. The verdict's box, found in the
    screenshot by its decision's background, must end within the first screen's height, and
    its heading come first after the page's title. An unclear verdict with every line the
    box can show (reasons, what would settle it, the checkpoint) is the tallest box."""
    from test_report import GOOD_VERDICT, verdict_run

    from horizon_engine.plugins import get_plugin_host
    from horizon_engine.report import write_report
    from horizon_engine.report_page import VERDICT_COLOURS

    verdict = {
        **GOOD_VERDICT,
        "decision": "unclear",
        "reasons": [f"Reason {index}: the interval straddles parity." for index in range(5)],
        "settle": "About 200 more eval episodes, or logging with more exploration.",
    }
    page = write_report(
        [verdict_run(tmp_path / "run", verdict)], tmp_path / "report.html", get_plugin_host()
    )

    rendered = render_page(page, screenshot=tmp_path / "report.png")

    assert rendered.console_errors == []
    assert rendered.headings[1:3] == ["Verdict", "Estimators behind the verdict"]
    background = Image.new("RGB", (1, 1), VERDICT_COLOURS["unclear"][0]).getpixel((0, 0))
    with Image.open(rendered.screenshot) as screenshot:
        rgb = screenshot.convert("RGB")
        boxed = [
            row
            for row in range(rgb.height)
            if sum(rgb.getpixel((x, row)) == background for x in range(0, rgb.width, 8)) > 50
        ]
    assert boxed, "no verdict box in the screenshot"
    assert boxed[-1] - boxed[0] > 200  # the box: headline, figures, five reasons and more
    assert boxed[-1] < VIEWPORT_HEIGHT, (boxed[0], boxed[-1])
