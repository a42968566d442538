"""The web page at `/` in a real browser: Debian's headless chromium, driven by playwright, against
the real server: the built-in model behind an API key (every page test enters the key the page asks
for), and the tiny model for --no-webui.

Every check waits on the page's state (playwright's waiting assertions), never on time.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from server_utils import SERVER_ARGS, openai_clients, running_server

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package; `make browser` installs it
# The background-networking flags keep chromium from reaching out (there is no network to reach).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000  # generous: CPU decoding on a shared machine
LONG_MAX_TOKENS = 1900  # far more than the test lets it write before pressing stop
KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
ANSWERS_JS = "[...document.querySelectorAll('.msg.assistant .content')].pop()?.dataset.raw?.length ?? 0"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium "
                    f"(CI={os.environ.get('CI', '')!r})")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def demo_server():
    with running_server(None, "--parallel", "2", "--ctx-size", "2048", "--api-key", KEY) as server:
        yield server


def _open(browser, url: str):
    """A fresh browser context (empty localStorage) on `url`; page errors are collected."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    return context, page, errors


def _enter_key(page, key: str) -> None:
    expect(page.locator("#key-banner")).to_be_visible()
    page.fill("#key-input", key)
    page.click("#key-form button")


@pytest.fixture
def page(browser, demo_server):
    context, page, errors = _open(browser, demo_server.root + "/")
    _enter_key(page, KEY)
    expect(page.locator("#connection")).to_have_text("connected")
    yield page
    context.close()
    assert not errors


