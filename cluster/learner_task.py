"""The learner task of a cluster (`--job_name=learner --task=0`).

Every task runs experiment.py with --job_name and --task; the addresses come
from addresses.py. The model, loss, checkpoints and logs are those of
single-machine training (learner/loop.py's `train_learner`); what differs is
where things live and how the tasks find each other and end (state.py).

Layout (`--job_name`, `--task`, addresses from addresses.resolve_cluster):
  /job:learner/task:0  the chief: its queue, the global variables (on its
                       CPU), the training step; the only task that writes
                       to --logdir.
  /job:learner/task:k  with --num_learners=N > 1, k = 1..N-1: learner k's
                       queue and tower, run by the chief's step (serve()).
  /job:actor/task:i    actor_task.py; feeds learner i mod N.
"""

from __future__ import annotations

import collections
import threading
import time

import tensorflow as tf
from absl import logging

import agent as agent_lib
from actor.unroll import actor_output_specs
from cluster import ports, spec
from cluster.state import (
    agreeing_settings,
    check_learner_lost,
    chief_learner_tasks,
    confirm_finished_op,
    create_cluster_state,
    learner_tasks_problem,
    settings_problems,
)
from config import Config
from learner import loop, pipeline, progress
from runtime import sessions
from runtime.errors import FlagError, first_line
from runtime.settings import DEFAULTS
from runtime.shutdown import ShutdownRequest

# At the end of training, how long the chief waits for the live actor tasks
# (and the other learner tasks) to see the end before it exits anyway.
TASK_FINISH_WAIT_SECS = 30
# Bound on a learner task's calls to the chief: an unreachable chief (a
# partition) fails the call instead of holding it.
CHIEF_CALL_TIMEOUT_MS = 10000

LearnerTaskOps = collections.namedtuple(
    "LearnerTaskOps",
    "pipeline end_training close_queue finished_actors finished_learners queue_sizes",
)


def build_learner_task(
    cluster_config: spec.ClusterConfig, specs, config: Config
) -> LearnerTaskOps:
    """The learner task's graph (call inside a fresh graph).

    Everything on /job:learner/task:0: the queue, the training pipeline (on
    its GPU when it has one) and every variable, pinned to its CPU.
    """
    task_device = spec.learner_task_device()
    num_learners = cluster_config.num_learners
    with tf.device(task_device), sessions.variables_on(f"{task_device}/cpu:0"):
        agent = agent_lib.create_agent(config.agent)
        queues = []
        for i in range(num_learners):
            with tf.device(spec.learner_task_device(i)):
                queues.append(pipeline.create_queue(specs, learner=i))
        # One learner: its GPU when it has one, as before. Several: tower i
        # on learner task i (its GPU, if any, by the placer's default).
        devices = (
            [sessions.learner_device()]
            if num_learners == 1
            else [spec.learner_task_device(i) for i in range(num_learners)]
        )
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, queues, specs, config.learner, devices
        )
        # The learner's local init creates the queues (with their shapes)
        # before setting `training_done`, which actors wait for: so an actor
        # with other shapes gets an error, instead of creating a queue first.
        state = create_cluster_state(
            cluster_config.num_actors,
            is_learner=True,
            after=[q.size() for q in queues],
            num_learners=num_learners,
            settings=agreeing_settings(config, specs.env_outputs.observation),
        )

        def close_queues():
            return tf.group([q.close(cancel_pending_enqueues=True) for q in queues])

        with tf.control_dependencies([state.training_done.assign(True)]):
            end_training = close_queues()
        return LearnerTaskOps(
            pipeline=learner_pipeline,
            end_training=end_training,
            close_queue=close_queues(),
            finished_actors=state.finished_actors.read_value(),
            finished_learners=state.finished_learners.read_value(),
            queue_sizes=[q.size() for q in queues],
        )


