"""The unroll: one actor's `unroll_length` agent steps over its
environments, as graph ops.

Each run of the unroll's output continues where the previous one stopped
(the environment and agent states persist in local variables) and yields an
ActorOutput (trajectory.py) of T + 1 steps per environment. The single-machine
actor threads (runner.py) and a cluster's actor tasks (cluster/actor_task.py)
build the same unroll.
"""

from __future__ import annotations

import tensorflow as tf

import agent as agent_lib
import environments
from actor import envs as actor_envs
from config import AgentConfig, EnvironmentConfig
from trajectory import ActorOutput, swap_leading_axes


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
    policy_frames: tf.Variable | None = None,
) -> tuple[ActorOutput, tf.Operation]:
    """One actor's unroll of `unroll_length` steps over one environment.

    As `build_vector_actor` with a single environment, without its batch
    dimension: ActorOutput(level_name string [], agent_state: core state
    [256] each, env_outputs [T + 1, ...], agent_outputs [T + 1, ...],
    policy_frames int64 []), and the state_initializer. `inference_fn` gets
    inputs of batch 1.
    """
    output, state_initializer = build_vector_actor(
        agent, [env], level_name, unroll_length, inference_fn, policy_frames
    )
    return tf.nest.map_structure(lambda t: t[0], output), state_initializer


def _stack(nests: list) -> object:
    return tf.nest.map_structure(lambda *ts: tf.stack(ts), *nests)


def build_vector_actor(
    agent: agent_lib.Agent,
    envs: list[environments.FlowEnvironment],
    level_name: str,
    unroll_length: int,
    inference_fn=None,
    policy_frames: tf.Variable | None = None,
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
      policy_frames: the int64 variable that counts the learner's frames
        when the parameters the agent acts with were read: the learner's
        global step on one machine, where every step reads the learner's
        parameters (read here before the unroll's first step, so it dates
        the oldest parameters of the unroll), or a cluster actor's copy of
        it taken with its weights. None: 0 (an unroll with no learner).

    Returns:
      (ActorOutput, state_initializer):
        ActorOutput, batch-major, one unroll per environment (ready for
        `enqueue_many`): level_name string [K], agent_state: core state
        [K, 256] each before the first step, env_outputs [K, T + 1, ...],
        agent_outputs [K, T + 1, ...], policy_frames int64 [K]. Step 0 is the last step of the
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
        # The frame count before any inference of this unroll reads the
        # parameters (the scan below consumes `first`).
        frames_read = (
            tf.constant(0, tf.int64)
            if policy_frames is None
            else tf.identity(policy_frames.read_value())
        )
        # read_value() snapshots the state: the assignments below must not
        # change what `first` refers to.
        with tf.control_dependencies([frames_read]):
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
                policy_frames=tf.fill([num_envs], frames_read),
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
        scratch_agent = agent_lib.create_agent(agent)
        _, env = actor_envs.create_flow_environment(
            level_name, seed=0, config=environment
        )
        output, _ = build_actor(scratch_agent, env, level_name, unroll_length)
        return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), output)
