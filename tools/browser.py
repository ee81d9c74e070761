"""The built book as a reader's browser sees it: every page opened in headless Chromium.

``python3 dev.py book`` runs these checks on the build it has just made (``python -m
tools.browser [HTML_DIR]`` runs them on any build, e.g. a ``dev.py page`` build). The
HTML build is served on 127.0.0.1 and every page is opened with Playwright driving
Debian's ``chromium``. Each page must show:

* no JavaScript error (console errors and uncaught exceptions) and no failed local request;
* every ``<img>`` loaded (``naturalWidth > 0``), figures in the text with alt text, and
  no cell output that shows a matplotlib figure as text (``<Figure size ...>``);
* on pages with math, every formula typeset by MathJax (``mjx-container``, no ``merror``);
* hidden cells (``hide-input`` solutions, ``hide-cell``, ``hide-output``) collapsed;
* at 1280x800 no code block, cell output, table or display formula scrolls sideways
  (each is measured, ``scrollWidth`` against ``clientWidth`` and the content column,
  with every ``<details>`` opened);
* on chapter pages: the Colab launch link for that chapter's self-study ``.ipynb`` on the
  repository/branch of ``_config.yml`` (the ``.ipynb`` exists in the repository), a
  launch menu that shows it, a working ``.ipynb`` download, as many collapsed
  ``hide-input`` cells as the chapter's source has, and, on chapters with solutions, a
  visible link to the student notebook on Colab.

``tests/test_browser.py`` runs the same checks on a synthetic page with every defect
they look for, so that a check that silently stopped working is noticed.

Requests to any host but 127.0.0.1 are blocked, and the console errors they cause are
not counted. MathJax requests to its CDN are served from a local MathJax 3 copy (the
files of the ``sphinx-mathjax-offline`` package, or ``BEYONDGRAD_MATHJAX=DIR`` holding
``tex-mml-chtml.js``); a book built with MathJax in its own ``_static`` needs neither.

Screenshots of each page go to ``BEYONDGRAD_SCREENSHOTS=DIR`` when that is set.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlparse

from tools import book

ROOT = book.ROOT
SKIPPED_DIRS = {"_static", "_sources", "_images"}
SKIPPED_PAGES = {"genindex.html", "search.html"}
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOST = "127.0.0.1"
# What the built pages load MathJax 3 from (sphinx's default mathjax_path, which
# jupyter-book keeps): https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js
MATHJAX_CDN = re.compile(
    r"https://cdn\.jsdelivr\.net/npm/mathjax@3[^/]*/es5/(?P<path>[^?#]+)"
)
PAGE_TIMEOUT_MS = 30_000
REFRESH = re.compile(
    r'<meta\s+http-equiv="refresh"\s+content="\d+;\s*url=(?P<url>[^"]+)"', re.IGNORECASE
)


def html_pages(root: Path) -> list[str]:
    """Every page of the build, relative to ``root`` (no index/search pages, no assets)."""
    if not root.is_dir():
        return []
    pages = []
    for path in root.rglob("*.html"):
        rel = path.relative_to(root)
        if rel.parts[0] in SKIPPED_DIRS or rel.as_posix() in SKIPPED_PAGES:
            continue
        pages.append(rel.as_posix())
    return sorted(pages)


def chromium_executable() -> str | None:
    """The browser to drive: ``$BEYONDGRAD_CHROMIUM``, else Debian's ``chromium``."""
    named = os.environ.get("BEYONDGRAD_CHROMIUM", "").strip()
    if named:
        return named if Path(named).is_file() else None
    exe = shutil.which("chromium")
    if exe is None and Path("/usr/bin/chromium").exists():
        exe = "/usr/bin/chromium"
    return exe


def missing_requirements() -> list[str]:
    """What the browser checks need and this machine lacks (empty when they can run)."""
    missing = []
    if chromium_executable() is None:
        missing.append(
            "Chromium (Debian: `apt-get install -y chromium`; or name a Chromium-based "
            "browser in BEYONDGRAD_CHROMIUM)"
        )
    if importlib.util.find_spec("playwright") is None:
        missing.append("the Python package `playwright` (pyproject.toml's dev group)")
    return missing


