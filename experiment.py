"""IMPALA: actors, learner, single-machine training and test mode.

Reading order (top to bottom):
  flags and their validation     validate_flags, resolve_levels
  devices and sessions           learner_device, session_config,
                                 create_training_session, check_checkpoint_fits
  the actor                      create_agent, create_environment, build_actor,
                                 actor_output_specs, make_inference_fn
  the learner's batch             stack_unrolls, time_major (the loss and
                                 update: learner.py)
  running actors                 ActorRunner (one thread per actor),
                                 ActorRunnerHook (starts and stops them)
  logging                        ProgressLogger, EpisodeLogger
  modes                          build_actors, create_queue,
                                 build_learner_pipeline, run_learner, train,
                                 test, main

Single-machine training (--task=-1): every actor is a Python thread of this
process that runs its own `enqueue` op in a loop (`ActorRunner`); each unroll
steps an environment in its own child process (py_process). The learner
dequeues `batch_size` unrolls, stages them (one step of policy lag), unrolls
the agent over them and applies one RMSProp update with the V-trace loss.
The session is in-process: no TensorFlow server, so no network port.
"""

import collections
import contextlib
import glob
import json
import os
import re
import signal
import sys
import threading
import time

# Before TensorFlow loads: hide the C++ runtime's INFO and WARNING lines (CPU
# feature banners, "enqueue cancelled" at every shutdown) so that what this
# script prints stays readable; errors still show. This script logs the device
# choice itself. Set TF_CPP_MIN_LOG_LEVEL=0 to see everything.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import agent as agent_lib  # noqa: E402
import atari57  # noqa: E402
import cluster  # noqa: E402
import dmlab30  # noqa: E402
import environments  # noqa: E402
import learner as learner_lib  # noqa: E402
import py_process  # noqa: E402

try:  # dynamic_batching is optional: without its op, inference is unbatched.
    import dynamic_batching  # noqa: E402
except ImportError:  # pragma: no cover - the module is part of the repository
    dynamic_batching = None

# -- flags ---------------------------------------------------------------------

DEFAULT_LEVEL = "explore_goal_locations_small"
FALLBACK_LEVEL = "atari/pong"

flags.DEFINE_string("logdir", "/tmp/agent", "Directory for checkpoints and logs.")
flags.DEFINE_enum("mode", "train", ["train", "test"], "Training or test mode.")
flags.DEFINE_integer("test_num_episodes", 10, "Number of episodes per level (test).")

# Cluster: task -1 is single-machine training (actors are threads here).
flags.DEFINE_enum("job_name", "learner", ["learner", "actor"], "Job name.")
flags.DEFINE_integer("task", -1, "Task id; -1 for single-machine training.")
flags.DEFINE_string("learner_host", "localhost:8000", "Learner address (host:port).")
flags.DEFINE_string(
    "actor_hosts", "", "Comma-separated actor addresses; default localhost:8001+i."
)

# Training.
flags.DEFINE_integer(
    "total_environment_frames", int(1e9), "Total environment frames to train for."
)
flags.DEFINE_integer("num_actors", 4, "Number of actors.")
flags.DEFINE_integer("batch_size", 2, "Batch size (unrolls per learner step).")
flags.DEFINE_integer("unroll_length", 100, "Unroll length in agent steps.")
flags.DEFINE_integer("num_action_repeats", 4, "Environment frames per agent step.")
flags.DEFINE_integer("seed", 1, "Random seed.")
flags.DEFINE_enum("agent", "deep", list(agent_lib.TORSOS), "Agent network torso.")
flags.DEFINE_bool(
    "dynamic_batching",
    True,
    "Batch the actors' inference calls into one forward pass (the dynamic "
    "batching op); false runs the agent once per actor step, unbatched.",
)

# Loss.
flags.DEFINE_float("entropy_cost", 0.00025, "Entropy cost/multiplier.")
flags.DEFINE_float("baseline_cost", 0.5, "Baseline cost/multiplier.")
flags.DEFINE_float("discounting", 0.99, "Discounting factor.")
flags.DEFINE_enum(
    "reward_clipping", "abs_one", ["abs_one", "soft_asymmetric"], "Reward clipping."
)

# Environment.
flags.DEFINE_string(
    "dataset_path", "", "Path to the dataset needed for psychlab (DeepMind Lab)."
)
flags.DEFINE_string(
    "level_name",
    DEFAULT_LEVEL,
    "Level: a DeepMind Lab level, 'dmlab30', 'atari/<game>' or 'atari57'. The "
    "default falls back to atari/pong when DeepMind Lab is not installed.",
)
flags.DEFINE_integer("width", 96, "Frame width (DeepMind Lab).")
flags.DEFINE_integer("height", 72, "Frame height (DeepMind Lab).")

# Optimizer.
flags.DEFINE_float("learning_rate", 0.00048, "Learning rate.")
flags.DEFINE_float("decay", 0.99, "RMSProp optimizer decay.")
flags.DEFINE_float("momentum", 0.0, "RMSProp momentum.")
flags.DEFINE_float("epsilon", 0.1, "RMSProp epsilon.")
flags.DEFINE_float(
    "max_grad_norm",
    0.0,
    "Clip gradients to this global norm; 0 turns clipping off (the paper's "
    "Atari runs used 40).",
)

# Checkpoints and fault handling.
flags.DEFINE_integer(
    "save_checkpoint_secs",
    600,
    "Seconds between checkpoints; one is also written when training starts, "
    "when it ends and on SIGINT/SIGTERM.",
)
flags.DEFINE_integer(
    "environment_timeout_secs",
    600,
    "Seconds an environment process may take to answer one call (a step, or "
    "the first observation of a level, which DeepMind Lab may need minutes to "
    "compile) before it is taken for hung, killed and restarted; 0 = no limit.",
)
flags.DEFINE_integer(
    "testonly_nan_reward_at_frame",
    0,
    "For tests only: from this environment frame on, the learner sees NaN "
    "rewards (to exercise the NaN/Inf guard); 0 = off.",
)

FLAGS = flags.FLAGS

SUMMARY_SECS = 30
PROGRESS_SECS = 10
RECENT_EPISODES = 100
TEST_RESULTS_FILE = "test_results.json"

ActorOutput = collections.namedtuple(
    "ActorOutput", "level_name agent_state env_outputs agent_outputs"
)
LearnerPipeline = collections.namedtuple(
    "LearnerPipeline", "batch learner stage_op queue_size"
)
Actor = collections.namedtuple(
    "Actor", "index level_name env_process output enqueue_op state_initializer"
)


class FlagError(ValueError):
    """A flag value this program cannot run with; the message says the fix."""


# -- flags and their validation -------------------------------------------------


def validate_flags(f=FLAGS) -> None:
    """Checks flag values before anything is built.

    Raises:
      FlagError: with a one-line message naming the flag, the value and a fix.
    """

    def require(ok: bool, flag: str, fix: str) -> None:
        if not ok:
            raise FlagError(f"--{flag}={getattr(f, flag)}: {fix}")

    require(f.batch_size > 0, "batch_size", "must be >= 1 (unrolls per update).")
    require(f.unroll_length > 0, "unroll_length", "must be >= 1.")
    require(f.num_action_repeats > 0, "num_action_repeats", "must be >= 1.")
    require(f.width > 0, "width", "must be >= 1.")
    require(f.height > 0, "height", "must be >= 1.")
    require(0.0 <= f.discounting <= 1.0, "discounting", "must be in [0, 1].")
    require(f.learning_rate >= 0.0, "learning_rate", "must be >= 0.")
    require(f.max_grad_norm >= 0.0, "max_grad_norm", "must be >= 0 (0 turns it off).")
    require(f.epsilon > 0.0, "epsilon", "must be > 0.")
    require(f.entropy_cost >= 0.0, "entropy_cost", "must be >= 0.")
    require(f.baseline_cost >= 0.0, "baseline_cost", "must be >= 0.")
    require(f.save_checkpoint_secs > 0, "save_checkpoint_secs", "must be >= 1.")
    require(
        f.environment_timeout_secs >= 0,
        "environment_timeout_secs",
        "must be >= 0 (0: wait for an environment forever).",
    )
    require(
        f.testonly_nan_reward_at_frame >= 0,
        "testonly_nan_reward_at_frame",
        "must be >= 0 (0 turns it off).",
    )
    if f.mode == "test":
        require(f.test_num_episodes > 0, "test_num_episodes", "must be >= 1.")
        require(
            f.task < 0,
            "task",
            "test mode runs in one process; drop --job_name and --task.",
        )
        return
    require(
        f.total_environment_frames > 0,
        "total_environment_frames",
        "training needs a positive frame target, e.g. "
        "--total_environment_frames=1000000000.",
    )
    # The learner takes batch_size unrolls per update from a queue the actors
    # fill one unroll at a time, so any number of actors >= 1 fills any batch
    # (an actor contributes several consecutive unrolls when batch_size >
    # num_actors); with no actor the learner would wait forever.
    require(
        f.num_actors >= 1,
        "num_actors",
        f"the learner needs at least one actor to fill its batches of "
        f"{f.batch_size} unrolls; use --num_actors=1 or more.",
    )


