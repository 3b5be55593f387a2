"""HOST:PORT addresses: parsing, checking, and the checks of a whole cluster's
addresses (each one valid, none twice, the task in range), each error one
line naming the flag or TF_CONFIG entry, the value and the fix
(TensorFlow-free).
"""

from __future__ import annotations

import ipaddress
import re

from cluster.spec import (
    ACTOR_JOB,
    JOB_NAMES,
    LEARNER_JOB,
    SOURCE_COMMAND_LINE,
    SOURCE_TF_CONFIG_TFJOB,
    SOURCE_TF_CONFIG_TFJOB_MASTER,
    ClusterConfig,
    from_tf_config,
)

DEFAULT_LEARNER_HOST = "localhost:8000"
DEFAULT_ACTOR_HOSTS = ""
# Default actor i listens on localhost:DEFAULT_ACTOR_PORT_BASE + i (the
# reference's layout).
DEFAULT_ACTOR_PORT_BASE = 8001

_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def describe_setting(source: str, job: str, task: int | None = None) -> str:
    """Names the setting an address came from, for error messages."""
    if from_tf_config(source):
        if source in (SOURCE_TF_CONFIG_TFJOB, SOURCE_TF_CONFIG_TFJOB_MASTER):
            # A TFJob: learner task 0 is the chief (or master), learner task
            # k > 0 is ps[k - 1], actor task i is worker[i].
            chief = "chief" if source == SOURCE_TF_CONFIG_TFJOB else "master"
            if job == ACTOR_JOB:
                job = "worker"
            elif task:
                job, task = "ps", task - 1
            else:
                job = chief
        return f"TF_CONFIG cluster.{job}" + ("" if task is None else f"[{task}]")
    return "--learner_host" if job == LEARNER_JOB else "--actor_hosts"


def parse_host_port(value: str, setting: str = "--learner_host") -> tuple[str, int]:
    """Splits and checks 'HOST:PORT'; returns (host, port).

    HOST is a DNS name (letters, digits, '-' and '.'), an IPv4 address or a
    bracketed IPv6 address ('[::1]:8000'); PORT is 1..65535. `setting` names
    the flag or TF_CONFIG entry in the ValueError raised on bad input.
    """
    example = "e.g. localhost:8000, 10.0.0.2:8000 or [::1]:8000"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"{setting}: empty address {value!r}; write it as HOST:PORT, {example}"
        )
    text = value.strip()
    if any(c.isspace() for c in text):
        raise ValueError(
            f"{setting}: address {value!r} contains whitespace; write it as "
            f"HOST:PORT, {example}"
        )
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(
                f"{setting}: address {value!r} opens '[' but never closes it; "
                f"write an IPv6 address as [ADDR]:PORT, e.g. [::1]:8000"
            )
        host, rest = text[1:close], text[close + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"{setting}: {host!r} in {value!r} is not an IPv6 address; "
                f"brackets are only for IPv6, e.g. [::1]:8000"
            ) from None
        if not rest.startswith(":"):
            raise ValueError(
                f"{setting}: address {value!r} has no port; write it as "
                f"[{host}]:PORT, e.g. [{host}]:8000"
            )
        port_text = rest[1:]
        shown_host = f"[{host}]"
    else:
        if text.count(":") > 1:
            raise ValueError(
                f"{setting}: {value!r} looks like an IPv6 address without "
                f"brackets; write it as [ADDR]:PORT, e.g. [::1]:8000"
            )
        if ":" not in text:
            raise ValueError(
                f"{setting}: address {value!r} has no port; write it as "
                f"HOST:PORT, e.g. {text}:8000"
            )
        host, port_text = text.split(":")
        shown_host = host
        _check_host_name(host, value, setting)
    if not port_text:
        raise ValueError(
            f"{setting}: address {value!r} has no port after the colon; "
            f"write it as HOST:PORT, e.g. {shown_host}:8000"
        )
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(
            f"{setting}: port {port_text!r} in {value!r} is not a number; "
            f"use a port from 1 to 65535, e.g. {shown_host}:8000"
        )
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(
            f"{setting}: port {port} in {value!r} is out of range; use a port "
            f"from 1 to 65535, e.g. {shown_host}:8000"
        )
    return host, port


