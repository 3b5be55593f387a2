"""The actors: environments, their unrolls as graph ops, and the threads
that run them.

An actor is an environment in its own process (py_process) plus an unroll of
the agent over it (`build_actor`): each run of its output continues where
the previous one stopped and yields the next `unroll_length` steps. On one
machine every actor is a thread of the learner's process that runs its
enqueue op in a loop (`ActorRunner`), with inference batched across actors
by the dynamic batching op (`make_inference_fn`); a cluster's actor task
builds the same unroll (distributed.py).

What an actor survives: its environment process dying, raising or hanging
(killed after `EnvironmentConfig.timeout_secs`). `EnvironmentSupervisor`,
the one policy for both runners (the actor threads here and the cluster's
actor tasks), then drops the unroll in flight, restarts the environment in a
fresh process and resets the actor's state; ENV_FAILURES_BEFORE_GIVING_UP
failures in a row end the actor with EnvironmentFailedError.
"""

from __future__ import annotations

import collections
import threading
import time

import tensorflow as tf
from absl import logging

import agent as agent_lib
import environments
import py_process
from config import AgentConfig, EnvironmentConfig
from errors import EnvironmentFailedError

try:  # dynamic_batching is optional: without its op, inference is unbatched.
    import dynamic_batching
except ImportError:  # pragma: no cover - the module is part of the repository
    dynamic_batching = None

# Failures of one actor's environment in a row (no complete unroll between
# them, failed restarts included) before training stops; and the pause
# before restart n (n x this many seconds).
ENV_FAILURES_BEFORE_GIVING_UP = 3
ENV_RESTART_DELAY_SECS = 1.0

ActorOutput = collections.namedtuple(
    "ActorOutput", "level_name agent_state env_outputs agent_outputs"
)
# env_processes: the actor's environment processes (envs_per_actor /
# envs_per_process of them).
Actor = collections.namedtuple(
    "Actor", "index level_name env_processes output enqueue_op state_initializer"
)


def create_agent(config: AgentConfig, name: str = "agent") -> agent_lib.Agent:
    """The configured network (with an instruction encoder only where some
    level has instructions)."""
    return agent_lib.Agent(
        config.num_actions,
        torso=config.torso,
        use_instruction=config.use_instruction,
        torso_dtype=config.torso_dtype,
        use_lstm=config.use_lstm,
        num_values=config.num_values,
        name=name,
    )


def create_environment(
    level_name: str, seed: int, config: EnvironmentConfig, is_test: bool = False
) -> tuple[py_process.PyProcess, environments.FlowEnvironment]:
    """The level's environment process (not started) and its FlowEnvironment.

    `level_name` is one of `config.level_names`.
    """
    process = environments.create_environment(
        level_name,
        seed,
        is_test,
        **environments.run_options(level_name, config, is_test),
    )
    _set_timeout(process, config, num_envs=1)
    return process, environments.FlowEnvironment(process.proxy)


def create_environments(
    level_name: str, seeds: list[int], config: EnvironmentConfig, is_test: bool = False
) -> tuple[py_process.PyProcess, environments.FlowEnvironment]:
    """len(seeds) environments of the level in one process (not started) and
    their FlowEnvironment (num_envs=len(seeds))."""
    process = environments.create_environment_vector(
        level_name,
        seeds,
        is_test,
        **environments.run_options(level_name, config, is_test),
    )
    _set_timeout(process, config, num_envs=len(seeds))
    return process, environments.FlowEnvironment(process.proxy, len(seeds))


def _set_timeout(
    process: py_process.PyProcess, config: EnvironmentConfig, num_envs: int
) -> None:
    # A hung environment (a stopped process, a library stuck in a loop) is
    # killed after this long; the actor then restarts it like a dead one. A
    # process of several environments steps them in turn: it gets as many
    # times the time.
    process.call_timeout_s = (config.timeout_secs * num_envs) or None


def actor_environments(
    level_name: str, seeds: list[int], config: EnvironmentConfig, envs_per_process: int
) -> tuple[tuple[py_process.PyProcess, ...], tuple[environments.FlowEnvironment, ...]]:
    """One actor's environments, one per seed: their processes (not started)
    and FlowEnvironments, one environment to a process, or envs_per_process
    (a divisor of len(seeds)) to a process when it is more than 1."""
    if envs_per_process < 1 or len(seeds) % envs_per_process:
        raise ValueError(
            f"envs_per_process={envs_per_process} does not divide the actor's "
            f"{len(seeds)} environments."
        )
    if envs_per_process == 1:
        made = [create_environment(level_name, s, config) for s in seeds]
    else:
        made = [
            create_environments(level_name, seeds[j : j + envs_per_process], config)
            for j in range(0, len(seeds), envs_per_process)
        ]
    processes, envs = zip(*made, strict=True)
    return processes, envs


