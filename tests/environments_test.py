"""Tests of environments.py: FlowEnvironment on real Atari games (in-process
and through py_process), level names, and the DeepMind Lab wrapper.

DeepMind Lab is a library the user installs; here the wrapper's own logic
runs in-process against a scripted fake `deepmind_lab` (an episode end on
cue, the exact settings strings), next to the tensor specs, the action set,
the error when it is missing and the level cache. dmlab_test.py runs the
wrapper in its processes on the real library or the stand-in package.
"""

import sys
import threading
import types

import numpy as np
import pytest
import tensorflow as tf

import dmlab30
import environments
from families import atari, dmlab


class _InProcessProxy:
    """The ops py_process builds, with the env object in this process.

    Lets FlowEnvironment's semantics be tested on the real ALE independently
    of py_process (which has its own tests; the py_process path is tested
    below too).
    """

    def __init__(self, env):
        self._env = env

    def _op(self, method_name, *args):
        specs = type(self._env)._tensor_specs(method_name, {}, {})
        flat_specs = tf.nest.flatten(specs)

        def call(*np_args):
            result = getattr(self._env, method_name)(*np_args)
            return [
                v if s.dtype == tf.string else np.asarray(v, s.dtype.as_numpy_dtype)
                for v, s in zip(tf.nest.flatten(result), flat_specs, strict=True)
            ]

        flat = tf.compat.v1.py_func(
            call, list(args), [s.dtype for s in flat_specs], stateful=True
        )
        for t, s in zip(flat, flat_specs, strict=True):
            t.set_shape(s.shape)
        return tf.nest.pack_sequence_as(specs, flat)

    def initial(self):
        return self._op("initial")

    def step(self, action):
        return self._op("step", action)


class _SteppedFlow:
    """FlowEnvironment ops, run one step per session.run with the state fed."""

    def __init__(self, flow_env):
        self.initial_output, self.initial_state = flow_env.initial()
        self.action = tf.compat.v1.placeholder(tf.int32, [])
        self.state = (
            tf.compat.v1.placeholder(tf.int64, []),
            environments.StepOutputInfo(
                tf.compat.v1.placeholder(tf.float32, []),
                tf.compat.v1.placeholder(tf.int32, []),
            ),
        )
        self.output, self.new_state = flow_env.step(self.action, self.state)

    def initial(self, sess):
        return sess.run((self.initial_output, self.initial_state))

    def step(self, sess, action, state):
        feed = {self.action: action}
        for ph, value in zip(
            tf.nest.flatten(self.state), tf.nest.flatten(state), strict=True
        ):
            feed[ph] = value
        return sess.run((self.output, self.new_state), feed)


def _check_episode_bookkeeping(sess, stepped, num_steps, num_actions, seed=0):
    """Steps randomly, checking FlowEnvironment's semantics at every step.

    Returns (finished episode returns, finished episode lengths, rewards).
    """
    rng = np.random.RandomState(seed)
    output, state = stepped.initial(sess)
    assert output.done and output.reward == 0
    assert output.info.episode_return == 0 and output.info.episode_step == 0
    assert output.observation[0].shape == (84, 84, 1)
    assert output.observation[0].dtype == np.uint8
    assert output.observation[1] == b""
    running_return, running_steps = 0.0, 0
    episodes, lengths, rewards = [], [], []
    for _ in range(num_steps):
        output, new_state = stepped.step(sess, rng.randint(num_actions), state)
        running_return += float(output.reward)
        running_steps += 1
        rewards.append(float(output.reward))
        # The info includes this step's reward, also at an episode's end.
        assert output.info.episode_return == pytest.approx(running_return)
        assert output.info.episode_step == running_steps
        assert new_state[0] == state[0] + 1
        if output.done:
            episodes.append(running_return)
            lengths.append(running_steps)
            running_return, running_steps = 0.0, 0
            assert new_state[1].episode_return == 0 and new_state[1].episode_step == 0
        else:
            assert new_state[1].episode_return == output.info.episode_return
            assert new_state[1].episode_step == output.info.episode_step
        state = new_state
    return episodes, lengths, rewards