def serve(
    config: Config,
    cluster_config: spec.ClusterConfig,
    server,
    proto: tf.compat.v1.ConfigProto,
    shutdown: ShutdownRequest,
) -> None:
    """A learner task other than the chief: its server holds learner k's
    queue and runs its tower, both driven by the chief's graph; this process
    only waits for the end of training (the chief's `training_done`), through
    restarts of the chief, confirms it (its entry of `finished_learners`, which
    the chief waits for before it exits) and returns; or stops on a signal."""
    task = cluster_config.task
    logging.info(
        "Learner task %d at %s: serving tower %d for the chief at %s.",
        task,
        cluster_config.address,
        task,
        cluster_config.learner_host,
    )
    specs = actor_output_specs(
        config.environment, config.agent, config.learner.unroll_length
    )
    mine = agreeing_settings(config, specs.env_outputs.observation)
    with tf.Graph().as_default():
        with tf.device(f"{spec.learner_task_device()}/cpu:0"):
            state = create_cluster_state(
                cluster_config.num_actors,
                is_learner=False,
                num_learners=cluster_config.num_learners,
                settings=mine,
            )
            training_done = state.training_done.read_value()
            confirm_finished = confirm_finished_op(state.finished_learners, task)
            chief_runs = chief_learner_tasks(state)
            chiefs_settings = state.run_settings.read_value()
        done = False
        # Once it has had the chief, a task that loses it for longer than
        # --learner_lost_secs exits (LearnerGoneError) rather than serve a
        # run that ended without it; before, it waits for the chief.
        connected, lost_since = False, None

        def check_lost() -> None:
            check_learner_lost(
                lost_since,
                config.run.learner_lost_secs,
                f"learner task {task}",
                "chief learner",
                cluster_config.learner_host,
            )

        bounded = tf.compat.v1.RunOptions(timeout_in_ms=CHIEF_CALL_TIMEOUT_MS)
        while not done and not shutdown.requested:
            if connected and not ports.reachable(cluster_config.learner_host):
                # A session's creation would wait for the chief without a
                # bound (TensorFlow's master waits for every task it names).
                lost_since = lost_since or time.monotonic()
                check_lost()
                shutdown.wait(1.0)
                continue
            session = tf.compat.v1.Session(server.target, config=proto)
            try:
                # Once per connection: a restarted chief may run another
                # number of learner tasks.
                problem = learner_tasks_problem(
                    int(session.run(chief_runs, options=bounded)), cluster_config
                )
                if problem:
                    raise FlagError(problem)
                if problems := settings_problems(
                    mine,
                    session.run(chiefs_settings, options=bounded),
                    cluster_config.learner_host,
                ):
                    raise FlagError("\n".join(problems))
                if not connected:
                    logging.info(
                        "Learner task %d: serving the chief at %s (at most "
                        "--learner_lost_secs=%g s without it once lost).",
                        task,
                        cluster_config.learner_host,
                        config.run.learner_lost_secs,
                    )
                connected, lost_since = True, None
                while not session.run(training_done, options=bounded):
                    if shutdown.wait(1.0):
                        break
                else:
                    session.run(confirm_finished, options=bounded)
                    done = True
            except (
                tf.errors.FailedPreconditionError,
                tf.errors.UnavailableError,
                tf.errors.DeadlineExceededError,
            ):
                # The chief is not up yet, restarting, or out of reach.
                if connected:
                    lost_since = lost_since or time.monotonic()
            except tf.errors.OpError as e:
                logging.debug("Learner task %d: %s", task, first_line(e))
            finally:
                # Closing a session whose chief is gone can take TensorFlow
                # 30 s of retries: done aside, so that the bound is kept.
                threading.Thread(target=session.close, daemon=True).start()
            check_lost()
            if not done:
                shutdown.wait(1.0)
        if not done:
            logging.info("Learner task %d: stopped by a signal.", task)
            return
    # The chief's session still runs ops here while it closes (its tower's
    # staging and dequeue threads); leaving first would hang its close on a
    # peer that is gone. So this task outlives the chief.
    logging.info("Learner task %d: training done; exiting once the chief has.", task)
    while ports.reachable(cluster_config.learner_host):
        if shutdown.wait(0.5):
            break
    logging.info("Learner task %d: the chief has exited; exiting.", task)


