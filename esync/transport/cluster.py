"""The job's shape from the environment, with ps-lite's variable names."""
from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from typing import Mapping, Optional

import config
from esync.errors import UserError

ROLES = ("scheduler", "server", "worker")
REQUIRED = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
            "DMLC_NUM_WORKER")


@dataclass(frozen=True)
class ClusterEnv:
    role: str
    root_uri: str
    root_port: int
    num_servers: int
    num_workers: int
    interface: Optional[str] = None
    verbose: bool = False  # PS_VERBOSE: the CLI logs the transport's messages (DEBUG)
    heartbeat_interval: float = config.HEARTBEAT_INTERVAL
    heartbeat_timeout: float = config.HEARTBEAT_TIMEOUT

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{resolve(self.root_uri, 'DMLC_PS_ROOT_URI')}:{self.root_port}"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "ClusterEnv":
        """Read and check the DMLC_* and PS_* variables; a bad one is a UserError."""
        missing = [name for name in REQUIRED if not environ.get(name)]
        if missing:
            raise UserError(f"the cluster roles need {', '.join(missing)} to be set")
        role = environ["DMLC_ROLE"]
        if role not in ROLES:
            raise UserError(f"DMLC_ROLE={role!r}: expected one of {', '.join(ROLES)}")

        def number(name: str, kind, low, default=None):
            text = environ.get(name)
            if text is None:
                return default
            try:
                value = kind(text)
            except ValueError:
                value = None
            if value is None or value < low or value != value:
                raise UserError(f"{name}={text!r}: expected a number >= {low}")
            return value

        port = number("DMLC_PS_ROOT_PORT", int, 0)
        if port > 65535:
            raise UserError(f"DMLC_PS_ROOT_PORT={port}: expected a port number in 1..65535")
        if port == 0 and role != "scheduler":
            raise UserError("DMLC_PS_ROOT_PORT=0: only the scheduler can pick a free port "
                            "(it reports it through ESYNC_READY_FD); give the others its port")
        interval = number("PS_HEARTBEAT_INTERVAL", float, 0.01, config.HEARTBEAT_INTERVAL)
        timeout = number("PS_HEARTBEAT_TIMEOUT", float, 0.05, config.HEARTBEAT_TIMEOUT)
        if timeout <= interval:
            raise UserError(f"PS_HEARTBEAT_TIMEOUT={timeout:g} must be longer than "
                            f"PS_HEARTBEAT_INTERVAL={interval:g}")
        return cls(role, environ["DMLC_PS_ROOT_URI"], port,
                   number("DMLC_NUM_SERVER", int, 1), number("DMLC_NUM_WORKER", int, 1),
                   environ.get("DMLC_INTERFACE") or None,
                   environ.get("PS_VERBOSE", "0") not in ("", "0"), interval, timeout)


def resolve(host: str, what: str) -> str:
    """An IPv4 address for `host` (a name or an address)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise UserError(f"{what}={host!r}: cannot resolve this host name") from None


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` (Linux)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                             struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        raise UserError(f"DMLC_INTERFACE={name!r}: no such network interface with an "
                        f"IPv4 address") from None
    finally:
        probe.close()


def advertised_address(env: ClusterEnv) -> str:
    """The address other nodes reach this one at: DMLC_NODE_HOST, DMLC_INTERFACE's
    address, or the local address of the route to the scheduler."""
    if os.environ.get("DMLC_NODE_HOST"):
        return resolve(os.environ["DMLC_NODE_HOST"], "DMLC_NODE_HOST")
    if env.interface:
        return interface_address(env.interface)
    route = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        route.connect((resolve(env.root_uri, "DMLC_PS_ROOT_URI"), env.root_port))
        return route.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        route.close()
