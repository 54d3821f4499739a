"""The state server's first middleware: what a request may be before anything reads it.

In this order, each refusal a JSON error that changes nothing:

- a body sent with Transfer-Encoding (chunked) is not accepted: 411, "send a
  Content-Length" (neither runserver nor Django reads such bodies; left on the
  connection, they would be parsed as the next request);
- a Content-Length that is not a number of bytes: 400; one above MAX_BODY_BYTES: 413,
  answered without reading the body (the runserver command then closes the connection
  instead of reading it);
- with ESYNC_STATE_TOKEN set (settings.STATE_TOKEN), a write (any method but GET and
  HEAD) without `Authorization: Bearer <token>`, or with a garbled one: 401 with
  `WWW-Authenticate: Bearer`; with another token: 403. Reads stay open;
- an accepted POST's body is read here, so that a body that never fully arrives (the
  server's read timeout) is answered 408 rather than failing inside a view.

It also gives every answer a Content-Length (also error answers made outside the views,
e.g. for a bad Host header), without which runserver would close a kept-alive connection.
"""
from __future__ import annotations

import hmac
import logging
import re
from typing import Optional

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

log = logging.getLogger("budgets")

#: methods that change nothing, open to anyone even where writes need the token
READ_METHODS = ("GET", "HEAD")
#: what a token may be made of (ESYNC_STATE_TOKEN is checked to be the same)
TOKEN = re.compile(r"[!-~]+")
_DIGITS = re.compile(r"[0-9]{1,18}")
#: stands for every Content-Length too long to be worth converting (> 18 digits)
HUGE = 10 ** 18

_warned_open = False


def declared_length(value: Optional[str]) -> Optional[int]:
    """The body length a Content-Length value declares (none or empty: 0); None if it is
    not a number of bytes. More than 18 digits is HUGE, not converted (Python refuses
    to convert integers of thousands of digits)."""
    value = (value or "0").strip()
    if _DIGITS.fullmatch(value):
        return int(value)
    if value.isascii() and value.isdigit():
        return HUGE
    return None


def refuse(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _warn_once_if_open() -> None:
    global _warned_open
    if settings.STATE_TOKEN is None and not _warned_open:
        _warned_open = True
        log.warning("ESYNC_STATE_TOKEN is not set: writes to this state server are "
                    "unauthenticated (anyone who reaches it can create jobs and report "
                    "times); set it for the server and its workers")


class Guard:
    def __init__(self, get_response):
        self.get_response = get_response
        _warn_once_if_open()  # Django builds the middleware once, when the server starts

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.refusal(request) or self.get_response(request)
        if not response.streaming and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        return response

    def refusal(self, request: HttpRequest) -> Optional[HttpResponse]:
        """The answer refusing `request`, or None to let the views answer it."""
        if "HTTP_TRANSFER_ENCODING" in request.META:
            return refuse("a request body needs a Content-Length header; Transfer-Encoding "
                          "is not accepted", 411)
        length = declared_length(request.META.get("CONTENT_LENGTH"))
        if length is None:
            return refuse("header Content-Length must be a number of bytes", 400)
        if length > settings.MAX_BODY_BYTES:
            shown = "more than 10**18" if length >= HUGE else str(length)
            return refuse(f"the request body ({shown} bytes, header Content-Length) is too "
                          f"large: at most {settings.MAX_BODY_BYTES} bytes", 413)
        if request.method not in READ_METHODS:
            denied = self.unauthorised(request)
            if denied is not None:
                return denied
        if request.method == "POST":
            try:
                body = request.body  # at most MAX_BODY_BYTES, read now, kept for the view
            except OSError:  # Django's UnreadablePostError: the read timed out or failed
                return refuse(f"the request body ({length} bytes, header Content-Length) "
                              f"did not arrive", 408)
            if len(body) < length:  # the client closed its side early
                return refuse(f"the request body ended after {len(body)} of the {length} "
                              f"bytes that header Content-Length announced", 400)
        return None

    @staticmethod
    def unauthorised(request: HttpRequest) -> Optional[HttpResponse]:
        """401/403 for a write without this server's token; None where it may go on."""
        token = settings.STATE_TOKEN
        if token is None:
            return None
        header = request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            response = refuse("writes to this state server need the header "
                              "'Authorization: Bearer <token>' with its token "
                              "(ESYNC_STATE_TOKEN)", 401)
            response["WWW-Authenticate"] = 'Bearer realm="esync"'
            return response
        scheme, _, credentials = header.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not TOKEN.fullmatch(credentials):
            response = refuse("header Authorization must be 'Bearer <token>' with this state "
                              "server's token (ESYNC_STATE_TOKEN)", 401)
            response["WWW-Authenticate"] = 'Bearer realm="esync", error="invalid_request"'
            return response
        if not hmac.compare_digest(credentials.encode("ascii"), token.encode("ascii")):
            return refuse("the bearer token in header Authorization is not this state "
                          "server's token (ESYNC_STATE_TOKEN)", 403)
        return None
