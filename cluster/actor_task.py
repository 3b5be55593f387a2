"""An actor task of a cluster (`--job_name=actor --task=i`).

One actor's environments and an unroll (actor/unroll.py) that runs entirely
on this task with a local copy of the weights, refreshed from the learner at
the start of every unroll, then enqueued into the learner's queue. Its
environments are supervised as the single-machine actors' are
(actor/supervisor.py). A learner that goes away (killed, restarted,
unreachable) is waited for: the task reconnects and carries on once a
learner is back, for up to --learner_lost_secs once it has had one (then it
stops its environments and exits with code 3, LearnerGoneError); the end of
training is state.py's protocol.
"""

from __future__ import annotations

import collections
import threading
import time

import tensorflow as tf
from absl import logging

import agent as agent_lib
import py_process
from actor.envs import actor_environments, actor_level_and_seeds
from actor.supervisor import EnvironmentSupervisor
from actor.unroll import build_vector_actor
from cluster import servers, spec
from cluster.state import (
    ClusterState,
    agreeing_settings,
    build_agent_variables,
    check_learner_lost,
    chief_learner_tasks,
    confirm_finished_op,
    create_cluster_state,
    learner_tasks_problem,
    settings_problems,
)
from config import Config
from learner import pipeline
from runtime.errors import FlagError, first_line
from runtime.shutdown import ShutdownRequest

# An enqueue waits this long before the actor checks that the learner is
# still there (a full queue only means the learner is busy): a dead learner is
# noticed within about this time, or at once when its connections reset.
ENQUEUE_TIMEOUT_MS = 5000
# Bound on the other remote calls (weight copy, reading `training_done`).
REMOTE_CALL_TIMEOUT_MS = 10000
RECONNECT_PAUSE_SECS = 1.0
# How long an ending actor waits for its session with the learner to close.
SESSION_CLOSE_WAIT_SECS = 5.0
# Prefix of the actor's local copy of the agent's variables.
LOCAL_AGENT_NAME = "local_agent"

ActorTaskOps = collections.namedtuple(
    "ActorTaskOps",
    "sync_weights output state_initializer placeholders enqueue training_done "
    "confirm_finished uninitialized learner_tasks settings chiefs_settings",
)


class LearnerLostError(Exception):
    """The learner went away, restarted or is unreachable: reconnect."""


class TrainingFinished(Exception):
    """The learner closed the queue after reaching its frame target."""


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
    cluster_config: spec.ClusterConfig, config: Config
) -> tuple[ActorTaskOps, tuple[py_process.PyProcess, ...]]:
    """This actor task's graph (call inside a fresh graph), and its
    environment processes (--envs_per_actor / --envs_per_process of them).

    The environments, the local agent copy and the unroll live on this task.
    The queue, the global agent variables and the cluster state are declared
    on the learner with the names they have there, so they are the learner's.
    """
    learner = spec.learner_task_device()
    task = cluster_config.task
    level_name, seeds = actor_level_and_seeds(
        config.environment.level_names,
        task,
        config.run.seed,
        config.run.envs_per_actor,
    )
    with tf.device(cluster_config.device):
        local_agent = agent_lib.create_agent(config.agent, name=LOCAL_AGENT_NAME)
        processes, envs = actor_environments(
            level_name, seeds, config.environment, config.run.envs_per_process
        )
        # The learner's frame count when the weights were last copied: the
        # unroll's policy_frames, from which the learner measures its lag.
        weights_frames = tf.compat.v1.Variable(
            tf.constant(0, tf.int64),
            trainable=False,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            use_resource=True,
            name="weights_frames",
        )
        # [K, ...]: one unroll per environment.
        output, state_initializer = build_vector_actor(
            local_agent,
            list(envs),
            level_name,
            config.learner.unroll_length,
            policy_frames=weights_frames,
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
    feeds = cluster_config.feeds_learner
    with tf.device(spec.learner_task_device(feeds)):
        queue = pipeline.create_queue(specs, learner=feeds)
        enqueue = queue.enqueue_many(tf.nest.flatten(placeholders))
    with tf.device(f"{learner}/cpu:0"):
        # Declares the learner's variables here; the ops of this call never run.
        global_agent = agent_lib.create_agent(config.agent)
        build_agent_variables(global_agent, specs)
        learner_frames = tf.compat.v1.train.get_or_create_global_step()
        settings = agreeing_settings(config, specs.env_outputs.observation)
        state = create_cluster_state(
            cluster_config.num_actors,
            is_learner=False,
            num_learners=cluster_config.num_learners,
            settings=settings,
        )
        confirm_finished = confirm_finished_op(state.finished_actors, task)
        training_done = state.training_done.read_value()
        learner_tasks = chief_learner_tasks(state)
        chiefs_settings = state.run_settings.read_value()
    with tf.device(cluster_config.device):
        sync_weights = tf.group(
            copy_weights_op(global_agent, local_agent),
            weights_frames.assign(learner_frames.read_value()),
        )
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
        learner_tasks=learner_tasks,
        settings=settings,
        chiefs_settings=chiefs_settings,
    )
    return ops, processes


