"""This machine's ports and the network probes: whether a port is free to
listen on, whether a task listens at HOST:PORT (and waiting until it does),
and free ports for a cluster on this machine (tests and launch.py).
TensorFlow-free.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Sequence

from absl import logging

from cluster.hosts import parse_host_port


class PortInUseError(RuntimeError):
    """The port a task should listen on is taken by another process."""


def port_in_use(port: int) -> OSError | None:
    """Returns the bind error if this machine cannot listen on `port`, else None.

    Binds the way gRPC does: all interfaces, dual-stack IPv6 when available
    (the server listens on *:PORT), with SO_REUSEADDR so that connections of
    an earlier server still in TIME_WAIT do not count as in use.
    """
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address: tuple = ("::", port)
    except OSError:  # No IPv6 on this machine.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = ("0.0.0.0", port)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            return e
        return None  # Anything else: let TensorFlow try and report.
    finally:
        sock.close()
    return None


def connection_error(host_port: str, timeout_secs: float = 1.0) -> OSError | None:
    """None when a TCP connection to HOST:PORT succeeds (a task listens
    there); the error otherwise (refused, unreachable, a name that does not
    resolve yet, a timeout). The one TCP check of whether a task is up."""
    host, port = parse_host_port(host_port)
    try:
        with socket.create_connection((host, port), timeout=timeout_secs):
            return None
    except OSError as e:
        return e


def reachable(host_port: str, timeout_secs: float = 1.0) -> bool:
    """Whether a task listens at HOST:PORT (see connection_error)."""
    return connection_error(host_port, timeout_secs) is None


# What a connection to a task's address says of the task (`task_status`).
LISTENING = "listening"
# The host answered and nothing listens: the task has exited (or crashed).
GONE = "gone"
# No answer (a timeout), no route, or a name that does not resolve: the
# task may be running behind a partition, or on a host that restarts its
# network; it can come back.
UNREACHABLE = "unreachable"


def task_status(host_port: str, timeout_secs: float = 1.0) -> str:
    """LISTENING, GONE or UNREACHABLE for the task at HOST:PORT.

    Only a refused connection is GONE: the host's own network stack
    answered that no process listens on the port. Every other failure
    leaves the task's fate unknown.
    """
    error = connection_error(host_port, timeout_secs)
    if error is None:
        return LISTENING
    if isinstance(error, ConnectionRefusedError):
        return GONE
    return UNREACHABLE


def wait_for_port(
    host_port: str,
    timeout_secs: float | None = None,
    poll_secs: float = 0.25,
    log_every_secs: float = 5.0,
    what: str = "learner",
) -> None:
    """Blocks until a TCP connection to HOST:PORT succeeds.

    Logs 'waiting for learner at HOST:PORT' every `log_every_secs`. Raises
    TimeoutError after `timeout_secs` (None = wait forever). A name that does
    not resolve yet (DNS of a pod still starting) counts as not up.
    """
    start = time.monotonic()
    next_log = start + log_every_secs
    while True:
        last_error = connection_error(host_port, max(poll_secs, 1.0))
        if last_error is None:
            return
        now = time.monotonic()
        if timeout_secs is not None and now - start >= timeout_secs:
            raise TimeoutError(
                f"{what} at {host_port} not reachable after {timeout_secs:.0f} s "
                f"({last_error}); check that it runs and that the address is right"
            )
        if now >= next_log:
            logging.info(
                "waiting for %s at %s (%.0f s so far: %s)",
                what,
                host_port,
                now - start,
                last_error,
            )
            next_log = now + log_every_secs
        time.sleep(poll_secs)


def pick_free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns n distinct TCP ports that are free right now.

    All sockets are held open together so the ports differ, then closed; a
    port could in principle be taken again before it is used.
    """
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def local_cluster_hosts(
    num_actors: int, port_base: int = 0, host: str = "localhost", num_learners: int = 1
) -> tuple[str, tuple[str, ...]]:
    """(learner_host, actor_hosts) for a cluster on this machine;
    learner_host lists the `num_learners` learner tasks, comma-separated.

    port_base > 0: learner task k on port_base + k, actor i on
    port_base + num_learners + i. port_base == 0: free ports picked now.
    """
    count = num_learners + num_actors
    if port_base < 0 or (port_base and port_base + count - 1 > 65535):
        raise ValueError(
            f"--port_base={port_base} leaves no room for {num_learners} "
            f"learner(s) and {num_actors} actors below 65536; use 0 (free "
            f"ports) or a port from 1 to {65536 - count}"
        )
    if port_base:
        ports: Sequence[int] = range(port_base, port_base + count)
    else:
        ports = pick_free_ports(count)
    hosts = [f"{host}:{p}" for p in ports]
    return ",".join(hosts[:num_learners]), tuple(hosts[num_learners:])
