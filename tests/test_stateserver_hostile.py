"""The state server against hostile and malformed input, over real HTTP to real
`manage.py runserver` processes: the token on writes, bounded work per request (caps,
body size, pages of the status), 4xx and never 5xx for what is malformed, kept-alive
connections that stay usable, and the budget rules for dead devices and resumed jobs."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.stateserver import StateServer

TOKEN = "t0k3n_for-the~tests.1"
#: a generous bound on any answer (the server answers in milliseconds)
TIMEOUT = 5.0
MAX_BODY = 64 * 1024
#: the runserver command's REQUEST_TIMEOUT_S, and some slack
REQUEST_TIMEOUT = 5.0 + 5.0


def _start(folder, token=None) -> StateServer:
    with pytest.MonkeyPatch.context() as env:  # the server process inherits it
        if token is None:
            env.delenv("ESYNC_STATE_TOKEN", raising=False)
        else:
            env.setenv("ESYNC_STATE_TOKEN", token)
        return StateServer(folder).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A state server without a token: writes are open."""
    state = _start(tmp_path_factory.mktemp("open"))
    yield state
    state.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    """A state server started with ESYNC_STATE_TOKEN=TOKEN."""
    state = _start(tmp_path_factory.mktemp("locked"), TOKEN)
    yield state
    state.stop(signal.SIGKILL)


def call(server, method, path, body=None, token=None, headers=None, conn=None):
    """(status, response, JSON answer) of one request; on `conn` if given (kept open),
    else on a connection of its own."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        raw = response.read()
        return response.status, response, json.loads(raw) if raw else None
    finally:
        if own:
            conn.close()


def raw(server, data: bytes, shut: bool = False, timeout: float = TIMEOUT):
    """(status, headers, JSON answer) of bytes sent as they are on a connection of their
    own (`shut`: then close our sending side); the first answer only."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer after {received!r}"
            received += chunk
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, "closed within the answer"
            rest += chunk
        return status, headers, json.loads(rest[:length])


def state(server, job):
    """A job's stored state (without what changes with the clock alone)."""
    status, _, body = call(server, "GET", f"/jobs/{job}/")
    assert status == 200, body
    for device in body["devices"]:
        del device["seconds_since_report"]
    return body


def report(server, job, rank, round_, seconds, token=None):
    return call(server, "POST", f"/jobs/{job}/budget/",
                {"rank": rank, "round": round_, "time_per_iteration": seconds}, token)


def budget(server, job, rank, round_, seconds, token=None) -> int:
    status, _, body = report(server, job, rank, round_, seconds, token)
    assert status == 200, body
    return body["budget"]


# --- the token --------------------------------------------------------------------------
def test_writes_need_the_token_and_refusals_change_nothing(locked):
    init = {"workers": 2, "max_local_steps": 8}
    status, response, body = call(locked, "POST", "/jobs/t1/", init)
    assert status == 401 and "ESYNC_STATE_TOKEN" in body["error"]
    assert response.getheader("WWW-Authenticate").startswith("Bearer")
    for garbled in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer ", f"Bearer {TOKEN} x", TOKEN,
                    f"Token {TOKEN}"):
        status, response, body = call(locked, "POST", "/jobs/t1/", init,
                                      headers={"Authorization": garbled})
        assert status == 401, (garbled, body)
        assert response.getheader("WWW-Authenticate").startswith("Bearer")
    for wrong in (TOKEN + "x", TOKEN[:-1], "x", TOKEN.upper()):
        status, _, body = call(locked, "POST", "/jobs/t1/", init, token=wrong)
        assert status == 403 and "ESYNC_STATE_TOKEN" in body["error"], body
    assert call(locked, "GET", "/jobs/t1/")[0] == 404  # none of them created the job

    assert call(locked, "POST", "/jobs/t1/", init, token=TOKEN)[0] == 201
    # the scheme is case-insensitive (RFC 9110)
    assert call(locked, "POST", "/jobs/t1/", init,
                headers={"Authorization": f"bearer {TOKEN}"})[0] == 200
    assert budget(locked, "t1", 0, 1, None, TOKEN) == 1
    before = state(locked, "t1")
    assert report(locked, "t1", 1, 1, 0.1)[0] == 401
    assert report(locked, "t1", 1, 1, 0.1, token="wrong")[0] == 403
    assert call(locked, "POST", "/jobs/t1/", dict(init, resume_round=1))[0] == 401
    assert state(locked, "t1") == before
    assert budget(locked, "t1", 1, 1, 0.1, TOKEN) == 1
    assert state(locked, "t1")["devices"][1]["round"] == 1


