"""IMPALA: actors, learner, single-machine training and test mode.

Reading order (top to bottom):
  flags and their validation     validate_flags, resolve_levels
  devices and sessions           learner_device, session_config,
                                 create_training_session, check_checkpoint_fits
  the actor                      create_environment, build_actor,
                                 actor_output_specs, make_inference_fn
  the learner                    clip_rewards, the loss terms, build_learner,
                                 stack_unrolls
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
import json
import os
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
import dmlab30  # noqa: E402
import environments  # noqa: E402
import py_process  # noqa: E402
import vtrace  # noqa: E402

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

FLAGS = flags.FLAGS

CHECKPOINT_SECS = 600
SUMMARY_SECS = 30
PROGRESS_SECS = 10
RECENT_EPISODES = 100
TEST_RESULTS_FILE = "test_results.json"

ActorOutput = collections.namedtuple(
    "ActorOutput", "level_name agent_state env_outputs agent_outputs"
)
LearnerConfig = collections.namedtuple(
    "LearnerConfig",
    "batch_size unroll_length num_action_repeats total_environment_frames "
    "discounting reward_clipping baseline_cost entropy_cost learning_rate decay "
    "momentum epsilon max_grad_norm",
)
Losses = collections.namedtuple("Losses", "total policy_gradient baseline entropy")
LearnerOutputs = collections.namedtuple(
    "LearnerOutputs",
    "train_and_count done info num_env_frames losses learning_rate vtrace_returns",
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
    if f.mode == "test":
        require(f.test_num_episodes > 0, "test_num_episodes", "must be >= 1.")
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
    require(
        f.task == -1,
        "task",
        "distributed training is not available in this build; use --task=-1 "
        "(single machine).",
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


def learner_config_from_flags(f=FLAGS) -> LearnerConfig:
    return LearnerConfig(
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
    # Take GPU memory as needed rather than all of it up front.
    config.gpu_options.allow_growth = True
    return config


def create_training_session(
    hooks: list, logdir: str, master: str = "", is_chief: bool = True
) -> tf.compat.v1.train.MonitoredSession:
    """A MonitoredTrainingSession: restores/initialises, checkpoints, summaries.

    master='' is an in-process session (no server, no port). Checkpoints every
    CHECKPOINT_SECS and at the end (the saver hook's `end`).
    """
    return tf.compat.v1.train.MonitoredTrainingSession(
        master=master,
        is_chief=is_chief,
        checkpoint_dir=logdir,
        save_checkpoint_secs=CHECKPOINT_SECS,
        save_summaries_secs=SUMMARY_SECS,
        log_step_count_steps=0,  # ProgressLogger reports speed instead.
        hooks=hooks,
        config=session_config(),
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
        scratch_agent = agent_lib.Agent(num_actions, torso=FLAGS.agent)
        _, env = create_environment(level_name, seed=0, level_names=level_names)
        output, _ = build_actor(scratch_agent, env, level_name, FLAGS.unroll_length)
        return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), output)


def make_inference_fn(agent: agent_lib.Agent, device: str):
    """The actors' one-step agent: dynamically batched when the op is built.

    Returns (function, batched: bool).
    """
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


# -- the learner ----------------------------------------------------------------


def clip_rewards(rewards: tf.Tensor, mode: str) -> tf.Tensor:
    """abs_one: clip to [-1, 1]. soft_asymmetric: 5 tanh(r / 5), negatives x0.3."""
    if mode == "abs_one":
        return tf.clip_by_value(rewards, -1.0, 1.0)
    if mode == "soft_asymmetric":
        squeezed = tf.tanh(rewards / 5.0)
        # Negative rewards count less, which keeps agents from over-avoiding.
        return tf.where(rewards < 0.0, 0.3 * squeezed, squeezed) * 5.0
    raise ValueError(f"Unknown reward clipping {mode!r}.")


def compute_baseline_loss(advantages: tf.Tensor) -> tf.Tensor:
    """Half the summed squared advantages (vs - V) over [T, B]."""
    return 0.5 * tf.reduce_sum(tf.square(advantages))


def compute_entropy_loss(logits: tf.Tensor) -> tf.Tensor:
    """Negative entropy of the policy, summed over [T, B]."""
    policy = tf.nn.softmax(logits)
    log_policy = tf.nn.log_softmax(logits)
    return tf.reduce_sum(policy * log_policy)


def compute_policy_gradient_loss(
    logits: tf.Tensor, actions: tf.Tensor, advantages: tf.Tensor
) -> tf.Tensor:
    """-sum log pi(a|x) * advantage over [T, B]; advantages get no gradient."""
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=actions, logits=logits
    )
    return tf.reduce_sum(cross_entropy * tf.stop_gradient(advantages))


def build_learner(
    agent: agent_lib.Agent,
    agent_state,
    env_outputs: environments.StepOutput,
    agent_outputs: agent_lib.AgentOutput,
    config: LearnerConfig,
) -> LearnerOutputs:
    """The V-trace loss and one RMSProp update on a time-major batch.

    Args:
      agent_state: core state [B, 256] before step 0 of each unroll.
      env_outputs: StepOutput of [T + 1, B, ...] tensors.
      agent_outputs: AgentOutput of [T + 1, B, ...] (the actors' outputs).
      config: LearnerConfig.

    Returns:
      LearnerOutputs: train_and_count (runs the update, then returns the new
      frame count int64), done / info [T, B] of the batch (for episode
      logging), num_env_frames (the global step variable), losses (Losses:
      total and each weighted term, scalars), learning_rate and
      vtrace_returns (vtrace.VTraceFromLogitsReturns, [T, B] each).
    """
    learner_outputs, _ = agent.unroll(agent_outputs.action, env_outputs, agent_state)
    # The value of the state after the last transition, for bootstrapping.
    bootstrap_value = learner_outputs.baseline[-1]

    # Align: the learner's output at t (computed from env output t) chose the
    # action the actor recorded at t + 1, which produced env output t + 1.
    agent_outputs = tf.nest.map_structure(lambda t: t[1:], agent_outputs)
    rewards, infos, done, _ = tf.nest.map_structure(lambda t: t[1:], env_outputs)
    learner_outputs = tf.nest.map_structure(lambda t: t[:-1], learner_outputs)

    clipped_rewards = clip_rewards(rewards, config.reward_clipping)
    discounts = tf.cast(~done, tf.float32) * config.discounting

    # V-trace's sequential recursion is faster on the CPU.
    with tf.device("/cpu:0"):
        vtrace_returns = vtrace.from_logits(
            behaviour_policy_logits=agent_outputs.policy_logits,
            target_policy_logits=learner_outputs.policy_logits,
            actions=agent_outputs.action,
            discounts=discounts,
            rewards=clipped_rewards,
            values=learner_outputs.baseline,
            bootstrap_value=bootstrap_value,
        )

    pg_loss = compute_policy_gradient_loss(
        learner_outputs.policy_logits,
        agent_outputs.action,
        vtrace_returns.pg_advantages,
    )
    baseline_loss = config.baseline_cost * compute_baseline_loss(
        vtrace_returns.vs - learner_outputs.baseline
    )
    entropy_loss = config.entropy_cost * compute_entropy_loss(
        learner_outputs.policy_logits
    )
    total_loss = pg_loss + baseline_loss + entropy_loss

    num_env_frames = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.compat.v1.train.polynomial_decay(
        config.learning_rate,
        num_env_frames,
        max(config.total_environment_frames, 1),
        end_learning_rate=0.0,
    )
    optimizer = tf.compat.v1.train.RMSPropOptimizer(
        learning_rate, config.decay, config.momentum, config.epsilon
    )
    grads_and_vars = optimizer.compute_gradients(
        total_loss, var_list=agent.trainable_variables
    )
    gradients, variables = zip(*grads_and_vars, strict=True)
    global_norm = tf.linalg.global_norm(gradients)
    if config.max_grad_norm > 0:
        gradients, _ = tf.clip_by_global_norm(
            gradients, config.max_grad_norm, use_norm=global_norm
        )
    train_op = optimizer.apply_gradients(zip(gradients, variables, strict=True))

    # The update and the frame count move together: global step = frames.
    frames_per_update = (
        config.batch_size * config.unroll_length * config.num_action_repeats
    )
    with tf.control_dependencies([train_op]):
        train_and_count = num_env_frames.assign_add(frames_per_update)

    entropy = -compute_entropy_loss(learner_outputs.policy_logits) / tf.cast(
        tf.size(done), tf.float32
    )
    summary = tf.compat.v1.summary
    summary.scalar("learning_rate", learning_rate)
    summary.scalar("total_loss", total_loss)
    summary.scalar("loss/policy_gradient", pg_loss)
    summary.scalar("loss/baseline", baseline_loss)
    summary.scalar("loss/entropy", entropy_loss)
    summary.scalar("policy_entropy", entropy)
    summary.scalar("gradient_global_norm", global_norm)
    return LearnerOutputs(
        train_and_count=train_and_count,
        done=done,
        info=infos,
        num_env_frames=num_env_frames,
        losses=Losses(total_loss, pg_loss, baseline_loss, entropy_loss),
        learning_rate=learning_rate,
        vtrace_returns=vtrace_returns,
    )


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


# -- running actors -------------------------------------------------------------


class ActorRunner:
    """Runs one actor's enqueue op in a loop, in its own thread.

    The thread ends quietly when the queue is closed or training stops; any
    other error stops training through the coordinator (and is re-raised by
    the training session).
    """

    def __init__(self, actor: Actor):
        self.actor = actor
        self._stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.unrolls = 0

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
                session.run(self.actor.enqueue_op)
                self.unrolls += 1
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            pass  # The queue was closed: training is over.
        except Exception as e:  # noqa: BLE001 - reported through coord
            if coord.should_stop() or self._stopping.is_set():
                logging.debug("Actor %d stopped: %s", self.actor.index, e)
                return
            logging.error(
                "Actor %d (%s) failed: %s", self.actor.index, self.actor.level_name, e
            )
            coord.request_stop(e)


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
    config: LearnerConfig,
    device: str,
) -> LearnerPipeline:
    """Dequeue batch_size unrolls, stack them time-major, stage them, learn.

    The staging area holds the next batch (already on `device`) while the
    current one trains: one more step of policy lag, no wait for the copy.
    Run `stage_op` once before the first training step.
    """
    # batch_size single dequeues (run together in one step), stacked.
    dequeued = stack_unrolls(
        [
            tf.nest.pack_sequence_as(specs, queue.dequeue())
            for _ in range(config.batch_size)
        ]
    )
    with tf.device(device):
        flat = tf.nest.flatten(dequeued)
        area = _staging_area(flat)
        stage_op = area.put(flat)
        batch = tf.nest.pack_sequence_as(specs, area.get())
        learner = build_learner(
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
    while not session.should_stop():
        levels, num_env_frames, done, info, queue_size, _ = session.run(fetches)
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
        agent = agent_lib.Agent(num_actions, torso=FLAGS.agent)
        queue = create_queue(specs)
        # The learner builds the agent's variables (in the main graph).
        pipeline = build_learner_pipeline(agent, queue, specs, config, device)
        inference_fn, batched = make_inference_fn(agent, device)
        actors = build_actors(agent, level_names, queue, inference_fn)
        hooks = [
            # Before PyProcessHook: its `end` must release the actors first.
            ActorRunnerHook(
                [ActorRunner(actor) for actor in actors],
                queue.close(cancel_pending_enqueues=True),
            ),
            py_process.PyProcessHook(),
        ]
        summary_writer = tf.compat.v1.summary.FileWriterCache.get(FLAGS.logdir)
        episodes = EpisodeLogger(summary_writer, level_name, level_names)
        progress = ProgressLogger(summary_writer)
        check_checkpoint_fits(tf.train.latest_checkpoint(FLAGS.logdir))
        with create_training_session(hooks, FLAGS.logdir) as session:
            num_env_frames = run_learner(
                session,
                pipeline,
                config.total_environment_frames,
                episodes,
                progress,
            )
        summary_writer.flush()
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
    checkpoint = tf.train.latest_checkpoint(FLAGS.logdir)
    if checkpoint is None:
        raise FlagError(
            f"--logdir={FLAGS.logdir}: no checkpoint to test; train first with "
            f"--mode=train --logdir={FLAGS.logdir}, or point --logdir at a run."
        )
    num_actions = environments.num_actions(level_names)
    level_returns = {name: [] for name in level_names}
    with tf.Graph().as_default():
        agent = agent_lib.Agent(num_actions, torso=FLAGS.agent)
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
    try:
        validate_flags()
        level_name, level_names = resolve_levels()
        if FLAGS.mode == "train":
            train(level_name, level_names)
        else:
            test(level_name, level_names)
    except FlagError as e:
        # A one-line message and a non-zero exit; no traceback.
        print(f"experiment.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