def local_mathjax_dir(html_root: Path | None = None) -> Path | None:
    """A local MathJax 3 distribution (the folder holding ``tex-mml-chtml.js``), if any."""
    candidates = []
    if os.environ.get("BEYONDGRAD_MATHJAX"):
        candidates.append(Path(os.environ["BEYONDGRAD_MATHJAX"]))
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is not None and spec.submodule_search_locations:
        candidates += [
            Path(p) / "static" / "mathjax" for p in spec.submodule_search_locations
        ]
    if html_root is not None:
        candidates.append(html_root / "_static" / "mathjax")
    for folder in candidates:
        if (folder / "tex-mml-chtml.js").is_file():
            return folder.resolve()
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (signature of the base class)
        pass


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 (a free port) in a thread; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, name="book-http", daemon=True
    )
    thread.start()
    try:
        yield f"http://{LOCAL_HOST}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# ---------------------------------------------------------------------------------------
# the checks, each returning a list of problems in plain words

_IMAGES_JS = """async () => {
  const imgs = Array.from(document.images);
  for (const i of imgs) if (i.loading === 'lazy') i.loading = 'eager';
  const settle = i => i.complete ? null : new Promise(r => {
    i.addEventListener('load', r, {once: true}); i.addEventListener('error', r, {once: true}); });
  const timeout = new Promise(r => setTimeout(r, 15000));
  await Promise.race([Promise.all(imgs.map(settle)), timeout]);
  return imgs.map(i => ({src: i.currentSrc || i.src, width: i.naturalWidth, complete: i.complete,
                         alt: i.getAttribute('alt'), inArticle: !!i.closest('article')}));
}"""

_MATH_JS = r"""() => {
  const nodes = Array.from(document.querySelectorAll('span.math, div.math'));
  const error = n => {
    const merror = n.querySelector('mjx-merror');
    if (merror) return merror.getAttribute('data-mjx-error') || 'TeX error';
    // an undefined macro is shown as red text, e.g. <mtext mathcolor="red">\badmacro</mtext>
    const undef = Array.from(n.querySelectorAll('mtext[mathcolor="red"]')).find(t => t.textContent.startsWith('\\'));
    return undef ? `undefined macro ${undef.textContent}` : null;
  };
  return nodes.map(n => ({typeset: !!n.querySelector('mjx-container'), error: error(n),
                          tex: (n.getAttribute('data-tex') || n.textContent || '').trim().slice(0, 80)}));
}"""

_HIDDEN_JS = """() => {
  // Chromium lays out closed <details> content with content-visibility: hidden, so it
  // keeps a box: ask checkVisibility(), which looks at that, not at the box.
  const shown = el => el.checkVisibility ? el.checkVisibility() : el.getClientRects().length > 0;
  const hidden_cells = '.cell.tag_hide-input, .cell.tag_hide-cell, .cell.tag_hide-output';
  const cells = Array.from(document.querySelectorAll(hidden_cells));
  const out = cells.map(cell => {
    const d = cell.querySelector('details');
    const hidden = d ? Array.from(d.children).filter(c => c.tagName !== 'SUMMARY') : [];
    const tag = (cell.className.match(/tag_hide-(input|cell|output)/) || ['?'])[0].replace('tag_', '');
    return {tag, hasDetails: !!d, open: d ? d.open : null, hiddenShown: hidden.some(shown),
            head: (cell.innerText || '').trim().split('\\n')[0].slice(0, 60)};
  });
  for (const d of document.querySelectorAll('details')) {
    if (d.closest('.cell')) continue;
    const summary = d.querySelector('summary');
    if (summary && /solution/i.test(summary.innerText))
      out.push({tag: 'solution dropdown', hasDetails: true, open: d.open, hiddenShown: false,
                head: summary.innerText.trim().slice(0, 60)});
  }
  return out;
}"""


