"""Tests for agent.py: shapes, state reset, variable sharing, sizes."""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import agent as agent_lib

# The agent reads only reward, done and observation; this mirrors
# environments.StepOutput so the test does not depend on environments.py.
StepOutput = collections.namedtuple("StepOutput", "reward info done observation")
Info = collections.namedtuple("Info", "episode_return episode_step")

ATARI_FRAME = (84, 84, 4)
DMLAB_FRAME = (72, 96, 3)


def count_parameters(variables) -> int:
    """Total number of scalars in `variables`."""
    return sum(int(v.shape.num_elements()) for v in variables)


def make_env_outputs(
    leading, frame_shape=ATARI_FRAME, instruction="", seed=0, done=None
):
    """Random numpy env outputs with leading dims `leading` ([T, B] or [B])."""
    rng = np.random.RandomState(seed)
    leading = tuple(leading)
    if done is None:
        done = np.zeros(leading, bool)
    return StepOutput(
        reward=rng.uniform(-3, 3, leading).astype(np.float32),
        info=Info(np.zeros(leading, np.float32), np.zeros(leading, np.int32)),
        done=np.asarray(done, bool),
        observation=(
            rng.randint(0, 256, leading + frame_shape).astype(np.uint8),
            np.full(leading, instruction, dtype=object),
        ),
    )


def to_constants(nest):
    return tf.nest.map_structure(tf.constant, nest)


def run(fetches):
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        return session.run(fetches)


@pytest.mark.parametrize(
    "torso,frame_shape",
    [("deep", ATARI_FRAME), ("shallow", ATARI_FRAME), ("deep", DMLAB_FRAME)],
)
def test_output_shapes(torso, frame_shape):
    num_actions, t, b = 6, 5, 3
    with tf.Graph().as_default():
        agent = agent_lib.Agent(num_actions, torso=torso)
        env = to_constants(make_env_outputs([t, b], frame_shape, "go to the red ball"))
        actions = tf.zeros([t, b], tf.int32)
        out, state = agent.unroll(actions, env, agent.initial_state(b))
        step_env = tf.nest.map_structure(lambda x: x[0], env)
        step_out, step_state = agent(actions[0], step_env, agent.initial_state(b))

        assert out.action.shape == (t, b) and out.action.dtype == tf.int32
        assert out.policy_logits.shape == (t, b, num_actions)
        assert out.baseline.shape == (t, b)
        assert step_out.action.shape == (b,)
        assert step_out.policy_logits.shape == (b, num_actions)
        assert step_out.baseline.shape == (b,)
        for s in (*state, *step_state):
            assert s.shape == (b, agent_lib.CORE_LSTM_SIZE)

        out_v, step_v = run((out, step_out))
        assert np.all((out_v.action >= 0) & (out_v.action < num_actions))
        assert np.all((step_v.action >= 0) & (step_v.action < num_actions))
        assert np.all(np.isfinite(out_v.policy_logits))


def test_core_state_resets_where_done():
    """A done at step k gives the same outputs as a fresh start at step k."""
    t, b, k = 4, 2, 1
    done = np.zeros([t, b], bool)
    done[k, 1] = True
    env_np = make_env_outputs([t, b], done=done, seed=1)
    actions_np = np.random.RandomState(2).randint(0, 4, [t, b]).astype(np.int32)
    with tf.Graph().as_default():
        agent = agent_lib.Agent(4, torso="shallow")
        # A non-zero incoming state, so that a missing reset would show.
        nonzero = snt.LSTMState(
            hidden=tf.fill([b, 256], 0.5), cell=tf.fill([b, 256], -0.7)
        )
        full, _ = agent.unroll(tf.constant(actions_np), to_constants(env_np), nonzero)
        tail_env = to_constants(tf.nest.map_structure(lambda x: x[k:], env_np))
        tail, _ = agent.unroll(
            tf.constant(actions_np[k:]), tail_env, agent.initial_state(b)
        )
        full_v, tail_v = run((full, tail))
    # Element 1 was reset at step k: identical to starting fresh there.
    np.testing.assert_allclose(
        full_v.policy_logits[k:, 1], tail_v.policy_logits[:, 1], atol=1e-5
    )
    np.testing.assert_allclose(full_v.baseline[k:, 1], tail_v.baseline[:, 1], atol=1e-5)
    # Element 0 was not reset: it still remembers the non-zero state.
    assert not np.allclose(full_v.baseline[k:, 0], tail_v.baseline[:, 0], atol=1e-5)