def resolve_level_name(
    level_name: str, is_default: bool, deepmind_lab_available: bool
) -> tuple[str, str | None]:
    """Returns (level name to use, warning or None).

    The default level is a DeepMind Lab level; without DeepMind Lab it falls
    back to atari/pong so that a fresh machine can train right away. A
    DeepMind Lab level named explicitly stays an error later on.
    """
    if is_default and not deepmind_lab_available:
        return FALLBACK_LEVEL, (
            f"DeepMind Lab is not installed, so the default level "
            f"{DEFAULT_LEVEL!r} cannot run: using {FALLBACK_LEVEL!r} "
            f"instead. To use DeepMind Lab, build it from source (see the "
            f"README / Dockerfile) or choose a level with --level_name."
        )
    return level_name, None


def resolve_levels(f=FLAGS) -> tuple[str, list[str]]:
    """Returns (level name, expanded level names) for the flags.

    Raises:
      FlagError: unknown level, or a DeepMind Lab level without DeepMind Lab.
    """
    level_name, warning = resolve_level_name(
        f.level_name,
        f["level_name"].using_default_value,
        environments.deepmind_lab_available(),
    )
    if warning:
        logging.warning(warning)
    try:
        level_names = environments.expand_level_names(
            level_name, is_test=f.mode == "test"
        )
    except ValueError as e:
        raise FlagError(str(e)) from None
    if not environments.is_atari_level(level_name) and not (
        environments.deepmind_lab_available()
    ):
        raise FlagError(
            f"--level_name={level_name}: a DeepMind Lab level, but DeepMind Lab "
            f"is not installed; build it from source (see the README / "
            f"Dockerfile) or use an Atari level such as --level_name=atari/pong."
        )
    return level_name, level_names


def learner_config_from_flags(f=FLAGS) -> learner_lib.LearnerConfig:
    return learner_lib.LearnerConfig(
        batch_size=f.batch_size,
        unroll_length=f.unroll_length,
        num_action_repeats=f.num_action_repeats,
        total_environment_frames=f.total_environment_frames,
        discounting=f.discounting,
        reward_clipping=f.reward_clipping,
        baseline_cost=f.baseline_cost,
        entropy_cost=f.entropy_cost,
        learning_rate=f.learning_rate,
        decay=f.decay,
        momentum=f.momentum,
        epsilon=f.epsilon,
        max_grad_norm=f.max_grad_norm,
    )


# -- devices and sessions -------------------------------------------------------


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


def session_config() -> tf.compat.v1.ConfigProto:
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if (
        FLAGS.is_parsed()
        and FLAGS.task == -1
        and FLAGS.mode == "train"
        and "TF_NUM_INTRAOP_THREADS" not in os.environ
    ):
        # Single-machine training: the actors' many small kernels (one-step
        # inference on batches of 1-8) run faster on one thread each, and
        # the actors and the learner keep all cores busy between them;
        # splitting every kernel over the intra-op pool cost more than it
        # saved (2 cores: +7-16% frames/s for the shallow agent, +28-32% for
        # the deep one; BENCHMARKS.md, "Profile"). TF_NUM_INTRAOP_THREADS,
        # when set, still decides.
        config.intra_op_parallelism_threads = 1
    # Take GPU memory as needed rather than all of it up front.
    config.gpu_options.allow_growth = True
    return config


def create_training_session(
    hooks: list,
    logdir: str,
    master: str = "",
    is_chief: bool = True,
    config: tf.compat.v1.ConfigProto | None = None,
) -> tf.compat.v1.train.MonitoredSession:
    """A MonitoredTrainingSession: restores/initialises, checkpoints, summaries.

    master='' is an in-process session (no server, no port); a distributed
    learner passes its server's target and `config` (its device filters).
    Checkpoints every
    --save_checkpoint_secs, at the start and at the end (the saver hook's
    `end`), with `checkpoint_saver()` (each file written atomically).
    """
    return tf.compat.v1.train.MonitoredTrainingSession(
        master=master,
        is_chief=is_chief,
        checkpoint_dir=logdir,
        scaffold=tf.compat.v1.train.Scaffold(saver=checkpoint_saver()),
        save_checkpoint_secs=FLAGS.save_checkpoint_secs,
        save_summaries_secs=SUMMARY_SECS,
        log_step_count_steps=0,  # ProgressLogger reports speed instead.
        hooks=hooks,
        config=config if config is not None else session_config(),
    )


def check_checkpoint_fits(checkpoint: str | None) -> None:
    """Raises FlagError when `checkpoint` cannot restore this graph's variables.

    A --logdir holding a run of another agent or level would otherwise fail
    late: TensorFlow restores resource variables without checking shapes.
    """
    if checkpoint is None:
        return
    saved = dict(tf.train.list_variables(checkpoint))
    for variable in tf.compat.v1.global_variables():
        name, shape = variable.op.name, variable.shape.as_list()
        problem = None
        if name not in saved:
            problem = f"it has no variable {name}"
        elif list(saved[name]) != shape:
            problem = f"{name} has shape {list(saved[name])} there, {shape} here"
        if problem:
            raise FlagError(
                f"--logdir={FLAGS.logdir}: its checkpoint does not fit this model "
                f"(--agent={FLAGS.agent}, --level_name={FLAGS.level_name}): "
                f"{problem}. Use the flags it was trained with, or another --logdir."
            )


# -- the actor ------------------------------------------------------------------


def create_agent(
    num_actions: int, level_names: list[str], name: str = "agent"
) -> agent_lib.Agent:
    """The --agent network, with an instruction encoder only where some level
    has instructions (environments.has_instructions)."""
    return agent_lib.Agent(
        num_actions,
        torso=FLAGS.agent,
        use_instruction=environments.has_instructions(level_names),
        name=name,
    )


def create_environment(
    level_name: str, seed: int, level_names: list[str], is_test: bool = False
) -> tuple[py_process.PyProcess, environments.FlowEnvironment]:
    """The level's environment process (not started) and its FlowEnvironment."""
    process = environments.create_environment(
        level_name,
        seed=seed,
        is_test=is_test,
        num_action_repeats=FLAGS.num_action_repeats,
        width=FLAGS.width,
        height=FLAGS.height,
        dataset_path=FLAGS.dataset_path,
        full_action_space=environments.uses_full_action_space(level_names),
        # Training on Atari ends an "episode" at each lost life (the usual
        # DQN/IMPALA setup); test mode always plays whole games.
        episode_life=not is_test,
    )
    # A hung environment (a stopped process, a library stuck in a loop) is
    # killed after this long; the actor then restarts it like a dead one.
    process.call_timeout_s = FLAGS.environment_timeout_secs or None
    return process, environments.FlowEnvironment(process.proxy)


def _add_batch_dim(nest):
    return tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), nest)


