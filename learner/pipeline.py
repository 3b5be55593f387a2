"""The learner's input pipeline: the queue, the time-major batch, staging.

Actors enqueue one ActorOutput per unroll into a FIFOQueue of capacity 1
(an actor blocks until the learner takes its unroll, which bounds the policy
lag). The learner dequeues `batch_size` unrolls at once (fewer with replay,
replay.py, which adds the rest from its buffer), makes them
time-major (`[T + 1, B, ...]`), stages them on its device (one more step of
lag, no wait for the copy) and trains on them (update.py). The training
loop around it is loop.py.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Sequence

import tensorflow as tf

import agent as agent_lib
from config import LearnerConfig
from learner import replay
from learner.update import build_learner, cpu_of
from runtime import sessions
from trajectory import ActorOutput, swap_leading_axes

LearnerPipeline = collections.namedtuple(
    "LearnerPipeline",
    "batch learner stage_op clear_staging_op queue_size replay_sizes",
)


class FreshStagingHook(tf.compat.v1.train.SessionRunHook):
    """Empties every staging area each time the session is created.

    A staging area lives on its tower's server and outlives a session: when
    the chief restarts, a learner task's area still holds the batch staged
    for the chief's last step, and when a learner task restarts, the
    chief's own area does. The first stage after the new session would add
    a second batch behind it, and that tower would train from then on one
    batch further behind its policy than the others. Emptied, every tower's
    next step trains on unrolls dequeued after the restart (the step that
    stages also waits for them).
    """

    def __init__(self, clear_staging_op):
        self._clear = clear_staging_op

    def after_create_session(self, session, coord):
        del coord
        session.run(self._clear)


def queue_name(learner: int) -> str:
    """The shared name of learner `learner`'s queue, by which the tasks of a
    cluster find it ('buffer' for the first: a single learner's is today's)."""
    return "buffer" if learner == 0 else f"buffer_{learner}"


def create_queue(specs, capacity: int = 1, learner: int = 0) -> tf.queue.FIFOQueue:
    """The queue of ActorOutputs between actors and learner `learner` (its
    tower: actor j feeds learner j mod N, actor/runner.py).

    Capacity 1: an actor blocks until the learner takes its unroll, which
    bounds the policy lag. shared_name lets other tasks of a cluster find it.
    """
    flat_specs = tf.nest.flatten(specs)
    return tf.queue.FIFOQueue(
        capacity,
        [s.dtype for s in flat_specs],
        [s.shape for s in flat_specs],
        shared_name=queue_name(learner),
        name=None if learner == 0 else f"queue_{learner}",
    )


def _staging_area(flat_tensors):
    from tensorflow.python.ops import data_flow_ops

    return data_flow_ops.StagingArea(
        [t.dtype for t in flat_tensors], [t.shape for t in flat_tensors]
    )


def build_learner_pipeline(
    agent: agent_lib.Agent,
    queues: Sequence[tf.queue.FIFOQueue],
    specs,
    config: LearnerConfig,
    devices: Sequence[str],
) -> LearnerPipeline:
    """For each learner (tower) i: dequeue batch_size unrolls from queues[i],
    stack them time-major, stage them on devices[i]; then one update from all
    towers (update.build_learner).

    Each staging area holds the next batch (already on its device) while the
    current one trains: one more step of policy lag, no wait for the copy.
    Run `stage_op` once before the first training step. `batch` is the towers'
    batches side by side ([T + 1, N * B, ...]; level_name [N * B]);
    `queue_size`: the queue's size, or [N] sizes with several learners.

    With replay (config.num_replayed R > 0) each tower's batch is its
    B - R fresh unrolls followed by R replayed from its buffer (replay.py),
    which lives on the CPU of the tower's task; `replay_sizes`: each
    buffer's size ([] without replay).
    """
    batches, stage_ops, clear_ops, buffers = [], [], [], []
    for queue, device in zip(queues, devices, strict=True):
        # One dequeue_many takes the batch's fresh unrolls as the actors
        # deliver them (the queue holds fewer); [B, T + 1, ...] -> time-major.
        # Several learners: on the tower's device, where its queue is, so
        # that the batch never leaves its learner task.
        with contextlib.nullcontext() if len(queues) == 1 else tf.device(device):
            fresh = tf.nest.pack_sequence_as(
                specs, queue.dequeue_many(config.num_fresh)
            )
            if config.num_replayed:
                # Replay: this tower's buffer in its task's host memory.
                cpu = cpu_of(device)
                with tf.device(cpu), sessions.variables_on(cpu):
                    buffer = replay.ReplayBuffer(specs, config.replay_capacity)
                    replayed = buffer.insert_then_sample(fresh, config.num_replayed)
                    fresh = tf.nest.map_structure(
                        lambda f, r: tf.concat([f, r], axis=0), fresh, replayed
                    )
                buffers.append(buffer)
            dequeued = time_major(fresh)
        with tf.device(device):
            flat = tf.nest.flatten(dequeued)
            area = _staging_area(flat)
            stage_ops.append(area.put(flat))
            clear_ops.append(area.clear())
            batches.append(tf.nest.pack_sequence_as(specs, area.get()))
    with tf.device(devices[0]):
        learner = build_learner(
            agent, batches, config, None if len(devices) == 1 else devices
        )
    if len(batches) == 1:
        batch, stage_op = batches[0], stage_ops[0]
    else:
        for i, queue in enumerate(queues):
            tf.compat.v1.summary.scalar(f"queue_size/learner_{i}", queue.size())
        batch = ActorOutput(
            level_name=tf.concat([b.level_name for b in batches], axis=0),
            agent_state=None,
            env_outputs=None,
            agent_outputs=None,
            policy_frames=None,
        )
        stage_op = tf.group(stage_ops)
    return LearnerPipeline(
        batch=batch,
        learner=learner,
        stage_op=stage_op,
        clear_staging_op=tf.group(clear_ops),
        queue_size=queues[0].size()
        if len(queues) == 1
        else tf.stack([q.size() for q in queues]),
        replay_sizes=[b.size() for b in buffers],
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