def wait_for_learner_tasks(
    cluster_config: spec.ClusterConfig,
    shutdown: ShutdownRequest,
    poll_secs: float = 1.0,
) -> bool:
    """Waits until every learner task but the chief listens; False when a
    signal (SIGINT/SIGTERM) came first.

    The chief's session names every learner task in its device filters, and
    TensorFlow's session creation waits for all of them in C++, where no
    signal handler of ours runs: a chief started before the others would
    stay there, deaf to SIGTERM, for as long as one is missing. So it waits
    here first, saying which tasks it waits for at once and then every
    PROGRESS_SECS, and a signal ends the wait at once.
    """
    others = dict(enumerate(cluster_config.learner_hosts[1:], start=1))
    start = time.monotonic()
    next_log = start
    while True:
        waiting = {k: h for k, h in others.items() if not ports.reachable(h)}
        if not waiting:
            return True
        now = time.monotonic()
        if now >= next_log:
            logging.info(
                "Learner task 0: waiting for learner task(s) %s (%.0f s so far); "
                "start each with --job_name=learner --task=K and this cluster.",
                ", ".join(f"{k} at {host}" for k, host in waiting.items()),
                now - start,
            )
            next_log = now + progress.PROGRESS_SECS
        if shutdown.wait(poll_secs):
            return False


