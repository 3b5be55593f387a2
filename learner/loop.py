"""The learner's loop: its training session, shared by the single-machine
learner and a cluster's learner task.

`train_learner` resumes from the newest whole checkpoint, runs learner steps
(pipeline.py's batch, loss.py's loss and update.py's update) to the frame target,
logs episodes and progress, and checkpoints; `run_learner` is the loop
itself; `raise_if_non_finite` turns the NaN guard's failed step into a
NonFiniteUpdateError.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Protocol

import tensorflow as tf
from absl import logging

from config import Config
from learner import progress
from learner.nan_guard import NON_FINITE_MARKER, non_finite_update
from learner.pipeline import FreshStagingHook, LearnerPipeline
from runtime import checkpoints, sessions
from runtime.errors import EnvironmentFailedError, NonFiniteUpdateError

# How a learner's training session ended: the frame count, the episodes it
# logged, whether it reached --total_environment_frames, the seconds it took,
# the returns of its last (up to 100) episodes and its mean policy lags
# (fresh, replayed or None; progress.PolicyLagMeter.means).
LearnerResult = collections.namedtuple(
    "LearnerResult",
    "num_env_frames num_episodes finished seconds recent_returns policy_lag",
)


class Evolver(Protocol):
    """What changes a running learner from outside its loop: Population Based
    Training's member (pbt/member.py). `build` runs in the training graph
    before the session; the session's get the raw tf.Session and the
    learner's MutableHyperparameters; `finish` runs after the final
    checkpoint."""

    def build(self) -> None: ...

    def after_create_session(self, session, hyperparameters) -> None: ...

    def after_step(
        self, session, num_env_frames: int, episodes: list, hyperparameters
    ) -> None: ...

    def finish(self, num_env_frames: int) -> None: ...


class _EvolverHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, evolver: Evolver, hyperparameters):
        self._evolver, self._hyperparameters = evolver, hyperparameters

    def after_create_session(self, session, coord):
        del coord
        self._evolver.after_create_session(session, self._hyperparameters)


def _evolve(evolver, num_env_frames, finished, hyperparameters, step_context):
    """The evolver's step, on the raw session (no hooks run)."""
    evolver.after_step(step_context.session, num_env_frames, finished, hyperparameters)


def run_learner(
    session,
    pipeline: LearnerPipeline,
    total_environment_frames: int,
    episodes: progress.EpisodeLogger,
    progress_logger: progress.ProgressLogger,
    shutdown,
    logdir: str,
    evolver: Evolver | None = None,
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
        learner.level_name,
        learner.train_and_count,
        learner.done,
        learner.info,
        pipeline.queue_size,
        learner.policy_lag,
        pipeline.stage_op,
    )
    # SIGINT/SIGTERM end the loop after the current step (a clean exit saves
    # a final checkpoint); see shutdown.ShutdownRequest.
    while not shutdown.requested:
        try:
            if session.should_stop():
                break
            levels, num_env_frames, done, info, queue_size, lag, _ = session.run(
                fetches
            )
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
        finished = episodes.log(levels, done, info, num_env_frames)
        if evolver is not None:
            session.run_step_fn(
                functools.partial(
                    _evolve, evolver, num_env_frames, finished, learner.hyperparameters
                )
            )
        progress_logger.step(
            num_env_frames, episodes.recent_returns, queue_size, policy_lag=lag
        )
        if num_env_frames >= total_environment_frames:
            break
    return num_env_frames


def raise_if_non_finite(error: tf.errors.OpError, logdir: str) -> None:
    """Raises NonFiniteUpdateError when `error` is learner.guard_finite_update's."""
    update = non_finite_update(error)
    if update is None:
        return
    latest = tf.train.latest_checkpoint(logdir)
    kept = (
        f"the last checkpoint, {latest}, holds the last good parameters"
        if latest
        else "no checkpoint had been written yet"
    )
    raise NonFiniteUpdateError(
        f"{NON_FINITE_MARKER} in the learner step at "
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
    evolver: Evolver | None = None,
) -> LearnerResult:
    """The learner's training session, from resume to the final checkpoint.

    Picks the checkpoint to resume from (checkpoints.resume_checkpoint),
    opens the MonitoredTrainingSession with `hooks` (master '' = in-process),
    trains to the frame target with episode and progress logging, and calls
    `at_target(session, num_env_frames)` inside the session when the target
    is reached. Leaving the session saves the final checkpoint. `evolver`:
    a PBT member, which sets the learner's hyperparameters after each new
    session and may change them, and its weights, after any step.
    """
    run, environment = config.run, config.environment
    started = time.monotonic()
    summary_writer = tf.compat.v1.summary.FileWriterCache.get(run.logdir)
    episodes = progress.EpisodeLogger(
        summary_writer,
        environment.level_name,
        list(environment.level_names),
        environment.num_action_repeats,
    )
    total = config.learner.total_environment_frames
    progress_logger = progress.ProgressLogger(
        summary_writer, total, interval_secs=run.progress_secs
    )
    # The newest checkpoint that restores (older ones if it is damaged).
    checkpoints.resume_checkpoint(run.logdir, config.describe_model())
    if evolver is not None:
        evolver.build()
        hooks = [*hooks, _EvolverHook(evolver, pipeline.learner.hyperparameters)]
    with sessions.create_training_session(
        [*hooks, FreshStagingHook(pipeline.clear_staging_op)],
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
            session,
            pipeline,
            total,
            episodes,
            progress_logger,
            shutdown,
            run.logdir,
            evolver,
        )
        finished = num_env_frames >= total
        if finished and at_target is not None:
            at_target(session, num_env_frames)
    summary_writer.flush()
    if evolver is not None:  # after the final checkpoint
        evolver.finish(num_env_frames)
    return LearnerResult(
        num_env_frames,
        episodes.num_episodes,
        finished,
        time.monotonic() - started,
        list(episodes.recent_returns),
        progress_logger.policy_lag.means(),
    )
