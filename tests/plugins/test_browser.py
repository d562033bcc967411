"""The view in a real browser: a real ``airflow api-server`` (the plugin loaded as Airflow loads it),
Debian's chromium driven by selenium, a user logging in through the simple auth manager's form, the
task instance page of a task that is running (a real ``dag.test()`` run in a process of its own,
killed after its first commit as a worker dies, its output then committed range by range by a
writer the test controls under that task's name), and the progress bar advancing
between two screenshots, kept under ``.cache/ui-screenshots/``.

chromium and chromium-driver are installed with apt-get when missing and running as root; the test
is skipped otherwise, saying why, except under ``CI=true`` where it must run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from benchmarks.status import ROWS_PER_RANGE
from tests.conftest import free_port
from tests.support.data import write_input
from tests.support.pipeline_runs import REPO
from tests.support.ui_outputs import (
    TASK_ID,
    RangeByRangeWriter,
    auth_environment,
    entry_point_installed,
    run_killed,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.usefixtures("airflow_db")]

DAG_ID = "ui_browser"
LOGICAL_DATE = datetime(2026, 11, 22, tzinfo=UTC)
RUN_ID = f"manual__{LOGICAL_DATE.isoformat()}"
#: A DAG run that never happened: its task instance's tab has no output to show.
NOT_RUN_ID = "manual__2030-01-01T00:00:00+00:00"
SCREENSHOTS = REPO / ".cache" / "ui-screenshots"
#: The output the test's writer commits: ranges, one every INTERVAL_S seconds (more than the test waits for).
RANGES = 150
INTERVAL_S = 1.0


def _skip_or_fail(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: the browser test must run, but {reason}")
    pytest.skip(reason)


def ensure_chromium() -> tuple[str, str]:
    """chromium and chromedriver, installed with apt-get when missing (as root)."""
    missing = [p for p, b in (("chromium", "chromium"), ("chromium-driver", "chromedriver")) if not shutil.which(b)]
    if missing:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            _skip_or_fail(f"{' and '.join(missing)} not installed, and not root with apt-get to install them")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *missing], env=env, check=True, capture_output=True, timeout=900
        )
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = ensure_chromium()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _skip_or_fail("selenium is not installed (the dev extra has it)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """``airflow api-server`` on the suite's metadata DB, the simple auth manager's users from a file."""
    home = tmp_path_factory.mktemp("ui-browser-home")
    port = free_port()
    env = {
        **os.environ,
        **auth_environment(home),
        "AIRFLOW__CORE__MULTI_TEAM": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "PYTHONPATH": str(REPO),
    }
    if not entry_point_installed():  # metadata installed before the entry point existed: the provider's way
        env["AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS"] = "False"
    log = (home / "api-server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow", "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the api-server", lambda: proc.poll() is None and _ok(f"{url}/api/v2/monitor/health"), 120, 1)
        yield url
    except AssertionError:
        raise AssertionError((home / "api-server.log").read_text()[-4000:]) from None
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def test_a_user_logs_in_and_sees_a_running_tasks_progress_advance(tmp_path, api_server, browser):
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    # A real task instance (its rendered fields name the output), its process SIGKILLed after its
    # first commit, as a worker that died: Airflow still has it running. Its output is then written
    # anew, range by range, by a writer this test controls, holding the lease in that task's name.
    write_input(tmp_path / "in", [100, 100])
    killed = run_killed(tmp_path, LOGICAL_DATE, commits=1, dag_id=DAG_ID)
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    output = tmp_path / "out" / LOGICAL_DATE.strftime("%Y-%m-%d")
    shutil.rmtree(output)
    writer = RangeByRangeWriter(str(output), f"{DAG_ID}/{RUN_ID}/{TASK_ID}/-1", ranges=RANGES, interval_s=INTERVAL_S)
    with writer:
        log_in(browser, api_server)
        frame, text = ti_tab(browser, api_server, RUN_ID)
        first = wait_for("the progress bar", lambda: _fraction(browser), 60)
        assert 0 < first < 1
        assert "running" in text and "held" in text and f"{DAG_ID} / {RUN_ID} / {TASK_ID}" in text
        assert "tokens in / out (committed rows)" in browser.find_element(By.ID, "tokens").text
        # What the bar's colours and the ranges' strip mean, in words, and plurals that agree.
        assert _text(browser, "rows-legend") == "rows: written rejected not done yet"
        assert _text(browser, "ranges-legend") == f"{RANGES} planned ranges, in plan order: committed not committed"
        assert _text(browser, "plan-size") == f"1 file, {RANGES} ranges, {RANGES * ROWS_PER_RANGE:,} rows"
        # The bar's label is the page's text colour (on a halo), not white on the grey of what is left.
        label = browser.find_element(By.CSS_SELECTOR, "#rows-bar .label").value_of_css_property("color")
        assert label not in ("rgba(255, 255, 255, 1)", "rgb(255, 255, 255)"), label
        shots = [screenshot(browser, "task-instance-1.png", frame)]

        # The page refreshes itself every few seconds while the task runs.
        second = wait_for("the bar to advance", lambda: (f := _fraction(browser)) > first + 0.05 and f, 60)
        shots.append(screenshot(browser, "task-instance-2.png", frame))

        # The verifier's answer on a running output: not done yet, calmly, kept over two refreshes.
        browser.execute_script("document.getElementById('verify').click()")
        verdict = wait_for("the verifier's answer", lambda: (v := _verdict(browser)) and "verifying" not in v[0] and v)
        assert verdict[0].startswith("not done yet (running): "), verdict
        assert "planned ranges committed; the verifier checks a finished output" in verdict[0], verdict
        assert "fault" not in verdict[0] and "fault" not in verdict[1], verdict
        draws = _draws(browser)
        wait_for("two refreshes", lambda: _draws(browser) >= draws + 2, 30)
        assert _verdict(browser) == verdict
        browser.execute_script("document.getElementById('verify-box').scrollIntoView({block: 'center'})")
        shots.append(screenshot(browser, "verify-running.png", frame))
        browser.execute_script("document.getElementById('dismiss').click()")
        assert _verdict(browser) is None

        # The DAG run's and the DAG's tabs: the task's line, and its date's cell, running.
        for route, element, shot in (
            (f"runs/{quote(RUN_ID, safe='')}/plugin/raybatch-run", "lines", "dag-run.png"),
            ("plugin/raybatch-dag", "dag-grid", "dag.png"),
        ):
            open_tab(browser, api_server, route)
            table = wait_for(f"#{element}", lambda e=element: browser.find_elements(By.ID, e), 60)[0]
            assert TASK_ID in table.text
            assert browser.find_elements(By.CSS_SELECTOR, f"#{element} [data-state=running], #{element} .s-running")
            shots.append(screenshot(browser, shot))

    # A task instance that has not run: where its output goes is not known yet, and it says so.
    browser.get(f"{api_server}/raybatch/ti/{DAG_ID}/{quote(NOT_RUN_ID, safe='')}/{TASK_ID}")
    header = wait_for("the header", lambda: browser.find_elements(By.CSS_SELECTOR, "#root h1 + p"), 60)[0].text
    assert "output path not known yet" in header and "?" not in header, header
    assert "?" not in _text(browser, "read-at")
    print(f"\nscreenshots: {', '.join(str(s) for s in shots)} (bar at {first:.0%}, then {second:.0%})")
    print(f"browser test: {time.monotonic() - started:.0f} s")
    assert 0 < first < second
    assert all(s.stat().st_size > 10_000 for s in shots)


def log_in(browser, url: str) -> None:
    """Log in as admin through the simple auth manager's form."""
    from selenium.webdriver.common.by import By

    browser.get(f"{url}/auth/login")
    wait_for("the login form", lambda: browser.find_elements(By.NAME, "username"), 60)
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin-password")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("the login", lambda: any(c["name"] == "_token" for c in browser.get_cookies()), 60)