def run(
    config: Config,
    cluster_config: spec.ClusterConfig,
    server,
    proto: tf.compat.v1.ConfigProto,
    shutdown: ShutdownRequest,
    evolver: loop.Evolver | None = None,
) -> None:
    """The learner task: trains on the unrolls the actor tasks enqueue
    (`evolver`: a PBT member, learner/loop.py).

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
    if not wait_for_learner_tasks(cluster_config, shutdown):
        logging.info(
            "Learner task 0: stopped by a signal while waiting for the other "
            "learner tasks; nothing to checkpoint yet."
        )
        return
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

        hooks = [
            ExitAtOnceUntilSessionHook(shutdown),
            CloseQueueOnShutdownHook(ops.close_queue, shutdown),
        ]
        if cluster_config.num_learners > 1 and config.run.stalled_learner_warning_secs:
            watch = StallWatch(
                config.run.stalled_learner_warning_secs,
                config.learner.batch_size,
                cluster_config,
            )
            hooks.append(StalledLearnerHook(ops.queue_sizes, watch))
        result = loop.train_learner(
            config,
            ops.pipeline,
            hooks,
            shutdown,
            master=server.target,
            session_config=proto,
            at_target=end_training,
            evolver=evolver,
        )
        # The session saved the final checkpoint on closing; the server (and
        # the variables on it) lives on until this process exits.
        if result.finished:
            with tf.compat.v1.Session(server.target, config=proto) as plain_session:
                wait_for_tasks_to_finish(
                    plain_session,
                    ops.finished_actors,
                    dict(enumerate(cluster_config.actor_hosts)),
                    "actor",
                    unreachable_secs=config.run.finish_wait_secs,
                )
                # Learner task 0 (the chief) never confirms: not waited for.
                wait_for_tasks_to_finish(
                    plain_session,
                    ops.finished_learners,
                    dict(enumerate(cluster_config.learner_hosts[1:], start=1)),
                    "learner",
                    unreachable_secs=config.run.finish_wait_secs,
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


class PollingHook(tf.compat.v1.train.SessionRunHook):
    """Runs `tick(session)` every `interval_secs` in a thread of its own, from
    session creation until the session ends or a tick returns True: for what
    must happen while the training step itself blocks (on an empty queue)."""

    interval_secs = 1.0
    thread_name = "polling-hook"

    def __init__(self) -> None:
        self._ended = threading.Event()

    def tick(self, session) -> bool:
        raise NotImplementedError

    def after_create_session(self, session, coord) -> None:
        del coord
        threading.Thread(
            target=self._run, args=(session,), name=self.thread_name, daemon=True
        ).start()

    def _run(self, session) -> None:
        while not self._ended.wait(self.interval_secs):
            if self.tick(session):
                return

    def end(self, session) -> None:
        del session
        self._ended.set()


class ExitAtOnceUntilSessionHook(tf.compat.v1.train.SessionRunHook):
    """SIGINT or SIGTERM while the chief creates its session exits at once.

    Session creation waits in C++ for every task of the cluster: a learner
    task that passed the chief's TCP probe (wait_for_learner_tasks) and died
    before answering leaves it there, where the stop flag is never read.
    Nothing is trained yet, so a signal then ends the process (128 + the
    signal) instead of setting the flag."""

    _WHAT = "creating its session with the cluster's tasks"

    def __init__(self, shutdown: ShutdownRequest):
        self._shutdown = shutdown

    def begin(self) -> None:
        logging.info("Learner task 0: %s (TensorFlow waits for each).", self._WHAT)
        self._shutdown.exit_at_once_while(self._WHAT)

    def after_create_session(self, session, coord) -> None:
        del session, coord
        self._shutdown.exit_at_once_while(None)


class CloseQueueOnShutdownHook(PollingHook):
    """On SIGINT/SIGTERM, closes the learner's queue (without `training_done`).

    A learner step waiting for unrolls (when the actors are gone or stopping
    too) then fails at once instead of blocking, and the learner still saves
    its final checkpoint. The actors take the closed queue without
    `training_done` for a learner that went away, and wait for it.
    """

    interval_secs = 0.2
    thread_name = "close-on-shutdown"

    def __init__(self, close_op: tf.Operation, shutdown: ShutdownRequest):
        super().__init__()
        self._close_op = close_op
        self._shutdown = shutdown

    def tick(self, session) -> bool:
        if not self._shutdown.requested:
            return False
        try:
            session.run(self._close_op)
        except Exception as e:  # noqa: BLE001 - the session may be closing
            logging.debug("Closing the queue: %s", e)
        return True


class StallWatch:
    """Which learner tasks to warn about: one whose queue has stayed empty
    for `bound_secs` while every other learner's queue holds a batch. The
    update is synchronous, so such a learner holds every update up: its
    actor tasks (actor j feeds learner j mod N) are gone or not started.
    Said once the bound has passed, then again each `bound_secs` while it
    lasts; `clock` is injectable for tests."""

    def __init__(
        self,
        bound_secs: float,
        batch_size: int,
        cluster_config: spec.ClusterConfig,
        clock=time.monotonic,
    ):
        self._bound = bound_secs
        self._batch_size = batch_size
        self._cluster = cluster_config
        self._clock = clock
        self._empty_since: dict[int, float] = {}
        self._said_at: dict[int, float] = {}

    def actors_of(self, learner: int) -> list[int]:
        n = self._cluster.num_learners
        return [j for j in range(self._cluster.num_actors) if j % n == learner]

    def update(self, sizes: list[int]) -> list[str]:
        """The warnings to log now for the queue sizes `sizes` (one a learner)."""
        now, lines = self._clock(), []
        for k, size in enumerate(sizes):
            others_full = all(
                other >= self._batch_size for i, other in enumerate(sizes) if i != k
            )
            if size or not others_full:
                self._empty_since.pop(k, None)
                self._said_at.pop(k, None)
                continue
            since = self._empty_since.setdefault(k, now)
            said = self._said_at.get(k)
            if now - since >= self._bound and (
                said is None or now - said >= self._bound
            ):
                self._said_at[k] = now
                actors = self.actors_of(k)
                hosts = ", ".join(
                    f"actor task {j} ({self._cluster.actor_hosts[j]})" for j in actors
                )
                lines.append(
                    f"Learner task {k} ({self._cluster.learner_hosts[k]}) has had no "
                    f"unroll for {now - since:.0f} s while the other learners' "
                    f"queues are full: every update waits for it, so training is "
                    f"stalled. It is fed by {hosts} (actor j feeds learner j mod "
                    f"{self._cluster.num_learners}); restart them, or check their "
                    f"hosts. Training goes on once one of them enqueues again."
                )
        return lines


class StalledLearnerHook(PollingHook):
    """Reads every learner's queue size every few seconds beside the
    training step and logs what a StallWatch says (the step itself waits on
    the empty queue, so the check runs in a thread of its own)."""

    interval_secs = 5.0
    thread_name = "stalled-learner"

    def __init__(self, queue_sizes: list[tf.Tensor], watch: StallWatch):
        super().__init__()
        self._queue_sizes = queue_sizes
        self._watch = watch

    def tick(self, session) -> bool:
        try:
            sizes = session.run(self._queue_sizes)
        except Exception as e:  # noqa: BLE001 - the session may be closing
            logging.debug("Reading the queue sizes: %s", e)
            return False
        for line in self._watch.update([int(size) for size in sizes]):
            logging.warning(line)
        return False


def wait_for_tasks_to_finish(
    session,
    confirmed: tf.Tensor,
    tasks: dict[int, str],
    kind: str,
    timeout_secs: float = TASK_FINISH_WAIT_SECS,
    unreachable_secs: float = DEFAULTS["finish_wait_secs"],
) -> list[int]:
    """Waits until every task of `tasks` (index -> HOST:PORT: the actor
    tasks, or the learner tasks other than the chief) has set its entry of
    `confirmed` or is gone; returns those that did neither.

    A task is gone when its host refuses the connection (nothing listens:
    killed, crashed, exited). One that still listens gets `timeout_secs` to
    finish (an actor its unroll), find the end and confirm. One that cannot
    be reached (no answer, no route: a partition, a host restarting its
    network) is not taken for gone: it gets `unreachable_secs`
    (--finish_wait_secs) to come back, and then `timeout_secs` more to
    confirm, while this learner keeps serving the end of training. Without
    the wait an actor would find no learner instead and wait for one until
    its --learner_lost_secs, and a learner task serving a tower would too.
    """
    start = time.monotonic()
    deadlines = {i: start + timeout_secs for i in tasks}
    unreachable_since: dict[int, float] = {}
    while True:
        done = session.run(confirmed)
        now = time.monotonic()
        statuses = {i: ports.task_status(h) for i, h in tasks.items() if not done[i]}
        for i, status in statuses.items():
            if status == ports.UNREACHABLE:
                unreachable_since.setdefault(i, now)
                deadlines[i] = max(deadlines[i], start + unreachable_secs)
            elif status == ports.LISTENING and i in unreachable_since:
                # Back: the usual time to find the end from now.
                deadlines[i] = max(deadlines[i], now + timeout_secs)
                unreachable_since.pop(i)
        pending = [i for i, status in statuses.items() if status != ports.GONE]
        if not pending or all(now >= deadlines[i] for i in pending):
            break
        time.sleep(0.5)
    if tasks:
        confirmed_count = sum(int(done[i] != 0) for i in tasks)
        gone = [i for i, status in statuses.items() if status == ports.GONE]
        line = (
            f"{confirmed_count} of {len(tasks)} {kind} task(s) confirmed the end "
            "of training"
        )
        if gone:
            line += f"; not running: {', '.join(map(str, gone))}"
        if pending:
            reasons = [
                f"{i} (unreachable for {now - unreachable_since[i]:.0f} s; "
                f"--finish_wait_secs={unreachable_secs:g})"
                if i in unreachable_since
                else f"{i} (still running after {now - start:.0f} s)"
                for i in pending
            ]
            logging.warning(
                "%s; never confirmed: %s. Exiting anyway: each exits on its own "
                "once it finds no learner for --learner_lost_secs.",
                line,
                ", ".join(reasons),
            )
        else:
            logging.info("%s.", line)
    return pending