def check_images(page) -> list[str]:
    problems = []
    for img in page.evaluate(_IMAGES_JS):
        src = img["src"]
        if urlparse(src).hostname not in (LOCAL_HOST, None) and not src.startswith(
            "data:"
        ):
            problems.append(
                f"image from an external host (not shipped with the book): {src}"
            )
        elif not img["complete"] or img["width"] == 0:
            problems.append(f"image did not load (naturalWidth 0): {src}")
        if img["inArticle"] and not (img["alt"] or "").strip():
            problems.append(f"image in the text without alt text: {src}")
    return problems


_FIGURES_JS = r"""() => {
  const problems = [];
  for (const f of document.querySelectorAll('.cell_output figure')) {
    // (the copy button of a code block carries an svg icon: not a picture)
    if (!Array.from(f.querySelectorAll('img, svg, canvas')).some(e => !e.closest('button'))) {
      const caption = (f.querySelector('figcaption') || f).innerText.trim().split('\n')[0].slice(0, 70);
      problems.push(`figure without an image: ${caption}`);
    }
  }
  for (const o of document.querySelectorAll('.cell_output .output')) {
    const m = (o.innerText || '').match(/<Figure size [0-9.]+x[0-9.]+ with \d+ Axes>/);
    if (m) problems.push(`a matplotlib figure is shown as text ${m[0]}: the kernel had no inline backend ` +
                         '(add %matplotlib inline to the chapter, or display the figure explicitly)');
  }
  return problems;
}"""


def check_figures(page) -> list[str]:
    """Every figure of a cell output is an image (not a ``<Figure size ...>`` text repr)."""
    return page.evaluate(_FIGURES_JS)


def check_math(page, mathjax_src: str | None, have_local_mathjax: bool) -> list[str]:
    """Every formula typeset by MathJax (only on pages that contain math)."""
    count = page.locator("span.math, div.math").count()
    if count == 0:
        return []
    if mathjax_src is None:
        return [f"{count} formulas but no MathJax script on the page"]
    if urlparse(mathjax_src).hostname != LOCAL_HOST and not (
        MATHJAX_CDN.match(mathjax_src) and have_local_mathjax
    ):
        return [
            f"MathJax comes from {mathjax_src}, which this machine cannot reach, and no local MathJax 3 "
            "was found: install `sphinx-mathjax-offline` or set BEYONDGRAD_MATHJAX to a folder holding tex-mml-chtml.js"
        ]
    try:
        page.wait_for_function(
            "() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise",
            timeout=PAGE_TIMEOUT_MS,
        )
        page.evaluate("() => window.MathJax.startup.promise.then(() => true)")
    except (
        Exception
    ) as e:  # playwright's TimeoutError/Error: report, don't crash the other checks
        return [
            f"MathJax did not start within {PAGE_TIMEOUT_MS / 1000:.0f} s: {str(e).splitlines()[0]}"
        ]
    problems = []
    for m in page.evaluate(_MATH_JS):
        if not m["typeset"]:
            problems.append(f"formula not typeset by MathJax: {m['tex']!r}")
        elif m["error"]:
            problems.append(f"MathJax error {m['error']!r} in {m['tex']!r}")
    return problems


#: The window the pages must fit (a laptop): nothing may scroll sideways at this width.
VIEWPORT = {"width": 1280, "height": 800}

_OVERFLOW_JS = r"""() => {
  // What a reader can open counts too: open every <details> (solutions, hidden cells).
  for (const d of document.querySelectorAll('details')) d.open = true;
  const article = document.querySelector('article') || document.body;
  const right = article.getBoundingClientRect().right;
  const blocks = Array.from(article.querySelectorAll(
    'pre, table, div.highlight, .cell_output .output, mjx-container[display="true"]'));
  const wide = blocks.filter(el => el.clientWidth > 0 &&
    (el.scrollWidth > el.clientWidth + 1 || el.getBoundingClientRect().right > right + 1));
  // report the outermost block only (a <pre> inside a wide output is the same problem)
  const outer = wide.filter(el => !wide.some(o => o !== el && o.contains(el)));
  return outer.map(el => {
    const kind = el.tagName === 'TABLE' ? 'table'
      : el.closest('.cell_input') ? 'code cell'
      : el.closest('.cell_output') ? 'cell output'
      : el.tagName.startsWith('MJX') ? 'formula' : 'code block';
    const width = Math.max(el.scrollWidth, Math.round(el.getBoundingClientRect().width));
    const room = Math.round(Math.min(el.clientWidth || width, right - el.getBoundingClientRect().left));
    const line = (el.innerText || '').split('\n').reduce((a, b) => b.length > a.length ? b : a, '');
    return {kind, width, room, line: line.trim().slice(0, 70)};
  });
}"""


