"""The chat page at `/` of a running `cortiq serve`, in a real browser: headless Chromium driven
by Selenium (crates/cli/tests/serve.rs starts the server; scripts/test installs Debian's
chromium and chromium-driver and the venv). Two turns: each answer streams in (text shown
while the request still runs), the second turn's stats say prompt tokens were reused; then the
stop button ends a long answer early. Saves a screenshot.

usage: chat_page.py BASE_URL SCREENSHOT.png
"""

import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

base, shot = sys.argv[1], sys.argv[2]
failed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failed.append(what)


opts = Options()
for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,760"]:
    opts.add_argument(arg)
opts.binary_location = "/usr/bin/chromium"
d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
try:
    d.get(base + "/")
    check("cortiq chat" in d.title, f"the page loads ({d.title!r})")
    WebDriverWait(d, 10).until(lambda d: d.find_element(By.ID, "model").text.startswith("model:"))

    def setting(id_, value):
        e = d.find_element(By.ID, id_)
        e.clear()
        e.send_keys(str(value))

    setting("temperature", 0)
    setting("max_tokens", 64)
    setting("system", "You are terse.")

    def turn(i, text):
        d.find_element(By.ID, "input").send_keys(text)
        d.find_element(By.ID, "send").click()
        seen_partial = False
        t0 = time.time()
        while time.time() - t0 < 120:
            bubbles = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")
            stats = d.find_elements(By.CSS_SELECTOR, ".stats")
            done = len(stats) > i and stats[i].get_attribute("data-done") == "1"
            if done:
                break
            if len(bubbles) > i and bubbles[i].text:
                seen_partial = True
            time.sleep(0.01)
        stats = d.find_elements(By.CSS_SELECTOR, ".stats")[i]
        answer = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[i].text
        return answer, stats, seen_partial

    a1, s1, partial1 = turn(0, "Name three colours.")
    check(len(a1) > 0, f"turn 1: an answer ({a1!r})")
    check(int(s1.get_attribute("data-prompt")) > 0, f"turn 1: stats ({s1.text!r})")
    print("turn 1 stats:", s1.text)
    time.sleep(1.0)  # the server refills prompt + answer for the cache while idle
    a2, s2, partial2 = turn(1, "And two more?")
    check(len(a2) > 0, f"turn 2: an answer ({a2!r})")
    cached, prompt = int(s2.get_attribute("data-cached")), int(s2.get_attribute("data-prompt"))
    check(cached > 0 and cached >= prompt - 30, f"turn 2 reuses the conversation so far ({s2.text!r})")
    check(float(s2.get_attribute("data-tps")) > 0, "turn 2: tok/s shown")
    print("turn 2 stats:", s2.text)
    check(partial1 or partial2, "an answer was on the page while its request still ran (streamed)")
    # Stop: a long answer, stopped once text arrives.
    setting("max_tokens", 2000)
    d.find_element(By.ID, "input").send_keys("Write a very long story about a dragon who learns to read, in many chapters.")
    d.find_element(By.ID, "send").click()
    WebDriverWait(d, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 3
                               and d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[2].text)
    d.find_element(By.ID, "stop").click()
    WebDriverWait(d, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".stats")[2].get_attribute("data-done") == "1")
    n1 = len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[2].text)
    time.sleep(0.5)
    n2 = len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[2].text)
    s3 = d.find_elements(By.CSS_SELECTOR, ".stats")[2].text
    check(s3 == "stopped" and n1 == n2 and d.find_element(By.ID, "send").is_enabled(),
          f"stop ends the answer early ({n1} chars, stats {s3!r}, send enabled again)")
    d.save_screenshot(shot)
    print("screenshot:", shot)
finally:
    d.quit()
if failed:
    sys.exit(f"{len(failed)} checks failed")
print("all checks passed")
