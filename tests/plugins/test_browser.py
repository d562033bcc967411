"""The view in a real browser: a real ``airflow api-server`` (the plugin loaded as Airflow loads it),
Debian's chromium driven by selenium, a user logging in through the simple auth manager's form, and
the task instance tab in the four states a user meets, each a real task instance of one DAG whose
output path is ``out/{{ ds }}``:

- **running**: a real ``dag.test()`` run in a process of its own, killed after its first commit as
  a worker dies, its output then committed range by range by a writer the test controls under that
  task's name; the progress bar advances between two screenshots;
- **refused**: a second DAG run of the same date, its output held by the running one;
- **nothing to do**: a second DAG run of a finished date (a new run id, the same output);
- **resumed**: a run SIGKILLed after two commits, then run again, committing the rest.

Screenshots go to ``.cache/ui-screenshots/``; with ``RAYBATCH_UPDATE_DOCS_SCREENSHOTS=1`` the four
states' are also written, scaled down, to ``docs/_static/ui/`` for docs/ui.md.

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from benchmarks.status import ROWS_PER_RANGE
from tests.conftest import free_port, run_dag
from tests.support.data import write_input
from tests.support.pipeline_runs import REPO
from tests.support.ui_outputs import (
    ROWS_PER_FILE,
    TASK_ID,
    RangeByRangeWriter,
    auth_environment,
    entry_point_installed,
    outputs_dag,
    runs_killed,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.usefixtures("airflow_db")]

DAG_ID = "ui_browser"
LOGICAL_DATE = datetime(2026, 11, 22, tzinfo=UTC)
RUN_ID = f"manual__{LOGICAL_DATE.isoformat()}"
#: A second DAG run of the running task's date (its ``{{ ds }}``, so its output): a second writer.
SECOND_WRITER_DATE = LOGICAL_DATE + timedelta(hours=12)
#: A date run to the end, then run again by a second DAG run of that date: nothing to do.
DONE_DATE = datetime(2026, 11, 20, tzinfo=UTC)
RERUN_DATE = DONE_DATE + timedelta(hours=12)
#: A date whose run is SIGKILLed after two commits, then run again: it resumes.
KILLED_DATE = datetime(2026, 11, 21, tzinfo=UTC)
#: A DAG run that never happened: its task instance's tab has no output to show.
NOT_RUN_ID = "manual__2030-01-01T00:00:00+00:00"
SCREENSHOTS = REPO / ".cache" / "ui-screenshots"
#: Where the four states' screenshots go for docs/ui.md, with this variable set to 1 (else nowhere).
DOCS_SCREENSHOTS_ENV = "RAYBATCH_UPDATE_DOCS_SCREENSHOTS"
DOCS_SCREENSHOTS = REPO / "docs" / "_static" / "ui"
DOCS_SCREENSHOT_WIDTH = 1200
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


def writer_of(run_id: str) -> str:
    """The DAG's task in ``run_id`` as the page names the writer of its ranges (dag.test() runs a
    date again as the same try of its task instance, where Airflow's scheduler would number it 2)."""
    return f"{DAG_ID} / {run_id} / {TASK_ID}, try 1"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Each DAG run's input (400 rows in 5 ranges) and its outputs, ``out/<ds>``."""
    root = tmp_path_factory.mktemp("ui-browser")
    write_input(root / "in", ROWS_PER_FILE)
    return root


@pytest.fixture(scope="module")
def killed(root):
    """Two real task instances (their rendered fields name their outputs), each SIGKILLed in a
    process of its own, as a worker that died: Airflow still has them running. The running date's
    after its first commit, KILLED_DATE's after two. Side by side: each mostly waits for its Ray."""
    procs = runs_killed(root, {LOGICAL_DATE: 1, KILLED_DATE: 2}, dag_id=DAG_ID)
    for proc in procs.values():
        assert proc.returncode == -signal.SIGKILL, proc.output[-3000:]
    return procs


@pytest.fixture(scope="module")
def running(root, killed):
    """The running date's task instance, its output written anew, range by range, by a writer this
    test controls, holding the lease in that task's name, until the module's tests end."""
    output = root / "out" / LOGICAL_DATE.strftime("%Y-%m-%d")
    shutil.rmtree(output)
    with RangeByRangeWriter(str(output), f"{DAG_ID}/{RUN_ID}/{TASK_ID}/-1", ranges=RANGES, interval_s=INTERVAL_S) as w:
        yield w


