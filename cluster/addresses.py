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
    parse_host_list,
    validate,
)
from cluster.spec import (
    ACTOR_JOB,
    LEARNER_JOB,
    SOURCE_COMMAND_LINE,
    SOURCE_TF_CONFIG,
    SOURCE_TF_CONFIG_TFJOB,
    ClusterConfig,
)

# TF_CONFIG job-name spellings: ours, and Kubeflow TFJob's chief/worker.
_TF_CONFIG_NAMINGS = (
    {"learner": LEARNER_JOB, "actor": ACTOR_JOB},
    {"chief": LEARNER_JOB, "worker": ACTOR_JOB},
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
        SOURCE_TF_CONFIG if "learner" in names else SOURCE_TF_CONFIG_TFJOB,
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