def _zero_agent_output(num_actions: int, batch_size: int) -> agent_lib.AgentOutput:
    return agent_lib.AgentOutput(
        action=tf.zeros([batch_size], tf.int32),
        policy_logits=tf.zeros([batch_size, num_actions], tf.float32),
        baseline=tf.zeros([batch_size], tf.float32),
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
    """One actor's unroll of `unroll_length` steps, as graph ops.

    The environment state, last environment output, agent core state and last
    agent output persist across unrolls in local variables, so each run of
    the returned tensors continues where the previous one stopped.

    Args:
      agent: the (shared) agent; built here once if it has no variables yet.
      env: the actor's FlowEnvironment.
      level_name: the level, recorded in the output.
      unroll_length: T, the agent steps per unroll.
      inference_fn: (last_actions [1], env_outputs [1, ...], core_state) ->
        (AgentOutput [1, ...], core_state); defaults to `agent` (one step).

    Returns:
      (ActorOutput, state_initializer):
        ActorOutput(level_name string [], agent_state: core state [256] each
        before the first step, env_outputs [T + 1, ...],
        agent_outputs [T + 1, ...]), where step 0 is the last step of the
        previous unroll (so consecutive unrolls overlap by one step: the
        learner needs it to pair each action with the observation it came
        from); state_initializer resets this actor's persistent state (and
        calls the environment's `initial`).
    """
    inference_fn = inference_fn or agent
    with tf.name_scope("actor"):
        initial_env_output, initial_env_state = env.initial()
        initial_values = (
            initial_env_state,
            initial_env_output,
            agent.initial_state(1),
            _zero_agent_output(agent.num_actions, 1),
        )
        if not agent.built:
            # Variables can only be created in the main graph, not in the
            # loop body of tf.scan (a function graph): build the agent once.
            agent(
                initial_values[3].action,
                _add_batch_dim(initial_env_output),
                initial_values[2],
            )
        state = tf.nest.map_structure(_persistent_variable, initial_values)
        state_initializer = tf.group(
            [v.initializer for v in tf.nest.flatten(state)], name="reset_actor"
        )
        # read_value() snapshots the state: the assignments below must not
        # change what `first` refers to.
        first = tf.nest.map_structure(lambda v: v.read_value(), state)

        def step(carry, unused_index):
            env_state, env_output, core_state, agent_output = carry
            agent_output, core_state = inference_fn(
                agent_output.action, _add_batch_dim(env_output), core_state
            )
            env_output, env_state = env.step(agent_output.action[0], env_state)
            return env_state, env_output, core_state, agent_output

        # outputs: each element stacked over the T steps of the unroll.
        outputs = tf.scan(step, tf.range(unroll_length), initializer=first)
        assignments = tf.nest.map_structure(
            lambda v, t: v.assign(t[-1]), state, outputs
        )
        with tf.control_dependencies(tf.nest.flatten(assignments)):
            _, first_env_output, first_core_state, first_agent_output = first
            _, env_outputs, _, agent_outputs = outputs
            # Drop the batch dimension of 1 used for inference.
            first_core_state = tf.nest.map_structure(lambda t: t[0], first_core_state)
            first_agent_output = tf.nest.map_structure(
                lambda t: t[0], first_agent_output
            )
            agent_outputs = tf.nest.map_structure(lambda t: t[:, 0], agent_outputs)
            full_env_outputs, full_agent_outputs = tf.nest.map_structure(
                lambda first_t, rest: tf.concat([first_t[None], rest], axis=0),
                (first_env_output, first_agent_output),
                (env_outputs, agent_outputs),
            )
            output = ActorOutput(
                level_name=tf.constant(level_name),
                agent_state=first_core_state,
                env_outputs=full_env_outputs,
                agent_outputs=full_agent_outputs,
            )
            # Nothing is ever differentiated through an actor's unroll.
            output = tf.nest.map_structure(tf.stop_gradient, output)
    return output, state_initializer


def actor_output_specs(level_name: str, level_names: list[str], num_actions: int):
    """The nest of tf.TensorSpec of one ActorOutput (shapes without batch).

    Built in a throwaway graph with a throwaway agent and an environment
    process that is never started, so the learner can create its queue
    without building (or running) an actor.
    """
    with tf.Graph().as_default():
        scratch_agent = create_agent(num_actions, level_names)
        _, env = create_environment(level_name, seed=0, level_names=level_names)
        output, _ = build_actor(scratch_agent, env, level_name, FLAGS.unroll_length)
        return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), output)


def make_inference_fn(agent: agent_lib.Agent, device: str):
    """The actors' one-step agent: dynamically batched when the op is built.

    Returns (function, batched: bool).
    """
    if not FLAGS.dynamic_batching:
        logging.info("--dynamic_batching=false: each actor runs the agent unbatched.")
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


# -- the learner's batch (its loss and update are in learner.py) ---------------


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

    Unstacked on axis 0 and restacked on axis 1 rather than transposed, for
    the same reason as in `stack_unrolls`; B must be static.
    """

    def swap(t: tf.Tensor) -> tf.Tensor:
        return tf.stack(tf.unstack(t, axis=0), axis=1)

    return batch._replace(
        env_outputs=tf.nest.map_structure(swap, batch.env_outputs),
        agent_outputs=tf.nest.map_structure(swap, batch.agent_outputs),
    )


# -- running actors -------------------------------------------------------------


class ActorRunner:
    """Runs one actor's enqueue op in a loop, in its own thread.

    The thread ends quietly when the queue is closed or training stops. When
    the actor's environment process dies or its environment raises, the
    unroll in flight is dropped (its enqueue never ran: nothing half-filled
    reaches the learner), the environment restarts in a fresh process and the
    actor's state is reset (`_recover_environment`); after
    ENV_FAILURES_BEFORE_GIVING_UP failures in a row without a complete unroll
    in between, an EnvironmentFailedError stops training. Any other error
    stops training through the coordinator (and is re-raised by the training
    session).
    """

    def __init__(self, actor: Actor, restarts: "EnvironmentRestarts | None" = None):
        self.actor = actor
        self._restarts = restarts
        self._stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.unrolls = 0
        self.environment_restarts = 0
        self._failures_in_a_row = 0

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
                    if not self._environment_failed(e, coord):
                        raise
                    self._recover_environment(session, coord, e)
                    continue
                self.unrolls += 1
                self._failures_in_a_row = 0
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
        # SHUTDOWN too: SIGTERM sent to a whole process group (systemd,
        # launch.py) kills the environments while the learner stops cleanly.
        return coord.should_stop() or self._stopping.is_set() or SHUTDOWN.requested

    def _environment_failed(self, error: Exception, coord) -> bool:
        """True when `error` comes from this actor's environment process
        (died, or its environment raised) while training goes on."""
        if isinstance(error, (tf.errors.CancelledError, tf.errors.OutOfRangeError)):
            return False
        return not self._should_end(coord) and not self.actor.env_process.alive

    def _recover_environment(self, session, coord, error: Exception) -> None:
        """Restarts the environment in a fresh process and resets the actor.

        The actor's persistent state (environment state and output, agent
        core state, last action) is re-initialised with its
        state_initializer, which calls the new environment's `initial()`.
        Restarts wait 1 s, 2 s, ... first (and stop waiting when training
        stops). Raises EnvironmentFailedError on the
        ENV_FAILURES_BEFORE_GIVING_UP-th failure in a row (failed restarts
        count too).
        """
        actor, process = self.actor, self.actor.env_process
        cause = environment_failure_cause(error)
        while True:
            self._failures_in_a_row += 1
            failures = self._failures_in_a_row
            if failures >= ENV_FAILURES_BEFORE_GIVING_UP:
                raise EnvironmentFailedError(
                    f"the environment of actor {actor.index} ({actor.level_name}) "
                    f"failed {failures} times in a row without completing an "
                    f"unroll; last cause: {cause}. Training stopped after "
                    f"saving a checkpoint (rerun the same command to resume). "
                    f"Check the level name, --dataset_path and the environment's "
                    f"installation."
                )
            logging.warning(
                "Actor %d (%s): environment failed: %s. Dropped the unroll in "
                "flight; restarting the environment in a fresh process "
                "(failure %d in a row; training stops at %d).",
                actor.index,
                actor.level_name,
                cause,
                failures,
                ENV_FAILURES_BEFORE_GIVING_UP,
            )
            if coord.wait_for_stop(ENV_RESTART_DELAY_SECS * failures):
                return
            if self._should_end(coord):
                return
            try:
                process.restart()
                session.run(actor.state_initializer)
            except (py_process.PyProcessError, tf.errors.OpError) as e:
                if self._should_end(coord):
                    return
                cause = environment_failure_cause(e)
                continue
            if self._should_end(coord):
                # Training stopped meanwhile, maybe after the environments
                # were closed: do not leave this fresh process behind.
                process.close()
                return
            self.environment_restarts += 1
            total = (
                self._restarts.record(session)
                if self._restarts is not None
                else self.environment_restarts
            )
            logging.warning(
                "Actor %d (%s): environment restarted (pid %s); training "
                "continues (%d environment restart(s) in this run).",
                actor.index,
                actor.level_name,
                process.pid,
                total,
            )
            return


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


# -- resilience: environment restarts, NaN guard, checkpoints, signals ----------
#
# What a long run survives (and how it ends when it cannot go on):
#   * an environment process that dies or raises: ActorRunner restarts it
#     (EnvironmentRestarts counts restarts for TensorBoard); repeated failures
#     end training with EnvironmentFailedError;
#   * a NaN/Inf loss or gradient: learner.guard_finite_update fails the step before
#     the update, NonFiniteUpdateError ends training without saving;
#   * a killed learner or a damaged newest checkpoint: checkpoint_saver
#     writes every file atomically, resume_checkpoint picks the newest
#     checkpoint that reads back whole (CheckpointError if none does);
#   * SIGINT/SIGTERM: ShutdownRequest ends training cleanly, with a final
#     checkpoint, and the process exits with 128 + the signal number.

# Failures of one actor's environment in a row (no complete unroll between
# them, failed restarts included) before training stops; and the pause
# before restart n (n x this many seconds).
ENV_FAILURES_BEFORE_GIVING_UP = 3
ENV_RESTART_DELAY_SECS = 1.0
# Checkpoints kept in --logdir (older ones are deleted as new ones come); at
# least 2, so that a damaged newest checkpoint leaves one to resume from.
CHECKPOINTS_TO_KEEP = 5


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""


class EnvironmentFailedError(TrainingError):
    """An actor's environment failed repeatedly, even in fresh processes."""