@pytest.fixture(scope="module")
def finished(root, killed, ray_local):
    """KILLED_DATE run again (it resumes); DONE_DATE run to the end, then again by a second DAG run
    of that date (RERUN_DATE). dag.test() runs a date again as the same try (1) of its task instance."""
    dag = outputs_dag(root, dag_id=DAG_ID)
    for date in (KILLED_DATE, DONE_DATE, RERUN_DATE):
        assert run_dag(dag, date).state == "success", date
    return killed[KILLED_DATE]


@pytest.fixture(scope="module")
def signed_in(api_server, browser):
    """The browser, its user logged in as admin through the simple auth manager's form."""
    from selenium.webdriver.common.by import By

    browser.get(f"{api_server}/auth/login")
    wait_for("the login form", lambda: browser.find_elements(By.NAME, "username"), 60)
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin-password")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("the login", lambda: any(c["name"] == "_token" for c in browser.get_cookies()), 60)
    return browser


def run_id_of(date: datetime) -> str:
    """The id of the DAG run ``dag.test()`` makes for ``date``."""
    return f"manual__{date.isoformat()}"


def test_a_user_logs_in_and_sees_a_running_tasks_progress_advance(api_server, signed_in, running):
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    browser = signed_in
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
    # This try's own story: running, what it committed so far, and the writer is this task instance.
    ranges = _running_ranges(browser)
    assert ranges >= 1 and _heading(browser) == ("running", "badge s-running")
    assert _text(browser, "last-writer") == f"Newest range committed by: {writer_of(RUN_ID)}"
    figures = _cards(browser)  # read a moment later: the page may have drawn a commit more
    committed = int(figures["rows committed by this try"].replace(",", ""))
    assert committed >= ranges * ROWS_PER_RANGE and committed % ROWS_PER_RANGE == 0, figures
    assert figures["rows skipped (committed before)"] == "0" and figures["commit rate"].endswith(" rows/s"), figures
    shots = [screenshot(browser, "task-instance-1.png", frame)]

    # The page refreshes itself every few seconds while the task runs: the bar and the try's count grow.
    second = wait_for("the bar to advance", lambda: (f := _fraction(browser)) > first + 0.05 and f, 60)
    assert _running_ranges(browser) > ranges
    shots.append(screenshot(browser, "task-instance-2.png", frame, docs="running.png"))

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


def test_a_second_writer_of_the_running_output_is_refused_and_says_why(root, api_server, signed_in, running):
    """Two DAG runs of one date at once (a manual run while the scheduled one still runs): the
    second is refused, its tab says so in red with the reason, and nothing on it is a green "done"."""
    browser = signed_in
    assert run_dag(outputs_dag(root, dag_id=DAG_ID), SECOND_WRITER_DATE).state == "failed"
    frame, text = ti_tab(browser, api_server, run_id_of(SECOND_WRITER_DATE))
    assert _heading(browser) == ("refused", "badge s-failed")
    story = _story(browser)
    assert story.startswith(
        f"Refused: output {root / 'out' / LOGICAL_DATE.strftime('%Y-%m-%d')} is being written by dag {DAG_ID}, "
        f"run {RUN_ID}, task {TASK_ID}, try 1"
    ), story
    assert "bad" in browser.execute_script("return document.getElementById('try').className").split()
    assert "Two writers at once would mix their results: retry once it has finished." in story
    # The output beside it is the running writer's, labelled as the output's, never this try's "done".
    assert _cards(browser)["rows committed by this try"] == "0"
    assert browser.execute_script("return document.querySelectorAll('.s-done').length") == 0
    assert "task failed" not in text and "100.0%" not in text
    assert "The output (all tries)" in text and _text(browser, "last-writer").endswith(writer_of(RUN_ID))
    screenshot(browser, "refused.png", frame, docs="refused.png")


def test_a_no_op_rerun_says_nothing_to_do_and_names_the_run_that_wrote(api_server, signed_in, finished):
    browser = signed_in
    frame, text = ti_tab(browser, api_server, run_id_of(RERUN_DATE))
    wrote = writer_of(run_id_of(DONE_DATE))
    assert _heading(browser) == ("nothing to do", "badge s-done")
    assert _text(browser, "try") == (
        "Nothing to do: every planned range was committed before this try.\n"
        f"Skipped 5 ranges (400 rows) committed before this try, by\n{wrote}: 5 ranges, 400 rows"
    )
    figures = _cards(browser)
    assert (figures["rows committed by this try"], figures["rows skipped (committed before)"]) == ("0", "400")
    assert (figures["scoring rate"], figures["commit rate"]) == ("–", "–"), figures
    # The output's writer is the run that wrote its rows, not the rerun; a finished output has no current rate.
    assert _text(browser, "last-writer") == f"Newest range committed by: {wrote}"
    assert figures["commit rate, current"] == "–", figures
    screenshot(browser, "nothing-to-do.png", frame, docs="nothing-to-do.png")


