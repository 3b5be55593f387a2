"""Tests of atari.py: the paper's Atari preprocessing on the real ALE.

Everything here runs the real emulator (ale_py's bundled ROMs) in-process;
FlowEnvironment and py_process are tested in environments_test.py.
"""

import os
import subprocess
import sys

import ale_py
import numpy as np
import pytest

from families import atari


def _replica(game, seed):
    """A raw ALE set up exactly as PyProcessAtari sets up its own."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", seed)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.setInt("frame_skip", 1)
    ale.loadROM(ale_py.roms.get_rom_path(game))
    return ale


def _expected_frame(screens):
    """resize(max of the last two raw grayscale screens)."""
    pooled = np.maximum(screens[-2] if len(screens) > 1 else screens[-1], screens[-1])
    return atari.resize_frame(pooled)


def _run(env, actions):
    out = [env.initial()]
    for a in actions:
        out.append(env.step(a))
    return out


def test_shapes_and_dtypes():
    # The environment the actors run returns the newest frame alone (the
    # agent stacks them).
    env = atari.PyProcessAtari("pong", seed=1)
    frame, instruction = env.initial()
    assert frame.shape == (84, 84, 1) and frame.dtype == np.uint8
    reward, done, (frame, instruction) = env.step(0)
    assert frame.shape == (84, 84, 1) and frame.dtype == np.uint8
    env.close()
    # The stack built here, as before the agent built it.
    env = atari.PyProcessAtari("pong", seed=1, frame_stack=4)
    frame, instruction = env.initial()
    assert frame.shape == (84, 84, 4) and frame.dtype == np.uint8
    assert instruction == ""
    # A fresh episode's stack holds one frame four times.
    for c in range(1, 4):
        np.testing.assert_array_equal(frame[..., c], frame[..., 0])
    reward, done, (frame, instruction) = env.step(0)
    assert isinstance(reward, np.float32)
    assert isinstance(done, np.bool_)
    assert frame.shape == (84, 84, 4) and frame.dtype == np.uint8
    assert instruction == ""
    env.close()


def test_max_pool_resize_and_stacking_match_a_raw_replica():
    # Space Invaders draws some sprites on alternate frames, so the max over
    # the last two frames differs visibly from the last frame alone.
    game, seed = "space_invaders", 7
    env = atari.PyProcessAtari(game, seed=seed, frame_stack=4)
    ale = _replica(game, seed)
    rng = np.random.RandomState(0)
    actions = env._actions  # the game's minimal set (ALE Action values)

    frame, _ = env.initial()
    ale.reset_game()
    screens = [ale.getScreenGrayscale()]
    for _ in range(env.last_noop_count):
        ale.act(ale_py.Action.NOOP)
        screens.append(ale.getScreenGrayscale())
    expected = _expected_frame(screens)
    for c in range(4):
        np.testing.assert_array_equal(frame[..., c], expected)

    pooled_differs = 0
    previous = frame
    for _ in range(60):
        a = rng.randint(len(actions))
        reward, done, (frame, _) = env.step(a)
        raw_reward = 0
        screens = []
        for _ in range(4):
            raw_reward += ale.act(actions[a])
            screens.append(ale.getScreenGrayscale())
        assert not done
        assert reward == raw_reward
        expected = _expected_frame(screens)
        np.testing.assert_array_equal(frame[..., -1], expected)
        # The stack shifts by one: oldest first, newest last.
        np.testing.assert_array_equal(frame[..., :3], previous[..., 1:])
        previous = frame
        if not np.array_equal(expected, atari.resize_frame(screens[-1])):
            pooled_differs += 1
    assert pooled_differs > 0, "max-pooling never mattered: test game too static"


def test_resize_is_area_average():
    screen = np.zeros((210, 160), np.uint8)
    screen[100, :] = 250  # a one-pixel line must survive the 2.5x reduction
    small = atari.resize_frame(screen)
    assert small.shape == (84, 84) and small.dtype == np.uint8
    assert small.max() > 0
    assert atari.resize_frame(np.full((210, 160), 77, np.uint8)).min() == 77


def test_deterministic_for_a_fixed_seed_across_episodes():
    # A short frame cap makes several episodes (and no-op draws) happen.
    kwargs = dict(seed=3, max_episode_frames=200)
    actions = np.random.RandomState(1).randint(6, size=150)
    a = _run(atari.PyProcessAtari("pong", **kwargs), actions)
    b = _run(atari.PyProcessAtari("pong", **kwargs), actions)
    assert sum(bool(x[1]) for x in a[1:]) >= 3
    np.testing.assert_array_equal(a[0][0], b[0][0])
    for x, y in zip(a[1:], b[1:], strict=True):
        assert x[0] == y[0] and x[1] == y[1]
        np.testing.assert_array_equal(x[2][0], y[2][0])
    c = _run(atari.PyProcessAtari("pong", seed=4, max_episode_frames=200), actions)
    assert any(
        not np.array_equal(x[2][0], y[2][0]) for x, y in zip(a[1:], c[1:], strict=True)
    )


def test_noop_starts():
    env = atari.PyProcessAtari("pong", seed=5, max_episode_frames=1)
    env.initial()
    counts = [env.last_noop_count]
    assert env.episode_frames == counts[0]
    for _ in range(60):
        _, done, _ = env.step(0)
        assert done  # every step reaches the 1-frame cap
        counts.append(env.last_noop_count)
        assert env.episode_frames == counts[-1]
    assert min(counts) >= 0 and max(counts) <= 30
    assert len(set(counts)) >= 10  # uniform over 31 values
    # The same seed draws the same counts; noop_max=0 disables them.
    env2 = atari.PyProcessAtari("pong", seed=5, max_episode_frames=1)
    env2.initial()
    again = [env2.last_noop_count] + [
        (env2.step(0), env2.last_noop_count)[1] for _ in range(60)
    ]
    assert again == counts
    env3 = atari.PyProcessAtari("pong", seed=5, noop_max=0)
    env3.initial()
    assert env3.last_noop_count == 0 and env3.episode_frames == 0


def test_episode_frame_cap():
    env = atari.PyProcessAtari("pong", seed=1, noop_max=0, max_episode_frames=40)
    env.initial()
    dones = [bool(env.step(0)[1]) for _ in range(25)]
    # 4 frames per step: the cap of 40 frames ends steps 10 and 20.
    assert [i + 1 for i, d in enumerate(dones) if d] == [10, 20]
    assert env.episode_frames == 20


def _first_life_loss(env, rng, limit=3000):
    lives = env.lives
    for n in range(1, limit):
        _, done, _ = env.step(rng.randint(len(env.action_set)))
        if env.lives < lives or done:
            return n, bool(done), lives
    raise AssertionError("no life lost")


def test_episode_life_ends_episode_without_resetting_the_game():
    env = atari.PyProcessAtari("breakout", seed=2, episode_life=True, frame_stack=4)
    env.initial()
    lives = env.lives
    assert lives == 5
    frames_before = env.episode_frames
    n, done, _ = _first_life_loss(env, np.random.RandomState(0))
    assert done and env.lives == lives - 1
    # The game went on: frames keep counting from the same reset.
    assert env.episode_frames > frames_before + 4 * (n - 1)
    frame, _ = env._observation()
    for c in range(1, 4):  # the stack restarts at a life loss
        np.testing.assert_array_equal(frame[..., c], frame[..., 0])

    # Without episode_life (test mode) losing a life is not an episode end.
    env = atari.PyProcessAtari("breakout", seed=2, episode_life=False)
    env.initial()
    n, done, _ = _first_life_loss(env, np.random.RandomState(0))
    assert not done and env.lives == 4


def test_action_sets_and_sticky_actions():
    assert atari.num_actions("pong") == 6
    assert atari.num_actions("breakout") == 4
    assert atari.num_actions("pong", full_action_space=True) == 18
    env = atari.PyProcessAtari("pong", seed=1)
    assert len(env.action_set) == 6 and env.action_set[0] == 0  # NOOP first
    assert env._ale.getFloat("repeat_action_probability") == 0.0
    env = atari.PyProcessAtari(
        "pong", seed=1, full_action_space=True, repeat_action_probability=0.25
    )
    assert env.action_set == list(range(18))
    assert env._ale.getFloat("repeat_action_probability") == 0.25
    env.initial()
    env.step(17)


def test_bad_arguments():
    with pytest.raises(ValueError, match="space_invaders"):
        atari.PyProcessAtari("space_invader", seed=1)
    with pytest.raises(ValueError, match="num_action_repeats"):
        atari.PyProcessAtari("pong", seed=1, num_action_repeats=0)
    with pytest.raises(ValueError, match="repeat_action_probability"):
        atari.PyProcessAtari("pong", seed=1, repeat_action_probability=2.0)
    env = atari.PyProcessAtari("pong", seed=1)
    env.initial()
    for action in (6, -1):
        with pytest.raises(ValueError, match="out of range"):
            env.step(action)


def test_all_atari57_games_load():
    from families import atari57

    assert set(atari57.GAMES) <= set(atari.available_games())


def test_every_atari57_rom_loads_and_steps():
    """Each of the 57 ROMs loads into the environment class the actors run,
    gives its first observation and takes one step of each end of its
    action set (a few milliseconds a game): a ROM that ale-py lists but
    cannot load, or an action set the agent's head would not fit, fails
    here rather than in a suite run hours in."""
    from families import atari57

    for game in atari57.GAMES:
        env = atari.PyProcessAtari(game=game, seed=1, noop_max=0)
        try:
            frame, instruction = env.initial()
            assert frame.shape == (84, 84, 1) and frame.dtype == np.uint8, game
            assert instruction == ""
            # The minimal action set, as atari.num_actions reads it for the
            # agent's head (from this already loaded ROM, not a second load).
            actions = len(env.action_set)
            assert 2 <= actions <= atari.NUM_FULL_ACTIONS, (game, actions)
            for action in (0, actions - 1):
                reward, done, (frame, _) = env.step(action)
                assert np.isfinite(reward) and frame.shape == (84, 84, 1), game
                assert isinstance(bool(done), bool)
        finally:
            env.close()


def test_tensor_specs():
    import tensorflow as tf

    initial = atari.PyProcessAtari._tensor_specs("initial", {}, {"game": "pong"})
    assert initial[0] == tf.TensorSpec([84, 84, 1], tf.uint8)
    stacked = atari.PyProcessAtari._tensor_specs(
        "initial", {}, {"game": "pong", "frame_stack": 4}
    )
    assert stacked[0] == tf.TensorSpec([84, 84, 4], tf.uint8)
    assert initial[1] == tf.TensorSpec([], tf.string)
    reward, done, observation = atari.PyProcessAtari._tensor_specs("step", {}, {})
    assert reward == tf.TensorSpec([], tf.float32)
    assert done == tf.TensorSpec([], tf.bool)
    assert observation == initial
    assert atari.PyProcessAtari._tensor_specs("close", {}, {}) is None


def test_child_side_does_not_import_tensorflow():
    code = (
        "import sys, environments\nfrom families import atari\n"
        "env = atari.PyProcessAtari('pong', seed=1)\n"
        "env.initial(); env.step(1)\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=repo_root)