def test_an_unroll_equals_sonnets_lstm_stepped_one_step_at_a_time():
    """The unroll's LSTM (its input's share of the gates in one matmul over
    all steps) against the agent called a step at a time (Sonnet's LSTM
    step), across resets and from a non-zero state: the same outputs and
    final state, and one set of variables."""
    t, b = 12, 3
    done = np.random.RandomState(3).rand(t, b) < 0.2
    env_np = make_env_outputs([t, b], done=done, seed=4)
    actions_np = np.random.RandomState(5).randint(0, 4, [t, b]).astype(np.int32)
    with tf.Graph().as_default():
        agent = agent_lib.Agent(4, torso="shallow")
        start = snt.LSTMState(
            hidden=tf.fill([b, 256], 0.3), cell=tf.fill([b, 256], -0.4)
        )
        unrolled, unrolled_state = agent.unroll(
            tf.constant(actions_np), to_constants(env_np), start
        )
        state, stepped = start, []
        for k in range(t):
            step_env = to_constants(tf.nest.map_structure(lambda x, k=k: x[k], env_np))
            output, state = agent(tf.constant(actions_np[k]), step_env, state)
            stepped.append(output)
        stepped = tf.nest.map_structure(lambda *xs: tf.stack(xs), *stepped)
        variables = tf.compat.v1.trainable_variables()
        assert len({v.name for v in variables}) == len(variables)
        assert sum("core_lstm" in v.name for v in variables) == 3
        values = run((unrolled, unrolled_state, stepped, state))
    unrolled_v, unrolled_state_v, stepped_v, state_v = values
    assert done[1:].any()  # resets inside the unroll
    np.testing.assert_allclose(
        unrolled_v.policy_logits, stepped_v.policy_logits, atol=1e-5
    )
    np.testing.assert_allclose(unrolled_v.baseline, stepped_v.baseline, atol=1e-5)
    np.testing.assert_allclose(unrolled_state_v.hidden, state_v.hidden, atol=1e-5)
    np.testing.assert_allclose(unrolled_state_v.cell, state_v.cell, atol=1e-5)


def test_variables_created_once_and_shared():
    """Learner unroll, one-step call and a tf.scan loop use the same variables."""
    b = 2
    with tf.Graph().as_default():
        agent = agent_lib.Agent(3, torso="deep")
        env = to_constants(make_env_outputs([5, b]))
        agent.unroll(tf.zeros([5, b], tf.int32), env, agent.initial_state(b))
        n_global = len(tf.compat.v1.global_variables())
        names = sorted(v.name for v in agent.trainable_variables)

        step_env = tf.nest.map_structure(lambda x: x[0], env)
        agent(tf.zeros([b], tf.int32), step_env, agent.initial_state(b))

        def body(carry, _):
            out, state = agent(carry, step_env, agent.initial_state(b))
            return out.action

        tf.scan(body, tf.range(3), initializer=tf.zeros([b], tf.int32))

        assert len(tf.compat.v1.global_variables()) == n_global
        assert sorted(v.name for v in agent.trainable_variables) == names
        assert len(tf.compat.v1.trainable_variables()) == len(names)


def _expected_parameters(torso: str, num_actions: int) -> int:
    def conv(k, c_in, c_out):
        return k * k * c_in * c_out + c_out

    def lstm(n_in, n_hidden):
        return (n_in + n_hidden) * 4 * n_hidden + 4 * n_hidden

    if torso == "deep":
        # 84 -> 42 -> 21 -> 11 (three max-pools, stride 2, SAME padding).
        convs = 0
        c_in = 4
        for c, blocks in agent_lib.DEEP_STAGES:
            convs += conv(3, c_in, c) + 2 * blocks * conv(3, c, c)
            c_in = c
        flat = 11 * 11 * 32
    else:
        # 84 -> 20 (8x8 stride 4) -> 9 (4x4 stride 2), VALID padding.
        convs = conv(8, 4, 16) + conv(4, 16, 32)
        flat = 9 * 9 * 32
    fc = flat * 256 + 256
    instruction = 1000 * 20 + lstm(20, 64)
    core = lstm(256 + 1 + num_actions + 64, 256)
    heads = 256 * num_actions + num_actions + 256 + 1
    return convs + fc + instruction + core + heads


