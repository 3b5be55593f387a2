"""What a cluster's tasks share: the end-of-training protocol's variables
on the learner, the agent's variables made from the trajectory's specs, and
how a task's process ends.

End of training: the learner sets `training_done`, closes the queue, saves
its checkpoint and waits (at most learner_task.TASK_FINISH_WAIT_SECS) until
every actor that is still running has set its entry of `finished_actors`,
and every other learner task that is still running (--num_learners > 1:
they serve the chief's towers) its entry of `finished_learners`. An
actor whose enqueue fails because the queue is closed reads `training_done`:
true means 'learner finished', and the actor exits 0. A learner that dies or
is killed never closes the queue, and one stopped by a signal closes it
without setting `training_done`: the actors see a fault (an unreachable,
restarted or stopping learner), log it, reconnect and carry on once a
learner is back (restored from its checkpoint).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import tensorflow as tf
from absl import logging

import agent as agent_lib
from cluster.spec import ClusterConfig
from runtime.errors import LearnerGoneError

ClusterState = collections.namedtuple(
    "ClusterState", "training_done finished_actors finished_learners run_settings"
)


def create_cluster_state(
    num_actors: int,
    is_learner: bool,
    after: list | None = None,
    num_learners: int = 1,
    settings: str = "",
) -> ClusterState:
    """The learner-side variables of the end-of-training protocol, and the
    chief's settings that every task must agree on.

    training_done: bool [], set by the learner just before it closes the queue.
    finished_actors: int32 [num_actors]; actor i sets entry i to 1 once it has
      seen the end.
    finished_learners: int32 [num_learners]; learner task k > 0 (the ones
      that serve the chief's towers) sets entry k to 1 once it has seen the
      end; entry 0 (the chief's) stays 0.
    run_settings: string [], the chief's `agreeing_settings` as JSON (its
      `settings`; the other tasks read it, `settings_problems`).
    Create them under the learner's device, with the same names in every
    task's graph. In the learner's graph they are local variables (set up at
    every start, never checkpointed); in an actor's graph they are in no
    collection, so an actor neither initialises nor waits for them.
    `after`: ops that initialising `training_done` runs first.
    """
    collections_ = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES] if is_learner else []
    with tf.control_dependencies(after or []):
        done_initial_value = tf.identity(False) if after else False

    def variable(initial_value, name):
        return tf.compat.v1.Variable(
            initial_value,
            trainable=False,
            collections=collections_,
            use_resource=True,
            name=name,
        )

    return ClusterState(
        training_done=variable(done_initial_value, "training_done"),
        finished_actors=variable(tf.zeros([num_actors], tf.int32), "finished_actors"),
        finished_learners=variable(
            tf.zeros([num_learners], tf.int32), "finished_learners"
        ),
        run_settings=variable(tf.constant(settings), "run_settings"),
    )


def confirm_finished_op(entries: tf.Variable, index: int) -> tf.Operation:
    """Sets entry `index` of `entries` (a state's finished_actors or
    finished_learners) to 1: task `index` has seen the end of training."""
    return entries.scatter_update(
        tf.IndexedSlices(tf.constant([1]), tf.constant([index]))
    )


def chief_learner_tasks(state: ClusterState) -> tf.Tensor:
    """int32 []: how many learner tasks the chief runs (its finished_learners
    has one entry each), read to refuse a cluster that disagrees."""
    return tf.size(state.finished_learners.read_value())


def agreeing_settings(config, observation_specs) -> str:
    """What every task of one cluster must have as the chief has it, as JSON
    ({flag: value}): the agent and its frame stack, the levels in their order, the action
    repeats, the unroll length, PopArt's value head, the off-policy
    correction and its thresholds, the replay settings (each learner task
    holds a buffer; the same proportion in every tower's batch) and the
    shapes of the observations (`observation_specs`, the trajectory's)."""
    return json.dumps(
        {
            "agent": config.agent.torso,
            "use_lstm": config.agent.use_lstm,
            "frame_stack": config.agent.frame_stack,
            "level_name": config.environment.level_name,
            "levels": list(config.environment.level_names),
            "num_actions": config.agent.num_actions,
            "num_action_repeats": config.environment.num_action_repeats,
            "unroll_length": config.learner.unroll_length,
            "popart": bool(config.agent.num_values),
            "off_policy_correction": config.learner.off_policy_correction,
            "rho_bar": config.learner.rho_bar,
            "c_bar": config.learner.c_bar,
            "vtrace_lambda": config.learner.vtrace_lambda,
            "replay_proportion": config.learner.replay_proportion,
            "replay_capacity": config.learner.replay_capacity,
            "observations": [
                list(spec.shape[1:]) for spec in tf.nest.flatten(observation_specs)
            ],
        },
        sort_keys=True,
    )


def settings_problems(mine: str, chiefs: bytes | str, learner_host: str) -> list[str]:
    """A line for each setting of this task (`mine`, agreeing_settings)
    that differs from the chief's; [] when they agree (or the chief has
    none: a version before this check)."""
    if isinstance(chiefs, bytes):
        chiefs = chiefs.decode()
    if not chiefs:
        return []
    mine_values, chiefs_values = json.loads(mine), json.loads(chiefs)
    return [
        f"{_what(name, mine_values[name])}: the chief at {learner_host} runs "
        f"{_text(chiefs_values.get(name))}; start every task of the cluster with "
        f"the same settings (the chief's logdir has them as run_flags.cfg)."
        for name in sorted(mine_values)
        if mine_values[name] != chiefs_values.get(name)
    ]


# The agreeing settings that are no flag of their own, as a message names them.
_DERIVED = {
    "levels": "the levels (from --level_name)",
    "num_actions": "the number of actions (from --level_name)",
    "observations": "the observation shapes (the family's flags)",
}


def _what(name: str, value) -> str:
    if name in _DERIVED:
        return f"{_DERIVED[name]} {_text(value)}"
    return f"--{name}={_text(value)}"


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def learner_tasks_problem(chief_runs: int, config: ClusterConfig) -> str | None:
    """The flag error when the chief runs another number of learner tasks
    than this task's --learner_host lists (its unrolls would go to a queue
    no tower reads, or its tower would never run), or None."""
    if chief_runs == config.num_learners:
        return None
    return (
        f"--learner_host lists {config.num_learners} learner task(s) but the "
        f"chief at {config.learner_host} runs {chief_runs}; start every task "
        f"with the chief's --learner_host list and --num_learners={chief_runs}."
    )


def build_agent_variables(agent: agent_lib.Agent, specs) -> None:
    """Creates `agent`'s variables by calling it once on zero inputs.

    `specs` is the ActorOutput nest of tf.TensorSpec (env_outputs [T + 1,
    ...]); the call sees one step with a batch of 1. Its outputs are unused.
    """

    def zeros(spec: tf.TensorSpec) -> tf.Tensor:
        shape = [1, *spec.shape.as_list()[1:]]
        if spec.dtype == tf.string:
            return tf.fill(shape, "")
        return tf.zeros(shape, spec.dtype)

    env_output = tf.nest.map_structure(zeros, specs.env_outputs)
    agent(tf.zeros([1], tf.int32), env_output, agent.initial_state(1))


def exit_cluster_task(code: int) -> None:
    """Ends a learner or actor task's process now, with `code`.

    Everything this task writes (checkpoints, summaries, logs) is closed by
    the time training returns. What is left are threads no Python code can
    stop: tf.train.Server's gRPC server has no shutdown, and a session to a
    peer that is going away may still be closing. Letting the interpreter
    tear down around them now and then ends in SIGABRT (exit 134) instead of
    the code the task earned, so skip the teardown.
    """
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_learner_lost(
    lost_since: float | None,
    bound_secs: float,
    who: str,
    learner: str,
    learner_host: str,
    ending: str = "exiting",
) -> None:
    """LearnerGoneError once a task that had the learner (`who`: 'actor task
    1') has been without it since `lost_since` (time.monotonic()) for longer
    than `bound_secs` (--learner_lost_secs); nothing while it has it
    (`lost_since` None). `learner` names what it lost ('learner', 'chief
    learner') at `learner_host`; `ending` closes the line."""
    if lost_since is None:
        return
    waited = time.monotonic() - lost_since
    if waited > bound_secs:
        raise LearnerGoneError(
            f"{who}: no {learner} at {learner_host} for {waited:.0f} s after it "
            f"was last reached (--learner_lost_secs={bound_secs:g}); {ending}."
        )
