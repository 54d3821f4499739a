"""Hostile and malformed HTTP requests against a running ESync state server.

    python bench/fuzz_http.py --url http://127.0.0.1:10010 [--token T] [--count 2000]
                              [--seed 0]

prints a JSON object of counts: requests sent, answers by HTTP status, answers 5xx
(`server_errors`), requests without a whole answer within 10 s (`hangs`), connections
closed or reset before an answer (`connection_errors`), answers whose body is not JSON
(`non_json_answers`: e.g. an HTML error page), whether the server still answers
`GET /status/` afterwards (`alive_after`), and the first few problems with the request
that caused them.

Every request goes over a raw socket of its own (written byte for byte, so that it can
be as malformed as wanted), a few at a time. The kinds, drawn at random (seeded): random
bytes, truncated, deeply nested or huge-numbered JSON bodies, fields of the wrong type,
wrong methods (with a second request on the same connection, which must be answered
too), a huge declared Content-Length, bodies larger than the server takes, writes
without, with a garbled or with a wrong token, unknown paths and query strings, garbage
headers (bad Host, too many, too long, duplicate or non-numeric Content-Length, chunked),
malformed request lines, requests cut short (the client then closes its side, or waits
for the server's timeout), and well-formed requests as a control.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

#: seconds a request may wait for its whole answer before it counts as a hang
ANSWER_TIMEOUT_S = 10.0
#: requests in flight at once
PARALLEL = 4
#: the state server's body limit (stateserver settings.MAX_BODY_BYTES)
MAX_BODY = 64 * 1024
#: problems kept for the report
SHOWN_PROBLEMS = 10


@dataclass
class Case:
    kind: str
    data: bytes  # what is sent
    # after sending: "answer" waits for the answer(s); "close" first shuts the write side
    # (the server sees the request end); "stall" waits with the request unfinished
    mode: str = "answer"
    answers: int = 1  # requests pipelined in `data`, each to be answered
    head: bool = False  # a HEAD request: its answer has no body


@dataclass
class Outcome:
    statuses: List[int] = field(default_factory=list)
    hang: bool = False
    connection_error: Optional[str] = None
    non_json: int = 0


# --- building requests -----------------------------------------------------------------
class Builder:
    def __init__(self, host: str, token: Optional[str], rng: random.Random):
        self.host, self.token, self.rng = host, token, rng
        self.jobs = [f"fuzz-{rng.randrange(16 ** 6):06x}-{i}" for i in range(8)]

    def request(self, method: str, path: str, body: Optional[bytes] = None,
                headers: Optional[List[Tuple[str, str]]] = None, auth: str = "good",
                length: Optional[str] = None, version: str = "HTTP/1.1") -> bytes:
        """One request's bytes; auth: good (the token, if any), none, wrong, garbled."""
        lines = [f"{method} {path} {version}", f"Host: {self.host}"]
        if auth == "good" and self.token is not None:
            lines.append(f"Authorization: Bearer {self.token}")
        elif auth == "wrong":
            lines.append(f"Authorization: Bearer {self.token or 'x'}x")
        elif auth == "garbled":
            lines.append("Authorization: " + self.rng.choice(
                ["Bearer", "Basic dXNlcjpwYXNz", "Bearer  ", "bearer a b c", "Token abc",
                 "Bearer \x7f\x80", "=" * 300]))
        if body is not None or length is not None:
            lines.append(f"Content-Length: {length if length is not None else len(body)}")
        if body is not None:
            lines.append("Content-Type: application/json")
        for name, value in headers or []:
            lines.append(f"{name}: {value}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        return head + (body or b"")

    def job_path(self) -> str:
        job = self.rng.choice(self.jobs)
        return self.rng.choice([f"/jobs/{job}/", f"/jobs/{job}/budget/",
                                f"/jobs/{job}/report/", f"/jobs/{job}/live/"])

    def valid_body(self, path: str) -> dict:
        if path.endswith("/report/"):  # the live page's (stateserver/budgets/report.py)
            return {"role": "worker", "rank": self.rng.randrange(4), "mode": "esync",
                    "round": self.rng.randrange(1, 50), "budget": self.rng.randrange(1, 9),
                    "samples": self.rng.randrange(10_000), "samples_per_second": 123.4,
                    "breakdown": {"compute": 0.1, "wait": 0.02}, "bytes_sent": 1000,
                    "bytes_received": 2000, "loss": 0.5}
        if path.endswith("/budget/"):
            return {"rank": self.rng.randrange(4), "round": self.rng.randrange(1, 50),
                    "time_per_iteration": self.rng.choice([None, 0.01, 0.05, 0.2])}
        return {"workers": 4, "max_local_steps": 8}

    def number(self) -> str:
        rng = self.rng
        return rng.choice([
            "1e999", "-1e999", "1e-999", "NaN", "Infinity", "-Infinity", "1e308", "5e-324",
            "9" * rng.randrange(20, 400), "1" + "0" * rng.randrange(300, 500),
            "7" * rng.randrange(4000, 5000), "-" + "8" * rng.randrange(4300, 6000),
            "1" * rng.randrange(10, 20) + "." + "3" * rng.randrange(1000, 3000),
            "2147483648", "-2147483649", "18446744073709551616", "0.0", "-0", "1E400",
        ])

    # each returns one Case
    def random_bytes(self) -> Case:
        body = self.rng.randbytes(self.rng.randrange(0, 2000))
        return Case("random bytes body", self.request("POST", self.job_path(), body))

    def truncated_json(self) -> Case:
        path = self.job_path()
        text = json.dumps(self.valid_body(path)).encode()
        cut = text[:self.rng.randrange(len(text))]
        return Case("truncated JSON", self.request("POST", path, cut))

    def nested_json(self) -> Case:
        depth = self.rng.choice([50, 500, 990, 1000, 1100, 5000, 20000, 32000])
        if self.rng.random() < 0.5:
            body = b"[" * depth + b"]" * depth
        else:
            body = b'{"rank": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"
        if len(body) > MAX_BODY:
            body = body[:MAX_BODY]
        return Case("deeply nested JSON", self.request("POST", self.job_path(), body))

    def huge_numbers(self) -> Case:
        path = self.job_path()
        fields = {k: json.dumps(v) for k, v in self.valid_body(path).items()}
        if not path.endswith("/budget/"):
            fields["resume_round"] = "3"
        names = list(fields)
        hit = {self.rng.choice(names)} | {k for k in names if self.rng.random() < 0.3}
        for name in hit:
            fields[name] = self.number()
        text = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
        return Case("huge numbers", self.request("POST", path, text.encode()))

    def wrong_types(self) -> Case:
        path = self.job_path()
        body = self.valid_body(path)
        odd = [None, True, False, "1", "", [], [1], {}, {"a": 1}, -1, 0, 1.5, "\u0000",
               "é" * 50]
        for key in list(body) + ["resume_round"]:
            if self.rng.random() < 0.5:
                body[key] = self.rng.choice(odd)
        if self.rng.random() < 0.2:
            body = self.rng.choice([[], "text", 3, None, [body]])
        return Case("wrong types", self.request("POST", path, json.dumps(body).encode()))

    def wrong_method(self) -> Case:
        method = self.rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO",
                                  "TRACE", "CONNECT"])
        path = self.rng.choice([self.job_path(), "/status/", "/", "/nosuch/"])
        body = None
        if self.rng.random() < 0.7:
            body = self.rng.choice([json.dumps(self.valid_body(path)).encode(),
                                    self.rng.randbytes(self.rng.randrange(1, 5000))])
        first = self.request(method, path, body, auth=self.rng.choice(["good", "none"]))
        second = self.request("GET", "/status/?limit=1")
        return Case("wrong method, then a second request", first + second, answers=2,
                    head=method == "HEAD")

    def huge_declared_length(self) -> Case:
        length = self.rng.choice([str(MAX_BODY + 1), str(10 ** 9), "9" * 30, "9" * 5000,
                                  str(2 ** 63), str(2 ** 64 + 1)])
        return Case("huge declared Content-Length",
                    self.request("POST", self.job_path(), None, length=length) + b'{"rank"')

    def oversized_body(self) -> Case:
        size = self.rng.randrange(MAX_BODY + 1, 512 * 1024)
        return Case("oversized body", self.request("POST", self.job_path(), b" " * size))

    def bad_auth(self) -> Case:
        path = self.rng.choice([self.job_path(), "/nosuch/", "/status/"])
        auth = self.rng.choice(["none", "wrong", "garbled"])
        return Case(f"write with {auth} token",
                    self.request("POST", path, json.dumps(self.valid_body(path)).encode(),
                                 auth=auth))

    def unknown_path(self) -> Case:
        rng = self.rng
        path = rng.choice([
            "/" + rng.randbytes(rng.randrange(1, 40)).hex(),
            "/jobs/" + "a" * rng.randrange(60, 300) + "/",
            "/jobs/%ff%fe/", "/jobs/../../etc/passwd", "/jobs/x y/", "/%00", "/jobs//budget/",
            "/jobs/x/budget/extra/", "/status", "/" + "a/" * rng.randrange(100, 3000),
            "/status/?" + "&".join(f"k{i}=v" for i in range(rng.randrange(900, 1500))),
            "/status/?limit=" + rng.choice(["0", "-1", "x", "501", "9" * 40, "1e3", ""]),
            "/status/?offset=" + rng.choice(["-5", "9" * 5000, "abc", "2147483648"]),
            "/status/?limit=2&offset=" + str(rng.randrange(0, 100)),
            "http://evil.example/status/", "*", "/" + "x" * rng.randrange(60000, 70000),
        ])
        method = rng.choice(["GET", "POST"])
        body = json.dumps({"workers": 2}).encode() if method == "POST" else None
        return Case("unknown path or query", self.request(method, path, body))

    def header_garbage(self) -> Case:
        rng = self.rng
        path = self.job_path()
        body = json.dumps(self.valid_body(path)).encode()
        choice = rng.randrange(12)
        headers: List[Tuple[str, str]] = []
        length = None
        if choice == 0:  # a bad Host (sent besides ours: the first one counts)
            data = self.request("GET", "/status/").replace(
                f"Host: {self.host}".encode(),
                b"Host: " + rng.choice([b"bad host!", b"", b"a" * 300, b"x:y:z", b"[::1",
                                        b"\xff\xfe", b"evil.example:99999"]))
            return Case("bad Host header", data)
        if choice == 1:
            headers = [(f"X-Junk-{i}", "v" * rng.randrange(1, 50))
                       for i in range(rng.randrange(90, 200))]
        elif choice == 2:
            headers = [("X-Long", "v" * rng.randrange(60000, 70000))]
        elif choice == 3:
            headers = [("Content-Length", str(len(body) + rng.randrange(0, 3)))]
        elif choice == 4:
            length = rng.choice(["abc", "-5", "1.5", "0x10", "", " ", "１２", "+3", "1 2"])
        elif choice == 5:
            data = self.request("POST", path, None, headers=[("Transfer-Encoding", "chunked")])
            return Case("chunked body", data + b"5\r\nhello\r\n0\r\n\r\n")
        elif choice == 6:
            data = self.request("POST", path, None, length=str(rng.choice([10 ** 6, 10 ** 12])),
                                headers=[("Expect", "100-continue")])
            return Case("Expect 100-continue, huge body", data)
        elif choice == 7:
            headers = [(rng.randbytes(8).hex(), rng.randbytes(20).decode("latin-1")
                        .replace("\r", "").replace("\n", ""))]
        elif choice == 8:
            data = self.request("POST", path, body).replace(
                b"\r\n\r\n", b"\r\nBroken header line without colon\r\n\r\n", 1)
            return Case("header without colon", data)
        elif choice == 9:
            headers = [("Content-Type", rng.choice([
                "text/html", "multipart/form-data; boundary=x",
                "application/x-www-form-urlencoded", "\x01"]))]
        elif choice == 10:
            headers = [("Connection", rng.choice(["close", "keep-alive", "upgrade",
                                                  "x" * 500])),
                       ("Upgrade", "websocket")]
        else:
            headers = [("Authorization_", "x"), ("X_Forwarded_For", "1.2.3.4"),
                       ("Accept-Encoding", "gzip" * 100)]
        return Case("header garbage", self.request("POST", path, body, headers=headers,
                                                   length=length))

    def raw_request_line(self) -> Case:
        rng = self.rng
        line = rng.choice([
            b"GARBAGE", b"GET", b"GET /", b"GET / HTTP/2.0", b"GET / HTTP/9.9",
            b"GET / HTTP/1.x", b"GET / HTTP/1.1 extra", b"GET  /  HTTP/1.1", b"/ GET HTTP/1.1",
            b"\x16\x03\x01\x02\x00",
            b"GET /status/ HTTP/1.1\x00", b" " * 100, b"GET " + b"/" * 70000 + b" HTTP/1.1",
            rng.randbytes(rng.randrange(1, 300)).replace(b"\n", b""),
            b"POST /jobs/x/ HTTP/1.1",
        ])
        if rng.random() < 0.2:  # no end of line: the client closes its side
            return Case("request line cut short", line, mode="close")
        return Case("malformed request line", line + b"\r\nHost: x\r\n\r\n")

    def cut_short(self) -> Case:
        path = self.job_path()
        body = json.dumps(self.valid_body(path)).encode()
        data = self.request("POST", path, body)
        data = data[:self.rng.randrange(1, len(data) - 1)]
        # rarely wait for the server's own timeout instead of closing our side
        mode = "stall" if self.rng.random() < 0.05 else "close"
        return Case("request cut short", data, mode=mode)

    def valid(self) -> Case:
        path = self.job_path()
        if self.rng.random() < 0.3:
            return Case("valid read", self.request("GET", self.rng.choice(
                ["/status/", "/", "/jobs/", path.replace("budget/", "")
                 .replace("report/", "live/")])))
        return Case("valid write", self.request("POST", path,
                                                json.dumps(self.valid_body(path)).encode()))

    KINDS = ["random_bytes", "truncated_json", "nested_json", "huge_numbers", "wrong_types",
             "wrong_method", "huge_declared_length", "oversized_body", "bad_auth",
             "unknown_path", "header_garbage", "raw_request_line", "cut_short", "valid"]

    def draw(self) -> Case:
        return getattr(self, self.rng.choice(self.KINDS))()


