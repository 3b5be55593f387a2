"""A small virtual network of "hosts" on this machine, for cluster tests.

Each host is a Linux network namespace with its own network stack: its
loopback, and one end of a veth pair whose other end is on a bridge that
joins the hosts. Host i has the address SUBNET.(i + 1)/24. The bridge has
no address and nothing routes between it and the machine's own network, so
traffic stays among the namespaces made here; no other address is ever
contacted. Needs root and iproute2's `ip` (`available()` says why not).

    with VirtualNetwork(3) as network:
        learner = network.popen(0, ["python3", "experiment.py", ...])
        network.set_link(2, up=False)     # host 2 drops off the network
        rx, tx = network.counters(1)      # bytes through host 1's interface

Everything is removed on exit, also after a failure: the processes started
through `popen`, the namespaces, the veth pairs and the bridge. Names carry
PREFIX and this process's id; leftovers of an earlier run that died are
removed at the start (`remove_leftovers`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

PREFIX = "sa"  # every namespace, veth and bridge made here: sa<pid>...
SUBNET = "10.231.42"  # a private /24 that no network here uses


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (apt-get install iproute2)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def namespaces() -> list[str]:
    """The names of every network namespace on the machine."""
    out = _ip("-j", "netns", "list", check=False).stdout.strip()
    return [entry["name"] for entry in json.loads(out)] if out else []


def links() -> list[str]:
    """The names of every network interface of the machine's own namespace."""
    out = _ip("-j", "link", "show", check=False).stdout.strip()
    return [entry["ifname"] for entry in json.loads(out)] if out else []


def ours(names: list[str]) -> list[str]:
    """The names made by some VirtualNetwork (PREFIX, then a process id)."""
    return [n for n in names if n.startswith(PREFIX) and n[len(PREFIX) :][:1].isdigit()]


def _pids_in(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split()]


def _remove_namespace(namespace: str) -> None:
    for pid in _pids_in(namespace):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + 10
    while _pids_in(namespace) and time.time() < deadline:
        time.sleep(0.1)
    _ip("netns", "delete", namespace, check=False)


def remove_leftovers() -> None:
    """Removes what an earlier VirtualNetwork left (its process died)."""
    for namespace in ours(namespaces()):
        _remove_namespace(namespace)
    for link in ours(links()):
        _ip("link", "delete", link, check=False)


class VirtualNetwork:
    def __init__(self, num_hosts: int):
        tag = f"{PREFIX}{os.getpid() % 100000}"
        self.num_hosts = num_hosts
        self.bridge = f"{tag}br"
        self.namespaces = [f"{tag}h{i}" for i in range(num_hosts)]
        # Interface names have at most 15 characters.
        self._outside = [f"{tag}o{i}" for i in range(num_hosts)]
        self.interface = "eth0"  # each host's end of its veth pair
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(num_hosts)]
        self._processes: list[subprocess.Popen] = []

    def __enter__(self) -> VirtualNetwork:
        remove_leftovers()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, (namespace, outside, address) in enumerate(
            zip(self.namespaces, self._outside, self.addresses, strict=True)
        ):
            inside = f"{self.bridge[:-2]}i{i}"
            _ip("netns", "add", namespace)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("-n", namespace, "link", "set", inside, "name", self.interface)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", self.interface)
            _ip("-n", namespace, "link", "set", self.interface, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def close(self) -> None:
        """Ends the processes, then removes the namespaces, links and bridge."""
        for process in self._processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        for namespace in self.namespaces:
            if namespace in namespaces():
                _remove_namespace(namespace)
        existing = links()
        for link in [*self._outside, self.bridge]:
            if link in existing:
                _ip("link", "delete", link, check=False)

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Starts `argv` on host `host` (in its namespace, its own process
        group); close() kills it if it is still running."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[host], *argv],
            start_new_session=True,
            **kwargs,
        )
        self._processes.append(process)
        return process

    def set_link(self, host: int, up: bool) -> None:
        """Takes host `host`'s interface down (it drops off the network,
        as when a cable is pulled) or up again."""
        state = "up" if up else "down"
        _ip("-n", self.namespaces[host], "link", "set", self.interface, state)

    def counters(self, host: int) -> tuple[int, int]:
        """(bytes received, bytes sent) through host `host`'s interface."""
        out = _ip(
            "-n",
            self.namespaces[host],
            "-j",
            "-s",
            "link",
            "show",
            "dev",
            self.interface,
        ).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]
