"""Distributed training: the learner task and the actor tasks of a cluster.

Every task runs experiment.py with --job_name and --task; the addresses come
from cluster.py. The model, loss, checkpoints and logs are those of
single-machine training (learner_loop.train_learner); what differs is where
things live and how the tasks find each other and end.

Layout (`--job_name`, `--task`, addresses from cluster.resolve_cluster):
  /job:learner/task:0  the queue, the global variables (on its CPU), the
                       training step; the only task that writes to --logdir.
  /job:actor/task:i    one environment and an unroll that runs entirely on
                       this task with a local copy of the weights, refreshed
                       from the learner at the start of every unroll.

End of training: the learner sets `training_done`, closes the queue, saves
its checkpoint and waits (at most ACTOR_FINISH_WAIT_SECS) until every actor
that is still running has set its entry of `finished_actors`. An actor whose
enqueue fails because the queue is closed reads `training_done`: true means
'learner finished', and the actor exits 0. A learner that dies or is killed
never closes the queue, and one stopped by a signal closes it without
setting `training_done`: the actors see a fault (an unreachable, restarted
or stopping learner), log it, reconnect and carry on once a learner is back
(restored from its checkpoint).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

import numpy as np
import tensorflow as tf
from absl import logging

import actors
import agent as agent_lib
import cluster
import cluster_runtime
import learner_loop
import pipeline
import py_process
import sessions
from config import Config
from errors import FlagError, first_line
from progress import PROGRESS_SECS
from shutdown import ShutdownRequest

# An enqueue waits this long before the actor checks that the learner is
# still there (a full queue only means the learner is busy): a dead learner is
# noticed within about this time, or at once when its connections reset.
ENQUEUE_TIMEOUT_MS = 5000
# Bound on the other remote calls (weight copy, reading `training_done`).
REMOTE_CALL_TIMEOUT_MS = 10000
# At the end of training, how long the learner waits for the live actors to
# see the closed queue before it exits anyway.
ACTOR_FINISH_WAIT_SECS = 30
RECONNECT_PAUSE_SECS = 1.0
# How long an ending actor waits for its session with the learner to close.
SESSION_CLOSE_WAIT_SECS = 5.0
# Prefix of the actor's local copy of the agent's variables.
LOCAL_AGENT_NAME = "local_agent"

ClusterState = collections.namedtuple("ClusterState", "training_done finished_actors")
LearnerTaskOps = collections.namedtuple(
    "LearnerTaskOps", "pipeline end_training close_queue finished_actors"
)
ActorTaskOps = collections.namedtuple(
    "ActorTaskOps",
    "sync_weights output state_initializer placeholders enqueue training_done "
    "confirm_finished uninitialized",
)


class LearnerLostError(Exception):
    """The learner went away, restarted or is unreachable: reconnect."""


class TrainingFinished(Exception):
    """The learner closed the queue after reaching its frame target."""


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


def build_learner_task(
    cluster_config: cluster.ClusterConfig, specs, config: Config
) -> LearnerTaskOps:
    """The learner task's graph (call inside a fresh graph).

    Everything on /job:learner/task:0: the queue, the training pipeline (on
    its GPU when it has one) and every variable, pinned to its CPU.
    """
    task_device = cluster.learner_device()
    with tf.device(task_device), sessions.variables_on(f"{task_device}/cpu:0"):
        agent = actors.create_agent(config.agent)
        queue = pipeline.create_queue(specs)
        learner_pipeline = pipeline.build_learner_pipeline(
            agent,
            queue,
            specs,
            config.learner,
            sessions.learner_device(),
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


def run_learner_task(
    config: Config,
    cluster_config: cluster.ClusterConfig,
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
    specs = actors.actor_output_specs(
        environment, config.agent, config.learner.unroll_length
    )
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

        result = learner_loop.train_learner(
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
        "Training done: %d environment frames, %d episodes. Checkpoint and "
        "TensorBoard logs in %s.",
        result.num_env_frames,
        result.num_episodes,
        config.run.logdir,
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
    config: cluster.ClusterConfig,
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
            if not confirmed[i] and cluster.reachable(host)
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


def _make_local(variables) -> None:
    """Moves `variables` from the global (and trainable) collections to local.

    Local variables are initialised by each actor session's local init op,
    never checked for by readiness ops, never saved.
    """
    graph = tf.compat.v1.get_default_graph()
    ids = {id(v) for v in variables}
    for key in (
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
    ):
        collection = graph.get_collection_ref(key)
        collection[:] = [v for v in collection if id(v) not in ids]
    for v in variables:
        graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, v)


def copy_weights_op(source: agent_lib.Agent, target: agent_lib.Agent) -> tf.Operation:
    """Assigns every variable of `source` to the same-named one of `target`.

    Names match after the module's own prefix ('agent/core_lstm/w_i' and
    'local_agent/core_lstm/w_i'). The assignments run on the target's device.
    """

    def by_name(agent):
        return {v.name.split("/", 1)[1]: v for v in agent.variables}

    sources, targets = by_name(source), by_name(target)
    if sorted(sources) != sorted(targets):
        raise ValueError(
            f"agents differ: {sorted(set(sources) ^ set(targets))[:5]} are in only one"
        )
    return tf.group(
        [targets[name].assign(sources[name]) for name in sorted(targets)],
        name="copy_learner_weights",
    )


def build_actor_task(
    cluster_config: cluster.ClusterConfig, config: Config
) -> tuple[ActorTaskOps, tuple[py_process.PyProcess, ...]]:
    """This actor task's graph (call inside a fresh graph), and its
    environment processes (--envs_per_actor / --envs_per_process of them).

    The environments, the local agent copy and the unroll live on this task.
    The queue, the global agent variables and the cluster state are declared
    on the learner with the names they have there, so they are the learner's.
    """
    learner = cluster.learner_device()
    task = cluster_config.task
    level_name, seeds = actors.actor_level_and_seeds(
        config.environment.level_names,
        task,
        config.run.seed,
        config.run.envs_per_actor,
    )
    with tf.device(cluster_config.device):
        local_agent = actors.create_agent(config.agent, name=LOCAL_AGENT_NAME)
        processes, envs = actors.actor_environments(
            level_name, seeds, config.environment, config.run.envs_per_process
        )
        # [K, ...]: one unroll per environment.
        output, state_initializer = actors.build_vector_actor(
            local_agent, list(envs), level_name, config.learner.unroll_length
        )
        _make_local(local_agent.variables)
        specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape[1:], t.dtype), output
        )
        # The unrolls are fetched, then fed to the enqueue: an enqueue that
        # times out (full queue) can be retried with the same unrolls.
        placeholders = tf.nest.map_structure(
            lambda t: tf.compat.v1.placeholder(t.dtype, t.shape), output
        )
    with tf.device(learner):
        queue = pipeline.create_queue(specs)
        enqueue = queue.enqueue_many(tf.nest.flatten(placeholders))
    with tf.device(f"{learner}/cpu:0"):
        # Declares the learner's variables here; the ops of this call never run.
        global_agent = actors.create_agent(config.agent)
        build_agent_variables(global_agent, specs)
        state = create_cluster_state(cluster_config.num_actors, is_learner=False)
        confirm_finished = state.finished_actors.scatter_update(
            tf.IndexedSlices(tf.constant([1]), tf.constant([task]))
        )
        training_done = state.training_done.read_value()
    with tf.device(cluster_config.device):
        sync_weights = copy_weights_op(global_agent, local_agent)
    # The learner's variables not initialised yet. The actor connects once
    # there is none: that includes the end-of-training state, which the
    # learner initialises after creating its queue.
    uninitialized = tf.compat.v1.report_uninitialized_variables(
        [*tf.compat.v1.global_variables(), *state]
    )
    ops = ActorTaskOps(
        sync_weights=sync_weights,
        output=output,
        state_initializer=state_initializer,
        placeholders=placeholders,
        enqueue=enqueue,
        training_done=training_done,
        confirm_finished=confirm_finished,
        uninitialized=uninitialized,
    )
    return ops, processes


def run_actor_task(
    config: Config,
    cluster_config: cluster.ClusterConfig,
    server,
    proto: tf.compat.v1.ConfigProto,
    shutdown: ShutdownRequest,
) -> None:
    """An actor task: plays its level and sends unrolls to the learner's queue.

    At the start of every unroll it copies the learner's weights into its
    local agent (the paper: "at the beginning of each trajectory, an actor
    updates its own local policy to the latest learner policy"), so the
    unroll reads no weight over the network. It connects whether started
    before or after the learner, reconnects whenever the learner goes away,
    and returns (exit 0) once the learner has finished training. It writes
    nothing to --logdir.
    """
    shutdown.stop_description = ShutdownRequest.ACTOR_TASK_STOP
    task, learner_host = cluster_config.task, cluster_config.learner_host
    level_name, _ = actors.actor_level_and_seeds(
        config.environment.level_names,
        task,
        config.run.seed,
        config.run.envs_per_actor,
    )
    logging.info(
        "Actor task %d at %s: playing %s for the learner at %s.",
        task,
        cluster_config.address,
        level_name,
        learner_host,
    )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(config.run.seed + task)
        ops, processes = build_actor_task(cluster_config, config)
        supervisor = actors.EnvironmentSupervisor(
            task,
            level_name,
            processes,
            after_giving_up="This actor task stopped; the learner and the other "
            "actors go on (start the task again to rejoin). ",
        )
        # Short waits, so that a signal is noticed while the learner is down.
        creator = cluster_runtime.worker_session_creator(
            cluster_config,
            server,
            scaffold=tf.compat.v1.train.Scaffold(
                ready_for_local_init_op=ops.uninitialized
            ),
            session_config=proto,
            max_wait_secs=2.0,
            log_every_secs=3600.0,
        )
        for process in processes:
            process.start()
        try:
            while not shutdown.requested:
                session = _connect(
                    creator,
                    cluster_config,
                    shutdown,
                    lambda: _why_not_ready(creator),
                )
                if session is None:
                    break
                finished = False
                try:
                    _act(session, ops, supervisor, cluster_config, shutdown)
                except TrainingFinished:
                    finished = True
                    logging.info(
                        "Actor %d: learner finished training (queue closed); exiting.",
                        task,
                    )
                    return
                except LearnerLostError as e:
                    logging.warning(
                        "Actor %d: lost the learner at %s (%s); reconnecting, "
                        "and waiting for it if it is down.",
                        task,
                        learner_host,
                        e,
                    )
                finally:
                    # Closing a session whose learner is gone (or going) can
                    # take seconds of gRPC retries: not in the way, but given
                    # a few seconds before the process exits.
                    closing = threading.Thread(
                        target=_close_quietly, args=(session,), daemon=True
                    )
                    closing.start()
                    if finished or shutdown.requested:
                        closing.join(SESSION_CLOSE_WAIT_SECS)
                time.sleep(RECONNECT_PAUSE_SECS)
        finally:
            for process in processes:
                process.close()
    logging.info("Actor %d: stopped by a signal.", task)


def _connect(creator, config, shutdown: ShutdownRequest, why_not_ready=None):
    """A session with the learner, waiting for it; None on SIGINT/SIGTERM.

    why_not_ready: optional () -> str, called for the periodic 'waiting' line
    to say why the learner is not ready yet.
    """
    logging.info(
        "Actor %d: connecting to the learner at %s.", config.task, config.learner_host
    )
    start = time.monotonic()
    next_log = start + PROGRESS_SECS
    while not shutdown.requested:
        try:
            session = creator.create_session()
        except TimeoutError as e:
            if time.monotonic() >= next_log:
                reason = why_not_ready() if why_not_ready else None
                logging.info(
                    "Actor %d: waiting for the learner at %s (%.0f s so far; %s).",
                    config.task,
                    config.learner_host,
                    time.monotonic() - start,
                    reason or e,
                )
                next_log += PROGRESS_SECS
            continue
        logging.info(
            "Actor %d: connected to the learner at %s after %.1f s.",
            config.task,
            config.learner_host,
            time.monotonic() - start,
        )
        return session
    return None


def _why_not_ready(creator) -> str | None:
    """Why a learner that is up is not ready for this actor; None if it is down.

    Reads what the session creator saw on its last attempt (it is the one
    place that asks the learner). A learner that never initialises the
    variables this actor declares runs another model: say which variables,
    and which flags to compare.
    """
    if not creator.learner_reachable:
        return None
    if creator.uninitialized is None:
        return "the learner is up but not answering"
    model = [n for n in creator.uninitialized if n not in ClusterState._fields]
    total = len(tf.compat.v1.global_variables())
    if len(model) in (0, total):
        return "the learner is up and initialising its model"
    # Some of the model is there, some not: another model.
    return (
        f"the learner has no variable(s) {', '.join(model[:3])} ({len(model)} "
        f"of {total}): it runs another model; give this actor the learner's "
        f"--agent, --use_lstm and --level_name"
    )


def _close_quietly(session) -> None:
    try:
        session.close()
    except Exception as e:  # noqa: BLE001 - the learner may be gone
        logging.debug("Closing the actor session: %s", e)


def _remote_run(session, fetches, what: str, timeout_ms: int = REMOTE_CALL_TIMEOUT_MS):
    """session.run for a call involving the learner.

    Raises LearnerLostError when the call fails, FlagError when the learner's
    variables have other shapes than this task's.
    """
    options = tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms)
    try:
        return session.run(fetches, options=options)
    except tf.errors.InvalidArgumentError as e:
        # Shapes that do not match the learner's: retrying cannot help.
        raise FlagError(
            f"{what}: {first_line(e)}; give every task the learner's "
            f"--level_name, --agent, --use_lstm, --unroll_length, --width and "
            f"--height."
        ) from None
    except tf.errors.OpError as e:
        raise LearnerLostError(f"{what}: {first_line(e)}") from None


def _act(
    session,
    ops: ActorTaskOps,
    supervisor: actors.EnvironmentSupervisor,
    config: cluster.ClusterConfig,
    shutdown: ShutdownRequest,
) -> None:
    """Unrolls and enqueues until the learner finishes or goes away.

    Raises TrainingFinished or LearnerLostError; returns on SIGINT/SIGTERM.
    A failure of this task's own environments is the supervisor's to handle
    (restart, or EnvironmentFailedError at its limit); other errors
    propagate.
    """
    processes = supervisor.processes
    unrolls, last_log, last_unrolls = 0, time.monotonic(), 0
    while not shutdown.requested:
        _remote_run(session, ops.sync_weights, "copying the learner's weights")
        values = _unroll(session, ops, supervisor, shutdown)
        if values is None or not _send_unroll(session, ops, values, config, shutdown):
            return
        unrolls += len(processes)
        now = time.monotonic()
        if unrolls == len(processes):
            logging.info(
                "Actor %d: first unroll sent to the learner (one per environment: %d).",
                config.task,
                len(processes),
            )
        elif now - last_log >= PROGRESS_SECS:
            logging.info(
                "Actor %d: %d unrolls sent (%.2f unrolls/s).",
                config.task,
                unrolls,
                (unrolls - last_unrolls) / (now - last_log),
            )
            last_log, last_unrolls = now, unrolls


def _unroll(
    session,
    ops: ActorTaskOps,
    supervisor: actors.EnvironmentSupervisor,
    shutdown: ShutdownRequest,
):
    """One unroll of each of this task's environments. A failed environment
    is restarted by the supervisor (as on a single machine: back-off, give-up
    limit) and the unroll run again.

    Returns None when a signal stops the task (a SIGTERM to the process group
    also ends the environment processes: no restart then).
    """
    while not shutdown.requested:
        try:
            values = session.run(ops.output)
        except tf.errors.OpError as e:
            if shutdown.requested:
                return None
            if not supervisor.is_environment_failure(e):
                raise
            if not supervisor.recover(session, ops.state_initializer, e, shutdown.wait):
                return None
            continue
        supervisor.unroll_completed()
        return values
    return None


def _send_unroll(
    session,
    ops: ActorTaskOps,
    values,
    config: cluster.ClusterConfig,
    shutdown: ShutdownRequest,
) -> bool:
    """Enqueues one unroll on the learner, retrying while the queue is full.

    Returns True once enqueued, False on SIGINT/SIGTERM. Raises
    TrainingFinished when the learner closed the queue at the end of
    training, LearnerLostError when it is gone, FlagError when its queue
    takes unrolls of another shape (different flags).
    """
    feed = dict(
        zip(
            tf.nest.flatten(ops.placeholders),
            tf.nest.flatten(values),
            strict=True,
        )
    )
    options = tf.compat.v1.RunOptions(timeout_in_ms=ENQUEUE_TIMEOUT_MS)
    while not shutdown.requested:
        try:
            session.run(ops.enqueue, feed, options=options)
            return True
        except tf.errors.DeadlineExceededError:
            # Full queue: the learner is busy (or gone: then this fails).
            if _remote_run(session, ops.training_done, "checking on the learner"):
                _confirm_finished(session, ops)
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError) as e:
            # Closed queue: the end of training, if the learner says so.
            if _remote_run(session, ops.training_done, "after the queue closed"):
                _confirm_finished(session, ops)
            raise LearnerLostError(
                f"the queue closed but training is not done ({first_line(e)})"
            ) from None
        except tf.errors.InvalidArgumentError as e:
            # The feed has the placeholders' own dtypes and shapes, so an
            # invalid argument here is the learner's queue refusing them: its
            # components differ (another model); retrying cannot help.
            raise FlagError(
                f"the learner at {config.learner_host} takes unrolls of "
                f"another shape ({first_line(e)}); give every task the same "
                f"--level_name, --unroll_length, --width, --height and "
                f"--agent and --use_lstm as the learner."
            ) from None
        except tf.errors.OpError as e:
            raise LearnerLostError(f"sending an unroll: {first_line(e)}") from None
    return False


def _confirm_finished(session, ops: ActorTaskOps) -> None:
    """Tells the learner this actor saw the end; raises TrainingFinished."""
    try:
        _remote_run(session, ops.confirm_finished, "confirming the end")
    except LearnerLostError as e:
        logging.info("Could not confirm the end to the learner: %s", e)
    raise TrainingFinished()


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
