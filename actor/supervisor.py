"""The supervisor: the one policy for an actor's environment failures.

What an actor survives: its environment process dying, raising or hanging
(killed after `EnvironmentConfig.timeout_secs`). `EnvironmentSupervisor`,
used by the single-machine actor threads (runner.py) and the cluster's actor
tasks (cluster/actor_task.py) alike, then drops the unroll in flight, restarts
the environment in a fresh process and resets the actor's state;
ENV_FAILURES_BEFORE_GIVING_UP failures in a row end the actor with
EnvironmentFailedError. Restarts are counted in TensorBoard
(`EnvironmentRestarts`).
"""

from __future__ import annotations

import threading

import tensorflow as tf
from absl import logging

import py_process
from runtime.errors import EnvironmentFailedError

# Failures of one actor's environment in a row (no complete unroll between
# them, failed restarts included) before training stops; and the pause
# before restart n (n x this many seconds).
ENV_FAILURES_BEFORE_GIVING_UP = 3
ENV_RESTART_DELAY_SECS = 1.0


class EnvironmentSupervisor:
    """One actor's environment processes, and the one policy for their
    failures, used by the single-machine actor threads (ActorRunner) and the
    cluster's actor tasks (cluster/actor_task.py) alike.

    It starts them (`start`, or `start_environments` for several actors at
    once) and restarts them: when an environment process dies or its
    environment raises, the unroll in flight is dropped (its enqueue never
    ran: nothing half-filled reaches the learner); after
    ENV_RESTART_DELAY_SECS x (failures in a row) the failed processes
    restart in fresh processes and the actor's state is reset
    (`state_initializer`, which calls every environment's initial()). A
    process killed by a signal while it starts (the OOM killer, say) is such
    a failure too; a constructor that raises at the first start (a bad level)
    fails the start at once. At the ENV_FAILURES_BEFORE_GIVING_UP-th failure
    in a row without a complete unroll in between (failed restarts count
    too), an EnvironmentFailedError says what happened and `after_giving_up`
    what that means for the run. Restarts are counted, and written to
    TensorBoard when `restarts` (an EnvironmentRestarts of the run) is given.
    """

    def __init__(
        self,
        actor_index: int,
        level_name: str,
        processes,
        restarts: EnvironmentRestarts | None = None,
        after_giving_up: str = "",
    ):
        self.actor_index = actor_index
        self.level_name = level_name
        self.processes = tuple(processes)
        self._restarts = restarts
        self._after_giving_up = after_giving_up
        self.failures_in_a_row = 0
        self.environment_restarts = 0
        # Restarts made before a session existed (while starting), written
        # to TensorBoard by record_restarts once there is one.
        self._unrecorded_restarts = 0

    def failed_processes(self) -> list[py_process.PyProcess]:
        return [p for p in self.processes if not p.alive]

    def is_environment_failure(self, error: Exception) -> bool:
        """Whether `error` comes from one of these environment processes
        (died, or its environment raised), not from the queue closing."""
        if isinstance(error, (tf.errors.CancelledError, tf.errors.OutOfRangeError)):
            return False
        return bool(self.failed_processes())

    def unroll_completed(self) -> None:
        self.failures_in_a_row = 0

    def start(self, wait) -> bool:
        """Starts the environment processes; see `start_environments`."""
        return start_environments([self], wait)

    def recover(self, session, state_initializer, error: Exception, wait) -> bool:
        """Restarts the failed environments and resets the actor.

        `wait(seconds)` pauses before each restart and returns True when the
        run is stopping meanwhile. Returns True once the environments run
        again, False when the run stops first (fresh processes are then
        closed). Raises EnvironmentFailedError at the give-up limit.
        """
        failed = self.failed_processes() or list(self.processes[:1])
        return self._restart(
            failed,
            failure_cause(error, failed[0]),
            wait,
            session,
            reset=lambda: session.run(state_initializer),
            what="Dropped the unroll in flight; restarting the environment",
        )

    def _recover_start(
        self, failed: list[tuple[py_process.PyProcess, Exception]], wait
    ) -> bool:
        """The failures of a first start: a child killed by a signal is
        restarted like any failed environment; anything else is raised."""
        for _, error in failed:
            if not py_process.killed_by_signal(error):
                raise error
        process, error = failed[0]
        return self._restart(
            [p for p, _ in failed],
            failure_cause(error, process),
            wait,
            session=None,
        )

    def _restart(
        self,
        failed,
        cause: str,
        wait,
        session,
        reset=None,
        what: str = "Restarting the environment",
    ) -> bool:
        """The policy: back off, restart the failed processes (and `reset`
        the actor), count; again on failure, until the give-up limit."""
        while True:
            self.failures_in_a_row += 1
            failures = self.failures_in_a_row
            if failures >= ENV_FAILURES_BEFORE_GIVING_UP:
                raise EnvironmentFailedError(
                    f"the environment of actor {self.actor_index} "
                    f"({self.level_name}) failed {failures} times in a row "
                    f"without completing an unroll; last cause: {cause}. "
                    f"{self._after_giving_up}Check the level name, its "
                    f"family's flags and the environment's installation."
                )
            logging.warning(
                "Actor %d (%s): environment failed: %s. %s in a fresh process "
                "(failure %d in a row; training stops at %d).",
                self.actor_index,
                self.level_name,
                cause,
                what,
                failures,
                ENV_FAILURES_BEFORE_GIVING_UP,
            )
            if wait(ENV_RESTART_DELAY_SECS * failures):
                return False
            restarted = self.failed_processes() or failed
            try:
                for process in restarted:
                    process.restart()
                if reset is not None:
                    reset()
            except (py_process.PyProcessError, tf.errors.OpError) as e:
                if wait(0):
                    return False
                cause = failure_cause(e, (self.failed_processes() or restarted)[0])
                continue
            if wait(0):
                # The run stopped meanwhile, maybe after the environments
                # were closed: do not leave these fresh processes behind.
                for process in restarted:
                    process.close()
                return False
            self.environment_restarts += len(restarted)
            self._unrecorded_restarts += len(restarted)
            total = self.record_restarts(session)
            logging.warning(
                "Actor %d (%s): environment restarted (pid %s); training "
                "continues (%d environment restart(s) in this run).",
                self.actor_index,
                self.level_name,
                ", ".join(str(p.pid) for p in restarted),
                total,
            )
            return True

    def record_restarts(self, session) -> int:
        """Writes the restarts not yet in TensorBoard there (with a session
        and an EnvironmentRestarts); returns the run's count so far."""
        if self._restarts is None:
            return self.environment_restarts
        if session is None:
            return self._restarts.count + self._unrecorded_restarts
        total = self._restarts.count
        while self._unrecorded_restarts:
            self._unrecorded_restarts -= 1
            total = self._restarts.record(session)
        return total