def test_a_resumed_run_says_what_it_committed_and_what_the_killed_try_had(root, api_server, signed_in, finished):
    """The resumed try's tab: what it committed, what it skipped as committed by the killed try, and
    the output's average commit rate over the tries' own times (the gap between them not counted),
    against the commit records' times."""
    browser, run_id = signed_in, run_id_of(KILLED_DATE)
    records = OutputLedger.open(str(root / "out" / KILLED_DATE.strftime("%Y-%m-%d"))).committed().values()
    killed, resumed = finished.pid, os.getpid()
    by_try = {pid: [r for r in records if r.writer.pid == pid] for pid in (killed, resumed)}
    assert [len(by_try[killed]), len(by_try[resumed])] == [2, 3]
    spans = {pid: (mine[0].writer.started_at, max(r.committed_at for r in mine)) for pid, mine in by_try.items()}
    rows = {pid: sum(r.input_rows for r in mine) for pid, mine in by_try.items()}
    average = 400 / sum(last - start for start, last in spans.values())
    with_gap = 400 / (spans[resumed][1] - spans[killed][0])

    frame, text = ti_tab(browser, api_server, run_id)
    assert _heading(browser) == ("wrote", "badge s-done")
    story = _text(browser, "try")
    assert story.startswith(f"Committed 3 ranges ({rows[resumed]} rows, "), story
    assert f"Skipped 2 ranges ({rows[killed]} rows) committed before this try, by\n" in story, story
    assert story.endswith(f"{writer_of(run_id)}: 2 ranges, {rows[killed]} rows"), story
    figures = _cards(browser)
    assert figures["rows committed by this try"] == str(rows[resumed]) and figures["commit rate"].endswith(" rows/s")
    assert _text(browser, "last-writer") == f"Newest range committed by: {writer_of(run_id)}"
    shown = int(figures["commit rate, average"].removesuffix(" rows/s").replace(",", ""))
    assert abs(shown - average) <= 1 and abs(shown - with_gap) > 2, (shown, average, with_gap)
    screenshot(browser, "resumed.png", frame, docs="resumed.png")


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


def screenshot(browser, name: str, frame=None, docs: str | None = None) -> Path:
    """The whole page (Airflow's and the tab's) under :data:`SCREENSHOTS`; the browser left inside
    ``frame`` if given, else outside the tab's frame. ``docs``: also the docs' picture of that name,
    scaled down (only with :data:`DOCS_SCREENSHOTS_ENV` set: a test run leaves the checkout as it was)."""
    browser.switch_to.default_content()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / name))
    if frame is not None:
        browser.switch_to.frame(frame)
    if docs is not None and os.environ.get(DOCS_SCREENSHOTS_ENV) == "1":
        from PIL import Image

        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with Image.open(SCREENSHOTS / name) as image:
            height = round(image.height * DOCS_SCREENSHOT_WIDTH / image.width)
            small = image.convert("RGB").resize((DOCS_SCREENSHOT_WIDTH, height), Image.Resampling.LANCZOS)
            # A palette of 128 colours: a page of flat colours keeps its look at half the bytes.
            small.quantize(colors=128).save(DOCS_SCREENSHOTS / docs, optimize=True)
        assert (DOCS_SCREENSHOTS / docs).stat().st_size < 150_000, docs
    return SCREENSHOTS / name


def _text(browser, element_id: str) -> str:
    """An element's lines as shown (no blank ones), read at once (the page may be redrawing)."""
    text = browser.execute_script(f"return document.getElementById('{element_id}').innerText")
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def _heading(browser) -> tuple[str, str]:
    """The heading's badge (what this try did): its text and class."""
    return tuple(
        browser.execute_script("const b = document.querySelector('#root h1 .badge'); return [b.innerText, b.className]")
    )


def _cards(browser) -> dict[str, str]:
    """The page's figures: each card's label and value (labels differ across the page's sections)."""
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('#root .card > b:first-child'), "
        "b => [b.parentNode.lastChild.textContent, b.textContent])"
    )
    return dict(cards)


def _running_ranges(browser) -> int:
    """The ranges this running try committed so far, as its story says."""
    story = wait_for("the try's story", lambda: _story(browser), 30)
    assert story.startswith("Running: ") and story.endswith(" committed so far."), story
    return int(story.split()[1].replace(",", ""))


def _story(browser) -> str | None:
    """The try's story, read at once (the page may be redrawing)."""
    return browser.execute_script("const t = document.getElementById('try'); return t ? t.textContent : null")


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
