"""The learner's input pipeline: the queue, the time-major batch, staging.

Actors enqueue one ActorOutput per unroll into a FIFOQueue of capacity 1
(an actor blocks until the learner takes its unroll, which bounds the policy
lag). The learner dequeues `batch_size` unrolls at once, makes them
time-major (`[T + 1, B, ...]`), stages them on its device (one more step of
lag, no wait for the copy) and trains on them (update.py). The training
loop around it is loop.py.
"""

from __future__ import annotations

import collections

import tensorflow as tf

import agent as agent_lib
from config import LearnerConfig
from learner.update import build_learner
from trajectory import ActorOutput, swap_leading_axes

LearnerPipeline = collections.namedtuple(
    "LearnerPipeline", "batch learner stage_op queue_size"
)


def create_queue(specs, capacity: int = 1) -> tf.queue.FIFOQueue:
    """The queue of ActorOutputs between actors and learner.

    Capacity 1: an actor blocks until the learner takes its unroll, which
    bounds the policy lag. shared_name lets other tasks of a cluster find it.
    """
    flat_specs = tf.nest.flatten(specs)
    return tf.queue.FIFOQueue(
        capacity,
        [s.dtype for s in flat_specs],
        [s.shape for s in flat_specs],
        shared_name="buffer",
    )


def _staging_area(flat_tensors):
    from tensorflow.python.ops import data_flow_ops

    return data_flow_ops.StagingArea(
        [t.dtype for t in flat_tensors], [t.shape for t in flat_tensors]
    )


def build_learner_pipeline(
    agent: agent_lib.Agent,
    queue: tf.queue.FIFOQueue,
    specs,
    config: LearnerConfig,
    device: str,
) -> LearnerPipeline:
    """Dequeue batch_size unrolls, stack them time-major, stage them, learn.

    The staging area holds the next batch (already on `device`) while the
    current one trains: one more step of policy lag, no wait for the copy.
    Run `stage_op` once before the first training step.
    """
    # One dequeue_many takes batch_size unrolls as the actors deliver them
    # (the queue holds fewer); [B, T + 1, ...] -> time-major.
    dequeued = time_major(
        tf.nest.pack_sequence_as(specs, queue.dequeue_many(config.batch_size))
    )
    with tf.device(device):
        flat = tf.nest.flatten(dequeued)
        area = _staging_area(flat)
        stage_op = area.put(flat)
        batch = tf.nest.pack_sequence_as(specs, area.get())
        learner = build_learner(
            agent,
            batch.agent_state,
            batch.env_outputs,
            batch.agent_outputs,
            config,
            batch.level_name,
        )
    return LearnerPipeline(
        batch=batch, learner=learner, stage_op=stage_op, queue_size=queue.size()
    )


def time_major(batch: ActorOutput) -> ActorOutput:
    """A batch-major batch (dequeue_many: every tensor [B, ...]) -> the
    learner's layout: env_outputs and agent_outputs [T + 1, B, ...];
    level_name [B] and agent_state [B, ...] stay batch-major.

    B must be static (actors.swap_leading_axes).
    """
    return batch._replace(
        env_outputs=tf.nest.map_structure(swap_leading_axes, batch.env_outputs),
        agent_outputs=tf.nest.map_structure(swap_leading_axes, batch.agent_outputs),
    )