@pytest.mark.parametrize(
    "torso,expected", [("deep", 1_730_807), ("shallow", 1_317_719)]
)
def test_parameter_counts(torso, expected):
    num_actions = 6
    with tf.Graph().as_default():
        agent = agent_lib.Agent(num_actions, torso=torso)
        agent(
            tf.zeros([1], tf.int32),
            to_constants(make_env_outputs([1])),
            agent.initial_state(1),
        )
        count = count_parameters(agent.trainable_variables)
    assert count == _expected_parameters(torso, num_actions) == expected


def test_instruction_encoding_is_length_aware_and_empty_is_zero():
    with tf.Graph().as_default():
        agent = agent_lib.Agent(4, torso="shallow")
        encoder = agent._instruction  # noqa: SLF001 - testing the submodule
        batch = encoder(tf.constant(["", "go to red", "go  to red", "go to red now"]))
        alone = encoder(tf.constant(["go to red"]))
        batch_v, alone_v = run((batch, alone))
    assert batch_v.shape == (4, agent_lib.INSTRUCTION_LSTM_SIZE)
    np.testing.assert_array_equal(batch_v[0], 0.0)
    # Padding after the last word (from the longer row) changes nothing, and
    # repeated spaces are not words.
    np.testing.assert_allclose(batch_v[1], alone_v[0], atol=1e-6)
    np.testing.assert_allclose(batch_v[2], alone_v[0], atol=1e-6)
    assert not np.allclose(batch_v[3], alone_v[0], atol=1e-3)


def test_gradients_reach_every_variable():
    t, b = 3, 2
    with tf.Graph().as_default():
        agent = agent_lib.Agent(5, torso="deep")
        env = to_constants(make_env_outputs([t, b], instruction="pick the apple"))
        out, _ = agent.unroll(tf.zeros([t, b], tf.int32), env, agent.initial_state(b))
        loss = tf.reduce_sum(out.policy_logits) + tf.reduce_sum(out.baseline)
        grads = tf.gradients(loss, agent.trainable_variables)
        missing = [
            v.name
            for v, g in zip(agent.trainable_variables, grads, strict=True)
            if g is None
        ]
        assert not missing


def test_unknown_torso_is_an_error():
    with pytest.raises(ValueError, match="torso"):
        agent_lib.Agent(4, torso="medium")


def test_without_instruction_encoder_same_outputs_on_empty_instructions():
    """use_instruction=False (Atari) computes what the full agent computes
    for empty instructions, with the same variables minus the encoder's."""
    t, b = 4, 3
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(3)
        full = agent_lib.Agent(6, torso="shallow", name="full")
        lean = agent_lib.Agent(6, torso="shallow", use_instruction=False, name="lean")
        env = to_constants(make_env_outputs([t, b], instruction=""))
        actions = tf.constant(np.random.RandomState(1).randint(0, 6, [t, b]), tf.int32)
        outputs = [
            agent.unroll(actions, env, agent.initial_state(b))[0].policy_logits
            for agent in (full, lean)
        ]

        def short(v):
            return v.name.split("/", 1)[1]

        full_vars = {short(v): v for v in full.trainable_variables}
        lean_vars = {short(v): v for v in lean.trainable_variables}
        assert set(lean_vars) < set(full_vars)
        assert all(
            name.startswith("instruction/") for name in set(full_vars) - set(lean_vars)
        )
        copy = [lean_vars[n].assign(full_vars[n]) for n in lean_vars]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before_full, before_lean = session.run(outputs)
            session.run(copy)
            after_full, after_lean = session.run(outputs)
    assert not np.allclose(before_full, before_lean)  # different weights first
    np.testing.assert_allclose(after_full, after_lean, atol=1e-5)


def test_unknown_torso_dtype_is_an_error():
    with pytest.raises(ValueError, match="torso_dtype"):
        agent_lib.Agent(4, torso="shallow", torso_dtype="float16")


