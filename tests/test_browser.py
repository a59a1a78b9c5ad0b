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
from browser import BrowserError, find_chromium, render_page
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
