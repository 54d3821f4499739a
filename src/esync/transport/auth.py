"""Authentication and encryption of the job's ZeroMQ connections with CurveZMQ.

A *job key* is one CurveZMQ secret key (40 characters of Z85), handed to every process
of the job in ESYNC_JOB_KEY, or in a file named by ESYNC_JOB_KEY_FILE (the launchers
draw one per job: `python -m esync.transport.auth` prints a fresh one). Every process
derives the same key pair from it. Sockets that bind (the scheduler, the servers, the
DDP model publisher) are CURVE servers with that key pair and admit, through libzmq's
ZAP handler (pyzmq's `zmq.auth.ThreadAuthenticator`), only clients that present the
same public key, which only a holder of the secret can do. A peer without the key
cannot complete the handshake: it can neither send nor read a single message.

Without a key, traffic is neither authenticated nor encrypted, as in ps-lite; each
process says so once, on a trusted network that is as intended.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Mapping, Optional

import zmq
import zmq.auth.thread

from esync.errors import UserError

KEY_ENV = "ESYNC_JOB_KEY"
KEY_FILE_ENV = "ESYNC_JOB_KEY_FILE"
DOMAIN = "esync"

log = logging.getLogger(__name__)


def new_key() -> str:
    """A fresh job key (a CurveZMQ secret key in Z85)."""
    return zmq.curve_keypair()[1].decode()


@dataclass(frozen=True)
class JobKey:
    secret: bytes
    public: bytes

    @classmethod
    def parse(cls, text: str, where: str) -> "JobKey":
        secret = text.strip().encode()
        try:
            if len(secret) != 40:
                raise ValueError
            public = zmq.curve_public(secret)
        except (ValueError, zmq.ZMQError):
            raise UserError(f"{where}: not a job key (40 characters of Z85, as "
                            f"`python -m esync.transport.auth` prints)") from None
        return cls(secret, public)


def job_key(environ: Mapping[str, str] = os.environ, warn: bool = True) -> Optional[JobKey]:
    """The job key from ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE; None without either (and,
    with `warn`, a warning, once per process)."""
    if environ.get(KEY_ENV):
        return JobKey.parse(environ[KEY_ENV], KEY_ENV)
    path = environ.get(KEY_FILE_ENV)
    if not path:
        if warn:
            _say_unauthenticated()
        return None
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{KEY_FILE_ENV}={path}: cannot read it: {e.strerror}") from None
    return JobKey.parse(text, f"{KEY_FILE_ENV}={path}")


@functools.lru_cache(maxsize=None)
def _say_unauthenticated() -> None:
    log.warning("esync: no job key (%s or %s): ZeroMQ traffic is unauthenticated and "
                "unencrypted; anyone who reaches the job's ports can join it", KEY_ENV,
                KEY_FILE_ENV)


class _OnlyTheJob:
    """ZAP credentials: a client is admitted if it presents the job's public key."""

    def __init__(self, public: bytes):
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public


class Guard:
    """Makes a context's sockets CURVE servers or clients of the job's key (no-op
    without a key). Call `close` before the context is terminated."""

    def __init__(self, context: zmq.Context, key: Optional[JobKey]):
        self.context, self.key = context, key
        self._authenticator: Optional[zmq.auth.thread.ThreadAuthenticator] = None

    @classmethod
    def from_environ(cls, context: zmq.Context, warn: bool = True) -> "Guard":
        return cls(context, job_key(warn=warn))

    @property
    def secure(self) -> bool:
        return self.key is not None

    def serve(self, sock: zmq.Socket) -> zmq.Socket:
        """Before `bind`: only holders of the job key may connect."""
        if self.key is None:
            return sock
        if self._authenticator is None:
            self._authenticator = zmq.auth.thread.ThreadAuthenticator(
                self.context, log=logging.getLogger("esync.transport.zap"))
            self._authenticator.start()
            self._authenticator.configure_curve_callback(
                DOMAIN, credentials_provider=_OnlyTheJob(self.key.public))
        sock.zap_domain = DOMAIN.encode()
        sock.curve_secretkey = self.key.secret
        sock.curve_publickey = self.key.public
        sock.curve_server = True
        return sock

    def connect(self, sock: zmq.Socket) -> zmq.Socket:
        """Before `connect`: prove the job key to the server."""
        if self.key is not None:
            sock.curve_serverkey = self.key.public
            sock.curve_publickey = self.key.public
            sock.curve_secretkey = self.key.secret
        return sock

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None


if __name__ == "__main__":
    print(new_key())
