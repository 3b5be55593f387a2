"""What a cluster's tasks share: the end-of-training protocol's variables
on the learner, the agent's variables made from the trajectory's specs, and
how a task's process ends.

End of training: the learner sets `training_done`, closes the queue, saves
its checkpoint and waits (at most learner_task.ACTOR_FINISH_WAIT_SECS) until
every actor that is still running has set its entry of `finished_actors`. An
actor whose enqueue fails because the queue is closed reads `training_done`:
true means 'learner finished', and the actor exits 0. A learner that dies or
is killed never closes the queue, and one stopped by a signal closes it
without setting `training_done`: the actors see a fault (an unreachable,
restarted or stopping learner), log it, reconnect and carry on once a
learner is back (restored from its checkpoint).
"""

from __future__ import annotations

import collections
import os
import sys

import tensorflow as tf
from absl import logging

import agent as agent_lib

ClusterState = collections.namedtuple("ClusterState", "training_done finished_actors")


def create_cluster_state(
    num_actors: int, is_learner: bool, after: list | None = None
) -> ClusterState:
    """The learner-side variables of the end-of-training protocol.

    training_done: bool [], set by the learner just before it closes the queue.
    finished_actors: int32 [num_actors]; actor i sets entry i to 1 once it has
      seen the end.
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