# --- sending them and reading the answers ----------------------------------------------
def _read_answers(sock: socket.socket, case: Case, deadline: float, out: Outcome) -> None:
    buffer = b""

    def more() -> bool:
        nonlocal buffer
        wait = deadline - time.monotonic()
        if wait <= 0:
            raise TimeoutError
        sock.settimeout(wait)
        data = sock.recv(65536)
        buffer += data
        return bool(data)

    for number in range(case.answers):
        while True:  # one answer; 1xx interim answers are skipped
            while b"\r\n\r\n" not in buffer:
                if not more():
                    if number == 0 and not buffer:
                        out.connection_error = "closed without an answer"
                    elif buffer:
                        out.connection_error = f"closed within an answer: {buffer[:80]!r}"
                    else:
                        out.connection_error = "closed before answering a second request"
                    return
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
                out.connection_error = f"not an HTTP answer: {lines[0][:80]!r}"
                return
            status = int(parts[1])
            if status >= 200:
                break
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get(b"content-length", b"0") or 0)
        if case.head and number == 0:
            length = 0
        while len(buffer) < length:
            if not more():
                out.connection_error = "closed within an answer's body"
                return
        body, buffer = buffer[:length], buffer[length:]
        out.statuses.append(status)
        if length:
            try:
                json.loads(body)
            except ValueError:
                out.non_json += 1