def start_environments(supervisors: list[EnvironmentSupervisor], wait) -> bool:
    """Starts the environment processes of `supervisors` at once (their
    constructors run at the same time), each actor's failures handled by its
    own supervisor's policy: a process killed by a signal while it starts is
    restarted and counted like any environment failure, and a constructor
    that raises or a process that exits by itself fails the start at once.
    Then, or at the give-up limit, every process is closed and the error
    raised. `wait(seconds)` as for `recover`; returns False when the run
    stops first.
    """
    processes = [p for supervisor in supervisors for p in supervisor.processes]
    failed = py_process.start_each(processes)
    try:
        for supervisor in supervisors:
            mine = [(p, e) for p, e in failed if p in supervisor.processes]
            if mine and not supervisor._recover_start(mine, wait):
                return False
    except BaseException:
        py_process.close_all(processes)
        raise
    return True


def failure_cause(error: Exception, process: py_process.PyProcess) -> str:
    """One line saying why `process` failed, e.g. 'PyProcess PyProcessAtari (pid
    12) died: killed by signal SIGKILL (while running step())'.

    A PyProcessError says it itself; a TensorFlow error (py_func wrapped the
    PyProcessError into text) defers to the error the process recorded.
    """
    if not isinstance(error, py_process.PyProcessError):
        error = getattr(process, "last_error", None) or error
    text = getattr(error, "message", None) or str(error)
    lines = text.strip().splitlines()
    return lines[0] if lines else type(error).__name__


class EnvironmentRestarts:
    """Counts environment restarts (all actors) and writes the count to
    TensorBoard as `environment_restarts`, at the frame count of each
    restart."""

    def __init__(self, logdir: str, num_env_frames: tf.Variable):
        self._logdir = logdir
        self._num_env_frames = num_env_frames
        self._lock = threading.Lock()
        self.count = 0

    def record(self, session) -> int:
        """Counts one restart; returns the count so far."""
        with self._lock:
            self.count += 1
            count = self.count
        try:
            frames = int(session.run(self._num_env_frames))
        except tf.errors.OpError:  # The session is closing: count it anyway.
            frames = 0
        summary = tf.compat.v1.Summary()
        summary.value.add(tag="environment_restarts", simple_value=count)
        writer = tf.compat.v1.summary.FileWriterCache.get(self._logdir)
        writer.add_summary(summary, frames)
        writer.flush()  # Rare, and worth seeing at once.
        return count
