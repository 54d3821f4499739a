"""The worker's state-server client against real HTTP servers: the state server's
refusals surface with its message; something that is not the state server is retried,
then named."""
import logging
import subprocess
import sys
import time

import pytest

from esync.stateclient import StateClient, StateServerError
from launch.supervisor import free_port
from tests.stateserver import StateServer


def test_refusals_carry_the_state_servers_message(tmp_path):
    with StateServer(tmp_path) as state:
        client = StateClient("127.0.0.1", state.port, "myjob", patience=1)
        with pytest.raises(StateServerError, match="no job 'myjob' here"):
            client.budget(0, 1, None)
        assert client.init_job(2, 4)["workers"] == 2
        assert client.budget(1, 1, None) == 1
        assert client.budget(1, 1, None) == 1  # asking again is safe
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