def _run(host: str, port: int, case: Case) -> Outcome:
    out = Outcome()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    try:
        with socket.create_connection((host, port), timeout=ANSWER_TIMEOUT_S) as sock:
            try:
                sock.sendall(case.data)
                if case.mode == "close":
                    sock.shutdown(socket.SHUT_WR)
            except ConnectionError:  # it may answer and close before all is sent: read on
                pass
            _read_answers(sock, case, deadline, out)
    except TimeoutError:
        out.hang = True
    except OSError as e:
        out.connection_error = f"{type(e).__name__}: {e}"
    return out


def fuzz_http(base_url: str, token: Optional[str], count: int = 2000, seed: int = 0,
              parallel: int = PARALLEL) -> dict:
    """Send `count` hostile requests (drawn with `seed`) to the state server at `base_url`
    (writes carry `token` where a case means them to); the counts described above."""
    url = urllib.parse.urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    rng = random.Random(seed)
    builder = Builder(f"{host}:{port}", token, rng)
    cases = [builder.draw() for _ in range(count)]
    lock = threading.Lock()
    result = {"requests": 0, "by_status": {}, "server_errors": 0, "hangs": 0,
              "connection_errors": 0, "non_json_answers": 0, "by_kind": {}, "problems": []}

    def problem(case: Case, what: str) -> None:
        if len(result["problems"]) < SHOWN_PROBLEMS:
            result["problems"].append({"kind": case.kind, "problem": what,
                                       "request": case.data[:120].decode("latin-1")})

    def one(case: Case) -> None:
        out = _run(host, port, case)
        with lock:
            result["requests"] += 1
            result["by_kind"][case.kind] = result["by_kind"].get(case.kind, 0) + 1
            for status in out.statuses:
                result["by_status"][status] = result["by_status"].get(status, 0) + 1
                if status >= 500:
                    result["server_errors"] += 1
                    problem(case, f"HTTP {status}")
            result["non_json_answers"] += out.non_json
            if out.non_json:
                problem(case, "an answer that is not JSON")
            if out.hang:
                result["hangs"] += 1
                problem(case, f"no whole answer within {ANSWER_TIMEOUT_S:g} s")
            elif out.connection_error:
                result["connection_errors"] += 1
                problem(case, out.connection_error)

    start = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, cases))
    result["seconds"] = round(time.monotonic() - start, 1)
    check = _run(host, port, Case("health", builder.request("GET", "/status/?limit=1")))
    result["alive_after"] = check.statuses == [200]
    result["by_status"] = dict(sorted(result["by_status"].items()))
    result["by_kind"] = dict(sorted(result["by_kind"].items()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True,
                        help="the state server, e.g. http://127.0.0.1:10010")
    parser.add_argument("--token", default=None, help="its token (ESYNC_STATE_TOKEN), if any")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(fuzz_http(args.url, args.token, args.count, args.seed), indent=1))


if __name__ == "__main__":
    main()
