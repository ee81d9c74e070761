"""The browser checks of the built book (tools/browser.py), tested without a book build.

``python3 dev.py book`` runs the checks on every page of the book it has just built
(so ``dev.py test`` needs no build). Here they run on synthetic pages with the defects
they look for, so that a check that silently stopped working is noticed, and dev.py is
checked to run them after a successful build. Without Chromium (or Playwright) the
browser tests are skipped, unless ``CI`` is set, where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dev
from tools import book
from tools import browser as browser_checks

# Checks the page checks of a built book: the same on every JAX release (conftest.py).
pytestmark = pytest.mark.one_env


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def browser():
    missing = browser_checks.missing_requirements()
    if missing:
        message = "the browser checks need " + " and ".join(missing)
        if _ci():
            pytest.fail(message)
        pytest.skip(message + " (with CI set this is a failure)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=browser_checks.chromium_executable(),
            args=browser_checks.CHROMIUM_ARGS,
            headless=True,
        )
        try:
            yield b
        finally:
            b.close()


def test_html_pages_skips_assets_and_index_pages(tmp_path):
    for rel in [
        "index.html",
        "intro.html",
        "chapters/01_tracers.html",
        "_static/x.html",
        "genindex.html",
        "search.html",
        "_sources/a.html",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("<html></html>")
    assert browser_checks.html_pages(tmp_path) == [
        "chapters/01_tracers.html",
        "index.html",
        "intro.html",
    ]


def test_check_build_without_a_build_says_so(tmp_path):
    assert browser_checks.check_build(tmp_path) == {
        "index.html": [f"no HTML build at {tmp_path} (index.html missing)"]
    }


# A 1x1 PNG, so that the synthetic page below has one image that loads.
_PIXEL_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360f8cfc0f01f0005000201a5f2f4f60000000049454e44ae426082"
)

_BROKEN_PAGE = """<!DOCTYPE html><html><head><title>broken</title></head><body><article>
<img src="pixel.png" alt="a pixel"><img src="pixel.png"><img src="missing.png" alt="gone">
<div class="cell tag_hide-input"><details open><summary>Show code cell source</summary>
<div class="cell_input"><pre>answer = 42</pre></div></details></div>
<div class="cell_output"><figure><div class="output text_plain"><pre>&lt;Figure size 640x480 with 1 Axes&gt;</pre></div>
<figcaption>Fig. 1 A plot that never became an image.</figcaption></figure></div>
<script>notDefined();</script>
<div class="cell_output"><div class="output stream"><pre>{wide}</pre></div></div>
<table><tr><td style="white-space: nowrap">{wide}</td></tr></table>
<pre style="overflow-x: auto">{narrow}</pre>
</article></body></html>""".replace("{wide}", "w" * 300).replace("{narrow}", "n" * 40)


@pytest.mark.timeout(120)
def test_the_checks_catch_a_broken_page(browser, tmp_path):
    """The checks are not vacuous: a page with every defect they look for fails each one."""
    (tmp_path / "pixel.png").write_bytes(_PIXEL_PNG)
    (tmp_path / "broken.html").write_text(_BROKEN_PAGE)
    with browser_checks.serve(tmp_path) as url:
        problems, shot = browser_checks.visit(
            browser, tmp_path, url, "broken.html", tmp_path
        )
        # no folder asked for: the same problems, and no screenshot taken
        again, no_shot = browser_checks.visit(
            browser, tmp_path, url, "broken.html", None
        )
    report = "\n".join(problems)
    expected = [
        "uncaught exception: notDefined is not defined",
        "HTTP 404 for ",
        "image did not load (naturalWidth 0): ",
        "image in the text without alt text",
        "hide-input cell starting 'Show code cell source' is expanded on load",
        "figure without an image: Fig. 1 A plot that never became an image.",
        "a matplotlib figure is shown as text <Figure size 640x480 with 1 Axes>",
        "cell output scrolls sideways (",
        "table scrolls sideways (",
    ]
    for text in expected:
        assert text in report, f"the checks missed {text!r}; they reported:\n{report}"
    assert all(
        p.endswith("missing.png")
        for p in problems
        if p.startswith(("HTTP 404", "image did not load"))
    ), report
    assert sum("pixel.png" in p for p in problems) == 1, (
        f"only the image without alt text is a problem:\n{report}"
    )
    assert sum("scrolls sideways" in p for p in problems) == 2, report  # not the narrow
    assert "nnnn" not in report
    assert shot is not None and shot.stat().st_size > 0
    assert no_shot is None
    assert sorted(again) == sorted(problems)


_BARE_CHAPTER = """<!DOCTYPE html><html><head><title>bare</title></head><body><article>
<p>A chapter page without launch buttons, download menu or collapsed cells.</p>
</article></body></html>"""


@pytest.mark.timeout(120)
def test_the_chapter_checks_catch_a_bare_chapter_page(browser, tmp_path):
    source = book.chapter_sources()[-1]
    rel = source.relative_to(book.ROOT).with_suffix(".html").as_posix()
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(_BARE_CHAPTER)
    with browser_checks.serve(tmp_path) as url:
        problems, _ = browser_checks.visit(browser, tmp_path, url, rel, tmp_path)
    report = "\n".join(problems)
    assert f"no Colab launch link to {book.colab_url(source)}" in report
    assert (
        "no launch (rocket) button" in report and "no .ipynb download entry" in report
    )
    if browser_checks.expected_hide_input_cells(source):
        assert "hide-input cells in" in report
    if book.solution_exercises(source):
        assert (
            f"no link to the student notebook {book.student_colab_url(source)}"
            in report
        )


def _fake_runs(monkeypatch, build_rc: int) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        return subprocess.CompletedProcess(
            cmd, build_rc if "build" in map(str, cmd) else 0
        )

    class Popen:  # the student notebooks, executed beside the build
        def __init__(self, cmd, **kw):
            calls.append([str(c) for c in cmd])

        def wait(self):
            return 0

    monkeypatch.setattr(dev.subprocess, "run", run)
    monkeypatch.setattr(dev.subprocess, "Popen", Popen)
    return calls


@pytest.mark.parametrize("build_rc", [0, 1])
def test_book_command_runs_the_browser_checks_after_a_good_build(
    monkeypatch, tmp_path, build_rc
):
    calls = _fake_runs(monkeypatch, build_rc)
    rc = dev.cmd_book(Path(sys.executable), force=False, build=tmp_path / "_build")
    checks = [c for c in calls if c[1:3] == ["-m", "tools.browser"]]
    assert rc == build_rc
    assert [
        sys.executable,
        "-m",
        "tools.execute",
        "--student",
    ] not in calls  # timings are published
    if build_rc == 0:
        assert checks == [
            [sys.executable, "-m", "tools.browser", str(tmp_path / "_build" / "html")]
        ]
    else:
        assert (
            checks == []
        )  # a failed build is reported as such, not checked in a browser


def test_notebook_links_are_checked_against_the_build(tmp_path):
    """Each link of a generated notebook into the online book must find its page's
    anchor in the build; pages the build lacks are not checked."""
    import json

    base = book.html_base_url()
    links = {}
    for source in book.chapter_sources():
        for cell in json.loads(source.with_suffix(".ipynb").read_text())["cells"]:
            for m in browser_checks._MD_LINK.finditer("".join(cell["source"])):
                if m["url"].startswith(base + "glossary.html#"):
                    links[m["url"]] = m["url"].partition("#")[2]
    if not links:
        pytest.skip("no notebook links to the glossary")
    (tmp_path / "glossary.html").write_text(
        "".join(f'<dt id="{a}">x</dt>' for a in list(links.values())[1:])
    )
    found = browser_checks.notebook_link_problems(tmp_path)
    missing = list(links)[0]
    assert found and all(
        set(problems) == {f"{missing}: no id {links[missing]!r} on glossary.html"}
        for problems in found.values()
    ), found
    (tmp_path / "glossary.html").write_text(
        "".join(f'<dt id="{a}">x</dt>' for a in links.values())
    )
    assert browser_checks.notebook_link_problems(tmp_path) == {}