def _check_host_name(host: str, value: str, setting: str) -> None:
    fix = (
        "use a DNS name (letters, digits, '-' and '.'), an IPv4 address or a "
        "bracketed IPv6 address such as [::1]:8000"
    )
    if not host:
        raise ValueError(f"{setting}: address {value!r} has no host; {fix}")
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise ValueError(f"{setting}: invalid host name {host!r} in {value!r}; {fix}")
    # All-numeric dotted names are IPv4 addresses and must be valid ones
    # ('10.0.0.300' is a typo, not a DNS name).
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(
                f"{setting}: {host!r} in {value!r} is not a valid IPv4 address; {fix}"
            ) from None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _endpoint_key(host: str, port: int) -> tuple[str, int]:
    # All loopback names are this machine; since every TensorFlow server binds
    # all interfaces, two tasks there with the same port collide whatever name
    # they are given.
    return ("<loopback>" if _is_loopback(host) else host.lower(), port)


def parse_host_list(value: str, setting: str = "--actor_hosts") -> tuple[str, ...]:
    """Splits a comma-separated HOST:PORT list (spaces around commas allowed)."""
    if not value.strip():
        return ()
    items = [item.strip() for item in value.split(",")]
    for i, item in enumerate(items):
        if not item:
            raise ValueError(
                f"{setting}: empty address at position {i} in {value!r}; "
                f"remove the extra comma"
            )
    return tuple(items)


def default_actor_hosts(num_actors: int) -> tuple[str, ...]:
    """The reference's layout: actor i on localhost:8001+i."""
    return tuple(f"localhost:{DEFAULT_ACTOR_PORT_BASE + i}" for i in range(num_actors))


def validate(config: ClusterConfig) -> ClusterConfig:
    """Checks addresses, duplicates, job name and task; returns `config`.

    Raises ValueError with one line naming the flag (or TF_CONFIG entry), the
    bad value and the fix.
    """
    src = config.source
    job_setting = "--job_name" if src == SOURCE_COMMAND_LINE else "TF_CONFIG task.type"
    task_setting = "--task" if src == SOURCE_COMMAND_LINE else "TF_CONFIG task.index"
    if config.job_name not in JOB_NAMES:
        raise ValueError(
            f"{job_setting}={config.job_name!r} is not a job of this cluster; "
            f"use {LEARNER_JOB!r} or {ACTOR_JOB!r}"
        )
    if not config.actor_hosts:
        raise ValueError(
            f"{describe_setting(src, ACTOR_JOB)}: the cluster has no actor task; list "
            f"at least one actor address (or set --num_actors >= 1)"
        )
    seen: dict[tuple[str, int], str] = {}
    entries = [
        (LEARNER_JOB, i, host) for i, host in enumerate(config.learner_hosts)
    ] + [(ACTOR_JOB, i, host) for i, host in enumerate(config.actor_hosts)]
    for job, task, value in entries:
        setting = describe_setting(src, job, task if from_tf_config(src) else None)
        host, port = parse_host_port(value, setting)
        key = _endpoint_key(host, port)
        where = f"{job} task {task} ({value!r})"
        if key in seen:
            same = (
                "is the same port on this machine as"
                if key[0] == "<loopback>"
                else "duplicates"
            )
            raise ValueError(
                f"{setting}: {where} {same} {seen[key]}; every task needs its "
                f"own HOST:PORT"
            )
        seen[key] = where
    if isinstance(config.task, bool) or not isinstance(config.task, int):
        raise ValueError(
            f"{task_setting}={config.task!r} is not an integer; use a task index"
        )
    if config.job_name == LEARNER_JOB and not 0 <= config.task < config.num_learners:
        raise ValueError(
            f"{task_setting}={config.task} is out of range for the learner: "
            + (
                f"there is one learner task, use {task_setting}=0"
                if config.num_learners == 1
                else f"the cluster has {config.num_learners} learner addresses, "
                f"so use {task_setting}=0..{config.num_learners - 1}"
            )
        )
    if config.job_name == ACTOR_JOB and not 0 <= config.task < config.num_actors:
        raise ValueError(
            f"{task_setting}={config.task} is out of range for the actors: the "
            f"cluster has {config.num_actors} actor address(es), so use "
            f"{task_setting}=0..{config.num_actors - 1}"
        )
    return config
