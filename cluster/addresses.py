"""Cluster addresses for IMPALA: flags, TF_CONFIG, devices and ports
(TensorFlow-free; the servers and sessions are servers.py).

A distributed run has one learner task (or --num_learners of them) and N
actor tasks, as TensorFlow jobs `learner` (tasks 0..L-1) and `actor` (tasks
0..N-1). The global variables live on /job:learner/task:0 (the chief), each
learner task's queue on that task; each actor runs its unroll on its own task
and talks only to the chief and the learner task it feeds.

Where the addresses come from (see `resolve_cluster`):

* Flags: `--learner_host` (default `localhost:8000`; several learner tasks
  comma-separated, the chief first) and `--actor_hosts`
  (comma-separated HOST:PORT list; empty = `localhost:8001+i` for
  i < `--num_actors`), with `--job_name` (learner|actor) and `--task`.
* The TF_CONFIG environment variable (the TensorFlow convention set by
  Kubeflow's TFJob and cloud trainers), a JSON object such as
  `{"cluster": {"learner": ["h0:8000"], "actor": ["h1:8001", "h2:8001"]},
  "task": {"type": "actor", "index": 1}}`. Two spellings of the job names are
  accepted, never mixed: `learner`/`actor`, or TFJob's `chief`/`worker`
  (chief = the learner, worker i = actor i; a TFJob chief is one task, so
  several learner tasks need the learner/actor names). Any other job (`ps`,
  `evaluator`, `master`, ...) is an error, as is an empty learner list.
  Other top-level keys (`environment`, ...) are ignored. `"task"` may be
  left out when `--job_name`/`--task` give it.

Precedence (`resolve_cluster`): without TF_CONFIG, `--task=-1` is
single-machine training (no cluster; address flags set then are an error) and
`--task` >= 0 uses the flags. With TF_CONFIG, it describes the cluster:
address flags left at their defaults are ignored, explicitly set ones must
agree with it (otherwise a ValueError names both), and so must a `--task` >= 0
with TF_CONFIG's task. The number of actors is then the length of its actor
list (use `ClusterConfig.num_actors`, not --num_actors).

Typical use in a task (experiment.py and the cluster tasks):

    config = cluster.resolve_cluster(learner_host, actor_hosts, num_actors,
                                     job_name, task)   # the flags' values
    if config is not None:
        server = servers.start_server(config)
        session_config = servers.server_config(config)
        # Graph: queue and global variables under tf.device(learner_device()),
        # the actor's unroll under tf.device(config.device).
        if config.is_learner:   # chief
            MonitoredTrainingSession(master=server.target, is_chief=True,
                                     config=session_config, ...)
        else:
            MonitoredSession(session_creator=servers.worker_session_creator(
                config, server, scaffold), hooks=...)

Security: a TensorFlow server runs any graph sent to it and listens on all
interfaces (*:PORT, IPv4 and IPv6; there is no option to bind loopback only).
Run clusters on a private network with the ports firewalled.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import socket
import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

from absl import logging

LEARNER_JOB = "learner"
ACTOR_JOB = "actor"
JOB_NAMES = (LEARNER_JOB, ACTOR_JOB)

DEFAULT_LEARNER_HOST = "localhost:8000"
DEFAULT_ACTOR_HOSTS = ""
# Default actor i listens on localhost:DEFAULT_ACTOR_PORT_BASE + i (the
# reference's layout).
DEFAULT_ACTOR_PORT_BASE = 8001

# TF_CONFIG job-name spellings: ours, and Kubeflow TFJob's chief/worker.
_TF_CONFIG_NAMINGS = (
    {"learner": LEARNER_JOB, "actor": ACTOR_JOB},
    {"chief": LEARNER_JOB, "worker": ACTOR_JOB},
)

# ClusterConfig.source values: where the addresses came from.
_SOURCE_COMMAND_LINE = "flags"
_SOURCE_TF_CONFIG = "TF_CONFIG"  # Jobs named learner/actor.
_SOURCE_TF_CONFIG_TFJOB = "TF_CONFIG chief/worker"  # Kubeflow TFJob names.


def from_tf_config(source: str) -> bool:
    return source.startswith(_SOURCE_TF_CONFIG)


_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class ClusterConfig(NamedTuple):
    """Where every task of the cluster listens, and which task this process is.

    learner_host: 'HOST:PORT' of /job:learner/task:0.
    actor_hosts: tuple of 'HOST:PORT', actor task i at index i.
    job_name: 'learner' or 'actor' (this process).
    task: this process's task index in its job.
    source: where the addresses came from, to name the right setting in
      error messages: 'flags', 'TF_CONFIG' or 'TF_CONFIG chief/worker'.
    """

    learner_host: str
    actor_hosts: tuple[str, ...]
    job_name: str
    task: int
    source: str = _SOURCE_COMMAND_LINE
    # Learner tasks 1..N-1 (--num_learners=N); task 0 is `learner_host`, the
    # chief, which holds the variables.
    more_learner_hosts: tuple[str, ...] = ()

    @property
    def num_actors(self) -> int:
        return len(self.actor_hosts)

    @property
    def learner_hosts(self) -> tuple[str, ...]:
        """Every learner task's HOST:PORT, task i at index i."""
        return (self.learner_host, *self.more_learner_hosts)

    @property
    def num_learners(self) -> int:
        return 1 + len(self.more_learner_hosts)

    @property
    def is_chief(self) -> bool:
        return self.is_learner and self.task == 0

    @property
    def feeds_learner(self) -> int:
        """The learner task whose queue this actor task feeds (actor j:
        learner j mod N, as on one machine)."""
        return self.task % self.num_learners

    @property
    def is_learner(self) -> bool:
        return self.job_name == LEARNER_JOB

    @property
    def role(self) -> str:
        """'chief' (learner task 0), 'learner' (another learner task, which
        serves the chief's tower) or 'actor'."""
        return "chief" if self.is_chief else self.job_name

    def task_counts_problem(self, num_learners: int) -> str | None:
        """The flag error when --num_learners differs from the number of
        learner tasks this cluster lists, or when the cluster has fewer actor
        tasks than learner tasks (actor j feeds learner j mod N: a learner
        with no actor would hold every update up forever); or None."""
        if num_learners != self.num_learners:
            return (
                f"--num_learners={num_learners}: the cluster lists "
                f"{self.num_learners} learner task(s); start every task with "
                f"--num_learners={self.num_learners}."
            )
        if self.num_actors < self.num_learners:
            return (
                f"--num_learners={num_learners}: the cluster lists "
                f"{self.num_learners} learner tasks but {self.num_actors} actor "
                f"task(s), and actor j feeds learner j mod {self.num_learners}, so "
                f"learner tasks {self.num_actors}..{self.num_learners - 1} would get "
                f"no unroll and the update would wait forever; list at least "
                f"{self.num_learners} actor tasks or fewer learner tasks."
            )
        return None

    @property
    def address(self) -> str:
        """This task's own HOST:PORT."""
        if self.is_learner:
            return self.learner_hosts[self.task]
        return self.actor_hosts[self.task]

    @property
    def device(self) -> str:
        """This task's device prefix, e.g. '/job:actor/task:3'."""
        return f"/job:{self.job_name}/task:{self.task}"


