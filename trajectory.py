"""What an actor sends and the learner reads: one unroll, as `ActorOutput`.

An actor enqueues one ActorOutput per unroll (batch-major, one per
environment: `level_name` [], `agent_state` the agent's core state before the
first step, `env_outputs` and `agent_outputs` [T + 1, ...], `policy_frames` []
the learner's frame count (its global step) when the actor read the
parameters it acted with, from which the learner measures the policy lag); the learner
dequeues `batch_size` of them and makes them time-major ([T + 1, B, ...]).
With several learners, actor j's unrolls go to learner `learner_of(j, N)`.
Both sides import this module and nothing of each other.
"""

from __future__ import annotations

import collections

import tensorflow as tf

ActorOutput = collections.namedtuple(
    "ActorOutput", "level_name agent_state env_outputs agent_outputs policy_frames"
)


def learner_of(actor: int, num_learners: int) -> int:
    """The learner (its queue, its tower) that actor `actor` feeds: round
    robin, so each of N learners gets every N-th actor."""
    return actor % num_learners


def swap_leading_axes(t: tf.Tensor) -> tf.Tensor:
    """[A, B, ...] -> [B, A, ...] (time-major <-> batch-major; A static).

    Unstacked and restacked rather than transposed: oneDNN has no uint8
    transpose and logs an error for the frames.
    """
    return tf.stack(tf.unstack(t, axis=0), axis=1)


def stack_unrolls(unrolls: list[ActorOutput]) -> ActorOutput:
    """B ActorOutputs -> one batch: level_name and policy_frames [B],
    agent_state [B, ...], env_outputs and agent_outputs time-major
    [T + 1, B, ...]: the learner's
    batch made by hand (tests, the learner benchmark), where the learner
    itself dequeues B unrolls at once.

    Stacking on axis 1 builds the time-major batch directly, without a
    transpose (oneDNN has no uint8 transpose and logs an error for it).
    """

    def stack(nests, axis):
        return tf.nest.map_structure(lambda *t: tf.stack(t, axis=axis), *nests)

    return ActorOutput(
        level_name=tf.stack([u.level_name for u in unrolls]),
        agent_state=stack([u.agent_state for u in unrolls], axis=0),
        env_outputs=stack([u.env_outputs for u in unrolls], axis=1),
        agent_outputs=stack([u.agent_outputs for u in unrolls], axis=1),
        policy_frames=tf.stack([u.policy_frames for u in unrolls]),
    )