class NonFiniteUpdateError(TrainingError):
    """A learner step had a NaN/Inf loss or gradient; it was not applied."""


class CheckpointError(TrainingError):
    """--logdir holds checkpoint files, but none of them can be restored."""


def environment_failure_cause(error: Exception) -> str:
    """The line of a (TensorFlow-wrapped) PyProcess error saying what happened,
    e.g. 'PyProcess AtariEnv (pid 12) died: killed by signal SIGKILL (while
    running step())'."""
    text = getattr(error, "message", None) or str(error)
    match = re.search(r"PyProcess \S+ \(pid \d+\)[^\n]*", text)
    if match:
        return match.group(0).strip()
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


def raise_if_non_finite(error: tf.errors.OpError) -> None:
    """Raises NonFiniteUpdateError when `error` is learner.guard_finite_update's."""
    text = error.message or ""
    if learner_lib.NON_FINITE_MARKER not in text:
        return

    def field(name: str) -> str:
        match = re.search(rf"\[{re.escape(name)}\] \[([^\]]*)\]", text)
        return match.group(1) if match else "?"

    latest = tf.train.latest_checkpoint(FLAGS.logdir)
    kept = (
        f"the last checkpoint, {latest}, holds the last good parameters"
        if latest
        else "no checkpoint had been written yet"
    )
    raise NonFiniteUpdateError(
        f"{learner_lib.NON_FINITE_MARKER} in the learner step at {field('frames:')} "
        f"environment frames (total loss {field('total loss:')}, gradient global "
        f"norm {field('gradient global norm:')}). Training stopped before "
        f"applying this update, and nothing was saved after it: {kept}. Find "
        f"the cause (rewards or observations of the environment, "
        f"--learning_rate, --max_grad_norm), then rerun to resume from it."
    ) from None


def testonly_nan_rewards(unrolls: ActorOutput, at_frame: int) -> ActorOutput:
    """--testonly_nan_reward_at_frame: NaN rewards in the learner's batches
    from frame `at_frame` on. Real environments never give NaN rewards; this
    lets tests show the NaN guard at work."""
    frames = tf.compat.v1.train.get_or_create_global_step()
    rewards = unrolls.env_outputs.reward
    nan = tf.fill(tf.shape(rewards), tf.constant(np.nan, rewards.dtype))
    rewards = tf.where(frames >= at_frame, nan, rewards)
    return unrolls._replace(env_outputs=unrolls.env_outputs._replace(reward=rewards))


def checkpoint_saver() -> tf.compat.v1.train.Saver:
    """The training checkpoints' saver: keeps CHECKPOINTS_TO_KEEP, not sharded.

    Why not sharded (the Scaffold's default): checked on TensorFlow 2.21 by
    tracing the file system calls of saves (strace -f -e trace=openat,rename),
    a non-sharded V2 save writes `<prefix>.data-00000-of-00001`, then
    `<prefix>.index`, each to a `.tempstate<random>` file renamed into place,
    then the `checkpoint` state file (checkpoint_management's
    atomic_write_string_to_file: a temporary file and a rename), then the
    `.meta` file likewise. So a SIGKILL at any moment leaves every file whole,
    and the state file always names a complete checkpoint (at worst a
    `.tempstate` file or a data file without its index is left over, which
    is never read). The sharded saver writes its shards to a `<prefix>_temp`
    directory the same way, but then writes the merged `<prefix>.index` in
    place (opened with O_TRUNC, no rename): killed during that write, it
    leaves a truncated index, and since every resume re-saves the restored
    step under the same name, that could damage the very checkpoint the
    state file names. (Renames are atomic against a killed process; without
    fsync they are not guaranteed against a power loss.)
    """
    # Relative paths in the `checkpoint` state file: a --logdir that was
    # moved or copied (another disk, another host) still names its files.
    return tf.compat.v1.train.Saver(
        sharded=False,
        max_to_keep=CHECKPOINTS_TO_KEEP,
        allow_empty=True,
        save_relative_paths=True,
    )


def _checkpoint_step(prefix: str) -> int:
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def find_checkpoints(logdir: str) -> list[str]:
    """Checkpoint prefixes in `logdir` (absolute), newest (highest step) first:
    every `<prefix>.index` file and whatever the `checkpoint` file names."""
    logdir = os.path.abspath(logdir)
    prefixes = {
        path[: -len(".index")]
        for path in glob.glob(os.path.join(glob.escape(logdir), "*.index"))
    }
    try:
        state = tf.train.get_checkpoint_state(logdir)
    except ValueError:  # A state file naming no checkpoint.
        state = None
    if state is not None:
        named = [state.model_checkpoint_path, *state.all_model_checkpoint_paths]
        prefixes.update(os.path.join(logdir, p) for p in named)
    return sorted(prefixes, key=lambda p: (_checkpoint_step(p), p), reverse=True)


def checkpoint_problem(prefix: str) -> str | None:
    """None when checkpoint `prefix` reads back whole, else what is wrong.

    Reads every tensor: TensorFlow checks each one's CRC32C on read, so a
    truncated, partly overwritten or missing file shows up here and not
    half-way through a restore. A checkpoint holding NaN/Inf values counts
    as damaged too.
    """
    if not os.path.exists(prefix + ".index"):
        return f"its index file {prefix}.index is missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name, dtype in reader.get_variable_to_dtype_map().items():
            value = reader.get_tensor(name)
            if dtype.is_floating and not np.all(np.isfinite(value)):
                return f"variable {name} holds NaN or infinite values"
    except Exception as e:  # noqa: BLE001 - OpError, IndexError on short files...
        lines = (getattr(e, "message", None) or str(e)).strip().splitlines()
        return f"{type(e).__name__}: {lines[0] if lines else ''}"
    return None


def newest_whole_checkpoint(logdir: str, candidates: list[str], use: str) -> str:
    """The first of `candidates` (newest first) that reads back whole.

    Logs a warning naming each newer, damaged one (left in place: nothing is
    ever deleted here); `use` says what is done with the chosen one, e.g.
    'resuming from'.

    Raises:
      CheckpointError: none of them reads back whole.
    """
    damaged = []
    for prefix in candidates:
        problem = checkpoint_problem(prefix)
        if problem is None:
            break
        damaged.append(f"{prefix} ({problem})")
    else:
        raise CheckpointError(
            f"--logdir={logdir} holds a training run, but none of its "
            f"checkpoints can be restored: {'; '.join(damaged)}. Nothing was "
            f"deleted and training did not start from scratch. Restore the files "
            f"from a backup, or use another --logdir for a new run."
        )
    for problem in damaged:
        logging.warning(
            "Checkpoint %s cannot be restored: %s the previous checkpoint %s "
            "instead. The damaged files are left in place.",
            problem,
            use,
            prefix,
        )
    return prefix


def resume_checkpoint(logdir: str) -> str | None:
    """Chooses the checkpoint training resumes from; None for a new run.

    Tries the checkpoints of `logdir` newest first (checkpoint_problem) and
    takes the first that reads back whole, with a warning naming each newer,
    damaged one; damaged files are left in place (nothing is ever deleted
    here). When the `checkpoint` state file names another one, it is pointed
    at the chosen checkpoint: the MonitoredTrainingSession restores what the
    state file names. Also checks the checkpoint fits the model
    (check_checkpoint_fits).

    Raises:
      CheckpointError: checkpoint files exist but none restores; training
        does not start from scratch over an existing run.
      FlagError: the checkpoint is of another agent or level.
    """
    candidates = find_checkpoints(logdir)
    state_file = os.path.join(logdir, "checkpoint")
    if not candidates:
        if os.path.exists(state_file):
            raise CheckpointError(
                f"--logdir={logdir}: its checkpoint state file {state_file} "
                f"names no checkpoint that exists. Nothing was deleted; move "
                f"the file away to start a new run there, or use another --logdir."
            )
        return None
    prefix = newest_whole_checkpoint(logdir, candidates, "resuming from")
    check_checkpoint_fits(prefix)
    try:
        state = tf.train.get_checkpoint_state(logdir)
    except ValueError:
        state = None
    if state is None or os.path.join(logdir, state.model_checkpoint_path) != prefix:
        # Older checkpoints the saver tracked stay tracked (so they rotate out
        # as usual); the damaged ones drop out of its list and stay on disk.
        tracked = set(state.all_model_checkpoint_paths) if state else set()
        older = [
            p
            for p in reversed(candidates)
            if p in tracked and _checkpoint_step(p) < _checkpoint_step(prefix)
        ]
        tf.compat.v1.train.update_checkpoint_state(
            logdir, prefix, all_model_checkpoint_paths=[*older, prefix]
        )
        logging.info("Pointed %s at %s.", state_file, prefix)
    return prefix


