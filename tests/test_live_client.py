"""esync.logs.live, the reports to the live page, against a real state server process: what a
worker's round records become on the page, the last report, the token, and a state
server that is gone or refuses (training goes on: nothing raises)."""
import logging
import os
import subprocess
import sys
import time

import pytest

from esync.errors import UserError
from esync.logs.live import LiveReporter, page_url, parse_url
from esync.launch.supervisor import free_port
from tests.helpers import MAIN, REPO, wait_until
from tests.stateserver import StateServer

TOKEN = "live-client-t0ken"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live")
    state = StateServer(folder)
    os.environ["ESYNC_STATE_TOKEN"] = TOKEN  # the server's; the tests' reporters pass theirs
    try:
        state.start()
    finally:
        del os.environ["ESYNC_STATE_TOKEN"]
    yield state
    state.stop()


def record(round_, **extra):
    return {"num_iters": round_, "num_samples": 64, "bytes_sent": 1000,
            "bytes_received": 2000, "loss": 0.5, "total_time": round_ * 0.1,
            "breakdown": {"compute": 0.08, "communication": 0.02}, **extra}


def live(server, job):
    status, answer = server.request("GET", f"/jobs/{job}/live/?points=0")
    return answer if status == 200 else None


def test_round_records_reach_the_page_and_the_last_report_says_done(server):
    url = page_url("127.0.0.1", server.port, "c1")
    reporter = LiveReporter(url, {"role": "worker", "rank": 2, "device": "w2-x4",
                                  "mode": "esync"}, token=TOKEN, interval=0.2)
    try:
        for k in range(1, 4):
            reporter.add(record(k, budget=3))
        shown = wait_until(lambda: (live(server, "c1") or {}).get("workers"), timeout=30,
                         what="the worker's report")
        figures = shown[0]["figures"]
        assert (shown[0]["rank"], figures["device"], figures["mode"]) == (2, "w2-x4", "esync")
        assert (figures["round"], figures["samples"], figures["budget"]) == (3, 192, 3)
        assert (figures["bytes_sent"], figures["bytes_received"]) == (3000, 6000)
        assert figures["breakdown"] == {"compute": 0.08, "communication": 0.02}
        assert figures["samples_per_second"] > 0
    finally:
        reporter.close()
    assert live(server, "c1")["workers"][0]["state"] == "done"


def test_a_quiet_process_reports_at_the_keepalive_and_news_at_once(server):
    """A report goes when a round record came (at most every interval), and every
    `keepalive` seconds when nothing did: a worker sitting rounds out reports about once
    a round, not every second (the state server's CPU at 16 workers)."""
    reporter = LiveReporter(page_url("127.0.0.1", server.port, "c5"),
                            {"role": "worker", "rank": 0, "mode": "esync"}, token=TOKEN,
                            interval=0.05, keepalive=0.6)

    def reports(at_least):
        shown = wait_until(lambda: [w for w in (live(server, "c5") or {}).get("workers", [])
                                    if w["reports"] >= at_least], timeout=30,
                           what=f"{at_least} reports")
        return shown[0]

    try:
        reporter.add(record(1))
        first = reports(1)["reports"]
        start = time.monotonic()
        reports(first + 2)  # two keepalives: not one every 0.05 s
        assert time.monotonic() - start >= 2 * 0.6 - 0.1
        reporter.add(record(2))
        assert wait_until(lambda: (live(server, "c5") or {"workers": [{}]})["workers"][0]
                          .get("figures", {}).get("round") == 2, timeout=30,
                          what="round 2 on the page")
    finally:
        reporter.close()