def test_reads_stay_open_and_every_other_method_needs_the_token(locked):
    assert call(locked, "GET", "/status/")[0] == 200
    assert call(locked, "GET", "/")[0] == 200
    assert call(locked, "GET", "/jobs/nosuch/")[0] == 404
    assert call(locked, "POST", "/no/such/url/", {})[0] == 401  # writes anywhere
    assert call(locked, "PUT", "/jobs/t2/", {"workers": 1})[0] == 401
    assert call(locked, "DELETE", "/jobs/t2/")[0] == 401
    assert call(locked, "PUT", "/jobs/t2/", {"workers": 1}, TOKEN)[0] == 405


def test_without_a_token_the_server_warns_once_at_start(server, locked):
    for _ in range(3):
        assert call(server, "POST", "/jobs/warned/", {"workers": 1})[0] in (200, 201)
    assert server.output().count("ESYNC_STATE_TOKEN is not set") == 1
    assert "ESYNC_STATE_TOKEN is not set" not in locked.output()


def test_a_token_that_cannot_travel_in_a_header_is_refused_at_start():
    result = subprocess.run([sys.executable, "manage.py", "check"],
                            cwd=os.path.join(REPO, "stateserver"), capture_output=True,
                            text=True, timeout=60,
                            env=dict(os.environ, ESYNC_STATE_TOKEN="two words"))
    assert result.returncode != 0
    assert "ESYNC_STATE_TOKEN must be printable ASCII without spaces" in result.stderr


# --- bounded work -------------------------------------------------------------------------
def test_a_job_has_at_most_1024_workers(server):
    status, _, body = call(server, "POST", "/jobs/big/", {"workers": 1025})
    assert status == 400 and "'workers' must be an integer in 1..1024" in body["error"]
    status, _, body = call(server, "POST", "/jobs/big/", {"workers": 100_000})
    assert status == 400
    assert call(server, "GET", "/jobs/big/")[0] == 404
    status, _, body = call(server, "POST", "/jobs/big/", {"workers": 1024})
    assert status == 201 and len(body["devices"]) == 1024


