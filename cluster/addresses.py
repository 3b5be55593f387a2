"""The cluster from the flags or TF_CONFIG: `resolve_cluster` turns them into
one checked `spec.ClusterConfig` (TensorFlow-free; the servers and sessions
are servers.py, the parsing of each address hosts.py).

Where the addresses come from (see `resolve_cluster`):

* Flags: `--learner_host` (default `localhost:8000`; several learner tasks
  comma-separated, the chief first) and `--actor_hosts`
  (comma-separated HOST:PORT list; empty = `localhost:8001+i` for
  i < `--num_actors`), with `--job_name` (learner|actor) and `--task`.
* The TF_CONFIG environment variable (the TensorFlow convention set by
  Kubeflow's TFJob and cloud trainers), a JSON object such as
  `{"cluster": {"learner": ["h0:8000"], "actor": ["h1:8001", "h2:8001"]},
  "task": {"type": "actor", "index": 1}}`. Two spellings of the job names are
  accepted, never mixed: `learner`/`actor`, or the replica types of a
  Kubeflow TFJob as its operator writes them: `chief` (or `master`) is
  learner task 0, `ps` replica i learner task i + 1, `worker` i actor i.
  An `evaluator` or any other job is an error, as is an empty learner list.
  Other top-level keys (`environment`, ...) are ignored. `"task"` may be
  left out when `--job_name`/`--task` give it.

Precedence (`resolve_cluster`): without TF_CONFIG, `--task=-1` is
single-machine training (no cluster; address flags set then are an error) and
`--task` >= 0 uses the flags. With TF_CONFIG, it describes the cluster:
address flags left at their defaults are ignored, explicitly set ones must
agree with it (otherwise a ValueError names both), and so must a `--task` >= 0
with TF_CONFIG's task. The number of actors is then the length of its actor
list (use `ClusterConfig.num_actors`, not --num_actors).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from typing import NamedTuple

from cluster.hosts import (
    DEFAULT_ACTOR_HOSTS,
    DEFAULT_LEARNER_HOST,
    default_actor_hosts,
    describe_setting,
    parse_host_list,
    validate,
)
from cluster.spec import (
    ACTOR_JOB,
    LEARNER_JOB,
    SOURCE_COMMAND_LINE,
    SOURCE_TF_CONFIG,
    SOURCE_TF_CONFIG_TFJOB,
    SOURCE_TF_CONFIG_TFJOB_MASTER,
    ClusterConfig,
)


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
    learners = parse_host_list(learner_host, "--learner_host") or (learner_host,)
    hosts = parse_host_list(actor_hosts)
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
            SOURCE_COMMAND_LINE,
            tuple(learners[1:]),
        )
    )


class _TfConfig(NamedTuple):
    learner_hosts: tuple[str, ...]
    actor_hosts: tuple[str, ...]
    job_name: str | None  # None when TF_CONFIG has no "task"
    task: int | None
    source: str


def _host_list(cluster: dict, job: str) -> list[str]:
    """cluster[job] as a list of strings (a ValueError naming it otherwise)."""
    entries = cluster[job]
    if isinstance(entries, dict) and job == "worker":
        raise ValueError(
            "TF_CONFIG cluster.worker is a map of some workers (a TFJob with "
            "enableDynamicWorker); every task of this program needs every "
            "address: leave enableDynamicWorker unset"
        )
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(
            f'TF_CONFIG cluster.{job} must be a list of "HOST:PORT" '
            f"strings, got {entries!r}"
        )
    return [e.strip() for e in entries]


def _tfjob_roles(cluster: dict) -> tuple[dict[str, list[str]], str] | None:
    """A TFJob's replica types as (learner and actor address lists, the
    source), or None when the jobs are not a TFJob's: the Chief (or Master)
    is learner task 0, PS replica i learner task i + 1, Worker i actor i."""
    names = set(cluster)
    chiefs = names & {"chief", "master"}
    if len(chiefs) != 1 or "worker" not in names or names - {*chiefs, "worker", "ps"}:
        return None
    (chief,) = chiefs
    chief_hosts = _host_list(cluster, chief)
    if len(chief_hosts) != 1:
        raise ValueError(
            f"TF_CONFIG cluster.{chief} lists {len(chief_hosts)} addresses; a "
            f"TFJob's {chief.capitalize()} is one replica (learner task 0): "
            "give further learner tasks as PS replicas"
        )
    ps_hosts = _host_list(cluster, "ps") if "ps" in names else []
    source = (
        SOURCE_TF_CONFIG_TFJOB if chief == "chief" else SOURCE_TF_CONFIG_TFJOB_MASTER
    )
    return {
        LEARNER_JOB: chief_hosts + ps_hosts,
        ACTOR_JOB: _host_list(cluster, "worker"),
    }, source


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
    if "evaluator" in names:
        raise ValueError(
            "TF_CONFIG cluster has an evaluator job; this program has no "
            "evaluator task: leave the Evaluator replica out and run test mode "
            "(--mode=test on the learner's --logdir) as a job of its own"
        )
    if names == {LEARNER_JOB, ACTOR_JOB}:
        lists = {job: _host_list(cluster, job) for job in (LEARNER_JOB, ACTOR_JOB)}
        source = SOURCE_TF_CONFIG
    elif tfjob := _tfjob_roles(cluster):
        lists, source = tfjob
    else:
        raise ValueError(
            f"TF_CONFIG cluster has jobs {sorted(names)}; this program needs "
            f'learner and actor tasks, named ["learner", "actor"] or, as a '
            f'Kubeflow TFJob writes them, ["chief", "worker"] with optional '
            f'"ps" (further learner tasks; "master" for "chief")'
        )
    learners = lists[LEARNER_JOB]
    if not learners:
        raise ValueError(
            "TF_CONFIG cluster.learner is empty; list the learner's address "
            "(one per learner task)"
        )
    if not lists[ACTOR_JOB]:
        raise ValueError(
            f"{describe_setting(source, ACTOR_JOB)} is empty; list at least one "
            "actor address"
        )
    job_name = task = None
    if "task" in data:
        spec = data["task"]
        if not isinstance(spec, dict) or "type" not in spec or "index" not in spec:
            raise ValueError(
                f'TF_CONFIG task={spec!r} must be an object with "type" and '
                f'"index", e.g. {{"type": "'
                f'{"actor" if source == SOURCE_TF_CONFIG else "worker"}", "index": 0}}'
            )
        if spec["type"] not in names:
            raise ValueError(
                f"TF_CONFIG task.type={spec['type']!r} is not a job of its "
                f"cluster; use one of {sorted(names)}"
            )
        index = spec["index"]
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(
                f"TF_CONFIG task.index={index!r} is not an integer; use a task "
                f"index such as 0"
            )
        job_name, task = _our_task(spec["type"], index)
    return _TfConfig(tuple(learners), tuple(lists[ACTOR_JOB]), job_name, task, source)


def _our_task(job: str, index: int) -> tuple[str, int]:
    """A TF_CONFIG task as (our job, our task index)."""
    if job in (ACTOR_JOB, "worker"):
        return ACTOR_JOB, index
    if job == "ps":
        return LEARNER_JOB, index + 1
    return LEARNER_JOB, index  # learner, chief or master


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
        and parse_host_list(learner_host, "--learner_host") != parsed.learner_hosts
    ):
        raise ValueError(
            f"--learner_host={learner_host!r} contradicts TF_CONFIG's learner "
            f"{','.join(parsed.learner_hosts)!r}; drop --learner_host or unset "
            f"TF_CONFIG"
        )
    if "actor_hosts" in explicit and parse_host_list(actor_hosts) != parsed.actor_hosts:
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
        job, index, task_source = job_name, task, SOURCE_COMMAND_LINE
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
