"""The runner: on one machine, every actor is a thread of the learner's
process that runs its enqueue op in a loop (`ActorRunner`), with inference
batched across actors by the dynamic batching op (`make_inference_fn`).

`build_actors` builds the actors (their environments, actor/envs.py, and
unrolls, actor/unroll.py); `ActorRunnerHook` starts their threads once the
training session exists and stops them at its end. Environment failures go
to each actor's EnvironmentSupervisor (actor/supervisor.py).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence

import tensorflow as tf
from absl import logging

import agent as agent_lib
from actor import envs as actor_envs
from actor.supervisor import (
    EnvironmentRestarts,
    EnvironmentSupervisor,
    start_environments,
)
from actor.unroll import build_vector_actor
from config import EnvironmentConfig, RunConfig
from trajectory import learner_of

try:  # dynamic_batching is optional: without its op, inference is unbatched.
    import dynamic_batching
except ImportError:  # pragma: no cover - the module is part of the repository
    dynamic_batching = None


# env_processes: the actor's environment processes (envs_per_actor /
# envs_per_process of them).
Actor = collections.namedtuple(
    "Actor", "index level_name env_processes output enqueue_op state_initializer"
)


def make_inference_fn(
    agent: agent_lib.Agent, device: str, dynamic: bool = True, envs_per_actor: int = 1
):
    """The actors' one-step agent: dynamically batched when `dynamic`, the op
    is built and each actor has one environment.

    The batcher takes one example per call, so an actor of several
    environments runs the agent itself, on a batch of its envs_per_actor
    examples.

    Returns (function, batched: bool).
    """
    if not dynamic:
        logging.info("--dynamic_batching=false: each actor runs the agent unbatched.")
        return agent, False
    if envs_per_actor > 1:
        logging.info(
            "--envs_per_actor=%d: each actor runs the agent on a batch of its "
            "%d environments (dynamic batching takes one example per call).",
            envs_per_actor,
            envs_per_actor,
        )
        return agent, False
    if dynamic_batching is not None and dynamic_batching.is_available():

        @dynamic_batching.batch_fn
        def batched_inference(last_actions, env_outputs, core_state):
            with tf.device(device):
                return agent(last_actions, env_outputs, core_state)

        return batched_inference, True
    logging.warning(
        "Dynamic batching is not available (its op could not be built; run "
        "`python3 dynamic_batching.py` to see why): each actor runs the agent "
        "on its own, unbatched."
    )
    return agent, False


def build_actors(
    agent: agent_lib.Agent,
    environment: EnvironmentConfig,
    run: RunConfig,
    unroll_length: int,
    queues: Sequence[tf.queue.FIFOQueue],
    inference_fn,
) -> list[Actor]:
    """`run.num_actors` actors, round-robin over the levels, each stepping
    `run.envs_per_actor` environments of its level and enqueuing one unroll
    per environment into its learner's queue (actor i: queues[i mod N],
    trajectory.learner_of). Environment k of actor i has seed
    `run.seed + i * envs_per_actor + k` (`seed + i` with one per actor).
    With `run.envs_per_process` M > 1 (a divisor of envs_per_actor) an
    actor's environments run M to a process (families/vector.py)."""
    actors = []
    for i in range(run.num_actors):
        level_name, seeds = actor_envs.actor_level_and_seeds(
            environment.level_names, i, run.seed, run.envs_per_actor
        )
        with tf.name_scope(f"actor_{i}"):
            processes, envs = actor_envs.actor_environments(
                level_name, seeds, environment, run.envs_per_process
            )
            output, state_initializer = build_vector_actor(
                agent,
                list(envs),
                level_name,
                unroll_length,
                inference_fn,
                # Every step reads the learner's own parameters.
                tf.compat.v1.train.get_global_step(),
            )
            queue = queues[learner_of(i, len(queues))]
            enqueue_op = queue.enqueue_many(tf.nest.flatten(output))
        actors.append(
            Actor(i, level_name, processes, output, enqueue_op, state_initializer)
        )
    return actors