@pytest.mark.parametrize("padding,stride", [("VALID", 4), ("SAME", 1)])
def test_conv_is_sonnets_conv_in_float32(padding, stride):
    """_Conv2D has snt.Conv2D's variables (names, shapes, dtypes) and, given
    the same weights, computes the same float32 outputs."""
    with tf.Graph().as_default():
        ours = agent_lib._Conv2D(16, 8, stride, padding, name="conv")  # noqa: SLF001
        sonnets = snt.Conv2D(16, 8, stride=stride, padding=padding, name="conv")
        x = tf.constant(np.random.RandomState(0).rand(2, 84, 84, 4), tf.float32)
        y_ours, y_sonnets = ours(x), sonnets(x)
        assert [(v.name, v.shape, v.dtype) for v in ours.variables] == [
            (v.name.replace("conv_1/", "conv/"), v.shape, v.dtype)
            for v in sonnets.variables
        ]
        copy = [
            a.assign(b) for a, b in zip(ours.variables, sonnets.variables, strict=True)
        ]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(copy)
            a, b = session.run((y_ours, y_sonnets))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("torso", ["deep", "shallow"])
def test_bfloat16_torso_keeps_float32_weights_and_approximates_float32(torso):
    """--torso_dtype=bfloat16 changes what the convolutions compute in, not
    the variables (a float32 checkpoint restores into it); its logits and
    baselines are float32's up to bfloat16 rounding, and every variable
    still gets a float32 gradient.

    The rounding is measured where it enters the heads: a head computes
    h . w + b from the core output h, so bfloat16 moves each output by at most
    |dh| |w|, a small fraction of |h| |w| when h is close to float32's. Against
    the output itself the same error can look large: h . w cancels to near 0
    for some initial weights (the baseline's did, on a CPU with native
    bfloat16, at 6.7 % of its largest value). Over 40 initialisations the
    ratio to |h| |w| peaked at 0.0017 (deep torso) on AVX-512; a head reading
    an unrelated h would be near 1 / sqrt(256)."""
    t, b = 3, 4
    with tf.Graph().as_default() as graph:
        tf.compat.v1.set_random_seed(7)
        agents = [
            agent_lib.Agent(6, torso=torso, use_instruction=False, name=name, **kw)
            for name, kw in (("f32", {}), ("bf16", {"torso_dtype": "bfloat16"}))
        ]
        env = to_constants(make_env_outputs([t, b]))
        actions = tf.constant(np.random.RandomState(1).randint(0, 6, [t, b]), tf.int32)
        outputs = [a.unroll(actions, env, a.initial_state(b))[0] for a in agents]
        loss = tf.reduce_sum(outputs[1].policy_logits) + tf.reduce_sum(
            outputs[1].baseline
        )
        grads = tf.gradients(loss, agents[1].trainable_variables)
        f32_vars, bf16_vars = (a.trainable_variables for a in agents)

        def short(v):
            return v.name.split("/", 1)[1]

        assert [(short(v), v.shape) for v in f32_vars] == [
            (short(v), v.shape) for v in bf16_vars
        ]
        assert all(v.dtype == tf.float32 for v in bf16_vars)
        assert all(g is not None and g.dtype == tf.float32 for g in grads)
        copy = [x.assign(y) for x, y in zip(bf16_vars, f32_vars, strict=True)]
        # The float32 agent's heads: MatMul(h [T * B, 256], w [256, out]).
        head_inputs = {
            field: list(graph.get_operation_by_name(f"f32/{field}/MatMul").inputs)
            for field in ("policy_logits", "baseline")
        }
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(copy)
            f32, bf16, grads_v, heads = session.run(
                (outputs[0], outputs[1], grads, head_inputs)
            )
    assert all(np.all(np.isfinite(g)) for g in grads_v)
    for field, (h, w) in heads.items():
        a = getattr(f32, field).reshape(t * b, -1)
        b16 = getattr(bf16, field).reshape(t * b, -1)
        scale = np.linalg.norm(h, axis=1)[:, None] * np.linalg.norm(w, axis=0)
        assert np.all(np.abs(a - b16) < 0.01 * scale), field
        assert not np.array_equal(a, b16), field  # it did compute in bfloat16


