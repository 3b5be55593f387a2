"""Tests for vtrace.py against an independent numpy version of the paper's maths.

The numpy reference below is written straight from section 4 of Espeholt et
al. 2018 (IMPALA) as an explicit double sum over s and t. It deliberately does
not use the backward recursion that vtrace.py uses, so agreement is evidence
that the recursion is right, not that two copies share a bug.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import tensorflow as tf

import vtrace

# --------------------------------------------------------------------------
# Independent numpy reference.


def _clip(rhos: np.ndarray, threshold: float | None) -> np.ndarray:
    return rhos if threshold is None else np.minimum(threshold, rhos)


def numpy_vtrace(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold=1.0,
    clip_pg_rho_threshold=1.0,
    clip_c_threshold=1.0,
    lambda_=1.0,
):
    """V-trace targets by the definition, O(T^2), float64.

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
    delta_t = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t))
    c_i = lambda min(c_bar, rho_i)  (c_bar = clip_c_threshold, the paper's 1;
          lambda = lambda_, 1 in the paper's V-trace)
    pg_s = min(pg_rho_bar, rho_s) (r_s + gamma_s v_{s+1} - V(x_s)), v_T = V(x_T)

    Inputs are time-major numpy arrays that broadcast against each other.
    """
    log_rhos, discounts, rewards, values, bootstrap_value = (
        np.asarray(x, np.float64)
        for x in (log_rhos, discounts, rewards, values, bootstrap_value)
    )
    num_steps = values.shape[0]
    rhos = np.exp(log_rhos)
    rho_bar_rhos = _clip(rhos, clip_rho_threshold)
    cs = lambda_ * _clip(rhos, clip_c_threshold)

    def value_at(s):  # V(x_s) for s = 0 .. T, with V(x_T) the bootstrap.
        return bootstrap_value if s == num_steps else values[s]

    out_shape = np.broadcast_shapes(
        log_rhos.shape, discounts.shape, rewards.shape, values.shape
    )
    vs = np.zeros(out_shape)
    for s in range(num_steps):
        total = np.zeros(out_shape[1:])
        for t in range(s, num_steps):
            trace = np.ones(out_shape[1:])
            for i in range(s, t):
                trace = trace * discounts[i] * cs[i]
            delta_t = rho_bar_rhos[t] * (
                rewards[t] + discounts[t] * value_at(t + 1) - values[t]
            )
            total = total + trace * delta_t
        vs[s] = values[s] + total

    pg_rhos = _clip(rhos, clip_pg_rho_threshold)
    pg_advantages = np.zeros(out_shape)
    for s in range(num_steps):
        v_next = bootstrap_value if s == num_steps - 1 else vs[s + 1]
        pg_advantages[s] = pg_rhos[s] * (rewards[s] + discounts[s] * v_next - values[s])
    return vs, pg_advantages


def numpy_log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def make_inputs(seed, num_steps, batch, value_shape=(), rho_shape=None):
    """Random V-trace inputs; rhos span well below 1 to well above 3.7."""
    rng = np.random.default_rng(seed)
    value_full = (num_steps, batch) + tuple(value_shape)
    rho_full = value_full if rho_shape is None else (num_steps, batch) + rho_shape
    # Discounts include zeros (episode ends) so the trace is cut there.
    discounts = np.where(rng.random(rho_full) < 0.2, 0.0, 0.9)
    return dict(
        log_rhos=rng.uniform(-2.5, 2.5, rho_full),
        discounts=discounts,
        rewards=rng.normal(size=value_full),
        values=rng.normal(size=value_full),
        bootstrap_value=rng.normal(size=value_full[1:]),
    )


def run_graph(fn, feeds: dict, dtype=tf.float64):
    """Builds fn(**placeholders) in a fresh graph with dynamic T and runs it."""
    with tf.Graph().as_default():
        placeholders = {
            k: tf.compat.v1.placeholder(dtype, [None] * (v.ndim - 1) + [v.shape[-1]])
            if k != "bootstrap_value"
            else tf.compat.v1.placeholder(dtype, v.shape)
            for k, v in feeds.items()
        }
        out = fn(**placeholders)
        with tf.compat.v1.Session() as sess:
            return sess.run(out, {placeholders[k]: v for k, v in feeds.items()})


THRESHOLD_CASES = [
    # (T, B, clip_rho_threshold, clip_pg_rho_threshold)
    (1, 1, None, None),
    (2, 3, 1.0, 1.0),
    (5, 4, 3.7, 3.7),
    (7, 2, None, 1.0),
    (11, 5, 1.0, None),
    (16, 3, 3.7, 1.0),
]

# --------------------------------------------------------------------------
# Numerical agreement with the reference.


@pytest.mark.parametrize("num_steps,batch,rho_bar,pg_rho_bar", THRESHOLD_CASES)
def test_from_importance_weights_matches_numpy_in_graph(
    num_steps, batch, rho_bar, pg_rho_bar
):
    inputs = make_inputs(num_steps * 100 + batch, num_steps, batch)
    got = run_graph(
        lambda **kw: vtrace.from_importance_weights(
            clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, **kw
        ),
        inputs,
    )
    want_vs, want_pg = numpy_vtrace(
        clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, **inputs
    )
    np.testing.assert_allclose(got.vs, want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages, want_pg, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("num_steps,batch,rho_bar,pg_rho_bar", THRESHOLD_CASES[1::2])
def test_from_importance_weights_matches_numpy_eagerly(
    num_steps, batch, rho_bar, pg_rho_bar
):
    assert tf.executing_eagerly()
    inputs = make_inputs(num_steps + 7 * batch, num_steps, batch)
    # float32 numpy in, float32 out: the dtype most callers use.
    got = vtrace.from_importance_weights(
        clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=pg_rho_bar,
        **{k: v.astype(np.float32) for k, v in inputs.items()},
    )
    assert got.vs.dtype == tf.float32
    want_vs, want_pg = numpy_vtrace(
        clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, **inputs
    )
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got.pg_advantages.numpy(), want_pg, rtol=1e-4, atol=1e-4)


def test_thresholds_actually_clip():
    """The cases above must exercise rhos above 1 and above 3.7 and differ."""
    inputs = make_inputs(3, 9, 4)
    rhos = np.exp(inputs["log_rhos"])
    assert (rhos > 3.7).any() and ((rhos > 1) & (rhos < 3.7)).any() and (rhos < 1).any()
    results = {
        bar: numpy_vtrace(clip_rho_threshold=bar, clip_pg_rho_threshold=bar, **inputs)
        for bar in (None, 1.0, 3.7)
    }
    assert not np.allclose(results[None][0], results[1.0][0])
    assert not np.allclose(results[3.7][0], results[1.0][0])
    assert not np.allclose(results[None][0], results[3.7][0])


def on_policy_inputs(seed, num_steps, batch, gamma):
    """rho = 1 everywhere: from_importance_weights' inputs with random
    rewards, values and bootstrap value and a constant discount."""
    rng = np.random.default_rng(seed)
    return dict(
        log_rhos=np.zeros((num_steps, batch)),
        discounts=np.full((num_steps, batch), gamma),
        rewards=rng.normal(size=(num_steps, batch)),
        values=rng.normal(size=(num_steps, batch)),
        bootstrap_value=rng.normal(size=(batch,)),
    )


def test_on_policy_gives_n_step_returns():
    """With rho = 1 everywhere, v_s is the n-step bootstrapped return (paper, 4.1)."""
    num_steps, batch, gamma = 6, 3, 0.95
    inputs = on_policy_inputs(0, num_steps, batch, gamma)
    rewards, bootstrap = inputs["rewards"], inputs["bootstrap_value"]
    got = vtrace.from_importance_weights(
        **dict(inputs, values=tf.constant(inputs["values"]))
    )
    for s in range(num_steps):
        n_step = sum(gamma ** (t - s) * rewards[t] for t in range(s, num_steps))
        n_step = n_step + gamma ** (num_steps - s) * bootstrap
        np.testing.assert_allclose(got.vs.numpy()[s], n_step, rtol=1e-10)


def test_dynamic_time_dimension_reuses_one_graph():
    with tf.Graph().as_default():
        ph = {
            name: tf.compat.v1.placeholder(tf.float64, [None, 3])
            for name in ("log_rhos", "discounts", "rewards", "values")
        }
        ph["bootstrap_value"] = tf.compat.v1.placeholder(tf.float64, [3])
        out = vtrace.from_importance_weights(clip_rho_threshold=3.7, **ph)
        assert out.vs.shape.as_list() == [None, 3]
        with tf.compat.v1.Session() as sess:
            for num_steps in (1, 4, 19):
                inputs = make_inputs(num_steps, num_steps, 3)
                got = sess.run(out, {ph[k]: v for k, v in inputs.items()})
                want_vs, want_pg = numpy_vtrace(clip_rho_threshold=3.7, **inputs)
                np.testing.assert_allclose(got.vs, want_vs, rtol=1e-10, atol=1e-10)
                np.testing.assert_allclose(
                    got.pg_advantages, want_pg, rtol=1e-10, atol=1e-10
                )


def test_default_thresholds_are_one():
    inputs = make_inputs(5, 6, 2)
    default = vtrace.from_importance_weights(**inputs)
    explicit = vtrace.from_importance_weights(
        clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, **inputs
    )
    np.testing.assert_array_equal(default.vs.numpy(), explicit.vs.numpy())
    np.testing.assert_array_equal(
        default.pg_advantages.numpy(), explicit.pg_advantages.numpy()
    )


def test_threshold_may_be_a_scalar_tensor():
    inputs = make_inputs(8, 4, 2)
    with tf.Graph().as_default():
        # A float32 threshold clips float64 rhos: it is cast to the inputs' dtype.
        bar = tf.compat.v1.placeholder(tf.float32, [])
        out = vtrace.from_importance_weights(
            clip_rho_threshold=bar,
            clip_pg_rho_threshold=bar,
            **{k: tf.constant(v) for k, v in inputs.items()},
        )
        assert out.vs.dtype == tf.float64
        with tf.compat.v1.Session() as sess:
            got = sess.run(out, {bar: 3.7})
    bar32 = float(np.float32(3.7))  # the clipped rhos equal the float32 value
    want_vs, want_pg = numpy_vtrace(
        clip_rho_threshold=bar32, clip_pg_rho_threshold=bar32, **inputs
    )
    np.testing.assert_allclose(got.vs, want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages, want_pg, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------
# Higher-rank broadcasting.


@pytest.mark.parametrize("rho_bar", [None, 1.0, 3.7])
def test_broadcasts_rhos_and_discounts_over_value_heads(rho_bar):
    num_steps, batch, heads = 6, 3, 4
    inputs = make_inputs(11, num_steps, batch, value_shape=(heads,), rho_shape=(1,))
    assert inputs["log_rhos"].shape == (num_steps, batch, 1)
    assert inputs["bootstrap_value"].shape == (batch, heads)
    got = run_graph(
        lambda **kw: vtrace.from_importance_weights(
            clip_rho_threshold=rho_bar, clip_pg_rho_threshold=rho_bar, **kw
        ),
        inputs,
    )
    assert got.vs.shape == (num_steps, batch, heads)
    want_vs, want_pg = numpy_vtrace(
        clip_rho_threshold=rho_bar, clip_pg_rho_threshold=rho_bar, **inputs
    )
    np.testing.assert_allclose(got.vs, want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages, want_pg, rtol=1e-10, atol=1e-10)
    # Each head equals the rank-2 computation on that head alone.
    for k in range(heads):
        one_head = vtrace.from_importance_weights(
            log_rhos=inputs["log_rhos"][..., 0],
            discounts=inputs["discounts"][..., 0],
            rewards=inputs["rewards"][..., k],
            values=inputs["values"][..., k],
            bootstrap_value=inputs["bootstrap_value"][..., k],
            clip_rho_threshold=rho_bar,
            clip_pg_rho_threshold=rho_bar,
        )
        np.testing.assert_allclose(
            one_head.vs.numpy(), got.vs[..., k], rtol=1e-4, atol=1e-4
        )


def test_broadcasts_rewards_over_heads_when_only_values_are_wide():
    num_steps, batch, heads = 4, 2, 3
    inputs = make_inputs(12, num_steps, batch, value_shape=(heads,))
    inputs["rewards"] = inputs["rewards"][..., :1]
    got = vtrace.from_importance_weights(
        **{k: tf.constant(v) for k, v in inputs.items()}
    )
    want_vs, want_pg = numpy_vtrace(**inputs)
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        got.pg_advantages.numpy(), want_pg, rtol=1e-10, atol=1e-10
    )


# --------------------------------------------------------------------------
# from_logits and log-probabilities.


def make_logits_inputs(seed, num_steps, batch, num_actions):
    rng = np.random.default_rng(seed)
    inputs = make_inputs(seed, num_steps, batch)
    del inputs["log_rhos"]
    inputs.update(
        behaviour_policy_logits=rng.normal(size=(num_steps, batch, num_actions)),
        target_policy_logits=rng.normal(size=(num_steps, batch, num_actions)) * 2,
        actions=rng.integers(0, num_actions, size=(num_steps, batch)).astype(np.int32),
    )
    return inputs


def test_log_probs_from_logits_and_actions_matches_numpy_log_softmax():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(7, 3, 5)) * 3
    actions = rng.integers(0, 5, size=(7, 3))
    got = vtrace.log_probs_from_logits_and_actions(logits, actions)
    assert got.shape == (7, 3)
    want = np.take_along_axis(numpy_log_softmax(logits), actions[..., None], -1)[..., 0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "rho_bar,pg_rho_bar,lambda_",
    [(None, None, 1.0), (1.0, 1.0, 1.0), (3.7, 1.0, 1.0), (1.0, 1.0, 0.5)],
)
def test_from_logits_matches_numpy(rho_bar, pg_rho_bar, lambda_):
    num_steps, batch, num_actions = 9, 4, 6
    inputs = make_logits_inputs(21, num_steps, batch, num_actions)
    with tf.Graph().as_default():
        out = vtrace.from_logits(
            clip_rho_threshold=rho_bar,
            clip_pg_rho_threshold=pg_rho_bar,
            lambda_=lambda_,
            **{
                k: tf.constant(v, tf.int32 if k == "actions" else tf.float32)
                for k, v in inputs.items()
            },
        )
        assert isinstance(out, vtrace.VTraceFromLogitsReturns)
        with tf.compat.v1.Session() as sess:
            got = sess.run(out)

    def action_log_probs(logits):
        return np.take_along_axis(
            numpy_log_softmax(logits), inputs["actions"][..., None], -1
        )[..., 0]

    want_target = action_log_probs(inputs["target_policy_logits"])
    want_behaviour = action_log_probs(inputs["behaviour_policy_logits"])
    want_log_rhos = want_target - want_behaviour
    want_vs, want_pg = numpy_vtrace(
        log_rhos=want_log_rhos,
        discounts=inputs["discounts"],
        rewards=inputs["rewards"],
        values=inputs["values"],
        bootstrap_value=inputs["bootstrap_value"],
        clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=pg_rho_bar,
        lambda_=lambda_,
    )
    tol = dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got.target_action_log_probs, want_target, **tol)
    np.testing.assert_allclose(got.behaviour_action_log_probs, want_behaviour, **tol)
    np.testing.assert_allclose(got.log_rhos, want_log_rhos, **tol)
    np.testing.assert_allclose(got.vs, want_vs, **tol)
    np.testing.assert_allclose(got.pg_advantages, want_pg, **tol)


# --------------------------------------------------------------------------
# Gradients: vs and pg_advantages are targets.


def test_no_gradient_through_targets_in_graph():
    inputs = make_logits_inputs(31, 5, 3, 4)
    with tf.Graph().as_default():
        tensors = {
            k: tf.constant(v, tf.int32 if k == "actions" else tf.float32)
            for k, v in inputs.items()
        }
        out = vtrace.from_logits(**tensors)
        float_inputs = [v for k, v in tensors.items() if k != "actions"]
        assert tf.gradients(out.vs, float_inputs) == [None] * len(float_inputs)
        assert tf.gradients(out.pg_advantages, float_inputs) == [None] * len(
            float_inputs
        )

        # The policy-gradient loss still trains the target policy (through
        # target_action_log_probs) and nothing reaches the behaviour logits.
        pg_loss = -tf.reduce_sum(out.target_action_log_probs * out.pg_advantages)
        target_grad, behaviour_grad = tf.gradients(
            pg_loss,
            [tensors["target_policy_logits"], tensors["behaviour_policy_logits"]],
        )
        assert behaviour_grad is None
        # The baseline loss trains values only through the prediction.
        values_grad = tf.gradients(
            tf.reduce_sum(tf.square(out.vs - tensors["values"])), tensors["values"]
        )[0]
        with tf.compat.v1.Session() as sess:
            target_grad_value, values_grad_value, vs_value = sess.run(
                [target_grad, values_grad, out.vs]
            )
    assert np.abs(target_grad_value).sum() > 0
    # d/dV sum (vs - V)^2 with vs constant is -2 (vs - V), nothing more.
    np.testing.assert_allclose(
        values_grad_value, -2 * (vs_value - inputs["values"]), rtol=1e-4, atol=1e-5
    )


def test_no_gradient_through_targets_eagerly():
    inputs = {k: tf.constant(v) for k, v in make_inputs(32, 4, 2).items()}
    with tf.GradientTape(persistent=True) as tape:
        for v in inputs.values():
            tape.watch(v)
        out = vtrace.from_importance_weights(**inputs)
    for target in out:
        grads = tape.gradient(target, list(inputs.values()))
        assert all(g is None for g in grads)


# --------------------------------------------------------------------------
# Build-time errors.

GOOD_SHAPES = dict(
    log_rhos=(4, 2),
    discounts=(4, 2),
    rewards=(4, 2),
    values=(4, 2),
    bootstrap_value=(2,),
)


@pytest.mark.parametrize(
    "arg,bad_shape",
    [
        ("discounts", (4, 2, 1)),
        ("rewards", (4,)),
        ("values", (4, 2, 3)),
        ("bootstrap_value", (4, 2)),
        ("bootstrap_value", ()),
    ],
)
def test_inconsistent_rank_raises_value_error_naming_argument(arg, bad_shape):
    with tf.Graph().as_default():
        kwargs = {
            k: tf.compat.v1.placeholder(tf.float32, bad_shape if k == arg else shape)
            for k, shape in GOOD_SHAPES.items()
        }
        with pytest.raises(ValueError, match=arg):
            vtrace.from_importance_weights(**kwargs)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(log_rhos=(1, 2)), "time dimension"),
        (dict(rewards=(4, 3)), "do not broadcast"),
        (dict(bootstrap_value=(3,)), "bootstrap_value"),
        (dict(log_rhos=()), "log_rhos"),
        (dict(log_rhos=None), "statically known rank"),
    ],
)
def test_bad_shapes_raise_value_error(overrides, match):
    with tf.Graph().as_default():
        shapes = {**GOOD_SHAPES, **overrides}
        kwargs = {k: tf.compat.v1.placeholder(tf.float32, s) for k, s in shapes.items()}
        with pytest.raises(ValueError, match=match):
            vtrace.from_importance_weights(**kwargs)


def test_non_scalar_threshold_raises():
    inputs = make_inputs(0, 3, 2)
    with pytest.raises(ValueError, match="clip_rho_threshold"):
        vtrace.from_importance_weights(clip_rho_threshold=[1.0, 2.0], **inputs)


@pytest.mark.parametrize(
    "arg,bad_shape",
    [
        ("behaviour_policy_logits", (5, 3)),
        ("target_policy_logits", (5, 3, 4, 1)),
        ("actions", (5,)),
    ],
)
def test_from_logits_rank_errors(arg, bad_shape):
    shapes = dict(
        behaviour_policy_logits=(5, 3, 4),
        target_policy_logits=(5, 3, 4),
        actions=(5, 3),
        discounts=(5, 3),
        rewards=(5, 3),
        values=(5, 3),
        bootstrap_value=(3,),
    )
    shapes[arg] = bad_shape
    with tf.Graph().as_default():
        kwargs = {
            k: tf.compat.v1.placeholder(tf.int32 if k == "actions" else tf.float32, s)
            for k, s in shapes.items()
        }
        with pytest.raises(ValueError, match=arg):
            vtrace.from_logits(**kwargs)


def test_log_probs_rank_and_shape_errors():
    with pytest.raises(ValueError, match="policy_logits"):
        vtrace.log_probs_from_logits_and_actions(np.zeros((3, 4)), np.zeros((3,), int))
    with pytest.raises(ValueError, match="actions"):
        vtrace.log_probs_from_logits_and_actions(
            np.zeros((3, 2, 4)), np.zeros((3,), int)
        )
    with pytest.raises(ValueError, match=r"\[T, B\]"):
        vtrace.log_probs_from_logits_and_actions(
            np.zeros((3, 2, 4)), np.zeros((3, 5), int)
        )


# --------------------------------------------------------------------------
# The public API of the reference codebase.


def test_public_api_matches_reference():
    assert vtrace.VTraceReturns._fields == ("vs", "pg_advantages")
    assert vtrace.VTraceFromLogitsReturns._fields == (
        "vs",
        "pg_advantages",
        "log_rhos",
        "behaviour_action_log_probs",
        "target_action_log_probs",
    )

    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    empty = inspect.Parameter.empty
    assert params(vtrace.log_probs_from_logits_and_actions) == [
        ("policy_logits", empty),
        ("actions", empty),
    ]
    assert params(vtrace.from_importance_weights) == [
        ("log_rhos", empty),
        ("discounts", empty),
        ("rewards", empty),
        ("values", empty),
        ("bootstrap_value", empty),
        ("clip_rho_threshold", 1.0),
        ("clip_pg_rho_threshold", 1.0),
        ("name", "vtrace_from_importance_weights"),
        # Ours, keyword-only after the reference's: c-bar and lambda.
        ("clip_c_threshold", 1.0),
        ("lambda_", 1.0),
    ]
    assert params(vtrace.from_logits) == [
        ("behaviour_policy_logits", empty),
        ("target_policy_logits", empty),
        ("actions", empty),
        ("discounts", empty),
        ("rewards", empty),
        ("values", empty),
        ("bootstrap_value", empty),
        ("clip_rho_threshold", 1.0),
        ("clip_pg_rho_threshold", 1.0),
        ("name", "vtrace_from_logits"),
        ("clip_c_threshold", 1.0),
        ("lambda_", 1.0),
    ]


def test_ops_live_under_the_name_scope():
    with tf.Graph().as_default():
        inputs = make_inputs(1, 3, 2)
        out = vtrace.from_importance_weights(name="my_vtrace", **inputs)
        assert out.vs.name.startswith("my_vtrace/")
        assert out.pg_advantages.name.startswith("my_vtrace/")


@pytest.mark.parametrize("c_bar", [0.5, 2.0, None])
def test_c_bar_clips_the_trace_coefficients(c_bar):
    """c_s = min(c-bar, rho_s): against the definition, for a c-bar below 1,
    above it and none."""
    inputs = make_inputs(4, 3, 2)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        out = session.run(
            vtrace.from_importance_weights(**inputs, clip_c_threshold=c_bar)
        )
    vs, pg = numpy_vtrace(**inputs, clip_c_threshold=c_bar)
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lambda_", [0.0, 0.5, 0.95])
@pytest.mark.parametrize("c_bar", [1.0, None])
def test_lambda_scales_the_trace_coefficients(lambda_, c_bar):
    """c_s = lambda min(c-bar, rho_s): against the definition
    (test_from_logits_matches_numpy covers from_logits passing it on)."""
    inputs = make_inputs(5, 6, 3)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        out = session.run(
            vtrace.from_importance_weights(
                **inputs, clip_c_threshold=c_bar, lambda_=lambda_
            )
        )
    vs, pg = numpy_vtrace(**inputs, clip_c_threshold=c_bar, lambda_=lambda_)
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-5, atol=1e-5)
    if lambda_ < 1.0:  # it changes the targets wherever a trace continues
        full, _ = numpy_vtrace(**inputs, clip_c_threshold=c_bar)
        assert np.abs(vs - full).max() > 1e-3


def test_on_policy_lambda_gives_lambda_returns():
    """With rho = 1, v_s is the lambda-return: G_s = r_s + gamma ((1 -
    lambda) V(x_{s+1}) + lambda G_{s+1}), G_T = V(x_T); lambda 0 is the
    one-step target r_s + gamma V(x_{s+1})."""
    num_steps, batch, gamma = 7, 3, 0.9
    inputs = on_policy_inputs(1, num_steps, batch, gamma)
    rewards, values = inputs["rewards"], inputs["values"]
    bootstrap = inputs["bootstrap_value"]
    for lambda_ in (0.0, 0.6, 0.95):
        got = vtrace.from_importance_weights(
            **dict(inputs, values=tf.constant(values)), lambda_=lambda_
        )
        following = bootstrap  # G_{s+1}, starting at G_T = V(x_T)
        for s in reversed(range(num_steps)):
            next_value = bootstrap if s == num_steps - 1 else values[s + 1]
            target = rewards[s] + gamma * (
                (1 - lambda_) * next_value + lambda_ * following
            )
            np.testing.assert_allclose(got.vs.numpy()[s], target, rtol=1e-10)
            following = target