def run(
    config: Config,
    cluster_config: spec.ClusterConfig,
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
    level_name, _ = actor_level_and_seeds(
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
        supervisor = EnvironmentSupervisor(
            task,
            level_name,
            processes,
            after_giving_up="This actor task stopped; the learner and the other "
            "actors go on (start the task again to rejoin). ",
        )
        # Short waits, so that a signal is noticed while the learner is down.
        creator = servers.worker_session_creator(
            cluster_config,
            server,
            scaffold=tf.compat.v1.train.Scaffold(
                ready_for_local_init_op=ops.uninitialized
            ),
            session_config=proto,
            max_wait_secs=2.0,
            log_every_secs=3600.0,
            check=lambda session: _check_settings(session, ops, cluster_config),
        )
        # Started as the single-machine actors' are: a process killed while
        # it starts is restarted and counted, a bad level fails at once.
        if not supervisor.start(shutdown.wait):
            py_process.close_all(processes)
            logging.info("Actor %d: stopped by a signal.", task)
            return
        # When the learner was lost, once it had been reached: past
        # --learner_lost_secs the task exits (LearnerGoneError) instead of
        # waiting for a run that ended without it.
        lost_since: float | None = None
        try:
            while not shutdown.requested:
                session = _connect(
                    creator,
                    cluster_config,
                    shutdown,
                    lambda: _why_not_ready(creator),
                    interval_secs=config.run.progress_secs,
                    lost_since=lost_since,
                    lost_bound_secs=config.run.learner_lost_secs,
                )
                if session is None:
                    break
                lost_since = None
                finished = False
                try:
                    _act(
                        session,
                        ops,
                        supervisor,
                        cluster_config,
                        shutdown,
                        interval_secs=config.run.progress_secs,
                    )
                except TrainingFinished:
                    finished = True
                    logging.info(
                        "Actor %d: learner finished training (queue closed); exiting.",
                        task,
                    )
                    return
                except LearnerLostError as e:
                    lost_since = time.monotonic()
                    logging.warning(
                        "Actor %d: lost the learner at %s (%s); reconnecting, "
                        "and waiting for it if it is down (at most "
                        "--learner_lost_secs=%g s).",
                        task,
                        learner_host,
                        e,
                        config.run.learner_lost_secs,
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


def _connect(
    creator,
    config,
    shutdown: ShutdownRequest,
    why_not_ready=None,
    interval_secs: float = 10,
    lost_since: float | None = None,
    lost_bound_secs: float | None = None,
):
    """A session with the learner, waiting for it; None on SIGINT/SIGTERM.

    why_not_ready: optional () -> str, called for the periodic 'waiting' line
    (every `interval_secs`, --progress_secs) to say why the learner is not
    ready yet.
    lost_since: when a learner this task had was lost (time.monotonic());
    None for one it never had, which it waits for as long as it takes.
    Otherwise LearnerGoneError once `lost_bound_secs` (--learner_lost_secs)
    have passed since then without a session.
    """
    logging.info(
        "Actor %d: connecting to the learner at %s.", config.task, config.learner_host
    )
    start = time.monotonic()
    next_log = start + interval_secs
    while not shutdown.requested:
        if lost_bound_secs is not None:
            check_learner_lost(
                lost_since,
                lost_bound_secs,
                f"actor task {config.task}",
                "learner",
                config.learner_host,
                "its environment processes stopped, exiting",
            )
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
                next_log += interval_secs
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


def _check_settings(session, ops: ActorTaskOps, config: spec.ClusterConfig) -> None:
    """Refuses (FlagError, a line a setting) a chief whose settings differ
    from this task's, as soon as the chief has set them: also while it has
    not initialised this task's model (another agent never does)."""
    try:
        chiefs = session.run(
            ops.chiefs_settings,
            options=tf.compat.v1.RunOptions(timeout_in_ms=REMOTE_CALL_TIMEOUT_MS),
        )
    except tf.errors.OpError:
        return  # Not set yet (the chief is starting), or gone: ask again later.
    if problems := settings_problems(ops.settings, chiefs, config.learner_host):
        raise FlagError("\n".join(problems))


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
            f"--level_name, --agent, --use_lstm, --unroll_length and the flags "
            f"of the level's environment family."
        ) from None
    except tf.errors.OpError as e:
        raise LearnerLostError(f"{what}: {first_line(e)}") from None


def _act(
    session,
    ops: ActorTaskOps,
    supervisor: EnvironmentSupervisor,
    config: spec.ClusterConfig,
    shutdown: ShutdownRequest,
    interval_secs: float = 10,
) -> None:
    """Unrolls and enqueues until the learner finishes or goes away, with a
    line every `interval_secs` (--progress_secs).

    Raises TrainingFinished or LearnerLostError; returns on SIGINT/SIGTERM.
    A failure of this task's own environments is the supervisor's to handle
    (restart, or EnvironmentFailedError at its limit); other errors
    propagate.
    """
    # One unroll an environment a round: K of them, however many share a
    # process (--envs_per_process).
    per_round = tf.nest.flatten(ops.placeholders)[0].shape[0]
    chief_runs = _remote_run(session, ops.learner_tasks, "asking the learner")
    if problem := learner_tasks_problem(int(chief_runs), config):
        raise FlagError(problem)
    chiefs = _remote_run(session, ops.chiefs_settings, "asking the learner")
    if problems := settings_problems(ops.settings, chiefs, config.learner_host):
        raise FlagError("\n".join(problems))
    unrolls, last_log, last_unrolls = 0, time.monotonic(), 0
    while not shutdown.requested:
        _remote_run(session, ops.sync_weights, "copying the learner's weights")
        values = _unroll(session, ops, supervisor, shutdown)
        if values is None or not _send_unroll(session, ops, values, config, shutdown):
            return
        unrolls += per_round
        now = time.monotonic()
        if unrolls == per_round:
            logging.info(
                "Actor %d: first unroll sent to the learner (one per environment: %d).",
                config.task,
                per_round,
            )
        elif now - last_log >= interval_secs:
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
    supervisor: EnvironmentSupervisor,
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
    config: spec.ClusterConfig,
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
                f"--level_name, --unroll_length, --agent, --use_lstm and flags "
                f"of the level's environment family as the learner."
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