def test_feed_forward_agent_has_no_core_state_and_steps_as_it_unrolls():
    """use_lstm=False: no LSTM variables, the empty tuple as core state, heads
    on the core's inputs ([torso 256, reward, one-hot action, code 64]), and
    with no memory the one-step call at t computes what the unroll does at t
    whatever came before (an LSTM agent's would differ)."""
    t, b, num_actions = 4, 3, 6
    with tf.Graph().as_default():
        agents = [
            agent_lib.Agent(
                num_actions, torso="shallow", use_instruction=False, use_lstm=lstm
            )
            for lstm in (False, True)
        ]
        env = to_constants(make_env_outputs([t, b], seed=4))
        actions = tf.constant(
            np.random.RandomState(5).randint(0, num_actions, [t, b]), tf.int32
        )
        results = []
        for agent in agents:
            unrolled, final = agent.unroll(actions, env, agent.initial_state(b))
            last = tf.nest.map_structure(lambda x: x[-1], env)
            stepped, _ = agent(actions[-1], last, agent.initial_state(b))
            results.append((unrolled, stepped, final))
        ff, lstm = agents
        assert ff.initial_state(b) == () and results[0][2] == ()
        assert not ff.use_lstm and lstm.use_lstm
        ff_names = {v.name.split("/", 1)[1] for v in ff.trainable_variables}
        assert not any(n.startswith("core_lstm/") for n in ff_names)
        assert ff._policy.w.shape == (256 + 1 + num_actions + 64, num_actions)  # noqa: SLF001
        values = run([(unrolled, stepped) for unrolled, stepped, _ in results])
    (ff_unrolled, ff_stepped), (lstm_unrolled, lstm_stepped) = values
    np.testing.assert_allclose(
        ff_unrolled.policy_logits[-1], ff_stepped.policy_logits, atol=1e-5
    )
    np.testing.assert_allclose(ff_unrolled.baseline[-1], ff_stepped.baseline, atol=1e-5)
    assert not np.allclose(lstm_unrolled.baseline[-1], lstm_stepped.baseline, atol=1e-5)


def test_feed_forward_parameter_count():
    """The shallow agent without its LSTM: the LSTM's parameters fewer, the
    heads wider (they read the 327 core inputs instead of 256 outputs)."""
    num_actions = 6
    with tf.Graph().as_default():
        agent = agent_lib.Agent(num_actions, torso="shallow", use_lstm=False)
        agent(tf.zeros([1], tf.int32), to_constants(make_env_outputs([1])), ())
        count = count_parameters(agent.trainable_variables)
    inputs = 256 + 1 + num_actions + 64
    lstm = (inputs + 256) * 4 * 256 + 4 * 256
    heads_lstm = 256 * num_actions + num_actions + 256 + 1
    heads_ff = inputs * num_actions + num_actions + inputs + 1
    assert (
        count
        == _expected_parameters("shallow", num_actions) - lstm - heads_lstm + heads_ff
    )


_BIAS_GRADIENT_CHECK = """
import numpy as np
import tensorflow as tf

import agent as agent_lib

tf.compat.v1.disable_eager_execution()
rng = np.random.RandomState(0)
# [T * B, H, W, C] as the deep torso's first convolution sees it at T x B =
# 21 x 8; the gradient of its output has a positive mean, the case in which a
# bfloat16 running sum stalls.
x_value = rng.rand(168, 84, 84, 4).astype(np.float32)
# Multiples of 1/128 in [0.5, 1.5) are exact in bfloat16, so the exact sum is
# numpy's float64 sum.
dy_value = (0.5 + rng.randint(0, 128, (168, 84, 84, 16)) / 128).astype(np.float32)
x = tf.compat.v1.placeholder(tf.float32, x_value.shape)
dy = tf.compat.v1.placeholder(tf.bfloat16, dy_value.shape)
conv = agent_lib._Conv2D(16, 3, 1, "SAME", name="conv")
y = conv(tf.cast(x, tf.bfloat16))
(bias_grad,) = tf.gradients(y, [conv.b], grad_ys=[dy])
with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    got = session.run(bias_grad, {x: x_value, dy: dy_value})
want = dy_value.astype(np.float64).sum(axis=(0, 1, 2))
print("max_relative_error", float(np.max(np.abs(got - want) / np.abs(want))))
"""


@pytest.mark.parametrize("onednn", ["1", "0"])
def test_bfloat16_bias_gradients_are_summed_in_float32(onednn):
    """A bfloat16 torso's bias gradients are the sums of its output gradients
    to float32 accuracy. TensorFlow's CPU BiasAddGrad sums bfloat16 in
    bfloat16: over these 1.2 M positive terms its sum stalls and comes out
    99.9 % short. Runs in a child process so that oneDNN can be on (as in
    training) and off (as in the other tests)."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", _BIAS_GRADIENT_CHECK],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    error = float(out.stdout.split("max_relative_error")[1])
    assert error < 0.01, error
