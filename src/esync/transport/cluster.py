"""The job's shape from the environment, with ps-lite's variable names."""
from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from typing import Mapping, Optional

from esync import config
from esync.errors import UserError

ROLES = ("scheduler", "server", "worker", "evaluator")
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
    #: DMLC_WORKER_ID (as BytePS spells it): the rank this worker asks for, so that a
    #: launcher's worker k is rank k in every run (None: the scheduler deals ranks in
    #: the order the workers register)
    worker_id: Optional[int] = None

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
        workers = number("DMLC_NUM_WORKER", int, 1)
        worker_id = number("DMLC_WORKER_ID", int, 0) if role == "worker" else None
        if worker_id is not None and worker_id >= workers:
            raise UserError(f"DMLC_WORKER_ID={worker_id}: expected a rank below "
                            f"DMLC_NUM_WORKER={workers}")
        return cls(role, environ["DMLC_PS_ROOT_URI"], port,
                   number("DMLC_NUM_SERVER", int, 0), workers,
                   environ.get("DMLC_INTERFACE") or None,
                   environ.get("PS_VERBOSE", "0") not in ("", "0"), interval, timeout,
                   worker_id)


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
    return _route_address(resolve(env.root_uri, "DMLC_PS_ROOT_URI"), env.root_port or 1)


def _route_address(host: str, port: int) -> str:
    """The local address of the route to host:port (127.0.0.1 if there is none)."""
    route = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        route.connect((host, port))
        return route.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        route.close()


#: torch.distributed's variables (torchrun sets them): the DDP baseline's rendezvous
DDP_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DDPEnv:
    """The DDP baseline's job from torch.distributed's variables. MASTER_PORT=0 (rank 0
    only) makes rank 0 host the rendezvous store on a free port, reported through
    ESYNC_READY_FD as the scheduler does; torchrun gives a real port. The evaluator
    (DMLC_ROLE=evaluator) needs only MASTER_ADDR and MASTER_PORT."""

    master_addr: str
    master_port: int
    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_environ(cls, evaluator: bool = False,
                     environ: Mapping[str, str] = os.environ) -> "DDPEnv":
        needed = DDP_REQUIRED[2:] if evaluator else DDP_REQUIRED
        missing = [name for name in needed if not environ.get(name)]
        if missing:
            raise UserError(f"-m/--mode ddp runs with torch.distributed's variables: set "
                            f"{', '.join(missing)} (or start it with torchrun)")
        values = {}
        for name, low in (("RANK", 0), ("WORLD_SIZE", 1), ("MASTER_PORT", 0)):
            text = environ.get(name, "0" if name == "RANK" else "1")
            try:
                values[name] = int(text)
            except ValueError:
                raise UserError(f"{name}={text!r}: expected an integer >= {low}") from None
            if values[name] < low:
                raise UserError(f"{name}={text!r}: expected an integer >= {low}")
        if values["MASTER_PORT"] > 65535:
            raise UserError(f"MASTER_PORT={values['MASTER_PORT']}: expected a port number")
        if not evaluator and values["RANK"] >= values["WORLD_SIZE"]:
            raise UserError(f"RANK={values['RANK']}: expected 0..WORLD_SIZE-1 "
                            f"(WORLD_SIZE={values['WORLD_SIZE']})")
        if values["MASTER_PORT"] == 0 and (evaluator or values["RANK"] != 0):
            raise UserError("MASTER_PORT=0: only rank 0 can pick a free port (it reports it "
                            "through ESYNC_READY_FD); give the others its port")
        return cls(resolve(environ["MASTER_ADDR"], "MASTER_ADDR"), values["MASTER_PORT"],
                   values["RANK"], values["WORLD_SIZE"])

    def local_address(self) -> str:
        """This process's address as the others reach it: DMLC_NODE_HOST, or the local
        address of the route to MASTER_ADDR."""
        if os.environ.get("DMLC_NODE_HOST"):
            return resolve(os.environ["DMLC_NODE_HOST"], "DMLC_NODE_HOST")
        return _route_address(self.master_addr, self.master_port or 1)
