"""Devices and sessions: where the learner runs and how its session is made."""

from __future__ import annotations

import contextlib
import os
import threading

import tensorflow as tf
from absl import logging

from runtime import checkpoints

# Seconds between TensorBoard summaries of the learner's graph.
SUMMARY_SECS = 30


def num_gpus() -> int:
    """The GPUs TensorFlow sees on this machine."""
    return len(tf.config.list_physical_devices("GPU"))


def learner_device() -> str:
    """'/gpu:0' when TensorFlow sees a GPU, else '/cpu:0' (and says which)."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        logging.info(
            "Learner and batched inference on /gpu:0 (%s; %d GPU(s) visible, "
            "memory growth on).",
            gpus[0].name,
            len(gpus),
        )
        return "/gpu:0"
    logging.info("No GPU visible: learner and inference on the CPU.")
    return "/cpu:0"


def learner_devices(num_learners: int) -> list[str]:
    """The learners' devices on one machine: learner_device() for one; for
    N > 1 a GPU each, /gpu:0 .. /gpu:N-1 (experiment.py has checked there are
    N; config.learners_problem). The variables and the optimiser's slots
    live on the first (learner/pipeline.py builds the update there): that
    tower reads them with no copy, each other one copies them once per
    update, and each tower's gradients cross once to be added there."""
    if num_learners == 1:
        return [learner_device()]
    logging.info(
        "%d learners: towers on /gpu:0 .. /gpu:%d.", num_learners, num_learners - 1
    )
    return [f"/gpu:{i}" for i in range(num_learners)]


def session_config(
    single_machine_training: bool = False, num_environments: int = 0
) -> tf.compat.v1.ConfigProto:
    """The sessions' ConfigProto.

    Single-machine training runs each kernel on one thread unless
    TF_NUM_INTRAOP_THREADS says otherwise. `num_environments`: how many
    environment processes the session's actors step; the inter-op pool gets
    a thread for each on top of one per core.
    """
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if single_machine_training and "TF_NUM_INTRAOP_THREADS" not in os.environ:
        # The actors' many small kernels (one-step inference on batches of
        # 1-8) run faster on one thread each, and the actors and the learner
        # keep all cores busy between them: splitting every kernel over the
        # intra-op pool cost more than it saved (BENCHMARKS.md, "Figures from the code").
        config.intra_op_parallelism_threads = 1
    if num_environments and "TF_NUM_INTEROP_THREADS" not in os.environ:
        # An environment step is a py_func that holds an inter-op thread
        # while it waits for its process to answer. With the default pool
        # (one thread per core) at most that many environments step at a
        # time, and the waiting threads leave none for inference and the
        # learner. A waiting thread costs no CPU.
        config.inter_op_parallelism_threads = (os.cpu_count() or 1) + num_environments
    # Take GPU memory as needed rather than all of it up front.
    config.gpu_options.allow_growth = True
    return config


def create_training_session(
    hooks: list,
    logdir: str,
    save_checkpoint_secs: int,
    master: str = "",
    is_chief: bool = True,
    config: tf.compat.v1.ConfigProto | None = None,
) -> tf.compat.v1.train.MonitoredSession:
    """A MonitoredTrainingSession: restores/initialises, checkpoints, summaries.

    master='' is an in-process session (no server, no port) with the
    single-machine session_config; a distributed learner passes its server's
    target and `config` (its device filters). Checkpoints every
    `save_checkpoint_secs`, at the start and at the end (the saver hook's
    `end`), with `checkpoints.checkpoint_saver()` (each file written
    atomically).
    """
    return tf.compat.v1.train.MonitoredTrainingSession(
        master=master,
        is_chief=is_chief,
        checkpoint_dir=logdir,
        scaffold=tf.compat.v1.train.Scaffold(saver=checkpoints.checkpoint_saver()),
        save_checkpoint_secs=save_checkpoint_secs,
        save_summaries_secs=SUMMARY_SECS,
        log_step_count_steps=0,  # progress.ProgressLogger reports speed instead.
        # Not graph.pbtxt nor a .meta file beside each checkpoint: nothing
        # reads them (test mode and a resume build the graph from the code),
        # and writing the learner's graph as text took seconds at every
        # start. TensorBoard's graph tab still gets it (GraphForTensorBoard).
        save_graph_def=False,
        hooks=hooks,
        chief_only_hooks=[GraphForTensorBoard(logdir)],
        config=config if config is not None else session_config(True),
    )


class GraphForTensorBoard(tf.compat.v1.train.SessionRunHook):
    """Adds the finished graph to the run's events file (TensorBoard's graph tab)."""

    def __init__(self, logdir: str):
        self._logdir = logdir

    def after_create_session(self, session, coord) -> None:
        writer = tf.compat.v1.summary.FileWriterCache.get(self._logdir)
        writer.add_graph(session.graph)


_pinning = threading.local()


@contextlib.contextmanager
def variables_on(device: str):
    """Creates every variable made inside on `device`, whatever the op devices.

    Sonnet 2 modules create their variables on their first call, under the
    device scope of that call; the creator scope pins them (and RMSProp's
    slots, which are colocated with them) to `device`. Nested, the innermost
    scope decides (a tower's replay buffer on its own task, inside the scope
    that pins the agent's variables to the chief).
    """

    def creator(next_creator, **kwargs):
        # The innermost scope's creator runs first and the outer ones inside
        # it: each would set its own device last and win, so only the first
        # (innermost) one sets it.
        if getattr(_pinning, "active", False):
            return next_creator(**kwargs)
        _pinning.active = True
        try:
            with tf.device(device):
                return next_creator(**kwargs)
        finally:
            _pinning.active = False

    with tf.compat.v1.variable_creator_scope(creator):
        yield
