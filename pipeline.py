"""The learner's input pipeline and its training loop.

Actors enqueue one ActorOutput per unroll into a FIFOQueue of capacity 1
(an actor blocks until the learner takes its unroll, which bounds the policy
lag). The learner dequeues `batch_size` unrolls at once, makes them
time-major (`[T + 1, B, ...]`), stages them on its device (one more step of
lag, no wait for the copy) and trains on them (learner.py).
`train_learner` is the training session around that, shared by the
single-machine learner and a cluster's learner task: resume, train to the
frame target, log, checkpoint.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
from absl import logging

import agent as agent_lib
import checkpoints
import learner as learner_lib
import progress
import sessions
from actors import ActorOutput, swap_leading_axes
from config import Config, LearnerConfig
from errors import EnvironmentFailedError, NonFiniteUpdateError

LearnerPipeline = collections.namedtuple(
    "LearnerPipeline", "batch learner stage_op queue_size"
)
# How a learner's training session ended: the frame count, the episodes it
# logged, and whether it reached --total_environment_frames.
LearnerResult = collections.namedtuple(
    "LearnerResult", "num_env_frames num_episodes finished"
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
    nan_reward_at_frame: int = 0,
) -> LearnerPipeline:
    """Dequeue batch_size unrolls, stack them time-major, stage them, learn.

    The staging area holds the next batch (already on `device`) while the
    current one trains: one more step of policy lag, no wait for the copy.
    Run `stage_op` once before the first training step.
    `nan_reward_at_frame` > 0 (tests only) feeds NaN rewards from that frame.
    """
    # One dequeue_many takes batch_size unrolls as the actors deliver them
    # (the queue holds fewer); [B, T + 1, ...] -> time-major.
    dequeued = time_major(
        tf.nest.pack_sequence_as(specs, queue.dequeue_many(config.batch_size))
    )
    if nan_reward_at_frame:
        dequeued = testonly_nan_rewards(dequeued, nan_reward_at_frame)
    with tf.device(device):
        flat = tf.nest.flatten(dequeued)
        area = _staging_area(flat)
        stage_op = area.put(flat)
        batch = tf.nest.pack_sequence_as(specs, area.get())
        learner = learner_lib.build_learner(
            agent, batch.agent_state, batch.env_outputs, batch.agent_outputs, config
        )
    return LearnerPipeline(
        batch=batch, learner=learner, stage_op=stage_op, queue_size=queue.size()
    )


def stack_unrolls(unrolls: list[ActorOutput]) -> ActorOutput:
    """B ActorOutputs -> one batch: level_name [B], agent_state [B, ...],
    env_outputs and agent_outputs time-major [T + 1, B, ...].

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


def testonly_nan_rewards(unrolls: ActorOutput, at_frame: int) -> ActorOutput:
    """--testonly_nan_reward_at_frame: NaN rewards in the learner's batches
    from frame `at_frame` on. Real environments never give NaN rewards; this
    lets tests show the NaN guard at work."""
    frames = tf.compat.v1.train.get_or_create_global_step()
    rewards = unrolls.env_outputs.reward
    nan = tf.fill(tf.shape(rewards), tf.constant(np.nan, rewards.dtype))
    rewards = tf.where(frames >= at_frame, nan, rewards)
    return unrolls._replace(env_outputs=unrolls.env_outputs._replace(reward=rewards))