def _zero_agent_output(
    agent: agent_lib.Agent, batch_size: int
) -> agent_lib.AgentOutput:
    values = [agent.num_values] if agent.num_values else []
    return agent_lib.AgentOutput(
        action=tf.zeros([batch_size], tf.int32),
        policy_logits=tf.zeros([batch_size, agent.num_actions], tf.float32),
        baseline=tf.zeros([batch_size, *values], tf.float32),
    )


def _persistent_variable(initial_value: tf.Tensor) -> tf.Variable:
    """A local (never checkpointed, never shared) resource variable."""
    return tf.compat.v1.Variable(
        initial_value,
        trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        use_resource=True,
        name="actor_state",
    )


def build_actor(
    agent: agent_lib.Agent,
    env: environments.FlowEnvironment,
    level_name: str,
    unroll_length: int,
    inference_fn=None,
) -> tuple[ActorOutput, tf.Operation]:
    """One actor's unroll of `unroll_length` steps over one environment.

    As `build_vector_actor` with a single environment, without its batch
    dimension: ActorOutput(level_name string [], agent_state: core state
    [256] each, env_outputs [T + 1, ...], agent_outputs [T + 1, ...]), and
    the state_initializer. `inference_fn` gets inputs of batch 1.
    """
    output, state_initializer = build_vector_actor(
        agent, [env], level_name, unroll_length, inference_fn
    )
    return tf.nest.map_structure(lambda t: t[0], output), state_initializer


def _stack(nests: list) -> object:
    return tf.nest.map_structure(lambda *ts: tf.stack(ts), *nests)


def swap_leading_axes(t: tf.Tensor) -> tf.Tensor:
    """[A, B, ...] -> [B, A, ...] (time-major <-> batch-major; A static).

    Unstacked and restacked rather than transposed: oneDNN has no uint8
    transpose and logs an error for the frames.
    """
    return tf.stack(tf.unstack(t, axis=0), axis=1)


