"""The worker's state-server client against real HTTP servers: the state server's
refusals surface with its message; something that is not the state server is retried,
then named; the token (ESYNC_STATE_TOKEN) travels, and its refusals name the variable."""
import logging
import subprocess
import sys
import time

import pytest

from esync.errors import UserError
from esync.infra.stateclient import (KeptAlive, StateClient, StateServerError,
                                     token_from_environ)
from esync.launch.supervisor import free_port
from tests.stateserver import StateServer


def test_refusals_carry_the_state_servers_message(tmp_path):
    with StateServer(tmp_path) as state:
        client = StateClient("127.0.0.1", state.port, "myjob", patience=1)
        with pytest.raises(StateServerError, match="no job 'myjob' here"):
            client.budget(0, 1, None)
        assert client.init_job(2, 4)["workers"] == 2
        assert client.budget(1, 1, None).local_iterations == 1
        assert client.budget(1, 1, None).local_iterations == 1  # asking again is safe
        with pytest.raises(StateServerError, match="'round' 0 must be|'round' must be"):
            client.budget(1, 0, 0.1)
        with pytest.raises(StateServerError, match="already exists with 2 workers"):
            client.init_job(3, 4)
        client.close()


def test_a_server_that_is_not_the_state_server_is_named(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="esync")
    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                              "127.0.0.1", "--directory", str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # wait until it answers, so that every try below gets its 501
        deadline = time.monotonic() + 30
        while _status(port) is None:
            assert other.poll() is None and time.monotonic() < deadline, "no http.server"
            time.sleep(0.05)
        client = StateClient("127.0.0.1", port, "myjob", patience=1.5)
        start = time.monotonic()
        # http.server answers POST with 501 and HTML: the client retries, then names it
        with pytest.raises(StateServerError, match="is it the ESync state server") as error:
            client.init_job(2, 4)
        assert "(HTTP 501 with b'<!DOCTYPE HTML" in str(error.value)
        assert 1.5 <= time.monotonic() - start < 30
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "retrying for up to 1.5 s" in lines[0]
        assert ": HTTP 501 with b'<!DOCTYPE HTML" in lines[0]
    finally:
        other.kill()
        other.wait()