class ShutdownRequest:
    """SIGINT and SIGTERM: a clean stop of training.

    The first signal sets `requested` at once: a thread reads the signal
    wakeup fd, so this works also while the main thread waits inside
    session.run (Python runs signal handlers only between bytecodes of the
    main thread). The learner loop then ends after its current step, actors
    stop restarting environments, and the session's normal exit saves a
    final checkpoint and ends every environment process; main() logs
    'Training stopped by SIGTERM at N frames; checkpoint saved to ...' and
    exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the
    code a shell reports for a process ended by that signal, so a supervisor
    sees that the run did not finish. A second signal exits at once, with
    the same code, without a final checkpoint (the environment processes die
    with this process).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    LEARNER_STOP = (
        "stopping after the current learner step, with a final checkpoint; "
        "every environment process will be ended. Send it again to exit at "
        "once without a checkpoint"
    )
    ACTOR_TASK_STOP = (
        "this actor task stops after its current call to the learner and ends "
        "its environment process (it writes no checkpoint; the learner goes "
        "on). Send it again to exit at once"
    )

    def __init__(self):
        self.signum: int | None = None
        self._lock = threading.Lock()
        # What the first signal does, for the log line (actor tasks differ).
        self.stop_description = self.LEARNER_STOP

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    def notice(self, signum: int) -> None:
        """Handles one delivered signal (called by the watcher thread)."""
        with self._lock:
            first = self.signum is None
            if first:
                self.signum = signum
        name = signal.Signals(signum).name
        if first:
            logging.warning("Received %s: %s.", name, self.stop_description)
            return
        logging.warning(
            "Received %s again: exiting at once (exit code %d), without a "
            "final checkpoint.",
            name,
            128 + signum,
        )
        os._exit(128 + signum)

    def log_stop(self, num_env_frames: int, logdir: str) -> None:
        logging.info(
            "Training stopped by %s at %d frames; checkpoint saved to %s. "
            "Exit code %d; rerun the same command to resume.",
            signal.Signals(self.signum).name,
            num_env_frames,
            tf.train.latest_checkpoint(logdir),
            self.exit_code,
        )

    def _watch(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as wakeups:
            while data := wakeups.read(64):  # Ends when the write end closes.
                for signum in data:
                    if signum in self.SIGNALS:
                        self.notice(signum)

    @contextlib.contextmanager
    def handling_signals(self):
        """Handles SIGINT and SIGTERM inside the `with` block (main thread
        only; elsewhere the block runs with the handlers unchanged)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        watcher = threading.Thread(
            target=self._watch, args=(read_fd,), name="shutdown-signals", daemon=True
        )
        watcher.start()
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        # Python-level handlers that do nothing: the C-level handler writes
        # the signal number to the wakeup fd, and the watcher does the rest.
        previous = {
            s: signal.signal(s, lambda signum, frame: None) for s in self.SIGNALS
        }
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(write_fd)
            watcher.join(timeout=5)


SHUTDOWN = ShutdownRequest()


# -- logging --------------------------------------------------------------------


class ProgressLogger:
    """A progress line every PROGRESS_SECS, and a frames/s summary."""

    def __init__(self, summary_writer, interval_secs: float = PROGRESS_SECS):
        self._writer = summary_writer
        self._interval = interval_secs
        self._last_time = time.time()
        self._last_frames = None
        self._steps = 0

    def step(self, num_env_frames: int, recent_returns, queue_size: int) -> None:
        self._steps += 1
        now = time.time()
        if self._last_frames is None:  # Count from the first step (after resume).
            self._last_frames, self._last_time, self._steps = num_env_frames, now, 0
            return
        elapsed = now - self._last_time
        if elapsed < self._interval:
            return
        fps = (num_env_frames - self._last_frames) / elapsed
        mean_return = np.mean(recent_returns) if recent_returns else float("nan")
        logging.info(
            "frames %d | %.0f frames/s | %.2f learner steps/s | mean return "
            "(last %d episodes) %.2f | queue %d",
            num_env_frames,
            fps,
            self._steps / elapsed,
            len(recent_returns),
            mean_return,
            queue_size,
        )
        summary = tf.compat.v1.Summary()
        summary.value.add(tag="frames_per_second", simple_value=fps)
        self._writer.add_summary(summary, num_env_frames)
        self._last_frames, self._last_time, self._steps = num_env_frames, now, 0


class EpisodeLogger:
    """Logs and summarises every finished episode of the learner's batches."""

    def __init__(self, summary_writer, level_name: str, level_names: list[str]):
        self._writer = summary_writer
        self._suite = level_name if level_name in ("dmlab30", "atari57") else None
        self._suite_returns = {name: [] for name in level_names}
        self.recent_returns = collections.deque(maxlen=RECENT_EPISODES)
        self.num_episodes = 0

    def log(self, level_names, done, info, num_env_frames: int) -> None:
        """level_names [B] bytes, done [T, B], info arrays [T, B]."""
        for t, b in zip(*np.nonzero(done), strict=True):
            level = level_names[b].decode()
            episode_return = float(info.episode_return[t, b])
            episode_frames = int(info.episode_step[t, b]) * FLAGS.num_action_repeats
            self.num_episodes += 1
            self.recent_returns.append(episode_return)
            logging.info(
                "Episode on %s: return %.1f, %d frames",
                level,
                episode_return,
                episode_frames,
            )
            summary = tf.compat.v1.Summary()
            summary.value.add(
                tag=f"{level}/episode_return", simple_value=episode_return
            )
            summary.value.add(
                tag=f"{level}/episode_frames", simple_value=episode_frames
            )
            self._writer.add_summary(summary, num_env_frames)
            if self._suite:
                self._suite_returns[level].append(episode_return)
        if self._suite and min(map(len, self._suite_returns.values())) >= 1:
            summary = tf.compat.v1.Summary()
            for tag, value in human_normalized_scores(
                self._suite, self._suite_returns
            ).items():
                summary.value.add(
                    tag=f"{self._suite}/training_{tag}", simple_value=value
                )
            self._writer.add_summary(summary, num_env_frames)
            self._suite_returns = {name: [] for name in self._suite_returns}


def human_normalized_scores(suite: str, level_returns) -> dict[str, float]:
    """dmlab30: {'no_cap', 'cap_100'}; atari57: {'median', 'mean'}."""
    if suite == "dmlab30":
        return {
            "no_cap": dmlab30.compute_human_normalized_score(level_returns, None),
            "cap_100": dmlab30.compute_human_normalized_score(level_returns, 100),
        }
    median, mean = atari57.compute_human_normalized_scores(level_returns)
    return {"median": median, "mean": mean}


# -- modes ----------------------------------------------------------------------


def build_actors(agent, level_names, queue, inference_fn) -> list[Actor]:
    """FLAGS.num_actors actors, round-robin over the levels, enqueuing."""
    actors = []
    for i in range(FLAGS.num_actors):
        level_name = level_names[i % len(level_names)]
        with tf.name_scope(f"actor_{i}"):
            process, env = create_environment(
                level_name, seed=FLAGS.seed + i, level_names=level_names
            )
            output, state_initializer = build_actor(
                agent, env, level_name, FLAGS.unroll_length, inference_fn
            )
            enqueue_op = queue.enqueue(tf.nest.flatten(output))
        actors.append(
            Actor(i, level_name, process, output, enqueue_op, state_initializer)
        )
    return actors


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
    config: learner_lib.LearnerConfig,
    device: str,
) -> LearnerPipeline:
    """Dequeue batch_size unrolls, stack them time-major, stage them, learn.

    The staging area holds the next batch (already on `device`) while the
    current one trains: one more step of policy lag, no wait for the copy.
    Run `stage_op` once before the first training step.
    """
    # One dequeue_many takes batch_size unrolls as the actors deliver them
    # (the queue holds fewer); [B, T + 1, ...] -> time-major.
    dequeued = time_major(
        tf.nest.pack_sequence_as(specs, queue.dequeue_many(config.batch_size))
    )
    if FLAGS.testonly_nan_reward_at_frame:
        dequeued = testonly_nan_rewards(dequeued, FLAGS.testonly_nan_reward_at_frame)
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


