"""`runserver` that first applies the migrations, so that the original's command
(`python manage.py runserver 0.0.0.0:10010`) works on a fresh clone with no other step,
answers kept-alive connections without Nagle's delay, and bounds what a connection can
hold (production servers, e.g. gunicorn, have their own settings for all this; they
need `python manage.py migrate` once):

- a kept-alive connection with no request for IDLE_TIMEOUT_S is closed (workers open
  a new one when they need it), and once a request has begun, each read of it (request
  line, headers, body) waits at most REQUEST_TIMEOUT_S: an unfinished request is
  answered 408 and its connection closed, instead of holding a thread for ever;
- a request's unread body (a GET with a body, a refused POST) is read and dropped after
  the answer, so the next request on the connection is parsed from its start; a body
  that cannot be dropped that way (larger than MAX_BODY_BYTES, chunked, or with a
  Content-Length that is no number) closes the connection instead;
- what the HTTP parser refuses (a malformed or empty request line, an HTTP version
  other than 1.0 and 1.1, too many or too long headers, two Content-Lengths, HTTP/0.9)
  is answered with a JSON error (4xx, never 505), not an HTML page, and the connection
  closed;
- with `Expect: 100-continue`, a body larger than MAX_BODY_BYTES is refused (413)
  before the client sends it;
- a connection closed with data still coming (a refused oversized body) is read and
  dropped for up to LINGER_S or LINGER_BYTES first: closing a socket with unread data
  sends a reset, which can destroy the answer before the client has read it.

A database that cannot be opened or written ends the command before it listens (with
manage.py's one line naming ESYNC_STATE_DB and the file).

Given port 0 (`runserver 127.0.0.1:0`) it listens on a free port the OS picks, and
reports it to a supervisor that asked for it (esync.infra.ready: ESYNC_READY_FD)."""
import json
import os
import socket
import time

from esync.infra import ready

from django.conf import settings
from django.core.management import call_command
from django.core.management.commands.runserver import Command as RunServer
from django.core.servers.basehttp import ServerHandler, WSGIRequestHandler, WSGIServer
from wsgiref import simple_server

from budgets.database import check_writable
from budgets.guard import declared_length

#: seconds a kept-alive connection may wait for its next request
IDLE_TIMEOUT_S = 120.0
#: seconds each read of a request that has begun may wait
REQUEST_TIMEOUT_S = 5.0
#: what a closing connection reads and drops at most, so that its answer is not reset
LINGER_S = 2.0
LINGER_BYTES = 1 << 20


class BoundedServerHandler(ServerHandler):
    """Django's handler of one request, which after the answer reads the unread rest of
    the body only where that is bounded, and otherwise closes the connection."""

    def _droppable(self) -> bool:
        length = declared_length(self.environ.get("CONTENT_LENGTH"))
        return length is not None and length <= settings.MAX_BODY_BYTES \
            and "HTTP_TRANSFER_ENCODING" not in self.environ

    def cleanup_headers(self):
        super().cleanup_headers()
        if not self._droppable():
            self.headers["Connection"] = "close"
            self.request_handler.close_connection = True

    def close(self):
        try:
            if self._droppable():
                self.get_stdin().read()  # at most MAX_BODY_BYTES
        except OSError:  # the rest of the body did not come (REQUEST_TIMEOUT_S)
            self.request_handler.close_connection = True
        finally:
            simple_server.ServerHandler.close(self)  # not Django's: it reads any length


class BoundedRequestHandler(WSGIRequestHandler):
    """Django's runserver connection handler with timeouts and JSON errors."""

    def handle(self):
        super().handle()  # every request of the connection; it ends with shutdown(SHUT_WR)
        self._linger()

    def _linger(self) -> None:
        """Read and drop what the client still sends, until it closes its side, for at
        most LINGER_S and LINGER_BYTES (the answer went out already)."""
        deadline, left = time.monotonic() + LINGER_S, LINGER_BYTES
        try:
            while left > 0:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                self.connection.settimeout(wait)
                data = self.connection.recv(min(left, 65536))
                if not data:
                    break
                left -= len(data)
        except OSError:
            pass

    def handle_one_request(self):
        try:
            self.connection.settimeout(IDLE_TIMEOUT_S)
            if not self.rfile.peek(1):  # the client closed the connection
                self.close_connection = True
                return
        except OSError:  # idle too long, or reset
            self.close_connection = True
            return
        self.connection.settimeout(REQUEST_TIMEOUT_S)
        # what send_error and the access log use if the request line never arrives whole
        self.command, self.requestline, self.request_version = "", "", "HTTP/1.1"
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.send_error(414)
                return
            if not self.parse_request():  # it answered already
                return
        except TimeoutError:
            self.send_error(408, f"the request did not arrive within {REQUEST_TIMEOUT_S:g} s")
            return
        except OSError:
            self.close_connection = True
            return
        handler = BoundedServerHandler(self.rfile, self.wfile, self.get_stderr(),
                                       self.get_environ())
        handler.request_handler = self  # for the access log and closing the connection
        handler.run(self.server.get_app())

    def parse_request(self) -> bool:
        if not self.raw_requestline.strip():  # http.server would close without a word
            self.send_error(400, "the request line is empty")
            return False
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # its answer has no status line: refuse
            self.send_error(400, "HTTP/0.9 requests are not served")
            return False
        if len(self.headers.get_all("Content-Length") or []) > 1:
            self.send_error(400, "more than one Content-Length header")
            return False
        return True

    def handle_expect_100(self) -> bool:
        length = declared_length(self.headers.get("Content-Length"))
        if length is not None and length > settings.MAX_BODY_BYTES:
            self.send_error(413, f"the request body is too large: at most "
                                 f"{settings.MAX_BODY_BYTES} bytes")
            return False
        return super().handle_expect_100()

    def send_error(self, code, message=None, explain=None):
        """http.server's error answer, as JSON (and closing the connection, whose state
        is unknown after a request it could not parse). Its 505 for an HTTP version other
        than 1.x is a 400: it is the request that is wrong."""
        if code == 505:
            code = 400
        try:
            short = self.responses[code][0]
        except KeyError:
            short = "Error"
        message = message or short
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # http.server would send no status line
            self.request_version = "HTTP/1.0"
        try:
            self.send_response(code)  # logs it; the standard reason phrase, no request text
            self.send_header("Connection", "close")
            body = json.dumps({"error": message}).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client is gone
            pass


class NoDelayWSGIServer(WSGIServer):
    """Django's development server, with TCP_NODELAY on each connection: it writes an
    answer's headers and body separately, and on a kept-alive connection Nagle's
    algorithm would hold the body back until the client's delayed ACK (40 ms). Its
    connections are handled by BoundedRequestHandler."""

    def get_request(self):
        conn, address = super().get_request()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address

    def finish_request(self, request, client_address):
        BoundedRequestHandler(request, client_address, self)


class Command(RunServer):
    help = "Apply pending migrations, then start the development server."
    server_cls = NoDelayWSGIServer

    def on_bind(self, server_port):
        super().on_bind(server_port)
        self.stdout.flush()
        ready.announce(server_port)

    def handle(self, *args, **options):
        if os.environ.get("RUN_MAIN") != "true":  # not again in the autoreloader's child
            # a database that cannot be opened or written stops it here (manage.py says
            # which file, in one line), not at each request
            call_command("migrate", interactive=False, verbosity=0)
            check_writable()
        super().handle(*args, **options)