def learner_device(task: int = 0) -> str:
    """A learner task's device; task 0's holds the global variables (and, as
    every learner task's, its own queue)."""
    return f"/job:{LEARNER_JOB}/task:{task}"


def actor_device(task: int) -> str:
    return f"/job:{ACTOR_JOB}/task:{task}"


class PortInUseError(RuntimeError):
    """The port a task should listen on is taken by another process."""


# ---------------------------------------------------------------------------
# Address parsing and validation.


def describe_setting(source: str, job: str, task: int | None = None) -> str:
    """Names the setting an address came from, for error messages."""
    if from_tf_config(source):
        if source == _SOURCE_TF_CONFIG_TFJOB:
            job = {LEARNER_JOB: "chief", ACTOR_JOB: "worker"}[job]
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


def parse_actor_hosts(value: str, setting: str = "--actor_hosts") -> tuple[str, ...]:
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
    job_setting = "--job_name" if src == _SOURCE_COMMAND_LINE else "TF_CONFIG task.type"
    task_setting = "--task" if src == _SOURCE_COMMAND_LINE else "TF_CONFIG task.index"
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


# ---------------------------------------------------------------------------
# Building a ClusterConfig from flags or TF_CONFIG.


def cluster_from_flags(
    learner_host: str,
    actor_hosts: str,
    num_actors: int,
    job_name: str,
    task: int,
) -> ClusterConfig:
    """The cluster described by --learner_host, --actor_hosts and --num_actors.

    `learner_host` is one HOST:PORT, or several comma-separated (learner
    task i at position i; task 0 is the chief). An empty `actor_hosts` means
    localhost:8001+i for i < num_actors. When `actor_hosts` is given,
    `num_actors` must equal its length (one actor task per address), so that
    every task agrees on the number of actors.
    """
    learners = parse_actor_hosts(learner_host, "--learner_host") or (learner_host,)
    hosts = parse_actor_hosts(actor_hosts)
    if hosts:
        if num_actors != len(hosts):
            raise ValueError(
                f"--actor_hosts lists {len(hosts)} address(es) but "
                f"--num_actors={num_actors}; set --num_actors={len(hosts)} "
                f"(one actor task per address)"
            )
    else:
        if num_actors < 1:
            raise ValueError(
                f"--num_actors={num_actors}: a distributed run needs at least "
                f"one actor task; set --num_actors >= 1"
            )
        hosts = default_actor_hosts(num_actors)
    return validate(
        ClusterConfig(
            learners[0].strip(),
            hosts,
            job_name,
            task,
            _SOURCE_COMMAND_LINE,
            tuple(learners[1:]),
        )
    )