class ActorRunner:
    """Runs one actor's enqueue op in a loop, in its own thread.

    The thread ends quietly when the queue is closed or training stops. When
    the actor's environment process dies or its environment raises, the
    unroll in flight is dropped (its enqueue never ran: nothing half-filled
    reaches the learner), the environment restarts in a fresh process and the
    actor's state is reset (its EnvironmentSupervisor); after
    ENV_FAILURES_BEFORE_GIVING_UP failures in a row without a complete unroll
    in between, an EnvironmentFailedError stops training. Any other error
    stops training through the coordinator (and is re-raised by the training
    session).
    """

    def __init__(
        self,
        actor: Actor,
        restarts: EnvironmentRestarts | None = None,
        shutdown=None,
    ):
        """`shutdown`: the run's ShutdownRequest (None in tests: no signals)."""
        self.actor = actor
        self._shutdown = shutdown
        self._stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.unrolls = 0
        self.supervisor = EnvironmentSupervisor(
            actor.index,
            actor.level_name,
            actor.env_processes,
            restarts,
            after_giving_up="Training stopped after saving a checkpoint (rerun "
            "the same command to resume). ",
        )

    @property
    def environment_restarts(self) -> int:
        return self.supervisor.environment_restarts

    def start(self, session, coord: tf.train.Coordinator) -> threading.Thread:
        self.thread = threading.Thread(
            target=self._loop,
            args=(session, coord),
            name=f"actor-{self.actor.index}",
            daemon=True,
        )
        coord.register_thread(self.thread)
        self.thread.start()
        return self.thread

    def stop(self) -> None:
        """Tells the loop to end; errors from here on are part of stopping."""
        self._stopping.set()

    def wait(self, seconds: float) -> bool:
        """Pauses up to `seconds`; True (at once) when the run is stopping."""
        if self._shutdown is not None:
            return self._shutdown.wait(seconds)
        time.sleep(seconds)
        return False

    def _loop(self, session, coord: tf.train.Coordinator) -> None:
        # Restarts while the environments started, now that a session can
        # tell the frame count.
        self.supervisor.record_restarts(session)
        try:
            while not coord.should_stop() and not self._stopping.is_set():
                try:
                    session.run(self.actor.enqueue_op)
                except tf.errors.OpError as e:
                    if self._should_end(coord):
                        raise
                    if not self.supervisor.is_environment_failure(e):
                        raise
                    self.supervisor.recover(
                        session,
                        self.actor.state_initializer,
                        e,
                        lambda secs: (
                            coord.wait_for_stop(secs) or self._should_end(coord)
                        ),
                    )
                    continue
                self.unrolls += 1
                self.supervisor.unroll_completed()
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            pass  # The queue was closed: training is over.
        except Exception as e:  # noqa: BLE001 - reported through coord
            if self._should_end(coord):
                logging.debug("Actor %d stopped: %s", self.actor.index, e)
                return
            logging.error(
                "Actor %d (%s) failed: %s", self.actor.index, self.actor.level_name, e
            )
            coord.request_stop(e)

    # -- environment failures (see the class docstring) --

    def _should_end(self, coord: tf.train.Coordinator) -> bool:
        # A signal too: SIGTERM sent to a whole process group (systemd,
        # launch.py) kills the environments while the learner stops cleanly.
        return (
            coord.should_stop()
            or self._stopping.is_set()
            or (self._shutdown is not None and self._shutdown.requested)
        )


class ActorRunnerHook(tf.compat.v1.train.SessionRunHook):
    """Starts the actors' environments (through their supervisors, all at
    once) before the session exists, the actor threads once it does; stops
    them at the end.

    Must come before PyProcessHook in the hook list: `end` closes the queue
    (releasing actors blocked in enqueue) before the environments close.
    """

    def __init__(self, runners: list[ActorRunner], close_queue_op: tf.Operation):
        self._runners = runners
        self._close_queue_op = close_queue_op

    def begin(self) -> None:
        if self._runners:
            start_environments(
                [runner.supervisor for runner in self._runners],
                self._runners[0].wait,
            )

    def after_create_session(self, session, coord) -> None:
        for runner in self._runners:
            runner.start(session, coord)
        # When training stops for any reason (also on an exception, when
        # `end` is not called), close the queue so no actor stays blocked.
        closer = threading.Thread(
            target=self._close_on_stop, args=(session, coord), daemon=True
        )
        coord.register_thread(closer)
        closer.start()

    def _close_on_stop(self, session, coord) -> None:
        coord.wait_for_stop()
        self._close_queue(session)

    def _close_queue(self, session) -> None:
        try:
            session.run(self._close_queue_op)
        except Exception as e:  # noqa: BLE001 - the session may be closing
            logging.debug("Closing the queue: %s", e)

    def end(self, session) -> None:
        for runner in self._runners:
            runner.stop()
        self._close_queue(session)
        # An actor in the middle of an unroll finishes it (its enqueue then
        # fails at once); one stuck longer is released when its environment
        # closes next, and ends quietly because it was told to stop.
        deadline = time.time() + 10
        for runner in self._runners:
            if runner.thread is not None:
                runner.thread.join(timeout=max(0.0, deadline - time.time()))
