"""families.vector.EnvironmentVector: several environments in one process
(--envs_per_process).

On real Pong: an actor whose environments share processes produces exactly
the unrolls of one whose environments each have a process (same seeds, same
scripted actions), episode ends included. The failure cases use
py_process_helpers.ScriptedEnvironment, a stand-in that raises, hangs or
fails to start on demand (a real game cannot be made to); the end-to-end
case of a killed shared process during training is in fault_test.
"""

import contextlib
import os
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf
from py_process_helpers import ScriptedEnvironment
from run_helpers import small_config

import agent as agent_lib
import environments
import py_process
from actor.envs import actor_environments
from actor.unroll import build_vector_actor
from families.vector import EnvironmentVector

UNROLL = 40
SEEDS = (1, 2, 3, 4)


def scripted_inference(last_actions, env_outputs, core_state):
    """Deterministic actions that depend on each environment's own episode
    step and on its index: any mix-up of environments changes them."""
    num_envs = tf.shape(last_actions)[0]
    index = tf.range(num_envs)
    action = (env_outputs.info.episode_step * 3 + index) % 6
    output = agent_lib.AgentOutput(
        action=action,
        policy_logits=tf.zeros([num_envs, 6]),
        baseline=tf.zeros([num_envs]),
    )
    return output, core_state


def pong_envs(per_process: int):
    """FlowEnvironments of atari/pong for SEEDS, per_process to a process;
    short episodes (300 frames) so that unrolls cross episode ends."""
    config = small_config().environment
    options = dict(
        num_action_repeats=config.num_action_repeats,
        max_episode_frames=300,
        episode_life=True,
    )
    processes, envs = [], []
    for j in range(0, len(SEEDS), per_process):
        seeds = list(SEEDS[j : j + per_process])
        if per_process == 1:
            process = environments.create_environment("atari/pong", seeds[0], **options)
            env = environments.FlowEnvironment(process.proxy)
        else:
            process = environments.create_environment_vector(
                "atari/pong", seeds, **options
            )
            env = environments.FlowEnvironment(process.proxy, num_envs=per_process)
        processes.append(process)
        envs.append(env)
    return processes, envs


def test_shared_processes_give_the_unrolls_of_one_process_per_environment():
    with tf.Graph().as_default():
        agent = agent_lib.create_agent(small_config().agent)
        outputs, all_processes = {}, {}
        for per_process in (1, 2, 4):
            processes, envs = pong_envs(per_process)
            outputs[per_process], _ = build_vector_actor(
                agent, envs, "atari/pong", UNROLL, scripted_inference
            )
            all_processes[per_process] = processes
        assert outputs[2].env_outputs.observation[0].shape == (4, UNROLL + 1, 84, 84, 1)
        with tf.compat.v1.train.SingularMonitoredSession(
            hooks=[py_process.PyProcessHook()]
        ) as session:
            unrolls = [session.run(outputs) for _ in range(3)]
    assert len(all_processes[1]) == 4 and len(all_processes[2]) == 2
    assert len(all_processes[4]) == 1
    dones = 0
    for unroll in unrolls:
        reference = unroll[1]
        for per_process in (2, 4):
            tf.nest.map_structure(
                np.testing.assert_array_equal,
                reference.env_outputs,
                unroll[per_process].env_outputs,
            )
            np.testing.assert_array_equal(
                reference.agent_outputs.action, unroll[per_process].agent_outputs.action
            )
        dones += int(reference.env_outputs.done[:, 1:].sum())
    # 300-frame episodes (~70 agent steps after the no-op start) in 120
    # steps: every environment ended at least one, so resets were compared;
    # not all at the same step (different no-op starts), so environments
    # that share a process kept their own episode bookkeeping.
    steps = np.concatenate(
        [u[1].env_outputs.info.episode_step[:, 1:] for u in unrolls], 1
    )
    assert dones >= len(SEEDS)
    assert len({tuple(row) for row in steps}) > 1


def test_specs_gain_a_leading_axis_of_the_number_of_environments():
    kwargs = {"env_type": ScriptedEnvironment, "env_kwargs": [{"seed": 1}] * 3}
    frame, instruction = EnvironmentVector._tensor_specs("initial", {}, kwargs)
    assert frame.shape == [3, 2, 2, 1] and frame.dtype == tf.uint8
    assert instruction.shape == [3] and instruction.dtype == tf.string
    reward, done, _ = EnvironmentVector._tensor_specs("step", {}, kwargs)
    assert reward.shape == [3] and done.shape == [3] and done.dtype == tf.bool
    assert EnvironmentVector._tensor_specs("close", {}, kwargs) is None