def run_learner(
    session,
    pipeline: LearnerPipeline,
    total_environment_frames: int,
    episodes: "EpisodeLogger",
    progress: "ProgressLogger",
) -> int:
    """Trains until total_environment_frames; returns the final frame count."""
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
    # a final checkpoint); see ShutdownRequest.
    while not SHUTDOWN.requested:
        try:
            if session.should_stop():
                break
            levels, num_env_frames, done, info, queue_size, _ = session.run(fetches)
        except EnvironmentFailedError:
            # An actor gave up on its environment. Leave the session normally
            # so that it saves a final checkpoint; closing it re-raises this.
            break
        except tf.errors.InvalidArgumentError as e:
            raise_if_non_finite(e)  # NonFiniteUpdateError: nothing is saved.
            raise
        num_env_frames = int(num_env_frames)
        episodes.log(levels, done, info, num_env_frames)
        progress.step(num_env_frames, episodes.recent_returns, queue_size)
        if num_env_frames >= total_environment_frames:
            break
    return num_env_frames


def train(level_name: str, level_names: list[str]) -> None:
    """Single-machine training until total_environment_frames."""
    num_actions = environments.num_actions(level_names)
    config = learner_config_from_flags()
    specs = actor_output_specs(level_names[0], level_names, num_actions)
    logging.info(
        "Training on %s (%d level(s), %d actions) with %d actors, the %s agent.",
        level_name,
        len(level_names),
        num_actions,
        FLAGS.num_actors,
        FLAGS.agent,
    )
    if FLAGS.batch_size > FLAGS.num_actors:
        logging.info(
            "batch_size %d > num_actors %d: batches include consecutive unrolls "
            "of the same actors.",
            FLAGS.batch_size,
            FLAGS.num_actors,
        )

    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(FLAGS.seed)
        device = learner_device()
        agent = create_agent(num_actions, level_names)
        queue = create_queue(specs)
        # The learner builds the agent's variables (in the main graph).
        pipeline = build_learner_pipeline(agent, queue, specs, config, device)
        inference_fn, batched = make_inference_fn(agent, device)
        actors = build_actors(agent, level_names, queue, inference_fn)
        restarts = EnvironmentRestarts(FLAGS.logdir, pipeline.learner.num_env_frames)
        hooks = [
            # Before PyProcessHook: its `end` must release the actors first.
            ActorRunnerHook(
                [ActorRunner(actor, restarts) for actor in actors],
                queue.close(cancel_pending_enqueues=True),
            ),
            py_process.PyProcessHook(),
        ]
        summary_writer = tf.compat.v1.summary.FileWriterCache.get(FLAGS.logdir)
        episodes = EpisodeLogger(summary_writer, level_name, level_names)
        progress = ProgressLogger(summary_writer)
        # The newest checkpoint that restores (older ones if it is damaged).
        resume_checkpoint(FLAGS.logdir)
        with create_training_session(hooks, FLAGS.logdir) as session:
            num_env_frames = run_learner(
                session,
                pipeline,
                config.total_environment_frames,
                episodes,
                progress,
            )
        summary_writer.flush()
    if SHUTDOWN.requested:
        SHUTDOWN.log_stop(num_env_frames, FLAGS.logdir)
        return
    logging.info(
        "Training done: %d environment frames, %d episodes (inference %s). "
        "Checkpoint and TensorBoard logs in %s.",
        num_env_frames,
        episodes.num_episodes,
        "dynamically batched" if batched else "unbatched",
        FLAGS.logdir,
    )


def test(level_name: str, level_names: list[str]) -> dict:
    """Plays test_num_episodes episodes per level with the latest checkpoint.

    Logs the mean return per level (and the suite's human-normalised scores)
    and writes them to <logdir>/test_results.json. Returns that dict.
    """
    # The newest checkpoint that reads back whole, found the way training
    # finds the one it resumes from; test mode writes nothing but its JSON.
    candidates = find_checkpoints(FLAGS.logdir)
    if not candidates:
        raise FlagError(
            f"--logdir={FLAGS.logdir}: no checkpoint to test; train first with "
            f"--mode=train --logdir={FLAGS.logdir}, or point --logdir at a run."
        )
    checkpoint = newest_whole_checkpoint(FLAGS.logdir, candidates, "testing")
    num_actions = environments.num_actions(level_names)
    level_returns = {name: [] for name in level_names}
    with tf.Graph().as_default():
        agent = create_agent(num_actions, level_names)
        outputs = {}
        for name in level_names:
            _, env = create_environment(
                name, seed=FLAGS.seed, level_names=level_names, is_test=True
            )
            outputs[name], _ = build_actor(agent, env, name, FLAGS.unroll_length)
        check_checkpoint_fits(checkpoint)
        with tf.compat.v1.train.SingularMonitoredSession(
            checkpoint_filename_with_path=checkpoint,
            hooks=[py_process.PyProcessHook()],
            config=session_config(),
        ) as session:
            logging.info("Testing %s from %s.", level_name, checkpoint)
            for name in level_names:
                env_outputs = outputs[name].env_outputs
                returns = level_returns[name]
                while len(returns) < FLAGS.test_num_episodes:
                    done, info = session.run((env_outputs.done, env_outputs.info))
                    # Step 0 repeats the previous unroll's last step.
                    finished = info.episode_return[1:][done[1:]]
                    returns.extend(float(r) for r in finished)
                del returns[FLAGS.test_num_episodes :]
                logging.info(
                    "Level %s: mean return %.2f over %d episodes.",
                    name,
                    np.mean(returns),
                    len(returns),
                )
    results = {
        "level_name": level_name,
        "checkpoint": checkpoint,
        "levels": {
            name: {"mean_return": float(np.mean(r)), "returns": r}
            for name, r in level_returns.items()
        },
    }
    if level_name in ("dmlab30", "atari57"):
        scores = human_normalized_scores(level_name, level_returns)
        results["human_normalized"] = scores
        logging.info("Human-normalised scores: %s", scores)
    path = os.path.join(FLAGS.logdir, TEST_RESULTS_FILE)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    logging.info("Test results written to %s.", path)
    return results


# -- distributed training: a learner task and actor tasks ------------------------
#
# Layout (`--job_name`, `--task`, addresses from cluster.resolve_cluster):
#   /job:learner/task:0  the queue, the global variables (on its CPU), the
#                        training step; the only task that writes to --logdir.
#   /job:actor/task:i    one environment and an unroll that runs entirely on
#                        this task with a local copy of the weights, refreshed
#                        from the learner at the start of every unroll.
#
# End of training: the learner sets `training_done`, closes the queue, saves
# its checkpoint and waits (at most ACTOR_FINISH_WAIT_SECS) until every actor
# that is still running has set its entry of `finished_actors`. An actor whose
# enqueue fails because the queue is closed reads `training_done`: true means
# 'learner finished', and the actor exits 0. A learner that dies or is killed
# never closes the queue, and one stopped by a signal closes it without
# setting `training_done`: the actors see a fault (an unreachable, restarted
# or stopping learner), log it, reconnect and carry on once a learner is back
# (restored from its checkpoint).

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


def run_training(level_name: str, level_names: list[str]) -> None:
    """--mode=train: single-machine training, or this task of a cluster."""
    config = resolve_cluster_config()
    if config is None:
        train(level_name, level_names)
        return
    proto = cluster.server_config(config, base=session_config())
    try:
        server = cluster.start_server(config, proto)
    except cluster.PortInUseError as e:
        raise FlagError(str(e)) from None
    global _cluster_server_started
    _cluster_server_started = True
    if config.is_learner:
        train_distributed_learner(config, server, proto, level_name, level_names)
    else:
        run_actor_task(config, server, proto, level_names)


# Set once this process runs a tf.train.Server: main() then ends it with
# exit_cluster_task.
_cluster_server_started = False


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


def resolve_cluster_config(f=FLAGS) -> "cluster.ClusterConfig | None":
    """The cluster from the address flags or TF_CONFIG; None = single machine.

    Raises:
      FlagError: a malformed address, or flags that contradict TF_CONFIG.
    """
    names = ("learner_host", "actor_hosts", "num_actors", "job_name", "task")
    try:
        return cluster.resolve_cluster(
            f.learner_host,
            f.actor_hosts,
            f.num_actors,
            f.job_name,
            f.task,
            explicit_flags={name for name in names if f[name].present},
        )
    except ValueError as e:
        raise FlagError(str(e)) from None