def test_reports_share_one_connection_and_a_restarted_server_gets_the_next_quietly(
        tmp_path, caplog, monkeypatch):
    """Reports go over one kept-alive connection (a new one per report cost the state
    server more CPU than the report); a server that closed it (restarted) gets the next
    report over a new one, with no warning."""
    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    state = StateServer(tmp_path).start()
    reporter = LiveReporter(page_url("127.0.0.1", state.port, "c6"),
                            {"role": "worker", "rank": 0, "mode": "sync"}, interval=0.05,
                            keepalive=600)  # nothing sent while the server restarts

    def shown_round():
        return ((live(state, "c6") or {"workers": [{}]})["workers"][0]
                .get("figures", {}).get("round"))

    try:
        with caplog.at_level(logging.WARNING, logger="esync.logs.live"):
            reporter.add(record(1))
            wait_until(lambda: shown_round() == 1, timeout=30, what="round 1 on the page")
            local = reporter._http._conn.sock.getsockname()
            reporter.add(record(2))
            wait_until(lambda: shown_round() == 2, timeout=30, what="round 2 on the page")
            assert reporter._http._conn.sock.getsockname() == local  # the same connection
            state.stop()
            state.start()  # same port, same database: it closed the connection
            reporter.add(record(3))
            wait_until(lambda: shown_round() == 3, timeout=30, what="round 3 on the page")
            reporter.close()
        assert [r.getMessage() for r in caplog.records] == []
        assert live(state, "c6")["workers"][0]["state"] == "done"
    finally:
        reporter.close()
        state.stop()


def test_the_evaluators_metric(server):
    reporter = LiveReporter(page_url("127.0.0.1", server.port, "c2"),
                            {"role": "evaluator", "mode": "sync"}, token=TOKEN, interval=0.2)
    reporter.add({"num_iters": 1, "round": 17, "num_samples": 0, "accuracy": 0.875})
    reporter.close()
    state = live(server, "c2")
    assert state["metric"] == {"name": "accuracy", "value": 0.875, "round": 17}
    assert state["evaluator"]["state"] == "done"


def test_a_refused_token_is_said_once_and_training_goes_on(server, caplog):
    reporter = LiveReporter(page_url("127.0.0.1", server.port, "c3"), {"role": "worker",
                            "rank": 0}, token="not-the-token", interval=0.05)
    with caplog.at_level(logging.WARNING, logger="esync.logs.live"):
        reporter.add(record(1))
        wait_until(lambda: any("ESYNC_STATE_TOKEN" in r.message for r in caplog.records),
                 timeout=30, what="the warning")
        time.sleep(0.3)  # several more refused reports: still one warning
        reporter.close()
    assert sum("ESYNC_STATE_TOKEN" in r.message for r in caplog.records) == 1
    assert live(server, "c3") is None  # nothing was kept


def test_a_state_server_that_is_gone_never_stops_training(caplog):
    reporter = LiveReporter(page_url("127.0.0.1", free_port(), "c4"), {"role": "worker",
                            "rank": 0}, interval=0.05)
    with caplog.at_level(logging.WARNING, logger="esync.logs.live"):
        for k in range(1, 50):
            reporter.add(record(k))
        wait_until(lambda: caplog.records, timeout=30, what="the warning")
        start = time.monotonic()
        reporter.close()
    assert time.monotonic() - start < 10
    assert len(caplog.records) == 1 and "cannot reach it" in caplog.records[0].message


@pytest.mark.parametrize("url", ["127.0.0.1:8000/jobs/x/", "https://h:1/jobs/x/",
                                 "http://h/jobs/x/", "http://h:1/jobs/", "http://h:1/x/",
                                 "http://h:1/jobs/a b/", "http://h:99999/jobs/x/"])
def test_a_bad_live_url_is_one_line_naming_the_variable(url):
    with pytest.raises(UserError, match=r"^ESYNC_LIVE_URL=.*expected http://HOST:PORT/jobs/"):
        parse_url(url)
    assert parse_url("http://10.0.0.1:10010/jobs/my-job.1/") == ("10.0.0.1", 10010, "my-job.1")


def test_a_worker_with_a_bad_live_url_stops_with_one_line(tmp_path):
    env = dict(os.environ, ESYNC_LIVE_URL="http://nowhere/jobs/x/")
    result = subprocess.run([sys.executable, MAIN, "-m", "local", "--max-rounds", "1",
                             "-ld", str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "main.py: error: ESYNC_LIVE_URL='http://nowhere/jobs/x/': expected "
        "http://HOST:PORT/jobs/<job>/ (a job id of 1 to 64 letters, digits, '.', '_' or '-')")
