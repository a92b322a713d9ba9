"""The attention page in a real headless Chromium (Debian's `chromium`, driven by Playwright).

Playwright's own browser downloads are never used: the test drives the system browser
through ``executable_path``. Where no chromium is installed (``.ci/run`` installs it with
apt) the test is skipped with that reason.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def _chromium() -> str | None:
    env = os.environ.get("AIAYN_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium browser installed (apt-get install chromium; .ci/run does this)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def test_page_translates_and_draws_the_attention_heatmap(browser, server, sentences: list[str],
                                                         tmp_path: Path) -> None:
    text = sentences[3]
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # Offline page: any request leaving this server is a bug (a CDN, a font service...).
    outside: list[str] = []
    page.on("request", lambda req: None if req.url.startswith(server.url) else outside.append(req.url))

    page.goto(server.url + "/", wait_until="networkidle")
    sync_api.expect(page.locator("#model-info")).to_contain_text("en → xx")
    page.fill("#source", text)
    page.click("#translate")
    sync_api.expect(page.locator("#attention-panel")).to_be_visible(timeout=60_000)

    # What the API says for the same request (beam from the page: the checkpoint's default, 4).
    api = httpx.post(f"{server.url}/v1/translate", json={"texts": [text], "attention": True, "beam": 4},
                     timeout=120).json()
    att = api["attention"][0]
    n_tgt, n_src = len(att["tgt_tokens"]), len(att["src_tokens"])
    assert page.locator("#translation").inner_text() == api["translations"][0]

    cells = page.locator("#heatmap rect.cell")
    assert cells.count() == n_tgt * n_src  # one cell per (target, source) token pair
    assert page.locator("#heatmap text.src-token").all_text_contents() == att["src_tokens"]
    assert page.locator("#heatmap text.tgt-token").all_text_contents() == att["tgt_tokens"]

    # Layer and head selectors: every layer, "average over heads" plus every head.
    assert page.locator("#layer option").count() == att["layers"]
    assert page.locator("#head option").count() == att["heads"] + 1
    assert page.locator("#head").input_value() == "avg"
    assert page.locator("#layer").input_value() == str(att["layers"] - 1)

    # The averaged view shows the mean of the heads of the last layer.
    last = att["weights"][-1]
    t, s = n_tgt - 1, 0
    mean = sum(h[t][s] for h in last) / len(last)
    cell = page.locator(f'#heatmap rect.cell[data-t="{t}"][data-s="{s}"]')
    assert float(cell.get_attribute("data-w")) == pytest.approx(mean, abs=2e-4)

    # One head of the first layer: the cells now carry that head's weights.
    page.select_option("#layer", "0")
    page.select_option("#head", "1")
    assert cells.count() == n_tgt * n_src
    shown = [float(w) for w in page.locator("#heatmap rect.cell").evaluate_all(
        "rects => rects.map(r => r.getAttribute('data-w'))")]
    expected = [w for row in att["weights"][0][1] for w in row]
    assert shown == pytest.approx(expected, abs=2e-4)

    page.hover('#heatmap rect.cell[data-t="0"][data-s="0"]')
    sync_api.expect(page.locator("#cell-info")).to_contain_text(att["src_tokens"][0])

    page.select_option("#head", "avg")
    shot = tmp_path / "attention_page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("AIAYN_SCREENSHOT_DIR"):  # keep a copy to look at
        shutil.copy(shot, Path(os.environ["AIAYN_SCREENSHOT_DIR"]) / shot.name)
    assert not errors, errors
    assert not outside, outside
    page.close()


def test_page_shows_api_errors(browser, server) -> None:
    page = browser.new_page()
    page.goto(server.url + "/", wait_until="networkidle")
    page.fill("#source", "word " * 100)  # over the test server's --max-chars
    page.click("#translate")
    sync_api.expect(page.locator("#error")).to_contain_text("characters", timeout=30_000)
    assert page.locator("#attention-panel").is_hidden()
    page.close()


def test_page_asks_for_the_api_key(browser, keyed_server, sentences: list[str]) -> None:
    """With `aiayn serve --api-key` the page loads without the key, asks for it on the first
    401, and sends it with every API call (kept for the tab's life: a reload keeps it)."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(keyed_server.url + "/", wait_until="networkidle")
    sync_api.expect(page.locator("#auth-panel")).to_be_visible()
    sync_api.expect(page.locator("#auth-message")).to_contain_text("needs an API key")

    page.fill("#api-key", "not-the-key")
    page.click("#use-key")
    sync_api.expect(page.locator("#auth-message")).to_contain_text("refused this API key")
    sync_api.expect(page.locator("#auth-panel")).to_be_visible()

    page.fill("#api-key", keyed_server.api_key)
    page.click("#use-key")
    sync_api.expect(page.locator("#model-info")).to_contain_text("en → xx")
    assert page.locator("#auth-panel").is_hidden()
    page.fill("#source", sentences[0])
    page.click("#translate")
    sync_api.expect(page.locator("#attention-panel")).to_be_visible(timeout=60_000)
    assert page.locator("#error").is_hidden()

    page.reload(wait_until="networkidle")
    sync_api.expect(page.locator("#model-info")).to_contain_text("en → xx")
    assert page.locator("#auth-panel").is_hidden()
    assert not errors, errors
    page.close()