@contextlib.contextmanager
def variables_on(device: str):
    """Creates every variable made inside on `device`, whatever the op devices.

    Sonnet 2 modules create their variables on their first call, under the
    device scope of that call; the creator scope pins them (and RMSProp's
    slots, which are colocated with them) to `device`.
    """

    def creator(next_creator, **kwargs):
        with tf.device(device):
            return next_creator(**kwargs)

    with tf.compat.v1.variable_creator_scope(creator):
        yield


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


def _first_line(error: Exception) -> str:
    """'ErrorType: the line of a TensorFlow error message that says what failed'.

    Graph execution errors start with 'Graph execution error:' and a stack;
    the cause follows 'From /job:...:' (an error on another task) or comes
    just before the '[[{{node ...}}]]' line.
    """
    message = getattr(error, "message", None) or str(error)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for i, line in enumerate(lines):
        if line.startswith("From /job:") and i + 1 < len(lines):
            text = lines[i + 1]
            break
        if line.startswith("[[") and i > 0:
            text = lines[i - 1]
            break
    return f"{type(error).__name__}: {text[:300]}"


def _reachable(host_port: str, timeout_secs: float = 1.0) -> bool:
    """Whether a TCP connection to HOST:PORT succeeds (a task is listening)."""
    import socket

    host, port = cluster.parse_host_port(host_port)
    try:
        with socket.create_connection((host, port), timeout=timeout_secs):
            return True
    except OSError:
        return False


def build_learner_task(
    config: "cluster.ClusterConfig",
    specs,
    level_names: list[str],
    learner_config: learner_lib.LearnerConfig,
) -> LearnerTaskOps:
    """The learner task's graph (call inside a fresh graph).

    Everything on /job:learner/task:0: the queue, the training pipeline (on
    its GPU when it has one) and every variable, pinned to its CPU.
    """
    task_device = cluster.learner_device()
    with tf.device(task_device), variables_on(f"{task_device}/cpu:0"):
        agent = create_agent(environments.num_actions(level_names), level_names)
        queue = create_queue(specs)
        pipeline = build_learner_pipeline(
            agent, queue, specs, learner_config, learner_device()
        )
        # The learner's local init creates the queue (with its shapes) before
        # setting `training_done`, which actors wait for: so an actor with
        # other shapes gets an error, instead of creating the queue first.
        state = create_cluster_state(
            config.num_actors, is_learner=True, after=[queue.size()]
        )
        with tf.control_dependencies([state.training_done.assign(True)]):
            end_training = queue.close(cancel_pending_enqueues=True)
        return LearnerTaskOps(
            pipeline=pipeline,
            end_training=end_training,
            close_queue=queue.close(cancel_pending_enqueues=True),
            finished_actors=state.finished_actors.read_value(),
        )


def train_distributed_learner(
    config: "cluster.ClusterConfig",
    server,
    proto: tf.compat.v1.ConfigProto,
    level_name: str,
    level_names: list[str],
) -> None:
    """The learner task: trains on the unrolls the actor tasks enqueue.

    The model, loss, checkpoints and logs are those of `train`; the queue,
    the variables (on this task's CPU) and the training step live on
    /job:learner/task:0, and the actors are other processes. Training starts
    as soon as batch_size unrolls are queued. At the frame target the learner
    ends training for the actors too (see the protocol above); when it stops
    before (a signal, an error, a kill) it does not set `training_done`, so
    the actors wait for it to come back.
    """
    num_actions = environments.num_actions(level_names)
    learner_config = learner_config_from_flags()
    specs = actor_output_specs(level_names[0], level_names, num_actions)
    logging.info(
        "Learner task at %s: training on %s (%d level(s), %d actions), the %s "
        "agent, for %d actor task(s).",
        config.address,
        level_name,
        len(level_names),
        num_actions,
        FLAGS.agent,
        config.num_actors,
    )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(FLAGS.seed)
        ops = build_learner_task(config, specs, level_names, learner_config)
        pipeline = ops.pipeline
        summary_writer = tf.compat.v1.summary.FileWriterCache.get(FLAGS.logdir)
        episodes = EpisodeLogger(summary_writer, level_name, level_names)
        progress = ProgressLogger(summary_writer)
        # The newest checkpoint that restores (older ones if it is damaged).
        resume_checkpoint(FLAGS.logdir)
        hooks = [CloseQueueOnShutdownHook(ops.close_queue)]
        with create_training_session(
            hooks, FLAGS.logdir, master=server.target, is_chief=True, config=proto
        ) as session:
            logging.info(
                "Learner ready: training starts once %d unroll(s) are queued.",
                learner_config.batch_size,
            )
            try:
                num_env_frames = run_learner(
                    session,
                    pipeline,
                    learner_config.total_environment_frames,
                    episodes,
                    progress,
                )
            except tf.errors.OutOfRangeError:
                if not SHUTDOWN.requested:
                    raise
                # A signal closed the queue while the step waited for unrolls.
                num_env_frames = int(
                    session.run_step_fn(
                        lambda step_context: step_context.session.run(
                            pipeline.learner.num_env_frames
                        )
                    )
                )
            finished = num_env_frames >= learner_config.total_environment_frames
            if finished:
                session.run_step_fn(
                    lambda step_context: step_context.session.run(ops.end_training)
                )
                logging.info(
                    "Reached %d environment frames: queue closed, actors told "
                    "to finish.",
                    num_env_frames,
                )
        # The session saved the final checkpoint on closing; the server (and
        # the variables on it) lives on until this process exits.
        summary_writer.flush()
        if finished:
            with tf.compat.v1.Session(server.target, config=proto) as plain_session:
                wait_for_actors_to_finish(plain_session, ops.finished_actors, config)
    if not finished:
        if SHUTDOWN.requested:
            SHUTDOWN.log_stop(num_env_frames, FLAGS.logdir)
        logging.info(
            "Learner stopped at %d environment frames, before the target: the "
            "actors wait for a learner to come back.",
            num_env_frames,
        )
        return
    logging.info(
        "Training done: %d environment frames, %d episodes. Checkpoint and "
        "TensorBoard logs in %s.",
        num_env_frames,
        episodes.num_episodes,
        FLAGS.logdir,
    )


class CloseQueueOnShutdownHook(tf.compat.v1.train.SessionRunHook):
    """On SIGINT/SIGTERM, closes the learner's queue (without `training_done`).

    A learner step waiting for unrolls (when the actors are gone or stopping
    too) then fails at once instead of blocking, and the learner still saves
    its final checkpoint. The actors take the closed queue without
    `training_done` for a learner that went away, and wait for it.
    """

    def __init__(self, close_op: tf.Operation):
        self._close_op = close_op
        self._ended = threading.Event()

    def after_create_session(self, session, coord) -> None:
        del coord
        threading.Thread(
            target=self._watch, args=(session,), name="close-on-shutdown", daemon=True
        ).start()

    def _watch(self, session) -> None:
        while not self._ended.wait(0.2):
            if SHUTDOWN.requested:
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
    config: "cluster.ClusterConfig",
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
            if not confirmed[i] and _reachable(host)
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
    config: "cluster.ClusterConfig", level_names: list[str], num_actions: int
) -> tuple[ActorTaskOps, py_process.PyProcess]:
    """This actor task's graph (call inside a fresh graph).

    The environment, the local agent copy and the unroll live on this task.
    The queue, the global agent variables and the cluster state are declared
    on the learner with the names they have there, so they are the learner's.
    """
    learner = cluster.learner_device()
    level_name = level_names[config.task % len(level_names)]
    with tf.device(config.device):
        local_agent = create_agent(num_actions, level_names, name=LOCAL_AGENT_NAME)
        process, env = create_environment(
            level_name, seed=FLAGS.seed + config.task, level_names=level_names
        )
        output, state_initializer = build_actor(
            local_agent, env, level_name, FLAGS.unroll_length
        )
        _make_local(local_agent.variables)
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), output)
        # The unroll is fetched, then fed to the enqueue: an enqueue that
        # times out (full queue) can be retried with the same unroll.
        placeholders = tf.nest.map_structure(
            lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), specs
        )
    with tf.device(learner):
        queue = create_queue(specs)
        enqueue = queue.enqueue(tf.nest.flatten(placeholders))
    with tf.device(f"{learner}/cpu:0"):
        # Declares the learner's variables here; the ops of this call never run.
        global_agent = create_agent(num_actions, level_names)
        build_agent_variables(global_agent, specs)
        state = create_cluster_state(config.num_actors, is_learner=False)
        confirm_finished = state.finished_actors.scatter_update(
            tf.IndexedSlices(tf.constant([1]), tf.constant([config.task]))
        )
        training_done = state.training_done.read_value()
    with tf.device(config.device):
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
    return ops, process