class _TfConfig(NamedTuple):
    learner_hosts: tuple[str, ...]
    actor_hosts: tuple[str, ...]
    job_name: str | None  # None when TF_CONFIG has no "task"
    task: int | None
    source: str


def _parse_tf_config(env_value: str) -> _TfConfig:
    example = (
        '{"cluster": {"learner": ["host0:8000"], "actor": ["host1:8001"]}, '
        '"task": {"type": "actor", "index": 0}}'
    )
    try:
        data = json.loads(env_value)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({e}); set it to an object like {example}"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
        raise ValueError(
            f'TF_CONFIG={env_value!r} has no "cluster" object; set it to an '
            f"object like {example}"
        )
    cluster = data["cluster"]
    names = set(cluster)
    naming = next((n for n in _TF_CONFIG_NAMINGS if names == set(n)), None)
    if naming is None:
        raise ValueError(
            f"TF_CONFIG cluster has jobs {sorted(names)}; this program needs "
            f'exactly a learner and actors, named ["learner", "actor"] or '
            f'(Kubeflow TFJob) ["chief", "worker"]'
        )
    to_ours = naming
    to_theirs = {ours: theirs for theirs, ours in naming.items()}
    lists = {}
    for theirs, ours in to_ours.items():
        entries = cluster[theirs]
        if not isinstance(entries, list) or not all(
            isinstance(e, str) for e in entries
        ):
            raise ValueError(
                f'TF_CONFIG cluster.{theirs} must be a list of "HOST:PORT" '
                f"strings, got {entries!r}"
            )
        lists[ours] = entries
    learners = lists[LEARNER_JOB]
    if not learners:
        raise ValueError(
            f"TF_CONFIG cluster.{to_theirs[LEARNER_JOB]} is empty; list the "
            f"learner's address (one per learner task)"
        )
    if len(learners) != 1 and to_theirs[LEARNER_JOB] == "chief":
        raise ValueError(
            f"TF_CONFIG cluster.chief lists {len(learners)} addresses; a TFJob "
            f"chief is one task, so name the jobs learner and actor to list "
            f"several learner tasks"
        )
    if not lists[ACTOR_JOB]:
        raise ValueError(
            f"TF_CONFIG cluster.{to_theirs[ACTOR_JOB]} is empty; list at least "
            f"one actor address"
        )
    job_name = task = None
    if "task" in data:
        spec = data["task"]
        if not isinstance(spec, dict) or "type" not in spec or "index" not in spec:
            raise ValueError(
                f'TF_CONFIG task={spec!r} must be an object with "type" and '
                f'"index", e.g. {{"type": "{to_theirs[ACTOR_JOB]}", "index": 0}}'
            )
        if spec["type"] not in to_ours:
            raise ValueError(
                f"TF_CONFIG task.type={spec['type']!r} is not a job of its "
                f"cluster; use one of {sorted(to_ours)}"
            )
        index = spec["index"]
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(
                f"TF_CONFIG task.index={index!r} is not an integer; use a task "
                f"index such as 0"
            )
        job_name, task = to_ours[spec["type"]], index
    return _TfConfig(
        tuple(h.strip() for h in learners),
        tuple(h.strip() for h in lists[ACTOR_JOB]),
        job_name,
        task,
        _SOURCE_TF_CONFIG if "learner" in names else _SOURCE_TF_CONFIG_TFJOB,
    )