def ti_tab(browser, url: str, run_id: str, task_id: str = TASK_ID):
    """Open a task instance's tab, wait until its view has drawn what it read, and return its frame
    (the browser left inside it) and the view's text."""
    from selenium.webdriver.common.by import By

    frame = open_tab(browser, url, f"runs/{quote(run_id, safe='')}/tasks/{task_id}/plugin/raybatch-output")
    wait_for("the view's figures", lambda: browser.find_elements(By.ID, "read-at"), 60)
    return frame, browser.find_element(By.ID, "root").text


def open_tab(browser, url: str, route: str):
    """Open the plugin's tab at ``route`` of a DAG's pages, switch into its frame once the view has
    drawn, and return the frame."""
    from selenium.webdriver.common.by import By

    browser.get(f"{url}/dags/{DAG_ID}/{route}")
    frame = wait_for("the view's frame", lambda: browser.find_elements(By.TAG_NAME, "iframe"), 60)[0]
    browser.switch_to.frame(frame)
    wait_for("the view", lambda: _draws(browser) or browser.find_elements(By.CSS_SELECTOR, "#root table, #root h1"), 60)
    return frame


def screenshot(browser, name: str, frame=None) -> Path:
    """The whole page (Airflow's and the tab's) under :data:`SCREENSHOTS`; the browser left inside
    ``frame`` if given, else outside the tab's frame."""
    browser.switch_to.default_content()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / name))
    if frame is not None:
        browser.switch_to.frame(frame)
    return SCREENSHOTS / name


def _text(browser, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id).text


def _draws(browser) -> int:
    """How many times the task instance's view has drawn itself (it counts its refreshes)."""
    return int(browser.execute_script("return document.getElementById('root').dataset.draws || 0"))


def _verdict(browser) -> tuple[str, str] | None:
    """The verifier's answer on the page (its text and class), read at once (the page may be redrawing)."""
    answer = browser.execute_script(
        "const v = document.getElementById('verdict'); return v ? [v.textContent, v.className] : null"
    )
    return tuple(answer) if answer else None


def _fraction(browser) -> float:
    """The bar's fraction; 0 while it is not drawn (or is being redrawn: the page refreshes itself)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        bars = browser.find_elements(By.ID, "rows-bar")
        return float(bars[0].get_attribute("data-fraction")) if bars else 0.0
    except StaleElementReferenceException:
        return 0.0