def run_learner(
    session,
    pipeline: LearnerPipeline,
    total_environment_frames: int,
    episodes: progress.EpisodeLogger,
    progress_logger: progress.ProgressLogger,
    shutdown,
    logdir: str,
) -> int:
    """Trains until total_environment_frames; returns the final frame count.

    Stops early, after the current step, when `shutdown` is requested (a
    queue closed meanwhile ends the step waiting for unrolls), when the
    session stops, or when an actor gave up on its environment.

    Raises:
      NonFiniteUpdateError: a step with a NaN/Inf loss or gradient; it was
        not applied and nothing is saved after it.
    """
    # Read the (possibly restored) frame count without running the hooks.
    num_env_frames = int(
        session.run_step_fn(
            lambda step_context: step_context.session.run(
                pipeline.learner.num_env_frames
            )
        )
    )
    if num_env_frames:
        logging.info(
            "Resuming from a checkpoint at %d environment frames.", num_env_frames
        )
    if num_env_frames >= total_environment_frames:
        logging.info(
            "Already trained %d of --total_environment_frames=%d: nothing to do.",
            num_env_frames,
            total_environment_frames,
        )
        return num_env_frames
    # Fill the staging area once; every training step then stages the next
    # batch while it learns from the current one.
    session.run_step_fn(
        lambda step_context: step_context.session.run(pipeline.stage_op)
    )
    learner = pipeline.learner
    fetches = (
        pipeline.batch.level_name,
        learner.train_and_count,
        learner.done,
        learner.info,
        pipeline.queue_size,
        pipeline.stage_op,
    )
    # SIGINT/SIGTERM end the loop after the current step (a clean exit saves
    # a final checkpoint); see shutdown.ShutdownRequest.
    while not shutdown.requested:
        try:
            if session.should_stop():
                break
            levels, num_env_frames, done, info, queue_size, _ = session.run(fetches)
        except EnvironmentFailedError:
            # An actor gave up on its environment. Leave the session normally
            # so that it saves a final checkpoint; closing it re-raises this.
            break
        except tf.errors.OutOfRangeError:
            if not shutdown.requested:
                raise
            # A signal closed the queue while the step waited for unrolls.
            break
        except tf.errors.InvalidArgumentError as e:
            raise_if_non_finite(e, logdir)  # NonFiniteUpdateError: no save.
            raise
        num_env_frames = int(num_env_frames)
        episodes.log(levels, done, info, num_env_frames)
        progress_logger.step(num_env_frames, episodes.recent_returns, queue_size)
        if num_env_frames >= total_environment_frames:
            break
    return num_env_frames


def raise_if_non_finite(error: tf.errors.OpError, logdir: str) -> None:
    """Raises NonFiniteUpdateError when `error` is learner.guard_finite_update's."""
    update = learner_lib.non_finite_update(error)
    if update is None:
        return
    latest = tf.train.latest_checkpoint(logdir)
    kept = (
        f"the last checkpoint, {latest}, holds the last good parameters"
        if latest
        else "no checkpoint had been written yet"
    )
    raise NonFiniteUpdateError(
        f"{learner_lib.NON_FINITE_MARKER} in the learner step at "
        f"{update.num_env_frames} environment frames (total loss "
        f"{update.total_loss}, gradient global norm {update.global_norm}). "
        f"Training stopped before applying this update, and nothing was saved "
        f"after it: {kept}. Find the cause (rewards or observations of the "
        f"environment, --learning_rate, --max_grad_norm), then rerun to resume "
        f"from it."
    ) from None


def train_learner(
    config: Config,
    pipeline: LearnerPipeline,
    hooks: list,
    shutdown,
    master: str = "",
    session_config: tf.compat.v1.ConfigProto | None = None,
    at_target=None,
) -> LearnerResult:
    """The learner's training session, from resume to the final checkpoint.

    Picks the checkpoint to resume from (checkpoints.resume_checkpoint),
    opens the MonitoredTrainingSession with `hooks` (master '' = in-process),
    trains to the frame target with episode and progress logging, and calls
    `at_target(session, num_env_frames)` inside the session when the target
    is reached. Leaving the session saves the final checkpoint.
    """
    run, environment = config.run, config.environment
    summary_writer = tf.compat.v1.summary.FileWriterCache.get(run.logdir)
    episodes = progress.EpisodeLogger(
        summary_writer,
        environment.level_name,
        list(environment.level_names),
        environment.num_action_repeats,
    )
    total = config.learner.total_environment_frames
    progress_logger = progress.ProgressLogger(summary_writer, total)
    # The newest checkpoint that restores (older ones if it is damaged).
    checkpoints.resume_checkpoint(run.logdir, config.describe_model())
    with sessions.create_training_session(
        hooks,
        run.logdir,
        run.save_checkpoint_secs,
        master=master,
        is_chief=True,
        config=session_config,
    ) as session:
        logging.info(
            "Learner ready: training starts once %d unroll(s) are queued.",
            config.learner.batch_size,
        )
        num_env_frames = run_learner(
            session, pipeline, total, episodes, progress_logger, shutdown, run.logdir
        )
        finished = num_env_frames >= total
        if finished and at_target is not None:
            at_target(session, num_env_frames)
    summary_writer.flush()
    return LearnerResult(num_env_frames, episodes.num_episodes, finished)
