"""`serve`'s page at `/`, in a real browser: Debian's headless Chromium (driven by
playwright, no browser of its own) loads it from a server on a loopback port, a sentence is
typed, and the translation read from the page is the engine's; then an n-best list with
scores. A screenshot of the page is kept under the test's tmp folder. Without the browser the
test skips, and fails under CI=true."""

import os
import shutil
import threading
import time

import pytest

from tests.conftest import run_engine
from tests.test_serve import ct2_export  # noqa: F401  (the fixture)
from tests.test_serve_http import free_port

pytestmark = pytest.mark.slow  # trains the tiny run, exports it, starts a browser

CHROMIUM = os.environ.get("KERAS_TRANSFORMER_CHROMIUM", "/usr/bin/chromium")
SENTENCE = "the dog runs in the park"


def browser_or_skip():
    """playwright's sync API, with Debian's Chromium at CHROMIUM; a skip without them (a
    failure under CI=true)."""
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "playwright is not installed (pip install playwright==1.65.3)"
    if missing is None and not shutil.which(CHROMIUM):
        missing = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(missing + " (CI=true: the browser test must run)")
        pytest.skip(missing)
    return sync_playwright


@pytest.fixture
def page_server(tiny_run, ct2_export):
    """The app `serve` runs, under uvicorn in a thread, on a free loopback port."""
    import uvicorn

    from keras_transformer.serving.app import build_app
    from keras_transformer.serving.server import ServeSettings, served_model

    folder = ct2_export
    served, _ = served_model(ServeSettings(
        run_dir=str(tiny_run), engine="ctranslate2", ctranslate2_model=str(folder),
        keras_fallback=False, model_name="toy", access_log=False))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(served), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while served.state != "AVAILABLE" or not server.started:
        assert served.state != "END" and time.monotonic() < deadline, served.error_message
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/", folder
    server.should_exit = True
    thread.join(timeout=15)


def test_the_page_translates_in_a_real_browser(page_server, tiny_run, tmp_path):
    sync_playwright = browser_or_skip()
    url, folder = page_server
    engine = run_engine(tiny_run, engine="ctranslate2", ctranslate2_model=str(folder))
    expected = engine.translate([SENTENCE], nbest=True)[0]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(url)
            page.fill("#sentence", SENTENCE)
            page.click("#translate")
            page.wait_for_function("document.getElementById('time').textContent !== ''",
                                   timeout=30000)
            assert page.text_content("#error") == ""
            assert page.text_content("#translation") == expected[0][0]
            assert page.text_content("#time").endswith(" ms")
            page.fill("#nbest", "3")
            page.click("#translate")
            page.wait_for_function("document.querySelectorAll('#hypotheses tr').length === 3",
                                   timeout=30000)
            rows = page.query_selector_all("#hypotheses tr")
            cells = [[c.text_content() for c in row.query_selector_all("td")] for row in rows]
            assert [text for _, text in cells] == [t for t, _ in expected[:3]]
            assert [float(score) for score, _ in cells] == pytest.approx(
                [s for _, s in expected[:3]], abs=1e-3)
            page.screenshot(path=str(tmp_path / "serve-page.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "serve-page.png").stat().st_size > 1000