def test_flow_environment_semantics_in_process():
    # 1,200-frame cap: 300 steps per Pong episode, enough for some points.
    env = atari.PyProcessAtari("pong", seed=1, max_episode_frames=1200)
    with tf.Graph().as_default():
        stepped = _SteppedFlow(environments.FlowEnvironment(_InProcessProxy(env)))
        with tf.compat.v1.Session() as sess:
            episodes, lengths, rewards = _check_episode_bookkeeping(
                sess, stepped, 700, 6
            )
    assert len(episodes) == 2
    assert any(r != 0 for r in rewards)
    # Episodes end at the 1,200-frame cap: 300 steps less the no-op frames.
    assert all(290 <= n <= 300 for n in lengths)
    assert sum(episodes) == pytest.approx(sum(rewards[: sum(lengths)]))


def test_flow_environment_orders_chained_steps():
    env = atari.PyProcessAtari("space_invaders", seed=2, frame_stack=4)
    with tf.Graph().as_default():
        flow = environments.FlowEnvironment(_InProcessProxy(env))
        out0, state0 = flow.initial()
        out1, state1 = flow.step(tf.constant(1), state0)
        out2, state2 = flow.step(tf.constant(2), state1)
        with tf.compat.v1.Session() as sess:
            # One run: only the state's control dependencies order the ops.
            o0, o1, o2, s2 = sess.run((out0, out1, out2, state2))
    assert (o1.info.episode_step, o2.info.episode_step) == (1, 2)
    assert s2[0] == 2
    f0, f1, f2 = (o.observation[0] for o in (o0, o1, o2))
    np.testing.assert_array_equal(f1[..., :3], f0[..., 1:])
    np.testing.assert_array_equal(f2[..., :3], f1[..., 1:])


def test_flow_environment_in_scan():
    # The actor unrolls with tf.scan; the state threads through the loop.
    env = atari.PyProcessAtari("pong", seed=3, max_episode_frames=40, noop_max=0)
    with tf.Graph().as_default():
        flow = environments.FlowEnvironment(_InProcessProxy(env))
        output, state = flow.initial()

        def body(carry, action):
            return flow.step(action, carry[1])

        outputs, _ = tf.scan(
            body, tf.zeros([25], tf.int32), initializer=(output, state)
        )
        with tf.compat.v1.Session() as sess:
            steps, done = sess.run((outputs.info.episode_step, outputs.done))
    # 40-frame cap, no no-ops: 10 steps per episode.
    assert steps.tolist() == list(range(1, 11)) * 2 + list(range(1, 6))
    assert np.flatnonzero(done).tolist() == [9, 19]


# -- through py_process ---------------------------------------------------------


def _py_process():
    import py_process

    return py_process


