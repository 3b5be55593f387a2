"""Atari's frame stack built in the graph (agent.py's `stack_frames`): one
frame a step crosses the pipe, the queue and the replay buffer, and the
stacks the agent sees are those the environment built before, frame for
frame.

The reference is the environment's own stack (`PyProcessAtari` with
frame_stack=4, how every earlier checkpoint was trained), stepped in this
process with the actions a real actor took in its own environment process:
same game, seed and options, so the same frames. The actor's unrolls go
through a replay buffer, and the learner's rebuild (each unroll's frames
and the state before its first step) must give the environment's stacks at
every step, across life losses and whole games.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from run_helpers import run_command_line

import agent as agent_lib
import environments
import py_process
from actor.envs import create_flow_environment
from actor.unroll import actor_output_specs, build_actor
from config import AgentConfig, EnvironmentConfig
from families import atari
from families.contract import StepOutput
from learner import replay

GAME = "atari/breakout"  # loses lives quickly under a random policy
SEED = 11
UNROLL = 40
UNROLLS = 15  # 600 agent steps: several lives and at least one whole game


def _rebuild_graph(agent: agent_lib.Agent, specs):
    """Placeholders for one batch-major unroll's frames [T + 1, 84, 84, 1],
    dones [T + 1] and state frames [3, 84, 84, 1], and the learner's stacks
    [T + 1, 84, 84, 4] from them."""
    frames = tf.compat.v1.placeholder(tf.uint8, specs.env_outputs.observation[0].shape)
    done = tf.compat.v1.placeholder(tf.bool, specs.env_outputs.done.shape)
    before = tf.compat.v1.placeholder(tf.uint8, specs.agent_state.frames.shape)
    env_outputs = StepOutput(
        reward=None,
        info=None,
        done=done[:, None],
        observation=(frames[:, None], None),  # instructions are unused
    )
    stacked, _ = agent.stack_frames(env_outputs, before[None])
    return (frames, done, before), stacked.observation[0][:, 0]


def test_stacks_built_in_the_graph_equal_the_environments_over_whole_games():
    environment = EnvironmentConfig(GAME, (GAME,), environments.num_actions([GAME]))
    options = environments.run_options(GAME, environment)
    assert options["episode_life"]  # training's episodes: one a life
    env_type, kwargs = environments.environment_class(GAME, SEED, **options)
    reference = env_type(**kwargs, frame_stack=4)  # the environment's stack

    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(5)
        agent = agent_lib.Agent(
            environment.num_actions,
            torso="shallow",
            use_instruction=False,
            **environments.frame_stack_settings([GAME]),
        )
        process, env = create_flow_environment(GAME, SEED, environment)
        output, _ = build_actor(agent, env, GAME, UNROLL)
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), output)
        # Every unroll goes into a buffer and comes back out of it, as a
        # replayed one would (capacity 1: the one just inserted).
        buffer = replay.ReplayBuffer(specs, capacity=1)
        replayed = tf.nest.map_structure(
            lambda t: t[0],
            buffer.insert_then_sample(
                tf.nest.map_structure(lambda t: t[None], output), 1
            ),
        )
        inputs, rebuilt = _rebuild_graph(agent, specs)
        with tf.compat.v1.train.SingularMonitoredSession(
            hooks=[py_process.PyProcessHook()]
        ) as session:
            expected = reference.initial()[0]
            lives_lost = games = 0
            for u in range(UNROLLS):
                sent, unroll = session.run((output, replayed))
                # What the queue and the buffer hold: one frame a step, the
                # 3 before the first step in the state.
                assert unroll.env_outputs.observation[0].shape == (
                    UNROLL + 1,
                    84,
                    84,
                    1,
                )
                assert unroll.agent_state.frames.shape == (3, 84, 84, 1)
                tf.nest.map_structure(np.testing.assert_array_equal, unroll, sent)
                stacks = session.run(
                    rebuilt,
                    dict(
                        zip(
                            inputs,
                            (
                                unroll.env_outputs.observation[0],
                                unroll.env_outputs.done,
                                unroll.agent_state.frames,
                            ),
                            strict=True,
                        )
                    ),
                )
                # Step 0 is the previous unroll's last step.
                np.testing.assert_array_equal(stacks[0], expected, f"unroll {u}")
                for t in range(1, UNROLL + 1):
                    lives = reference.lives
                    action = unroll.agent_outputs.action[t]
                    _, done, (expected, _) = reference.step(action)
                    assert bool(done) == bool(unroll.env_outputs.done[t])
                    if done:
                        # A new game has played its no-ops alone.
                        if reference.episode_frames <= atari.DEFAULT_NOOP_MAX:
                            games += 1
                        elif reference.lives < lives:
                            lives_lost += 1
                    np.testing.assert_array_equal(
                        stacks[t], expected, f"unroll {u}, step {t}"
                    )
                    np.testing.assert_array_equal(
                        stacks[t][..., -1], unroll.env_outputs.observation[0][t][..., 0]
                    )
    reference.close()
    # Both kinds of restart happened: a life lost inside a game, a new game.
    assert lives_lost >= 3 and games >= 1, (lives_lost, games)


def test_the_papers_replay_of_10000_atari_unrolls_fits_in_6_5_gb():
    """The buffer's shapes at Atari's default (unroll 80, 18 actions, the
    largest head): each frame once, 81 of them and the 3 before."""
    level = "atari/battle_zone"
    environment = EnvironmentConfig(level, (level,), 18)
    agent = AgentConfig(
        torso="shallow",
        num_actions=18,
        use_instruction=False,
        **environments.frame_stack_settings([level]),
    )
    specs = actor_output_specs(environment, agent, 80)
    assert specs.env_outputs.observation[0].shape == (81, 84, 84, 1)
    assert specs.agent_state.frames.shape == (3, 84, 84, 1)
    per_unroll = replay.unroll_bytes(specs)
    frames = (81 + 3) * 84 * 84
    assert frames <= per_unroll <= frames + 20_000, per_unroll
    assert per_unroll * 10_000 <= 6.5e9
    # The environment's stack of 4 took four times the frames.
    assert per_unroll * 10_000 * 3 < 81 * 84 * 84 * 4 * 10_000


@pytest.mark.parametrize(
    "level,value,expected",
    [
        (
            "vizdoom/defend_the_center",
            4,
            "--frame_stack=4: ViZDoom has no frame stack (its agent sees one "
            "frame a step); leave --frame_stack out, or give 1.",
        ),
        ("atari/pong", -1, "--frame_stack=-1: must be >= 0"),
    ],
)
def test_a_stack_where_a_family_has_none_is_one_line_naming_the_flag(
    tmp_path, capsys, level, value, expected
):
    logdir = tmp_path / "run"
    code = run_command_line(
        f"--level_name={level}", f"--frame_stack={value}", f"--logdir={logdir}"
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0, err
    assert expected in err
    assert not logdir.exists()


def test_the_stack_restarts_where_an_episode_starts_and_shifts_elsewhere():
    """agent.stack_frames on frames numbered by step: the stack at each step
    is the last 4 frames of its episode, its first frame repeated before."""
    agent = agent_lib.Agent(
        4, torso="shallow", use_instruction=False, frame_stack=4, frame_shape=(1, 1, 1)
    )
    done = np.array([[True], [False], [False], [True], [False], [False], [False]])
    frames = np.arange(1, 8, dtype=np.uint8).reshape(7, 1, 1, 1, 1)
    with tf.Graph().as_default():
        env_outputs = StepOutput(None, None, done, (tf.constant(frames), None))
        stacked, after = agent.stack_frames(
            env_outputs, tf.zeros([1, 3, 1, 1, 1], tf.uint8)
        )
        with tf.compat.v1.Session() as session:
            stacks, after = session.run((stacked.observation[0], after))
    assert stacks[:, 0, 0, 0].tolist() == [
        [1, 1, 1, 1],
        [1, 1, 1, 2],
        [1, 1, 2, 3],
        [4, 4, 4, 4],
        [4, 4, 4, 5],
        [4, 4, 5, 6],
        [4, 5, 6, 7],
    ]
    assert after[0, :, 0, 0, 0].tolist() == [5, 6, 7]
    assert atari.FAMILY.frame_stack == 4