def resolve_cluster(
    learner_host: str,
    actor_hosts: str,
    num_actors: int,
    job_name: str,
    task: int,
    tf_config: str | None = None,
    explicit_flags: Collection[str] | None = None,
) -> ClusterConfig | None:
    """Decides between single-machine mode, flags and TF_CONFIG.

    Args:
      learner_host, actor_hosts, num_actors, job_name, task: the flag values.
      tf_config: the TF_CONFIG value; None reads os.environ, '' means unset.
      explicit_flags: names of the flags given on the command line (e.g.
        those whose absl flag is `.present`). When None, an address flag
        counts as explicit when it differs from its default, and --num_actors
        is never checked against TF_CONFIG.

    Returns:
      None for single-machine training (no TF_CONFIG and task < 0), else the
      validated ClusterConfig.

    Raises:
      ValueError: bad addresses, or flags that contradict TF_CONFIG.
    """
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG", "")
    if explicit_flags is None:
        explicit = set()
        if learner_host.strip() != DEFAULT_LEARNER_HOST:
            explicit.add("learner_host")
        if actor_hosts.strip() != DEFAULT_ACTOR_HOSTS:
            explicit.add("actor_hosts")
    else:
        explicit = set(explicit_flags)

    if not tf_config.strip():
        if task < 0:
            given = sorted(f"--{n}" for n in explicit & {"learner_host", "actor_hosts"})
            if given:
                raise ValueError(
                    f"{', '.join(given)} set but --task={task} means "
                    f"single-machine training, which uses no cluster; pass "
                    f"--job_name and --task >= 0 to run a cluster task, or "
                    f"drop {', '.join(given)}"
                )
            return None
        return cluster_from_flags(learner_host, actor_hosts, num_actors, job_name, task)

    parsed = _parse_tf_config(tf_config)
    if (
        "learner_host" in explicit
        and parse_actor_hosts(learner_host, "--learner_host") != parsed.learner_hosts
    ):
        raise ValueError(
            f"--learner_host={learner_host!r} contradicts TF_CONFIG's learner "
            f"{','.join(parsed.learner_hosts)!r}; drop --learner_host or unset "
            f"TF_CONFIG"
        )
    if (
        "actor_hosts" in explicit
        and parse_actor_hosts(actor_hosts) != parsed.actor_hosts
    ):
        raise ValueError(
            f"--actor_hosts={actor_hosts!r} contradicts TF_CONFIG's actors "
            f"{','.join(parsed.actor_hosts)!r}; drop --actor_hosts or unset TF_CONFIG"
        )
    if "num_actors" in explicit and num_actors != len(parsed.actor_hosts):
        raise ValueError(
            f"--num_actors={num_actors} but TF_CONFIG lists "
            f"{len(parsed.actor_hosts)} actors; set --num_actors="
            f"{len(parsed.actor_hosts)} or drop it"
        )
    if parsed.job_name is None:
        if task < 0:
            raise ValueError(
                f'TF_CONFIG has no "task" entry and --task={task}; add '
                f'"task": {{"type": "actor", "index": 0}} to TF_CONFIG, pass '
                f"--job_name and --task, or unset TF_CONFIG for single-machine "
                f"training"
            )
        job, index, task_source = job_name, task, _SOURCE_COMMAND_LINE
    else:
        task_given = task >= 0 or "task" in explicit
        if task_given and (job_name, task) != (parsed.job_name, parsed.task):
            raise ValueError(
                f"--job_name={job_name} --task={task} contradicts TF_CONFIG's "
                f"task ({parsed.job_name} {parsed.task}); drop --job_name and "
                f"--task or make them agree"
            )
        job, index, task_source = parsed.job_name, parsed.task, parsed.source
    config = ClusterConfig(
        parsed.learner_hosts[0],
        parsed.actor_hosts,
        job,
        index,
        parsed.source,
        parsed.learner_hosts[1:],
    )
    # The addresses come from TF_CONFIG, job and task maybe from flags: name
    # TF_CONFIG in address errors and the flags in job/task errors.
    validate(config._replace(job_name=LEARNER_JOB, task=0))
    validate(config._replace(source=task_source))
    return config


def device_filters(config: ClusterConfig) -> list[str]:
    """Devices a task's sessions may see.

    The chief (learner task 0) needs the learner tasks, whose towers and
    queues its graph uses (actors connect to it, never the reverse), so it
    neither waits for nor depends on actors. Another learner task needs the
    chief and itself. An actor needs the chief (the variables), the learner
    task whose queue it feeds and itself, never the other actors.
    """
    learners = [learner_device(i) for i in range(config.num_learners)]
    if config.is_chief:
        return learners
    if config.is_learner:
        return [learner_device(), learner_device(config.task)]
    feeds = config.feeds_learner
    return [
        learner_device(),
        *([learner_device(feeds)] if feeds else []),
        actor_device(config.task),
    ]


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


# gRPC keepalive on the connections between tasks. A peer whose host drops
# off the network (a pulled cable, a dead switch port) neither closes nor
# resets its connections; without pings, a call to it waits until the network
# comes back, whatever its RunOptions timeout. With them the call fails about
# KEEPALIVE_TIME + KEEPALIVE_TIMEOUT after the peer went silent. Pings go only
# while a call is in flight (gRPC's default), and no more often than every 5 s,
# so a busy learner's server never sees them as abuse. TensorFlow reads these
# options from TF_GRPC_DEFAULT_OPTIONS when it makes its first channel.


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


# ---------------------------------------------------------------------------
# Local ports for tests and the launcher.


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
