"""The live page of a real running job, opened in headless Chromium (Debian's chromium and
chromedriver, driven by Selenium): the devices, their budgets (ESync) or rounds and rates
(SSGD, ASGD), and an evaluator metric that rises between two loads; the page's live part
reloads by itself; a screenshot of each is kept (ESYNC_SCREENSHOTS=DIR copies them there,
as docs/img/live-page.png was made).

Without Chromium these tests are skipped, unless ESYNC_REQUIRE_BROWSER is set (.ci/run
installs Chromium and sets it), where they fail instead."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from tests.helpers import REPO, wait_until

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
LAUNCH = os.path.join(REPO, "src", "esync", "launch", "local.py")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        message = "needs Debian's chromium and chromium-driver (apt-get install chromium " \
                  "chromium-driver)"
        if os.environ.get("ESYNC_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="esync-chromium-")
    # as root, headless, and nothing that reaches for the internet (refused here)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1400,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


class Job:
    """esync-launch running a job of 4 workers at --slowdown 1,1,4,4, and its live page."""

    def __init__(self, folder, *mode):
        self.out = open(os.path.join(folder, "launch.out"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, LAUNCH, *mode, "--workers", "4", "--servers", "1",
             "--slowdown", "1,1,4,4", "-n", "lenet", "--time-limit", "120",
             "--eval-interval", "1", "--no-progress", "--out", str(folder)],
            cwd=REPO, stdout=self.out, stderr=subprocess.STDOUT)
        self.url = wait_until(self._address, "the launcher's live page line", timeout=120)

    def _address(self):
        assert self.proc.poll() is None, self.output()
        found = re.search(r"live page: (http://\S+)", self.output())
        return found.group(1) if found else None

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the launcher stops its children
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


@pytest.fixture
def job(tmp_path):
    started = []

    def start(*mode):
        started.append(Job(tmp_path, *mode))
        return started[-1]

    yield start
    for j in started:
        j.stop()


#: the page as it is now, read in one script: the page replaces its live part every 2 s,
#: so elements found by one WebDriver call may be gone by the next (a stale element)
SNAPSHOT = """
const rows = [...document.querySelectorAll("#devices tr.device")].map(row => ({
    rank: Number(row.dataset.rank), device: row.cells[1].textContent,
    state: row.dataset.state, budget: row.dataset.budget, round: row.dataset.round,
    rate: row.dataset.rate, budget_cell: row.querySelector("td.budget").textContent}));
const metric = document.getElementById("metric");
const charts = [...document.querySelectorAll("svg.chart")];
return {devices: rows, metric: metric ? metric.dataset.value : null,
        charts: charts.map(c => c.getAttribute("aria-label")),
        lines: document.querySelectorAll("svg.chart polyline").length};
"""


def snapshot(browser):
    """The page's devices (rank, device, state, budget, round, rate, budget_cell), its
    metric, its charts' labels and their number of lines, all as of one moment."""
    return browser.execute_script(SNAPSHOT)


def devices(browser):
    return snapshot(browser)["devices"]


def metric(browser):
    value = snapshot(browser)["metric"]
    return float(value) if value else None


def loaded(browser, url, ready):
    """`ready(browser)`'s first true value, loading the page afresh each time."""
    def look():
        browser.get(url)
        try:
            return ready(browser)
        except Exception:  # the page between two of its reloads
            return None
    return wait_until(look, f"{ready.__name__} on {url}", timeout=120, poll=0.5)


def four_training(browser):
    rows = devices(browser)
    return rows if len(rows) == 4 and all(r["round"] and int(r["round"]) > 0 and r["rate"]
                                          for r in rows) else None


def a_metric(browser):
    return metric(browser)


def check_page(browser, job, tmp_path, name, with_budgets):
    # the metric rises between two loads of the page
    first = loaded(browser, job.url, a_metric)
    rows = loaded(browser, job.url, four_training)
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    assert all(r["state"] == "running" for r in rows)
    later = loaded(browser, job.url, lambda b: (metric(b) or 0) > first and metric(b))
    assert later > first
    if with_budgets:
        # the two devices 4 times slower run 1 local iteration a round, the fast ones more
        def budgets(b):
            found = {r["device"]: int(r["budget"]) for r in devices(b) if r["budget"]}
            slow = [v for d, v in found.items() if d.endswith("-x4")]
            fast = [v for d, v in found.items() if not d.endswith("-x4")]
            return found if len(found) == 4 and slow == [1, 1] and \
                min(fast) >= 2 * max(slow) else None
        budgets.__name__ = "budgets of about 4 and 1"
        loaded(browser, job.url, budgets)
        # each budget shown is the one the device ran in the round shown (its own log).
        for row in devices(browser):
            logged = os.path.join(str(tmp_path), "lenet", "esync", socket.gethostname(),
                                  row["device"], f"iter-{row['round']}.json")
            with open(logged) as f:
                assert json.load(f)["budget"] == int(row["budget"]), row
    else:
        page = snapshot(browser)
        assert all(r["budget"] == "" for r in page["devices"])
        assert {r["budget_cell"] for r in page["devices"]} == {"-"}
        assert "round" in page["charts"][2]
    assert all(float(r["rate"]) > 0 for r in devices(browser))
    # the live part reloads by itself: rounds move on with no load of the page
    before = {r["rank"]: int(r["round"]) for r in devices(browser)}

    def moved():
        now = {r["rank"]: int(r["round"]) for r in devices(browser)}
        return now if now != before and all(now[k] >= before[k] for k in now) else None
    wait_until(moved, "the page's own reload", timeout=60, poll=0.3)
    assert snapshot(browser)["lines"] >= 4
    shot = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
    if os.environ.get("ESYNC_SCREENSHOTS"):
        shutil.copy(shot, os.path.join(os.environ["ESYNC_SCREENSHOTS"], f"{name}.png"))


def test_an_esync_job_shows_its_devices_budgets_and_metric(browser, job, tmp_path):
    # the paper's rule: the 4x slower devices run 1 local iteration a round
    running = job("-m", "esync", "--coordination-share", "0")
    check_page(browser, running, tmp_path, "live-page", with_budgets=True)
    # the jobs' list links to it
    browser.get(running.url.rsplit("/jobs/", 1)[0] + "/jobs/")
    link = browser.find_element("css selector", "#jobs a")
    assert link.get_attribute("href") == running.url


@pytest.mark.parametrize("mode", [["-m", "sync"], ["-m", "async"]])
def test_sync_and_async_jobs_show_rounds_and_rates(browser, job, tmp_path, mode):
    check_page(browser, job(*mode), tmp_path, f"live-page-{mode[1]}", with_budgets=False)