def check_overflow(page, limit: int = 12) -> list[str]:
    """Every code block, cell output, table and display formula fits the content column
    at :data:`VIEWPORT`'s width: none scrolls sideways (hidden cells opened first)."""
    found = page.evaluate(_OVERFLOW_JS)
    problems = [
        f"{b['kind']} scrolls sideways ({b['width']} px in {b['room']} px): {b['line']!r}"
        for b in found[:limit]
    ]
    if len(found) > limit:
        problems.append(
            f"... and {len(found) - limit} more blocks that scroll sideways"
        )
    return problems


def check_hidden_collapsed(page) -> list[str]:
    problems = []
    for cell in page.evaluate(_HIDDEN_JS):
        where = f"{cell['tag']} cell starting {cell['head']!r}"
        if not cell["hasDetails"]:
            problems.append(f"{where} has no collapsible <details>")
        elif cell["open"] or cell["hiddenShown"]:
            problems.append(
                f"{where} is expanded on load; it must be collapsed by default"
            )
    return problems


def expected_hide_input_cells(source: Path) -> int:
    """How many code cells of the chapter's source show a collapsed input (``hide-input``)."""
    nb = book.md_to_notebook(source)
    count = 0
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if (
            cell["cell_type"] == "code"
            and "hide-input" in tags
            and not tags & {"remove-cell", "remove-input"}
        ):
            count += 1
    return count


def check_chapter(page, rel: str, context) -> list[str]:
    """Colab launch link, the .ipynb in the repository, the .ipynb download, solutions."""
    problems = []
    source = ROOT / Path(rel).with_suffix(".md")
    if not source.exists():
        return [
            f"no source {source.relative_to(ROOT)} in the repository for this chapter page"
        ]

    expected = book.colab_url(source)
    colab_links = page.eval_on_selector_all(
        "a[href*='colab.research.google.com']", "els => els.map(e => e.href)"
    )
    if expected not in colab_links:
        problems.append(
            f"no Colab launch link to {expected} (found {colab_links or 'none'})"
        )
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        problems.append(
            f"{ipynb.relative_to(ROOT)} (what Colab opens) is missing: run `python3 dev.py sync`"
        )

    launch = page.locator(".dropdown-launch-buttons button.dropdown-toggle")
    if launch.count() == 0:
        problems.append("no launch (rocket) button")
    elif expected in colab_links:
        launch.first.click()
        colab = page.locator(f".dropdown-launch-buttons a[href='{expected}']")
        if colab.count() == 0 or not colab.first.is_visible():
            problems.append("the launch menu opens without a visible Colab entry")
        page.keyboard.press("Escape")

    download = page.locator("a.btn-download-notebook-button")
    if download.count() == 0:
        problems.append("no .ipynb download entry in the download menu")
    else:
        href = download.first.evaluate("a => a.href")
        if not href.endswith(".ipynb"):
            problems.append(f"the notebook download points at {href}, not an .ipynb")
        else:
            response = context.request.get(href)
            if response.status != 200:
                problems.append(
                    f"the .ipynb download {href} answers HTTP {response.status}"
                )
            else:
                try:
                    nb = json.loads(response.body())
                except ValueError:
                    nb = None
                if (
                    not isinstance(nb, dict)
                    or "cells" not in nb
                    or "nbformat" not in nb
                ):
                    problems.append(f"the .ipynb download {href} is not a notebook")

    if book.solution_exercises(source):
        student = book.student_colab_url(source)
        link = page.locator(f"a[href='{student}']")
        if link.count() == 0:
            problems.append(f"no link to the student notebook {student}")
        elif not link.first.is_visible():
            problems.append("the link to the student notebook is not visible")
        if not book.student_path(source).exists():
            problems.append(
                f"{book.student_path(source).relative_to(ROOT)} is missing: run `python3 dev.py sync`"
            )

    expected_hidden = expected_hide_input_cells(source)
    found_hidden = page.locator(".cell.tag_hide-input").count()
    if found_hidden != expected_hidden:
        problems.append(
            f"{expected_hidden} hide-input cells in {source.name} but {found_hidden} collapsible ones on the page"
        )
    return problems


