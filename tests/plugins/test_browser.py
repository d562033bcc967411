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
from urllib.parse import quote

import pytest
import requests

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
SCREENSHOTS = REPO / ".cache" / "ui-screenshots"
#: The output the test's writer commits: ranges, one every INTERVAL_S seconds.
RANGES = 100
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
        # Log in through the simple auth manager's form.
        browser.get(f"{api_server}/auth/login")
        wait_for("the login form", lambda: browser.find_elements(By.NAME, "username"), 60)
        browser.find_element(By.NAME, "username").send_keys("admin")
        browser.find_element(By.NAME, "password").send_keys("admin-password")
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for("the login", lambda: any(c["name"] == "_token" for c in browser.get_cookies()), 60)

        # The task instance page's tab of the plugin.
        browser.get(f"{api_server}/dags/{DAG_ID}/runs/{quote(RUN_ID, safe='')}/tasks/{TASK_ID}/plugin/raybatch-output")
        frame = wait_for("the view's frame", lambda: browser.find_elements(By.TAG_NAME, "iframe"), 60)[0]
        browser.switch_to.frame(frame)
        first = wait_for("the progress bar", lambda: _fraction(browser), 60)
        assert 0 < first < 1
        text = wait_for(
            "the lease holder", lambda: (t := browser.find_element(By.ID, "root").text) and "held" in t and t
        )
        assert "running" in text and "held" in text and f"{DAG_ID} / {RUN_ID} / {TASK_ID}" in text
        assert "tokens in / out (committed rows)" in browser.find_element(By.ID, "tokens").text
        browser.switch_to.default_content()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shots = [SCREENSHOTS / "task-instance-1.png", SCREENSHOTS / "task-instance-2.png"]
        browser.save_screenshot(str(shots[0]))

        browser.switch_to.frame(frame)
        # The page refreshes itself every few seconds while the task runs.
        second = wait_for("the bar to advance", lambda: (f := _fraction(browser)) > first + 0.05 and f, 60)
        browser.switch_to.default_content()
        browser.save_screenshot(str(shots[1]))

        # The DAG run's and the DAG's tabs: the task's line, and its date's cell, running.
        for route, element, shot in (
            (f"runs/{quote(RUN_ID, safe='')}/plugin/raybatch-run", "lines", "dag-run.png"),
            ("plugin/raybatch-dag", "dag-grid", "dag.png"),
        ):
            browser.get(f"{api_server}/dags/{DAG_ID}/{route}")
            frame = wait_for("the view's frame", lambda: browser.find_elements(By.TAG_NAME, "iframe"), 60)[0]
            browser.switch_to.frame(frame)
            table = wait_for(f"#{element}", lambda e=element: browser.find_elements(By.ID, e), 60)[0]
            assert TASK_ID in table.text
            assert browser.find_elements(By.CSS_SELECTOR, f"#{element} [data-state=running], #{element} .s-running")
            browser.switch_to.default_content()
            browser.save_screenshot(str(SCREENSHOTS / shot))
            shots.append(SCREENSHOTS / shot)
    print(f"\nscreenshots: {shots[0]} ({first:.0%}), {shots[1]} ({second:.0%}), {shots[2]}, {shots[3]}")
    print(f"browser test: {time.monotonic() - started:.0f} s")
    assert 0 < first < second
    assert all(s.stat().st_size > 10_000 for s in shots)


def _fraction(browser) -> float:
    """The bar's fraction; 0 while it is not drawn (or is being redrawn: the page refreshes itself)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        bars = browser.find_elements(By.ID, "rows-bar")
        return float(bars[0].get_attribute("data-fraction")) if bars else 0.0
    except StaleElementReferenceException:
        return 0.0