def run_actor_task(
    config: "cluster.ClusterConfig",
    server,
    proto: tf.compat.v1.ConfigProto,
    level_names: list[str],
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
    SHUTDOWN.stop_description = ShutdownRequest.ACTOR_TASK_STOP
    num_actions = environments.num_actions(level_names)
    level_name = level_names[config.task % len(level_names)]
    logging.info(
        "Actor task %d at %s: playing %s for the learner at %s.",
        config.task,
        config.address,
        level_name,
        config.learner_host,
    )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(FLAGS.seed + config.task)
        ops, process = build_actor_task(config, level_names, num_actions)
        # Short waits, so that a signal is noticed while the learner is down.
        creator = cluster.worker_session_creator(
            config,
            server,
            scaffold=tf.compat.v1.train.Scaffold(
                ready_for_local_init_op=ops.uninitialized
            ),
            session_config=proto,
            max_wait_secs=2.0,
            log_every_secs=3600.0,
        )
        process.start()
        try:
            while not SHUTDOWN.requested:
                session = _connect(
                    creator,
                    config,
                    lambda: _why_not_ready(server, proto, ops, config.learner_host),
                )
                if session is None:
                    break
                finished = False
                try:
                    _act(session, ops, process, config)
                except TrainingFinished:
                    finished = True
                    logging.info(
                        "Actor %d: learner finished training (queue closed); exiting.",
                        config.task,
                    )
                    return
                except LearnerLostError as e:
                    logging.warning(
                        "Actor %d: lost the learner at %s (%s); reconnecting, "
                        "and waiting for it if it is down.",
                        config.task,
                        config.learner_host,
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
                    if finished or SHUTDOWN.requested:
                        closing.join(SESSION_CLOSE_WAIT_SECS)
                time.sleep(RECONNECT_PAUSE_SECS)
        finally:
            process.close()
    logging.info("Actor %d: stopped by a signal.", config.task)


def _connect(creator, config, why_not_ready=None):
    """A session with the learner, waiting for it; None on SIGINT/SIGTERM.

    why_not_ready: optional () -> str, called for the periodic 'waiting' line
    to say why the learner is not ready yet.
    """
    logging.info(
        "Actor %d: connecting to the learner at %s.", config.task, config.learner_host
    )
    start = time.monotonic()
    next_log = start + PROGRESS_SECS
    while not SHUTDOWN.requested:
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


def _why_not_ready(server, proto, ops: ActorTaskOps, learner_host: str) -> str | None:
    """Why a learner that is up is not ready for this actor; None if it is down.

    A learner that never initialises the variables this actor declares runs
    another model: say which variables, and which flags to compare.
    """
    if not _reachable(learner_host):
        return None
    try:
        with tf.compat.v1.Session(server.target, config=proto) as session:
            missing = _remote_run(session, ops.uninitialized, "checking readiness")
    except (LearnerLostError, tf.errors.OpError) as e:
        return f"the learner is up but not answering: {e}"
    model = [n.decode() for n in missing.flat if n.decode() not in ClusterState._fields]
    total = len(tf.compat.v1.global_variables())
    if len(model) in (0, total):
        return "the learner is up and initialising its model"
    # Some of the model is there, some not: another model.
    return (
        f"the learner has no variable(s) {', '.join(model[:3])} ({len(model)} "
        f"of {total}): it runs another model; give this actor the learner's "
        f"--agent and --level_name"
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
            f"{what}: {_first_line(e)}; give every task the learner's "
            f"--level_name, --agent, --unroll_length, --width and --height."
        ) from None
    except tf.errors.OpError as e:
        raise LearnerLostError(f"{what}: {_first_line(e)}") from None


def _act(session, ops: ActorTaskOps, process: py_process.PyProcess, config) -> None:
    """Unrolls and enqueues until the learner finishes or goes away.

    Raises TrainingFinished or LearnerLostError; returns on SIGINT/SIGTERM.
    A failure of this task's own environment restarts it; other errors
    propagate.
    """
    unrolls, last_log, last_unrolls = 0, time.monotonic(), 0
    while not SHUTDOWN.requested:
        _remote_run(session, ops.sync_weights, "copying the learner's weights")
        values = _unroll(session, ops, process, config.task)
        if values is None or not _send_unroll(session, ops, values, config):
            return
        unrolls += 1
        now = time.monotonic()
        if unrolls == 1:
            logging.info("Actor %d: first unroll sent to the learner.", config.task)
        elif now - last_log >= PROGRESS_SECS:
            logging.info(
                "Actor %d: %d unrolls sent (%.2f unrolls/s).",
                config.task,
                unrolls,
                (unrolls - last_unrolls) / (now - last_log),
            )
            last_log, last_unrolls = now, unrolls


def _unroll(session, ops: ActorTaskOps, process: py_process.PyProcess, task: int):
    """Runs one unroll (all on this task); restarts a dead environment.

    Returns None when a signal stops the task (a SIGTERM to the process group
    also ends the environment process: no restart then).
    """
    try:
        return session.run(ops.output)
    except tf.errors.OpError as e:
        if SHUTDOWN.requested:
            return None
        if process.alive:
            raise
        logging.warning(
            "Actor %d: its environment process died (%s); restarting it.",
            task,
            _first_line(e),
        )
    process.restart()
    session.run(ops.state_initializer)
    return session.run(ops.output)


def _send_unroll(session, ops: ActorTaskOps, values, config) -> bool:
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
    while not SHUTDOWN.requested:
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
                f"the queue closed but training is not done ({_first_line(e)})"
            ) from None
        except tf.errors.InvalidArgumentError as e:
            if "shared queue" in e.message.lower() or "shape" in e.message.lower():
                raise FlagError(
                    f"the learner at {config.learner_host} takes unrolls of "
                    f"another shape ({_first_line(e)}); give every task the same "
                    f"--level_name, --unroll_length, --width, --height and "
                    f"--agent as the learner."
                ) from None
            raise LearnerLostError(_first_line(e)) from None
        except tf.errors.OpError as e:
            raise LearnerLostError(f"sending an unroll: {_first_line(e)}") from None
    return False


def _confirm_finished(session, ops: ActorTaskOps) -> None:
    """Tells the learner this actor saw the end; raises TrainingFinished."""
    try:
        _remote_run(session, ops.confirm_finished, "confirming the end")
    except LearnerLostError as e:
        logging.info("Could not confirm the end to the learner: %s", e)
    raise TrainingFinished()


def quiet_tensorflow_logging() -> None:
    """One copy of each log line, and no deprecation notices for v1 APIs.

    TensorFlow's Python logger has its own handler and also propagates to
    absl's, which prints every line twice; the graph-mode APIs this program
    uses on purpose (queue runners, v1 optimizers) each print a deprecation
    notice.
    """
    tf.get_logger().handlers.clear()
    from tensorflow.python.util import deprecation

    deprecation._PRINT_DEPRECATION_WARNINGS = False  # noqa: SLF001


def main(argv) -> None:
    del argv
    quiet_tensorflow_logging()
    code = run_mode()
    if _cluster_server_started:
        exit_cluster_task(code)
    if code:
        sys.exit(code)


def run_mode() -> int:
    """Runs --mode; returns the process's exit code."""
    try:
        validate_flags()
        level_name, level_names = resolve_levels()
        if FLAGS.mode == "train":
            with SHUTDOWN.handling_signals():
                run_training(level_name, level_names)
        else:
            test(level_name, level_names)
    except FlagError as e:
        # A one-line message and a non-zero exit; no traceback.
        print(f"experiment.py: error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        # An environment given up on, a NaN/Inf update, checkpoints that do
        # not restore: the message says what happened and what is kept.
        print(f"experiment.py: error: {e}", file=sys.stderr)
        return 1
    except py_process.PyProcessError as e:
        # An environment that cannot even start (e.g. a bad level or path).
        print(f"experiment.py: error: an environment failed: {e}", file=sys.stderr)
        return 1
    # Stopped by SIGINT/SIGTERM after a final checkpoint: 128 + signal
    # number, as a shell reports a process ended by that signal.
    return SHUTDOWN.exit_code if SHUTDOWN.requested else 0


if __name__ == "__main__":
    app.run(main)
