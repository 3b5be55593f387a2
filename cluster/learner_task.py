"""The learner task of a cluster (`--job_name=learner --task=0`).

Every task runs experiment.py with --job_name and --task; the addresses come
from addresses.py. The model, loss, checkpoints and logs are those of
single-machine training (learner/loop.py's `train_learner`); what differs is
where things live and how the tasks find each other and end (state.py).

Layout (`--job_name`, `--task`, addresses from addresses.resolve_cluster):
  /job:learner/task:0  the queue, the global variables (on its CPU), the
                       training step; the only task that writes to --logdir.
  /job:actor/task:i    actor_task.py.
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import tensorflow as tf
from absl import logging

import agent as agent_lib
from actor.unroll import actor_output_specs
from cluster import addresses
from cluster.state import create_cluster_state
from config import Config
from learner import loop, pipeline, progress
from runtime import sessions
from runtime.shutdown import ShutdownRequest

# At the end of training, how long the learner waits for the live actors to
# see the closed queue before it exits anyway.
ACTOR_FINISH_WAIT_SECS = 30

LearnerTaskOps = collections.namedtuple(
    "LearnerTaskOps", "pipeline end_training close_queue finished_actors"
)


def build_learner_task(
    cluster_config: addresses.ClusterConfig, specs, config: Config
) -> LearnerTaskOps:
    """The learner task's graph (call inside a fresh graph).

    Everything on /job:learner/task:0: the queue, the training pipeline (on
    its GPU when it has one) and every variable, pinned to its CPU.
    """
    task_device = addresses.learner_device()
    with tf.device(task_device), sessions.variables_on(f"{task_device}/cpu:0"):
        agent = agent_lib.create_agent(config.agent)
        queue = pipeline.create_queue(specs)
        learner_pipeline = pipeline.build_learner_pipeline(
            agent,
            [queue],
            specs,
            config.learner,
            [sessions.learner_device()],
        )
        # The learner's local init creates the queue (with its shapes) before
        # setting `training_done`, which actors wait for: so an actor with
        # other shapes gets an error, instead of creating the queue first.
        state = create_cluster_state(
            cluster_config.num_actors, is_learner=True, after=[queue.size()]
        )
        with tf.control_dependencies([state.training_done.assign(True)]):
            end_training = queue.close(cancel_pending_enqueues=True)
        return LearnerTaskOps(
            pipeline=learner_pipeline,
            end_training=end_training,
            close_queue=queue.close(cancel_pending_enqueues=True),
            finished_actors=state.finished_actors.read_value(),
        )


def run(
    config: Config,
    cluster_config: addresses.ClusterConfig,
    server,
    proto: tf.compat.v1.ConfigProto,
    shutdown: ShutdownRequest,
) -> None:
    """The learner task: trains on the unrolls the actor tasks enqueue.

    The model, loss, checkpoints and logs are those of single-machine
    training; the queue, the variables (on this task's CPU) and the training
    step live on /job:learner/task:0, and the actors are other processes.
    Training starts as soon as batch_size unrolls are queued. At the frame
    target the learner ends training for the actors too (see the protocol
    above); when it stops before (a signal, an error, a kill) it does not set
    `training_done`, so the actors wait for it to come back.
    """
    environment = config.environment
    specs = actor_output_specs(environment, config.agent, config.learner.unroll_length)
    logging.info(
        "Learner task at %s: training %s.",
        cluster_config.address,
        config.summary(num_actors=cluster_config.num_actors),
    )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(config.run.seed)
        ops = build_learner_task(cluster_config, specs, config)

        def end_training(session, num_env_frames: int) -> None:
            session.run_step_fn(
                lambda step_context: step_context.session.run(ops.end_training)
            )
            logging.info(
                "Reached %d environment frames: queue closed, actors told to finish.",
                num_env_frames,
            )

        result = loop.train_learner(
            config,
            ops.pipeline,
            [CloseQueueOnShutdownHook(ops.close_queue, shutdown)],
            shutdown,
            master=server.target,
            session_config=proto,
            at_target=end_training,
        )
        # The session saved the final checkpoint on closing; the server (and
        # the variables on it) lives on until this process exits.
        if result.finished:
            with tf.compat.v1.Session(server.target, config=proto) as plain_session:
                wait_for_actors_to_finish(
                    plain_session, ops.finished_actors, cluster_config
                )
    if not result.finished:
        if shutdown.requested:
            shutdown.log_stop(result.num_env_frames, config.run.logdir)
        logging.info(
            "Learner stopped at %d environment frames, before the target: the "
            "actors wait for a learner to come back.",
            result.num_env_frames,
        )
        return
    logging.info(
        progress.done_line(result, config.run.logdir, config.environment.level_name)
    )


class CloseQueueOnShutdownHook(tf.compat.v1.train.SessionRunHook):
    """On SIGINT/SIGTERM, closes the learner's queue (without `training_done`).

    A learner step waiting for unrolls (when the actors are gone or stopping
    too) then fails at once instead of blocking, and the learner still saves
    its final checkpoint. The actors take the closed queue without
    `training_done` for a learner that went away, and wait for it.
    """

    def __init__(self, close_op: tf.Operation, shutdown: ShutdownRequest):
        self._close_op = close_op
        self._shutdown = shutdown
        self._ended = threading.Event()

    def after_create_session(self, session, coord) -> None:
        del coord
        threading.Thread(
            target=self._watch, args=(session,), name="close-on-shutdown", daemon=True
        ).start()

    def _watch(self, session) -> None:
        while not self._ended.wait(0.2):
            if self._shutdown.requested:
                try:
                    session.run(self._close_op)
                except Exception as e:  # noqa: BLE001 - the session may be closing
                    logging.debug("Closing the queue: %s", e)
                return

    def end(self, session) -> None:
        del session
        self._ended.set()


def wait_for_actors_to_finish(
    session,
    finished_actors: tf.Tensor,
    config: addresses.ClusterConfig,
    timeout_secs: float = ACTOR_FINISH_WAIT_SECS,
) -> list[int]:
    """Waits until every actor saw the end or is gone; returns those that did not.

    An actor is gone when nothing listens on its address any more (killed,
    crashed). One that is still running gets `timeout_secs` to finish its
    unroll, find the queue closed and confirm; without this wait it could find
    no learner instead and wait for one forever.
    """
    deadline = time.monotonic() + timeout_secs
    while True:
        confirmed = session.run(finished_actors)
        waiting = [
            i
            for i, host in enumerate(config.actor_hosts)
            if not confirmed[i] and addresses.reachable(host)
        ]
        if not waiting:
            logging.info(
                "%d of %d actor task(s) confirmed the end of training; the "
                "others are not running.",
                int(np.count_nonzero(confirmed)),
                config.num_actors,
            )
            return []
        if time.monotonic() >= deadline:
            logging.warning(
                "Actor task(s) %s still running but did not confirm the end of "
                "training within %d s; exiting anyway.",
                ", ".join(map(str, waiting)),
                timeout_secs,
            )
            return waiting
        time.sleep(0.5)
