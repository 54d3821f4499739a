"""Start the real ESync state server (`python manage.py runserver`, its database in a temp
folder) on a free loopback port, talk to it over HTTP, and never leave it running."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Optional

from esync.launch.supervisor import free_port
from tests.helpers import REPO


class StateServer:
    def __init__(self, folder, port: Optional[int] = None, db: Optional[str] = None,
                 name: str = "stateserver"):
        self.folder = str(folder)
        self.port = port or free_port()
        self.db = db or os.path.join(self.folder, "state.sqlite3")
        self.name = name
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "StateServer":
        self.starts += 1
        out = open(os.path.join(self.folder, f"{self.name}-{self.starts}.out"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
            cwd=os.path.join(REPO, "stateserver"), stdout=out, stderr=subprocess.STDOUT,
            env=dict(os.environ, ESYNC_STATE_DB=self.db))
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"the state server exited: {self.output()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, "the state server did not start"
                time.sleep(0.2)

    def output(self) -> str:
        with open(os.path.join(self.folder, f"{self.name}-{self.starts}.out")) as f:
            return f.read()

    def request(self, method: str, path: str, body=None):
        """(HTTP status, JSON answer)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path: str):
        status, answer = self.request("GET", path)
        assert status == 200, answer
        return answer

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "StateServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(signal.SIGKILL)