def test_an_endless_answer_is_not_read_whole(caplog):
    """A server on the state server's port answering a body far longer than any of the
    state server's: the client reads at most KeptAlive.MAX_ANSWER_BYTES of it, retries,
    then names the server and the reason."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    huge = 64 * KeptAlive.MAX_ANSWER_BYTES

    def answer():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the test closed it
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {huge}\r\n\r\n".encode())
                    block = b" " * 65536
                    for _ in range(huge // len(block)):
                        conn.sendall(block)
                except OSError:  # the client stopped reading and closed
                    pass

    threading.Thread(target=answer, daemon=True).start()
    try:
        client = StateClient("127.0.0.1", port, "myjob", patience=0.5)
        with pytest.raises(StateServerError, match="answer longer than 1048576 bytes"):
            client.init_job(2, 4)
        client.close()
    finally:
        listener.close()


def _status(port):
    """The HTTP status a POST to 127.0.0.1:port gets; None while nothing answers."""
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


TOKEN = "client-test-token_1"


def test_the_token_travels_and_refusals_name_its_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("ESYNC_STATE_TOKEN", TOKEN)  # for the server process only
    state = StateServer(tmp_path).start()
    monkeypatch.delenv("ESYNC_STATE_TOKEN")
    try:
        client = StateClient("127.0.0.1", state.port, "myjob", patience=1)  # none in env
        assert client.token is None
        with pytest.raises(StateServerError, match="this worker has no ESYNC_STATE_TOKEN"):
            client.init_job(2, 4)
        wrong = StateClient("127.0.0.1", state.port, "myjob", patience=1, token="other")
        with pytest.raises(StateServerError, match="this worker's ESYNC_STATE_TOKEN is not"):
            wrong.init_job(2, 4)
        right = StateClient("127.0.0.1", state.port, "myjob", patience=1, token=TOKEN)
        assert right.init_job(2, 4)["workers"] == 2
        monkeypatch.setenv("ESYNC_STATE_TOKEN", TOKEN)  # the default: the environment's
        from_env = StateClient("127.0.0.1", state.port, "myjob", patience=1)
        assert from_env.token == TOKEN and from_env.budget(1, 1, None) == (1, False, False)
        for c in (client, wrong, right, from_env):
            c.close()
    finally:
        state.stop()


def test_token_from_environ():
    assert token_from_environ({}) is None
    assert token_from_environ({"ESYNC_STATE_TOKEN": ""}) is None
    assert token_from_environ({"ESYNC_STATE_TOKEN": "a-B_9~"}) == "a-B_9~"
    for bad in ("two words", "tab\there", "naïve", "line\n"):
        with pytest.raises(UserError, match="ESYNC_STATE_TOKEN must be printable ASCII"):
            token_from_environ({"ESYNC_STATE_TOKEN": bad})


def test_init_job_passes_resume_round(tmp_path, monkeypatch):
    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    with StateServer(tmp_path) as state:
        client = StateClient("127.0.0.1", state.port, "myjob", patience=1)
        client.init_job(2, 4)
        for round_ in (1, 2, 3):
            client.budget(0, round_, 0.01)
        with pytest.raises(StateServerError, match="'round' 2 is in the past"):
            client.budget(0, 2, 0.01)
        assert client.init_job(2, 4, resume_round=2)["round"] == 1
        assert client.budget(0, 2, 0.01).local_iterations >= 1
        client.close()


def test_a_kept_alive_connection_the_server_closed_is_replaced_quietly(tmp_path, caplog,
                                                                        monkeypatch):
    """The server closes idle connections (and a restart closes all): the next request
    goes over a new one at once, without the warning of an unreachable server."""
    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    caplog.set_level(logging.INFO, logger="esync")
    state = StateServer(tmp_path).start()
    try:
        client = StateClient("127.0.0.1", state.port, "myjob", patience=5)
        client.init_job(2, 4)
        state.stop()
        state.start()
        start = time.monotonic()
        assert client.budget(0, 1, None).local_iterations == 1
        assert time.monotonic() - start < 5
        assert [r.getMessage() for r in caplog.records] == []
        client.close()
    finally:
        state.stop()


def test_the_client_errors_are_one_line_user_errors():
    """Uncaught, they end the worker with one line (esync.cli prints a UserError), and
    a refusal is a StateServerError that the worker may carry on after."""
    from esync.infra.stateclient import StateServerRefusal

    assert issubclass(StateServerError, UserError)
    assert issubclass(StateServerRefusal, StateServerError)


def test_a_budget_above_the_workers_cap_is_refused(tmp_path, monkeypatch):
    """The real state server gives budgets up to the job's cap (worker 0's
    --max-local-steps); a worker checks them against its own."""
    from esync.infra.stateclient import StateServerRefusal

    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    with StateServer(tmp_path) as state:
        client = StateClient("127.0.0.1", state.port, "capped", patience=1)
        client.init_job(2, 16)
        first = (client.budget(0, 1, None, cap=4), client.budget(1, 1, None, cap=4))
        assert first == ((1, False, False), (1, False, False))
        assert client.budget(0, 2, 0.01, cap=4) == (1, False, False)  # rank 1 has not measured yet
        assert client.budget(1, 2, 0.08, cap=4) == (1, False, False)  # the slowest
        with pytest.raises(StateServerRefusal,
                           match=r"field 'budget' 8 for round 3: expected an integer in "
                                 r"0\.\.4 \(this worker's --max-local-steps\)"):
            client.budget(0, 3, 0.01, cap=4)
        assert client.budget(0, 3, 0.01, cap=8) == (8, False, False)  # asking again: the same answer
        client.close()


def test_with_a_least_speed_the_rounds_before_every_device_measured_are_measuring(
        tmp_path, monkeypatch):
    """The real state server: with a least speed, a device's round 1 measures its speed
    (its delta will weigh nothing); measured, it trains at once, the devices not
    measured yet counted as sitting out (alone: 1/least speed of its iterations);
    once every device has a
    time, budgets follow the speeds. With least speed 0 (the paper's rule) no round
    measures, and every budget is 1 until every device has a time."""
    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    with StateServer(tmp_path) as state:
        client = StateClient("127.0.0.1", state.port, "measured", patience=1)
        client.init_job(2, 16, least_speed=0.2)
        assert client.budget(0, 1, None) == (1, True, False) == client.budget(1, 1, None)
        # rank 1 has not reported yet: rank 0, measured, trains as if alone, for as long
        # as one that would train could take for its first iteration (1 / 0.2 of its own)
        assert client.budget(0, 2, 1.0) == (5, False, True)  # open: until rank 1 has measured
        # rank 1 fills what is left of that round; then every device has a time
        assert client.budget(1, 2, 2.0) == (2, False, False)
        assert client.budget(0, 3, 1.0) == (2, False, False)
        assert client.budget(0, 3, 1.0) == (2, False, False)  # asking again: the same answer
        paper = StateClient("127.0.0.1", state.port, "paper", patience=1)
        paper.init_job(2, 16)
        assert paper.budget(0, 1, None) == (1, False, False) == paper.budget(1, 1, None)
        assert paper.budget(0, 2, 0.01) == (1, False, False)
        client.close()
        paper.close()


class _Answers:
    """A stand-in for a state server gone wrong: a real HTTP server on loopback that
    answers every POST with one fixed JSON body."""

    def __init__(self, body: dict):
        import http.server
        import json
        import threading

        payload = json.dumps(body).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("answer, message", [
    ({"rank": 0, "round": 2147483647, "budget": 1}, "field 'round' 2147483647: expected 5"),
    ({"rank": 1, "round": 5, "budget": 1}, "field 'rank' 1: expected 0"),
    ({"rank": 0, "round": 5.0, "budget": 1}, "field 'round' 5.0: expected 5"),
    ({"rank": 0, "round": 5, "budget": -1}, r"field 'budget' -1 for round 5: expected an "
                                            r"integer in 0\.\.16"),
    ({"rank": 0, "round": 5, "budget": 10**9}, "field 'budget' 1000000000"),
    ({"rank": 0, "round": 5, "budget": True}, "field 'budget' True"),
    ({"rank": 0, "round": 5, "budget": "many"}, "field 'budget' 'many'"),
    ({"rank": 0, "round": 5}, "field 'budget' None"),
    ({"rank": 0, "round": 5, "budget": 1, "measuring": "yes"},
     "field 'measuring' 'yes' for round 5: expected true or false"),
])
def test_values_out_of_range_from_the_state_server_are_refused(answer, message):
    from esync.infra.stateclient import StateServerRefusal

    server = _Answers(answer)
    try:
        client = StateClient("127.0.0.1", server.port, "myjob", patience=1, token=None)
        with pytest.raises(StateServerRefusal, match=message) as error:
            client.budget(0, 5, 0.01, cap=16)
        assert "\n" not in str(error.value)
        client.close()
    finally:
        server.close()


def test_budgets_asked_for_later_are_answered_in_order_by_one_thread(tmp_path, monkeypatch):
    """budget_later's requests share the client's one connection: sent one at a time,
    in the order asked, by one thread for the client's life; a refusal reaches the one
    who waits for that answer, and the requests after it are answered."""
    import threading
    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    with StateServer(tmp_path) as state:
        client = StateClient("127.0.0.1", state.port, "myjob", patience=1)
        client.init_job(2, 4)
        before = set(threading.enumerate())
        asked = [client.budget_later(0, r, 0.01) for r in (1, 2, 3)]
        past = client.budget_later(0, 2, 0.01)  # round 2 is past once round 3 is asked
        after = client.budget_later(0, 4, 0.01)
        assert [p.result().local_iterations >= 1 for p in asked] == [True] * 3
        with pytest.raises(StateServerError, match="'round' 2 is in the past"):
            past.result()
        assert after.result().local_iterations >= 1
        started = [t for t in set(threading.enumerate()) - before if t.name == "esync-budget"]
        assert len(started) == 1, started  # one thread for the five requests
        requester = started[0]
        client.close()
        requester.join(timeout=5)
        assert not requester.is_alive()