def build_vector_actor(
    agent: agent_lib.Agent,
    envs: list[environments.FlowEnvironment],
    level_name: str,
    unroll_length: int,
    inference_fn=None,
) -> tuple[ActorOutput, tf.Operation]:
    """One actor's unroll of `unroll_length` steps over the K environments
    of `envs`, as graph ops.

    At each step the agent runs once on the K environments' outputs (one
    inference call of batch K), then the environments step: each
    FlowEnvironment of `envs` is a process of its own (one environment, or
    num_envs of them stepped in turn in one call), and their py_func ops do
    not depend on each other, so they run at the same time. The loop, the
    inference call and the batcher's hop are paid once per K agent steps.
    K = 1 is the reference's actor.

    The environment states, last environment outputs, agent core states and
    last agent outputs persist across unrolls in local variables, so each
    run of the returned tensors continues where the previous one stopped.

    Args:
      agent: the (shared) agent; built here once if it has no variables yet.
      envs: the actor's FlowEnvironments (all of `level_name`); K is the sum
        of their num_envs (1 for an unbatched one).
      level_name: the level, recorded in the output.
      unroll_length: T, the agent steps per unroll.
      inference_fn: (last_actions [K], env_outputs [K, ...], core_state) ->
        (AgentOutput [K, ...], core_state); defaults to `agent` (one step).

    Returns:
      (ActorOutput, state_initializer):
        ActorOutput, batch-major, one unroll per environment (ready for
        `enqueue_many`): level_name string [K], agent_state: core state
        [K, 256] each before the first step, env_outputs [K, T + 1, ...],
        agent_outputs [K, T + 1, ...]. Step 0 is the last step of the
        previous unroll (so consecutive unrolls overlap by one step: the
        learner needs it to pair each action with the observation it came
        from). state_initializer resets this actor's persistent state (and
        calls every environment's `initial`).
    """
    inference_fn = inference_fn or agent
    sizes = [env.num_envs or 1 for env in envs]
    num_envs = sum(sizes)
    starts = [sum(sizes[:i]) for i in range(len(envs))]
    batched = any(env.num_envs is not None for env in envs)

    def join(outputs: list) -> object:
        """The K environments' outputs, one nest of [K, ...] tensors."""
        if not batched:
            return _stack(outputs)
        outputs = [
            o
            if env.num_envs is not None
            else tf.nest.map_structure(lambda t: t[None], o)
            for o, env in zip(outputs, envs, strict=True)
        ]
        if len(outputs) == 1:
            return outputs[0]
        return tf.nest.map_structure(lambda *ts: tf.concat(ts, 0), *outputs)

    def actions_of(actions: tf.Tensor, i: int) -> tf.Tensor:
        """The slice of the K actions that envs[i] takes."""
        if envs[i].num_envs is None:
            return actions[starts[i]]
        return actions[starts[i] : starts[i] + sizes[i]]

    with tf.name_scope("actor"):
        initials = [env.initial() for env in envs]
        initial_values = (
            tuple(env_state for _, env_state in initials),
            join([env_output for env_output, _ in initials]),
            agent.initial_state(num_envs),
            _zero_agent_output(agent, num_envs),
        )
        if not agent.built:
            # Variables can only be created in the main graph, not in the
            # loop body of tf.scan (a function graph): build the agent once.
            agent(initial_values[3].action, initial_values[1], initial_values[2])
        state = tf.nest.map_structure(_persistent_variable, initial_values)
        state_initializer = tf.group(
            [v.initializer for v in tf.nest.flatten(state)], name="reset_actor"
        )
        # read_value() snapshots the state: the assignments below must not
        # change what `first` refers to.
        first = tf.nest.map_structure(lambda v: v.read_value(), state)

        def step(carry, unused_index):
            env_states, env_output, core_state, agent_output = carry
            agent_output, core_state = inference_fn(
                agent_output.action, env_output, core_state
            )
            stepped = [
                env.step(actions_of(agent_output.action, i), env_states[i])
                for i, env in enumerate(envs)
            ]
            env_states = tuple(env_state for _, env_state in stepped)
            env_output = join([output for output, _ in stepped])
            return env_states, env_output, core_state, agent_output

        # outputs: each element stacked over the T steps of the unroll.
        outputs = tf.scan(step, tf.range(unroll_length), initializer=first)
        # Every read of `first` before any assignment: a read that the loop
        # does not consume (the last policy_logits and baseline; the last
        # actions of an inference_fn that reads only their shape) has no
        # data path to the assignments, and resource variables order
        # nothing by themselves, so it could see this unroll's last step.
        with tf.control_dependencies(tf.nest.flatten(first)):
            assignments = tf.nest.map_structure(
                lambda v, t: v.assign(t[-1]), state, outputs
            )
        with tf.control_dependencies(tf.nest.flatten(assignments)):
            _, first_env_output, first_core_state, first_agent_output = first
            _, env_outputs, _, agent_outputs = outputs
            full_env_outputs, full_agent_outputs = tf.nest.map_structure(
                lambda first_t, rest: swap_leading_axes(
                    tf.concat([first_t[None], rest], axis=0)
                ),
                (first_env_output, first_agent_output),
                (env_outputs, agent_outputs),
            )
            output = ActorOutput(
                level_name=tf.fill([num_envs], level_name),
                # An op inside the control dependencies: the state is read
                # before the assignments, the output returned after them.
                agent_state=tf.nest.map_structure(tf.identity, first_core_state),
                env_outputs=full_env_outputs,
                agent_outputs=full_agent_outputs,
            )
            # Nothing is ever differentiated through an actor's unroll.
            output = tf.nest.map_structure(tf.stop_gradient, output)
    return output, state_initializer


def actor_output_specs(
    environment: EnvironmentConfig, agent: AgentConfig, unroll_length: int
):
    """The nest of tf.TensorSpec of one ActorOutput (shapes without batch).

    Built in a throwaway graph with a throwaway agent and an environment
    process that is never started, so the learner can create its queue
    without building (or running) an actor.
    """
    level_name = environment.level_names[0]
    with tf.Graph().as_default():
        scratch_agent = create_agent(agent)
        _, env = create_environment(level_name, seed=0, config=environment)
        output, _ = build_actor(scratch_agent, env, level_name, unroll_length)
        return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), output)


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
    num_actors: int,
    unroll_length: int,
    seed: int,
    queue: tf.queue.FIFOQueue,
    inference_fn,
    envs_per_actor: int = 1,
    envs_per_process: int = 1,
) -> list[Actor]:
    """`num_actors` actors, round-robin over the levels, each stepping
    `envs_per_actor` environments of its level and enqueuing one unroll per
    environment into `queue`. Environment k of actor i has seed
    `seed + i * envs_per_actor + k` (`seed + i` with one per actor). With
    `envs_per_process` M > 1 (a divisor of envs_per_actor) an actor's
    environments run M to a process (environment_vector.py)."""
    actors = []
    for i in range(num_actors):
        level_name, seeds = actor_level_and_seeds(
            environment.level_names, i, seed, envs_per_actor
        )
        with tf.name_scope(f"actor_{i}"):
            processes, envs = actor_environments(
                level_name, seeds, environment, envs_per_process
            )
            output, state_initializer = build_vector_actor(
                agent, list(envs), level_name, unroll_length, inference_fn
            )
            enqueue_op = queue.enqueue_many(tf.nest.flatten(output))
        actors.append(
            Actor(i, level_name, processes, output, enqueue_op, state_initializer)
        )
    return actors