def check_page(
    page,
    rel: str,
    url: str,
    context,
    screenshot_dir: Path | None,
    mathjax_dir: Path | None,
):
    """Open one page, run every check on it (and screenshot it when ``screenshot_dir``
    is given); return (problems, screenshot or None)."""
    page.goto(url, wait_until="load")
    problems = check_images(page) + check_figures(page)
    mathjax_src = page.evaluate(
        "() => { const s = document.querySelector('script[src*=\"mathjax\" i]'); return s ? s.src : null; }"
    )
    problems += check_math(page, mathjax_src, mathjax_dir is not None)
    problems += check_hidden_collapsed(page)
    shot = None
    if screenshot_dir is not None:  # a full-page screenshot costs ~1 s on a long page
        shot = screenshot_dir / (rel.replace("/", "__").removesuffix(".html") + ".png")
        page.screenshot(path=str(shot), full_page=True)
    if re.fullmatch(r"chapters/[^/]+\.html", rel):
        problems += check_chapter(page, rel, context)
    problems += check_overflow(page)  # last: it opens every <details>
    return problems, shot


def is_local(url: str) -> bool:
    return urlparse(url).hostname == LOCAL_HOST or url.startswith(
        ("data:", "blob:", "about:")
    )


def visit(
    browser, root: Path, base_url: str, rel: str, screenshot_dir: Path | None
) -> tuple[list[str], Path | None]:
    """Open ``rel`` (a page of ``root`` served at ``base_url``) and return (problems, screenshot).

    Requests to hosts other than 127.0.0.1 are blocked (MathJax's CDN is answered from a
    local copy when there is one); console errors, uncaught exceptions and failed local
    requests are problems, as is everything the ``check_*`` functions report.
    """
    mathjax_dir = local_mathjax_dir(root)
    errors: list[str] = []

    def route(r):
        url = r.request.url
        if is_local(url):
            return r.continue_()
        m = MATHJAX_CDN.match(url)
        if m and mathjax_dir is not None:
            target = (mathjax_dir / m.group("path")).resolve()
            if target.is_file() and target.is_relative_to(mathjax_dir):
                return r.fulfill(path=str(target))
        return r.abort(
            "blockedbyclient"
        )  # no network here: every other host is blocked

    def on_console(msg):
        if msg.type != "error":
            return
        where = (msg.location or {}).get("url", "")
        if (
            msg.text.startswith("Failed to load resource")
            and where
            and not is_local(where)
        ):
            return  # a request to an external host, blocked above
        errors.append(
            f"console error: {msg.text}"
            + (f" ({where}:{msg.location.get('lineNumber')})" if where else "")
        )

    def on_response(response):
        if is_local(response.url) and response.status >= 400:
            errors.append(f"HTTP {response.status} for {response.url}")

    def on_request_failed(request):
        if is_local(request.url):
            errors.append(f"request failed: {request.url} ({request.failure})")

    redirect = REFRESH.search((root / rel).read_text(errors="replace"))
    context = browser.new_context(viewport=VIEWPORT)
    shot = None
    try:
        context.route("**/*", route)
        page = context.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda exc: errors.append(f"uncaught exception: {exc}"))
        page.on("response", on_response)
        page.on("requestfailed", on_request_failed)
        page.set_default_timeout(PAGE_TIMEOUT_MS)

        if redirect:  # e.g. index.html: a meta refresh to the root page
            target = urljoin(base_url + rel, redirect.group("url"))
            if not is_local(target):
                return [f"redirects to an external page {target}"], None
            page.goto(base_url + rel, wait_until="load")
            page.wait_for_url(target, wait_until="load")
            problems: list[str] = []
        else:
            problems, shot = check_page(
                page, rel, base_url + rel, context, screenshot_dir, mathjax_dir
            )
        page.wait_for_timeout(200)  # let late console messages arrive
    finally:
        context.close()
    return errors + problems, shot