def test_steps_each_environment_with_its_own_action_in_process():
    vector = EnvironmentVector(ScriptedEnvironment, [{"seed": 10}, {"seed": 20}])
    frames, instructions = vector.initial()
    assert frames.shape == (2, 2, 2, 1) and list(instructions) == ["env 10", "env 20"]
    rewards, dones, (frames, _) = vector.step(np.array([3, 5], np.int32))
    np.testing.assert_array_equal(rewards, [3.0, 5.0])
    assert rewards.dtype == np.float32 and dones.dtype == np.bool_
    assert frames[0, 0, 0, 0] == 11 and frames[1, 0, 0, 0] == 21
    with pytest.raises(ValueError, match="2 environments got 3 actions"):
        vector.step(np.array([0, 0, 0]))


def test_a_constructor_failure_closes_the_environments_already_built(tmp_path):
    marker = tmp_path / "closed"
    env_kwargs = [
        {"seed": 1, "close_marker": str(marker)},
        {"seed": 2, "close_marker": str(marker)},
        {"seed": 3, "fail_in_constructor": True},
    ]
    with pytest.raises(ValueError, match="environment 3 cannot start"):
        EnvironmentVector(ScriptedEnvironment, env_kwargs)
    assert marker.read_text().split() == ["1", "2"]


@contextlib.contextmanager
def scripted_process(timeout=None, **second):
    """A started process of two ScriptedEnvironments, the second with
    `second`'s options, in a graph and session of its own; yields (process,
    step), step([a0, a1]) running its step op. Closed on the way out."""
    with tf.Graph().as_default():
        process = py_process.PyProcess(
            EnvironmentVector,
            env_type=ScriptedEnvironment,
            env_kwargs=[{"seed": 1}, {"seed": 2, **second}],
        )
        process.call_timeout_s = timeout
        actions = tf.compat.v1.placeholder(tf.int32, [2])
        step_op = process.proxy.step(actions)
        with tf.compat.v1.Session() as session:
            process.start()
            try:
                yield process, lambda a: session.run(step_op, {actions: a})
            finally:
                process.close()


def test_an_environment_raising_ends_its_process_and_a_restart_is_fresh():
    with scripted_process(fail_at_step=3) as (process, step):
        for _ in range(2):
            step([0, 1])
        with pytest.raises(tf.errors.OpError):
            step([0, 1])
        error = process.last_error
        assert isinstance(error, py_process.PyProcessRemoteError)
        assert "environment 2 broke at step 3" in str(error)
        assert not process.alive
        # The restart builds both environments anew: two steps pass again
        # before the scripted failure.
        old_pid = process.pid
        process.restart()
        assert process.pid != old_pid
        for _ in range(2):
            rewards, _, (frames, _) = step([4, 2])
        np.testing.assert_array_equal(rewards, [4.0, 2.0])
        assert frames[:, 0, 0, 0].tolist() == [3, 4]
    assert not process.alive


def test_a_process_killed_mid_step_reports_it_and_restarts():
    with scripted_process(hang_at_step=2) as (process, step):
        step([0, 0])
        killer = threading.Timer(0.5, os.kill, (process.pid, signal.SIGKILL))
        killer.start()
        with pytest.raises(tf.errors.OpError):
            step([0, 0])  # hangs until killed
        killer.join()
        assert isinstance(process.last_error, py_process.PyProcessDiedError)
        assert "SIGKILL" in str(process.last_error)
        process.restart()
        rewards, _, _ = step([1, 1])
        np.testing.assert_array_equal(rewards, [1.0, 1.0])


def test_a_hung_shared_process_is_killed_after_its_timeout():
    """The actor's timeout covers a call of M environments: here a short one
    on a process whose second environment hangs."""
    with scripted_process(timeout=1.0, hang_at_step=1) as (process, step):
        with pytest.raises(tf.errors.OpError):
            step([0, 0])
        assert "no answer for 1 s" in str(process.last_error)
        assert not process.alive


def test_actor_environments_put_m_environments_to_a_process():
    config = small_config().environment
    processes, envs = actor_environments("atari/pong", [5, 6, 7, 8], config, 2)
    assert len(processes) == 2 and [e.num_envs for e in envs] == [2, 2]
    assert processes[0].name == processes[1].name
    # The timeout scales with the environments a call steps.
    assert processes[0].call_timeout_s == 2 * config.timeout_secs
    processes, envs = actor_environments("atari/pong", [5, 6], config, 1)
    assert len(processes) == 2 and [e.num_envs for e in envs] == [None, None]
    with pytest.raises(ValueError, match="does not divide"):
        actor_environments("atari/pong", [5, 6, 7], config, 2)