def actor_level_and_seeds(
    level_names, index: int, seed: int, envs_per_actor: int
) -> tuple[str, list[int]]:
    """Actor `index`'s level and its environments' seeds, for the
    single-machine actors and the cluster's actor tasks alike: the levels
    round-robin (actor i plays level i mod len(level_names), as the reference
    assigns them) and environment k of actor i has seed
    `seed + i * envs_per_actor + k`."""
    level_name = level_names[index % len(level_names)]
    return level_name, [
        seed + index * envs_per_actor + k for k in range(envs_per_actor)
    ]


class EnvironmentSupervisor:
    """One actor's environment processes, and the one policy for their
    failures, used by the single-machine actor threads (ActorRunner) and the
    cluster's actor tasks (distributed.py) alike.

    When an environment process dies or its environment raises, the unroll in
    flight is dropped (its enqueue never ran: nothing half-filled reaches the
    learner); after ENV_RESTART_DELAY_SECS x (failures in a row) the failed
    processes restart in fresh processes and the actor's state is reset
    (`state_initializer`, which calls every environment's initial()). At the
    ENV_FAILURES_BEFORE_GIVING_UP-th failure in a row without a complete
    unroll in between (failed restarts count too), an EnvironmentFailedError
    says what happened and `after_giving_up` what that means for the run.
    Restarts are counted, and written to TensorBoard when `restarts` (an
    EnvironmentRestarts of the run) is given.
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

    def recover(self, session, state_initializer, error: Exception, wait) -> bool:
        """Restarts the failed environments and resets the actor.

        `wait(seconds)` pauses before each restart and returns True when the
        run is stopping meanwhile. Returns True once the environments run
        again, False when the run stops first (fresh processes are then
        closed). Raises EnvironmentFailedError at the give-up limit.
        """
        failed = self.failed_processes() or list(self.processes[:1])
        cause = failure_cause(error, failed[0])
        while True:
            self.failures_in_a_row += 1
            failures = self.failures_in_a_row
            if failures >= ENV_FAILURES_BEFORE_GIVING_UP:
                raise EnvironmentFailedError(
                    f"the environment of actor {self.actor_index} "
                    f"({self.level_name}) failed {failures} times in a row "
                    f"without completing an unroll; last cause: {cause}. "
                    f"{self._after_giving_up}Check the level name, "
                    f"--dataset_path and the environment's installation."
                )
            logging.warning(
                "Actor %d (%s): environment failed: %s. Dropped the unroll in "
                "flight; restarting the environment in a fresh process "
                "(failure %d in a row; training stops at %d).",
                self.actor_index,
                self.level_name,
                cause,
                failures,
                ENV_FAILURES_BEFORE_GIVING_UP,
            )
            if wait(ENV_RESTART_DELAY_SECS * failures):
                return False
            restarted = self.failed_processes() or failed
            try:
                for process in restarted:
                    process.restart()
                session.run(state_initializer)
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
            total = self.environment_restarts
            if self._restarts is not None:
                for _ in restarted:
                    total = self._restarts.record(session)
            logging.warning(
                "Actor %d (%s): environment restarted (pid %s); training "
                "continues (%d environment restart(s) in this run).",
                self.actor_index,
                self.level_name,
                ", ".join(str(p.pid) for p in restarted),
                total,
            )
            return True


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

    def _loop(self, session, coord: tf.train.Coordinator) -> None:
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
    """Starts the actor threads once the session exists; stops them at end.

    Must come before PyProcessHook in the hook list: `end` closes the queue
    (releasing actors blocked in enqueue) before the environments close.
    """

    def __init__(self, runners: list[ActorRunner], close_queue_op: tf.Operation):
        self._runners = runners
        self._close_queue_op = close_queue_op

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


def failure_cause(error: Exception, process: py_process.PyProcess) -> str:
    """One line saying why `process` failed, e.g. 'PyProcess AtariEnv (pid
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