def test_a_body_above_64_kib_gets_413(server):
    status, _, body = call(server, "POST", "/jobs/b1/", b" " * (MAX_BODY + 1))
    assert status == 413 and "at most 65536 bytes" in body["error"]
    status, _, body = call(server, "POST", "/jobs/b1/", b" " * MAX_BODY)  # read, not JSON
    assert status == 400 and "not valid JSON" in body["error"]
    # a huge declared length is refused at once, without waiting for the body
    for length in ("1000000000000", "9" * 5000):
        status, headers, body = raw(server, b"POST /jobs/b1/ HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: " + length.encode() + b"\r\n\r\n{")
        assert status == 413 and headers["connection"] == "close", body
    # and with Expect: 100-continue, before the client sends it
    status, _, body = raw(server, b"POST /jobs/b1/ HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          b"70000\r\nExpect: 100-continue\r\n\r\n")
    assert status == 413, body
    assert call(server, "GET", "/jobs/b1/")[0] == 404


def test_the_status_comes_in_pages(server):
    for k in range(7):
        assert call(server, "POST", f"/jobs/page{k}/", {"workers": 1})[0] in (200, 201)
    status, _, first = call(server, "GET", "/status/")
    assert status == 200 and first["offset"] == 0 and first["limit"] == 50
    total = first["total"]
    assert total >= 7 and len(first["jobs"]) == min(total, 50)
    seen, offset = [], 0
    while offset is not None:
        status, _, page = call(server, "GET", f"/status/?limit=3&offset={offset}")
        assert status == 200 and page["offset"] == offset and page["total"] == total
        assert 1 <= len(page["jobs"]) <= 3
        seen += [j["job"] for j in page["jobs"]]
        offset = page["next_offset"]
        assert offset is None or offset == len(seen)
    assert len(seen) == total == len(set(seen))
    assert [f"page{k}" for k in range(7)] == [j for j in seen if j.startswith("page")]
    status, _, body = call(server, "GET", f"/status/?offset={total}")
    assert status == 200 and body["jobs"] == [] and body["next_offset"] is None
    for query, name in (("limit=0", "limit"), ("limit=501", "limit"), ("limit=x", "limit"),
                        ("limit=-1", "limit"), ("offset=-1", "offset"),
                        ("offset=" + "9" * 5000, "offset")):
        status, _, body = call(server, "GET", f"/status/?{query}")
        assert status == 400 and f"query parameter '{name}'" in body["error"], body


def test_a_page_of_the_status_stops_before_4096_devices(server):
    for k in range(5):
        assert call(server, "POST", f"/jobs/wide{k}/", {"workers": 1000})[0] in (200, 201)
    seen, offset, early = [], 0, False
    while offset is not None:
        status, _, page = call(server, "GET", f"/status/?limit=500&offset={offset}")
        assert status == 200
        devices = sum(j["workers"] for j in page["jobs"])
        assert devices <= 4096 or len(page["jobs"]) == 1
        early |= page["next_offset"] is not None and len(page["jobs"]) < 500
        seen += [j["job"] for j in page["jobs"]]
        offset = page["next_offset"]
    assert early and len(seen) == page["total"] == len(set(seen))


# --- malformed input: 4xx ------------------------------------------------------------------
@pytest.fixture(scope="module")
def job(server):
    assert call(server, "POST", "/jobs/target/", {"workers": 2})[0] == 201
    assert budget(server, "target", 0, 2, 0.02) == 1
    return "target"


@pytest.mark.parametrize("depth", [1000, 5000, 30000])
def test_deeply_nested_json_gets_400(server, job, depth):
    before = state(server, job)
    for body in (b"[" * depth + b"]" * depth,
                 b'{"rank": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"):
        body = body[:MAX_BODY]
        for path in (f"/jobs/{job}/budget/", f"/jobs/{job}/"):
            status, _, answer = call(server, "POST", path, body)
            assert status == 400 and "error" in answer, answer
    assert state(server, job) == before


HUGE = [
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "1" + "0" * 400),
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "1e999"),
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "-1e999"),
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "Infinity"),
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "1e300"),
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "7" * 4200),
    ('{"rank": 0, "round": 3, "time_per_iteration": %s}', "7" * 5000),
    ('{"rank": 0, "round": %s, "time_per_iteration": 0.1}', "9" * 5000),
    ('{"rank": 0, "round": %s, "time_per_iteration": 0.1}', "2147483648"),
    ('{"rank": %s, "round": 3, "time_per_iteration": 0.1}', "1e400"),
    ('{"rank": %s, "round": 3, "time_per_iteration": 0.1}', "-" + "9" * 4000),
]


@pytest.mark.parametrize("template, number", HUGE)
def test_huge_numbers_get_400_and_change_nothing(server, job, template, number):
    before = state(server, job)
    status, _, answer = call(server, "POST", f"/jobs/{job}/budget/",
                             (template % number).encode())
    assert status == 400 and "error" in answer, answer
    assert len(answer["error"]) < 300  # a refused value is not echoed whole
    assert state(server, job) == before


@pytest.mark.parametrize("field, value", [("workers", "1e999"), ("workers", "9" * 5000),
                                          ("max_local_steps", "1" + "0" * 400),
                                          ("resume_round", "1e999"), ("resume_round", "0")])
def test_huge_numbers_in_an_init_get_400(server, job, field, value):
    before = state(server, job)
    fields = {"workers": "2", "max_local_steps": "16", field: value}
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    status, _, answer = call(server, "POST", f"/jobs/{job}/", body.encode())
    assert status == 400, answer
    assert f"'{field}'" in answer["error"] or "not valid JSON" in answer["error"]
    assert state(server, job) == before