def _bounded(fn, timeout_s=120.0):
    """Runs fn() in a thread: a hang fails the test instead of blocking CI."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"timed out after {timeout_s} s")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_flow_environment_through_py_process():
    py_process = _py_process()

    def run():
        with tf.Graph().as_default():
            process = environments.create_environment(
                "atari/pong", seed=1, max_episode_frames=1200
            )
            assert isinstance(process, py_process.PyProcess)
            stepped = _SteppedFlow(environments.FlowEnvironment(process.proxy))
            with tf.compat.v1.train.SingularMonitoredSession(
                hooks=[py_process.PyProcessHook()]
            ) as sess:
                return _check_episode_bookkeeping(sess.raw_session(), stepped, 700, 6)

    episodes, lengths, rewards = _bounded(run)
    assert len(episodes) == 2 and any(r != 0 for r in rewards)
    assert all(290 <= n <= 300 for n in lengths)
    # The child plays exactly what the same env plays in this process.
    env = atari.PyProcessAtari("pong", seed=1, max_episode_frames=1200)
    env.initial()
    rng = np.random.RandomState(0)
    assert rewards == [float(env.step(rng.randint(6))[0]) for _ in range(700)]


def test_episode_life_through_py_process():
    # Training with loss of life as episode end: episodes are single lives.
    # Random Breakout loses a life every ~100-200 steps.
    py_process = _py_process()

    def run():
        with tf.Graph().as_default():
            process = environments.create_environment(
                "atari/breakout", seed=4, episode_life=True
            )
            test_process = environments.create_environment(
                "atari/breakout", seed=4, is_test=True, episode_life=True
            )
            stepped = _SteppedFlow(environments.FlowEnvironment(process.proxy))
            test_stepped = _SteppedFlow(
                environments.FlowEnvironment(test_process.proxy)
            )
            with tf.compat.v1.train.SingularMonitoredSession(
                hooks=[py_process.PyProcessHook()]
            ) as sess:
                _, lengths, _ = _check_episode_bookkeeping(
                    sess.raw_session(), stepped, 600, 4, seed=1
                )
                _, test_lengths, _ = _check_episode_bookkeeping(
                    sess.raw_session(), test_stepped, 600, 4, seed=1
                )
                return lengths, test_lengths

    lengths, test_lengths = _bounded(run)
    # The same seed and actions: training ends an episode at each life lost,
    # test mode plays on (a whole game lasts longer than 600 steps).
    assert len(lengths) >= 2
    assert len(test_lengths) < len(lengths)


def test_create_environment_full_action_space_and_specs():
    _py_process()
    with tf.Graph().as_default():
        process = environments.create_environment(
            "atari/pong", seed=1, full_action_space=True
        )
        frame, instruction = process.proxy.initial()
        assert frame.shape.as_list() == [84, 84, 1] and frame.dtype == tf.uint8
        assert instruction.dtype == tf.string


# -- level names ----------------------------------------------------------------


def test_expand_level_names():
    train = environments.expand_level_names("dmlab30")
    test = environments.expand_level_names("dmlab30", is_test=True)
    assert len(train) == len(test) == 30
    assert train[0] == "contributed/dmlab30/rooms_collect_good_objects_train"
    assert test[0] == "contributed/dmlab30/rooms_collect_good_objects_test"
    games = environments.expand_level_names("atari57")
    assert (
        len(games) == 57 and "atari/pong" in games and "atari/space_invaders" in games
    )
    assert environments.expand_level_names("atari/pong") == ["atari/pong"]
    # Atari games beyond the 57 that ale_py ships are fine too.
    assert environments.expand_level_names("atari/adventure") == ["atari/adventure"]
    for name in (
        "explore_goal_locations_small",
        "contributed/dmlab30/rooms_watermaze",
        "seekavoid_arena_01",
    ):
        assert environments.expand_level_names(name) == [name]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("atari/pongg", "atari/pong"),
        ("pong", "atari/pong"),
        ("atari/SpaceInvaders", "atari/space_invaders"),
        ("explore_goal_location_small", "explore_goal_locations_small"),
        ("dmlab_30", "dmlab30"),
    ],
)
def test_unknown_level_names_list_close_names(name, expected, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    with pytest.raises(ValueError) as info:
        environments.expand_level_names(name)
    message = str(info.value)
    assert "--level_name" in message and repr(name) in message
    assert expected in message


def test_unknown_name_without_deepmind_lab_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    assert not dmlab.deepmind_lab_available()
    with pytest.raises(ValueError, match="google-deepmind/lab") as info:
        environments.expand_level_names("my_custom_level")
    assert "atari/pong" in str(info.value)
    # With DeepMind Lab, custom level names go to DeepMind Lab to check.
    monkeypatch.setitem(sys.modules, "deepmind_lab", types.ModuleType("deepmind_lab"))
    assert dmlab.deepmind_lab_available()
    assert environments.expand_level_names("my_custom_level") == ["my_custom_level"]


def test_family_of_level_names_and_num_actions():
    assert environments.family_of("atari/pong") is atari.FAMILY
    assert environments.family_of("atari57") is atari.FAMILY
    assert environments.family_of("explore_goal_locations_small") is dmlab.FAMILY
    assert environments.family_of("dmlab30") is dmlab.FAMILY
    assert environments.num_actions(["atari/pong"]) == 6
    assert environments.num_actions(["atari/pong", "atari/pong"]) == 6
    assert environments.num_actions(environments.expand_level_names("atari57")) == 18
    assert environments.num_actions(["explore_goal_locations_small"]) == 9
    assert environments.num_actions(environments.expand_level_names("dmlab30")) == 9
    assert atari.shares_one_policy(["atari/pong", "atari/breakout"])
    assert not atari.shares_one_policy(["atari/pong"])
    assert not environments.has_instructions(["atari/pong", "atari/breakout"])
    assert environments.has_instructions(["explore_goal_locations_small"])
    assert environments.has_instructions(environments.expand_level_names("dmlab30"))
    with pytest.raises(ValueError, match="mix"):
        environments.num_actions(["atari/pong", "rooms_watermaze"])
    with pytest.raises(ValueError):
        environments.num_actions([])


# -- DeepMind Lab without the library ---------------------------------------------


def test_default_action_set():
    actions = np.array(dmlab.DEFAULT_ACTION_SET)
    assert actions.shape == (9, 7)
    assert len({tuple(a) for a in actions}) == 9
    assert dmlab.DEFAULT_ACTION_SET[0] == (0, 0, 0, 1, 0, 0, 0)  # forward
    assert dmlab.DEFAULT_ACTION_SET[8] == (0, 0, 0, 0, 1, 0, 0)  # fire


def test_dmlab_tensor_specs():
    specs = dmlab.PyProcessDmLab._tensor_specs(
        "initial", {}, {"config": {"width": 96, "height": "72"}}
    )
    assert specs == (
        tf.TensorSpec([72, 96, 3], tf.uint8),
        tf.TensorSpec([], tf.string),
    )
    reward, done, observation = dmlab.PyProcessDmLab._tensor_specs(
        "step", {}, {"config": {}}
    )
    assert reward == tf.TensorSpec([], tf.float32)
    assert done == tf.TensorSpec([], tf.bool)
    assert observation[0] == tf.TensorSpec([240, 320, 3], tf.uint8)  # DMLab defaults
    assert dmlab.PyProcessDmLab._tensor_specs("close", {}, {}) is None


def test_missing_deepmind_lab_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)  # import fails
    with pytest.raises(dmlab.DeepMindLabNotInstalledError) as info:
        dmlab.PyProcessDmLab("explore_goal_locations_small", {}, 4, 1)
    for text in ("DeepMind Lab is not installed", "google-deepmind/lab", "atari/pong"):
        assert text in str(info.value)
    assert isinstance(info.value, ImportError)
    with pytest.raises(dmlab.DeepMindLabNotInstalledError, match="google-deepmind/lab"):
        environments.create_environment("explore_goal_locations_small", seed=1)


class _FakeLab:
    """Stand-in for deepmind_lab.Lab (the real library is not installed)."""

    instances = []

    def __init__(self, level, observations, config, level_cache=None):
        self.level, self.config, self.level_cache = level, config, level_cache
        assert observations == ["RGB_INTERLEAVED", "INSTR"]
        self.reset_seeds, self.steps = [], []
        self.frames_left = 0
        _FakeLab.instances.append(self)

    def reset(self, seed=None):
        self.reset_seeds.append(seed)
        self.frames_left = 12

    def observations(self):
        height, width = int(self.config["height"]), int(self.config["width"])
        frame = np.full((height, width, 3), len(self.reset_seeds), np.uint8)
        return {"RGB_INTERLEAVED": frame, "INSTR": "find the apple"}

    def step(self, action, num_steps=1):
        assert action.dtype == np.intc and action.shape == (7,)
        self.steps.append((tuple(action), num_steps))
        self.frames_left -= num_steps
        return 1.0

    def is_running(self):
        return self.frames_left > 0

    def close(self):
        self.closed = True


@pytest.fixture
def fake_deepmind_lab(monkeypatch):
    module = types.ModuleType("deepmind_lab")
    module.Lab = _FakeLab
    module.runfiles = []
    module.set_runfiles_path = module.runfiles.append
    monkeypatch.setitem(sys.modules, "deepmind_lab", module)
    _FakeLab.instances = []
    return module


def test_dmlab_wrapper_logic(fake_deepmind_lab):
    config = {"width": 96, "height": 72, "datasetPath": "", "logLevel": "WARN"}
    env = dmlab.PyProcessDmLab(
        "contributed/dmlab30/rooms_watermaze", config, 4, seed=1, runfiles_path="/rf"
    )
    lab = _FakeLab.instances[0]
    assert lab.config == {
        "width": "96",
        "height": "72",
        "datasetPath": "",
        "logLevel": "WARN",
    }
    assert fake_deepmind_lab.runfiles == ["/rf"]
    frame, instruction = env.initial()
    assert frame.shape == (72, 96, 3) and instruction == "find the apple"
    # An index into DEFAULT_ACTION_SET, or a native 7-int action.
    reward, done, _ = env.step(np.int32(6))
    assert lab.steps[-1] == ((-20, 0, 0, 1, 0, 0, 0), 4)
    assert isinstance(reward, np.float32) and reward == 1.0 and not done
    reward, done, (frame, _) = env.step(np.array([20, 0, 0, 1, 0, 0, 0], np.int32))
    assert lab.steps[-1] == ((20, 0, 0, 1, 0, 0, 0), 4)
    assert not done and frame[0, 0, 0] == 1
    # 12 frames per episode, 4 per step: the 3rd step ends it and resets.
    _, done, (frame, _) = env.step(0)
    assert done and frame[0, 0, 0] == 2  # the next episode's first frame
    assert len(lab.reset_seeds) == 2 and lab.reset_seeds[0] != lab.reset_seeds[1]
    # Reset seeds come from the seeded generator.
    dmlab.PyProcessDmLab("rooms_watermaze", config, 4, seed=1).initial()
    assert _FakeLab.instances[1].reset_seeds[0] == lab.reset_seeds[0]
    env.close()
    assert lab.closed


def test_create_dmlab_environment_config(fake_deepmind_lab):
    py_process = _py_process()
    with tf.Graph().as_default():
        process = environments.create_environment(
            "rooms_watermaze", seed=3, is_test=True, width=64, height=48
        )
        assert isinstance(process, py_process.PyProcess)
        # The op's static shape comes from the config's width and height.
        frame, instruction = process.proxy.initial()
        assert frame.shape.as_list() == [48, 64, 3]
        assert instruction.dtype == tf.string


def test_local_level_cache(tmp_path):
    cache = dmlab.LocalLevelCache(str(tmp_path / "cache"))
    pk3 = tmp_path / "level.pk3"
    pk3.write_bytes(b"compiled level")
    target = tmp_path / "fetched.pk3"
    assert not cache.fetch("key1", str(target))
    cache.write("key1", str(pk3))
    assert cache.fetch("key1", str(target))
    assert target.read_bytes() == b"compiled level"
    pk3.write_bytes(b"other")
    cache.write("key1", str(pk3))  # an existing entry is kept
    assert cache.fetch("key1", str(target)) and target.read_bytes() == b"compiled level"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["key1"]


def test_dmlab30_level_names_are_known():
    for name in dmlab30.ALL_LEVELS:
        assert name in dmlab.KNOWN_DEEPMIND_LAB_LEVELS
        assert "contributed/dmlab30/" + name in dmlab.KNOWN_DEEPMIND_LAB_LEVELS