def check_build(
    html_root: Path, screenshots: Path | None = None
) -> dict[str, list[str]]:
    """Open every page of the build at ``html_root``; return {page: problems} (empty: all fine)."""
    from playwright.sync_api import sync_playwright

    if not (html_root / "index.html").exists():
        return {"index.html": [f"no HTML build at {html_root} (index.html missing)"]}
    pages = html_pages(html_root)
    if not any(re.fullmatch(r"chapters/[^/]+\.html", p) for p in pages):
        return {"chapters/": [f"no chapter pages (chapters/*.html) under {html_root}"]}
    if screenshots is not None:
        screenshots.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[str]] = {}
    with serve(html_root) as base_url, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_executable(), args=CHROMIUM_ARGS, headless=True
        )
        try:
            for rel in pages:
                problems, _ = visit(browser, html_root, base_url, rel, screenshots)
                if problems:
                    found[rel] = problems
        finally:
            browser.close()
    return found


_MD_LINK = re.compile(r"\]\((?P<url>[^)\s]+)\)")


def notebook_link_problems(html_root: Path) -> dict[str, list[str]]:
    """Every link of the generated notebooks into the online book, checked against this
    build: the page exists and has the anchor (``id="..."``). Links to pages that this
    build lacks (a ``dev.py page`` build of a few chapters) are not checked."""
    base = book.html_base_url()
    found: dict[str, list[str]] = {}
    ids: dict[str, set[str]] = {}
    for source in book.chapter_sources():
        for path in (source.with_suffix(".ipynb"), book.student_path(source)):
            if not path.exists():
                continue
            problems = []
            for cell in json.loads(path.read_text())["cells"]:
                if cell["cell_type"] != "markdown":
                    continue
                text = "".join(cell["source"])
                for m in _MD_LINK.finditer(text):
                    url = m["url"]
                    if not url.startswith(base):
                        continue
                    page, _, anchor = url.removeprefix(base).partition("#")
                    target = html_root / page
                    if not target.exists():
                        continue
                    if page not in ids:
                        html = target.read_text(errors="replace")
                        ids[page] = set(re.findall(r'\bid="([^"]+)"', html))
                    if anchor and anchor not in ids[page]:
                        problems.append(f"{url}: no id {anchor!r} on {page}")
            if problems:
                found[path.relative_to(ROOT).as_posix()] = problems
    return found


def main(argv: list[str]) -> int:
    """``python -m tools.browser [HTML_DIR]``: check every page; exit 1 on any problem.

    Without Chromium or Playwright the checks are skipped (exit 0) with a message, except
    under CI (``CI`` set), where that is a failure (exit 1).
    """
    html_root = Path(argv[0]).resolve() if argv else book.build_dir() / "html"
    broken = notebook_link_problems(html_root)
    for rel, problems in broken.items():
        print(f"[browser] links of {rel}:\n  - " + "\n  - ".join(problems))
    if broken:
        return 1
    missing = missing_requirements()
    if missing:
        under_ci = os.environ.get("CI", "").strip().lower() not in (
            "",
            "0",
            "false",
            "no",
        )
        print(
            f"[browser] {'FAIL' if under_ci else 'skipped'}: the browser checks need "
            + " and ".join(missing)
        )
        return 1 if under_ci else 0
    keep = os.environ.get("BEYONDGRAD_SCREENSHOTS")
    t0 = time.perf_counter()
    found = check_build(html_root, Path(keep) if keep else None)
    pages = len(html_pages(html_root))
    for rel, problems in found.items():
        print(f"[browser] {rel}:\n  - " + "\n  - ".join(problems))
    print(
        f"[browser] {pages} pages of {html_root} checked in Chromium in {time.perf_counter() - t0:.0f} s: "
        + ("no problems" if not found else f"{len(found)} with problems")
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