def _abort_count(server) -> float:
    text = httpx.get(f"{server.root}/metrics", headers=AUTH).text
    found = re.search(r'^onebit:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _wait_all_slots_idle(server, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(slot["is_processing"] for slot in httpx.get(f"{server.root}/slots", headers=AUTH).json()):
            return
        time.sleep(0.2)
    raise AssertionError(f"a slot stayed busy: {httpx.get(f'{server.root}/slots', headers=AUTH).json()}")


def test_chat_streams_the_models_answer(page, demo_server):
    page.fill("#set-temperature", "0")
    page.fill("#set-max_tokens", "24")
    question = "Write a function that reads a JSON file."
    page.fill("#chat-input", question)
    page.press("#chat-input", "Enter")
    answer = page.locator(".msg.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    text = answer.locator(".content").get_attribute("data-raw")
    # The page sent the settings and joined the streamed deltas: the same greedy answer as the API's.
    client, _ = openai_clients(demo_server, api_key=KEY)
    want = client.chat.completions.create(model=client.models.list().data[0].id, temperature=0, top_p=0.95,
                                          max_tokens=24, messages=[{"role": "user", "content": question}])
    assert text and text == want.choices[0].message.content
    expect(answer.locator(".status")).to_contain_text(f"done · {want.usage.completion_tokens} tokens")
    expect(answer.locator(".content")).not_to_be_empty()
    expect(page.locator(".msg.user .content")).to_have_text(question)


def test_stop_aborts_a_long_generation_and_the_slot_view_follows(page, demo_server):
    aborted_before = _abort_count(demo_server)
    page.fill("#set-max_tokens", str(LONG_MAX_TOKENS))
    page.fill("#set-extra", json.dumps({"ignore_eos": True}))
    page.fill("#chat-input", "Write a long program.")
    page.click("#send")
    expect(page.locator("#stop")).to_be_enabled()
    page.wait_for_function(f"{ANSWERS_JS} >= 10")
    grown = page.evaluate(ANSWERS_JS)
    page.wait_for_function(f"{ANSWERS_JS} > {grown}")  # still streaming: the answer grows

    page.click("#tab-status")
    expect(page.locator("tr.slot[data-state=busy]")).to_have_count(1)
    expect(page.locator("tr.slot[data-state=idle]")).to_have_count(1)
    expect(page.locator("#busy-slots")).to_have_text("1 / 2")

    page.click("#tab-chat")
    page.click("#stop")
    answer = page.locator(".msg.assistant").last
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(answer.locator(".status")).to_contain_text("stopped")
    expect(page.locator("#stop")).to_be_disabled()
    expect(page.locator("#send")).to_be_enabled()
    stopped_at = answer.locator(".content").get_attribute("data-raw")

    _wait_all_slots_idle(demo_server)  # the server dropped the request: the page's fetch was aborted
    assert _abort_count(demo_server) == aborted_before + 1
    page.click("#tab-status")
    expect(page.locator("tr.slot[data-state=idle]")).to_have_count(2)
    expect(page.locator("tr.slot[data-state=busy]")).to_have_count(0)
    # Nothing arrived after the stop: the answer is as it was when the page said "stopped".
    assert answer.locator(".content").get_attribute("data-raw") == stopped_at
    shown = int(re.search(r"stopped · (\d+) tokens", answer.locator(".status").text_content()).group(1))
    assert 0 < shown < LONG_MAX_TOKENS


def test_markdown_renders_model_text_safely(page):
    facts = page.evaluate("""async () => {
        const { renderMarkdown } = await import('/webui/markdown.js');
        const box = document.createElement('div');
        document.body.append(box);
        renderMarkdown([
            'Hi **bold** and *it* and `x<y` in my_var_name, 2 * 3 * 4',
            '',
            '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">',
            '',
            '- one', '- two **b**', '',
            '1. first', '2. second', '',
            '```python', 'if a < b:', "    print('<b>')", '```',
        ].join('\\n'), box);
        const all = (sel) => [...box.querySelectorAll(sel)].map((n) => n.textContent);
        return {strong: all('strong'), em: all('em'), code: all(':not(pre) > code'), script: all('script').length,
                img: all('img').length, ul: all('ul > li'), ol: all('ol > li'),
                pre: all('pre > code'), lang: box.querySelector('pre > code').dataset.language,
                text: box.textContent};
    }""")
    assert facts["strong"] == ["bold", "b"] and facts["em"] == ["it"] and facts["code"] == ["x<y"]
    assert facts["script"] == 0 and facts["img"] == 0
    assert '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">' in facts["text"]
    assert "my_var_name, 2 * 3 * 4" in facts["text"]
    assert facts["ul"] == ["one", "two b"] and facts["ol"] == ["first", "second"]
    assert facts["pre"] == ["if a < b:\n    print('<b>')"] and facts["lang"] == "python"
    assert page.evaluate("window.pwned") is None


def test_api_key_guards_the_data_and_the_page_asks_for_it(browser, demo_server):
    root = demo_server.root
    page_answer = httpx.get(f"{root}/")
    assert page_answer.status_code == 200 and page_answer.headers["content-type"].startswith("text/html")
    assert httpx.get(f"{root}/webui/app.js").status_code == 200
    for path in ("/slots", "/props", "/metrics", "/queue", "/v1/models"):
        refused = httpx.get(f"{root}{path}")
        assert refused.status_code == 401 and refused.json()["error"]["message"], path
    assert httpx.get(f"{root}/slots", headers=AUTH).status_code == 200
    assert httpx.get(f"{root}/webui/..%2Fapi%2Fapp.py").status_code == 404
    assert httpx.get(f"{root}/webui/nothing.js").status_code == 404
    model = httpx.get(f"{root}/v1/models", headers=AUTH).json()["data"][0]["id"]

    context, page, errors = _open(browser, root + "/")
    expect(page.locator("#connection")).to_have_text("API key needed")
    _enter_key(page, "wrong")
    expect(page.locator("#key-error")).to_have_text("That key was refused.")
    _enter_key(page, KEY)
    expect(page.locator("#connection")).to_have_text("connected")
    expect(page.locator("#model-name")).to_have_text(model)
    expect(page.locator("#key-banner")).to_be_hidden()
    page.click("#tab-status")
    expect(page.locator("tr.slot[data-state=idle]")).to_have_count(2)
    page.reload()  # the key stays in this browser, and the page opens on the view it showed
    expect(page.locator("#connection")).to_have_text("connected")
    expect(page.locator("tr.slot[data-state=idle]")).to_have_count(2)
    context.close()
    assert not errors


def test_no_webui_leaves_root_unserved(tiny_model_dir):
    with running_server(tiny_model_dir, *SERVER_ARGS, "--no-webui") as server:
        for path in ("/", "/webui/app.js"):
            answer = httpx.get(f"{server.root}{path}")
            assert answer.status_code == 404 and "error" in answer.json(), path
        assert httpx.get(f"{server.root}/health").status_code == 200