MALFORMED = [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 400),
    (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 400),
    (b"   \r\nHost: x\r\n\r\n", 400),
    (b"GET /\r\n\r\n", 400),  # HTTP/0.9
    (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /status/ HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", 431),
    (b"GET /status/ HTTP/1.1\r\nHost: x\r\nX-Long: " + b"v" * 70000 + b"\r\n\r\n", 431),
    (b"POST /jobs/m/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n", 411),
    (b"POST /jobs/m/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n{}",
     400),
    (b"POST /jobs/m/ HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", 400),
    (b"GET /status/ HTTP/1.1\r\nContent-Length: -5\r\nHost: x\r\n\r\n", 400),
    (b"GET /status/ HTTP/1.1\r\nHost: bad host!\r\n\r\n", 400),
    (b"GET /status/ HTTP/1.1\r\nHost: \r\n\r\n", 400),
    (b"GET /no/such/url HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    (b"GET /jobs/%ff%fe/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /status/?" + b"&".join(b"k%d=v" % i for i in range(1500)) + b" HTTP/1.1\r\n"
     b"Host: x\r\n\r\n", 400),
]


@pytest.mark.parametrize("data, expected", MALFORMED)
def test_malformed_http_gets_a_json_4xx(server, data, expected):
    status, headers, body = raw(server, data)
    assert status == expected, body
    assert headers["content-type"] == "application/json" and body["error"]


def test_a_request_that_stops_midway_gets_408(server):
    """The server waits for each read of a begun request for a while, not for ever."""
    socks = []
    try:
        for data in (b"POST /jobs/slow/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                     b"GET /status/ HTTP/1.1\r\nHost: x\r\n",
                     b"GET /stat"):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT)
            sock.sendall(data)
            socks.append(sock)
        for sock in socks:
            answer = b""
            while True:  # the server closes the connection after its answer
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b"\r\n\r\n{\"error\": " in answer
    finally:
        for sock in socks:
            sock.close()
    # and a body cut short by the client closing its side is a 400 at once
    status, _, body = raw(server, b"POST /jobs/slow/ HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 100\r\n\r\n{", shut=True)
    assert status == 400 and "ended after 1 of the 100 bytes" in body["error"]


# --- kept-alive connections ---------------------------------------------------------------
def test_a_wrong_method_with_a_body_leaves_the_connection_usable(server, locked, job):
    for target, method, path, token in ((server, "GET", f"/jobs/{job}/budget/", None),
                                        (server, "PUT", f"/jobs/{job}/", None),
                                        (server, "DELETE", "/status/", None),
                                        (locked, "POST", "/jobs/t9/", None),
                                        (locked, "PUT", "/jobs/t9/", TOKEN)):
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=TIMEOUT)
        try:
            status, response, _ = call(target, method, path, {"rank": 0, "x": "y" * 3000},
                                       token, conn=conn)
            assert status in (401, 405), (method, path, status)
            assert response.getheader("Connection") != "close"
            sock = conn.sock
            status, _, body = call(target, "GET", "/status/?limit=1", conn=conn)
            assert status == 200 and "jobs" in body
            assert conn.sock is sock  # the same connection answered
        finally:
            conn.close()


def test_pipelined_requests_after_a_refused_body_are_answered(server, job):
    first = (f"GET /jobs/{job}/budget/ HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n"
             f"hello world").encode()
    second = b"GET /status/?limit=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(first + second)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", received) == [b"405", b"200"]


