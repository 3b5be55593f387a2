"""The cluster's description: its jobs, where each task listens, which task
this process is, and the devices the tasks see (TensorFlow-free).

A distributed run has one learner task (or --num_learners of them) and N
actor tasks, as TensorFlow jobs `learner` (tasks 0..L-1) and `actor` (tasks
0..N-1). The global variables live on /job:learner/task:0 (the chief), each
learner task's queue on that task; each actor runs its unroll on its own task
and talks only to the chief and the learner task it feeds. Where the
addresses come from is addresses.py; how they are parsed, hosts.py.
"""

from __future__ import annotations

from typing import NamedTuple

LEARNER_JOB = "learner"
ACTOR_JOB = "actor"
JOB_NAMES = (LEARNER_JOB, ACTOR_JOB)

# ClusterConfig.source values: where the addresses came from.
SOURCE_COMMAND_LINE = "flags"
SOURCE_TF_CONFIG = "TF_CONFIG"  # Jobs named learner/actor.
# Kubeflow TFJob's replica types: Chief (or Master) and PS are the learner
# tasks, Worker the actor tasks (cluster/addresses.py).
SOURCE_TF_CONFIG_TFJOB = "TF_CONFIG chief/worker"
SOURCE_TF_CONFIG_TFJOB_MASTER = "TF_CONFIG master/worker"


def from_tf_config(source: str) -> bool:
    return source.startswith(SOURCE_TF_CONFIG)


class ClusterConfig(NamedTuple):
    """Where every task of the cluster listens, and which task this process is.

    learner_host: 'HOST:PORT' of /job:learner/task:0.
    actor_hosts: tuple of 'HOST:PORT', actor task i at index i.
    job_name: 'learner' or 'actor' (this process).
    task: this process's task index in its job.
    source: where the addresses came from, to name the right setting in
      error messages: 'flags', 'TF_CONFIG', or a TFJob's 'TF_CONFIG
      chief/worker' or 'TF_CONFIG master/worker'.
    """

    learner_host: str
    actor_hosts: tuple[str, ...]
    job_name: str
    task: int
    source: str = SOURCE_COMMAND_LINE
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


def learner_task_device(task: int = 0) -> str:
    """A learner task's device; task 0's holds the global variables (and, as
    every learner task's, its own queue)."""
    return f"/job:{LEARNER_JOB}/task:{task}"


def actor_device(task: int) -> str:
    return f"/job:{ACTOR_JOB}/task:{task}"


def device_filters(config: ClusterConfig) -> list[str]:
    """Devices a task's sessions may see.

    The chief (learner task 0) needs the learner tasks, whose towers and
    queues its graph uses (actors connect to it, never the reverse), so it
    neither waits for nor depends on actors. Another learner task needs the
    chief and itself. An actor needs the chief (the variables), the learner
    task whose queue it feeds and itself, never the other actors.
    """
    learners = [learner_task_device(i) for i in range(config.num_learners)]
    if config.is_chief:
        return learners
    if config.is_learner:
        return [learner_task_device(), learner_task_device(config.task)]
    feeds = config.feeds_learner
    return [
        learner_task_device(),
        *([learner_task_device(feeds)] if feeds else []),
        actor_device(config.task),
    ]