# --- dead devices and resumed jobs -----------------------------------------------------------
def test_dead_devices_do_not_hold_the_others_back(server):
    """Rank 2, the slowest, stops reporting after round 3: from round 5 (2 rounds behind)
    the budgets follow rank 1; when it reports again, it counts again."""
    assert call(server, "POST", "/jobs/dead/", {"workers": 3, "max_local_steps": 16})[0] == 201
    times = {0: 0.01, 1: 0.02, 2: 0.08}
    for rank in times:
        budget(server, "dead", rank, 1, None)
    for round_ in (2, 3):
        got = {rank: budget(server, "dead", rank, round_, t) for rank, t in times.items()}
    assert got == {0: 8, 1: 4, 2: 1}
    # round 4: rank 2 is one round behind, alive
    assert budget(server, "dead", 0, 4, 0.01) == 8
    assert budget(server, "dead", 1, 4, 0.02) == 4
    assert [d["living"] for d in state(server, "dead")["devices"]] == [True, True, True]
    # round 5: rank 2 is 2 rounds behind, gone: rank 1 is the slowest
    assert budget(server, "dead", 0, 5, 0.01) == 2
    assert budget(server, "dead", 1, 5, 0.02) == 1
    assert [d["living"] for d in state(server, "dead")["devices"]] == [True, True, False]
    # rank 2 rejoins: it asks for the job's next round and counts again
    assert budget(server, "dead", 2, 6, 0.08) == 1
    assert budget(server, "dead", 0, 6, 0.01) == 8
    assert [d["living"] for d in state(server, "dead")["devices"]] == [True, True, True]


def test_a_device_that_never_reported_stops_counting_too(server):
    """Budgets are 1 until every device has measured: not for ever when one never will.
    One that has not asked yet is starting while the job asks for round 2 (a device may
    ask for round 2 before another asked for round 1), and gone from round 3 on."""
    assert call(server, "POST", "/jobs/never/", {"workers": 3})[0] == 201
    assert budget(server, "never", 0, 1, None) == 1
    assert budget(server, "never", 1, 1, None) == 1
    assert [d["living"] for d in state(server, "never")["devices"]] == [True, True, True]
    assert budget(server, "never", 0, 2, 0.01) == 1  # rank 1 has not measured yet
    assert budget(server, "never", 1, 2, 0.04) == 1  # rank 2 has not: still starting
    assert [d["living"] for d in state(server, "never")["devices"]] == [True, True, True]
    assert budget(server, "never", 0, 3, 0.01) == 4
    assert [d["living"] for d in state(server, "never")["devices"]] == [True, True, False]


def test_resume_round_accepts_earlier_rounds_again(server):
    init = {"workers": 2, "max_local_steps": 16}
    assert call(server, "POST", "/jobs/resumed/", init)[0] == 201
    for round_ in range(1, 6):
        budget(server, "resumed", 0, round_, 0.01 if round_ > 1 else None)
        budget(server, "resumed", 1, round_, 0.04 if round_ > 1 else None)
    status, _, body = report(server, "resumed", 0, 3, 0.01)
    assert status == 400 and "is in the past" in body["error"]
    assert "resume_round" in body["error"]
    before = state(server, "resumed")
    # other settings: refused, nothing changes
    status, _, body = call(server, "POST", "/jobs/resumed/",
                           dict(init, workers=3, resume_round=3))
    assert status == 400 and state(server, "resumed") == before
    # resumed from round 3: rounds from 3 on are accepted again
    status, _, body = call(server, "POST", "/jobs/resumed/", dict(init, resume_round=3))
    assert status == 200 and body["round"] == 2
    after = state(server, "resumed")
    assert after["round"] == 2 and [d["round"] for d in after["devices"]] == [2, 2]
    for old, new in zip(before["devices"], after["devices"]):  # nothing else is lost
        assert {**old, "round": 2} == new
    assert budget(server, "resumed", 0, 3, 0.01) == 4  # the smoothed times survived
    assert budget(server, "resumed", 1, 3, 0.04) == 1
    # a resume round beyond what was asked changes nothing
    before = state(server, "resumed")
    assert call(server, "POST", "/jobs/resumed/", dict(init, resume_round=100))[0] == 200
    assert state(server, "resumed") == before
    # a new job given a resume round is simply created
    status, _, body = call(server, "POST", "/jobs/resumed-new/", dict(init, resume_round=7))
    assert status == 201 and body["round"] == 0
    for bad in (0, -1, "3", 2.5, None, True):
        status, _, body = call(server, "POST", "/jobs/resumed/", dict(init, resume_round=bad))
        assert status == 400 and "'resume_round' must be an integer" in body["error"], bad
