"""The learner's update (learner/update.py), term by term against NumPy, on a
tiny quadratic loss: gradient clipping by --max_grad_norm, the linear
learning-rate schedule, RMSProp's step, the frame count and the order of
`after_step`, and the NaN guard. The loss itself is tests/loss_test.py's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from config import LearnerConfig
from learner import loop
from learner.nan_guard import guard_finite_update, non_finite_update
from learner.update import build_update
from runtime import errors

# loss = sum(SCALE * w^2 / 2): its gradient is SCALE * w, of global norm
# |SCALE * W0| = 50 at W0, far above the clipping norm below.
W0 = np.array([3.0, -4.0], np.float32)
SCALE = 10.0


def learner_config(**overrides) -> LearnerConfig:
    # 2 x 5 x 4 = 40 frames per update, decaying to 0 over 400 frames.
    settings = dict(
        batch_size=2,
        unroll_length=5,
        num_action_repeats=4,
        total_environment_frames=400,
        learning_rate=0.01,
    )
    return LearnerConfig(**{**settings, **overrides})


def numpy_rmsprop_step(w, gradient, config: LearnerConfig, learning_rate: float):
    """TensorFlow v1 RMSProp's first step: mean squares start at 1, epsilon
    inside the square root, no momentum."""
    mean_square = config.decay * 1.0 + (1 - config.decay) * gradient**2
    return w - learning_rate * gradient / np.sqrt(mean_square + config.epsilon)


def run_updates(config: LearnerConfig, steps: int = 1, after_step=None):
    """(w, frames, learning rates seen, global norms) after `steps` updates
    of the quadratic loss."""
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(W0, name="w", use_resource=True)
        loss = tf.reduce_sum(SCALE * tf.square(w) / 2)
        update = build_update([loss], [w], config, after_step)
        rates, norms = [], []
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                rate, norm = session.run((update.learning_rate, update.global_norm))
                rates.append(rate)
                norms.append(norm)
                frames = session.run(update.train_and_count)
            return session.run(w), frames, rates, norms


@pytest.mark.parametrize("max_grad_norm", [0.0, 5.0, 100.0])
def test_gradients_are_clipped_to_max_grad_norm(max_grad_norm):
    config = learner_config(max_grad_norm=max_grad_norm)
    w, _, rates, norms = run_updates(config)
    gradient = SCALE * W0
    assert norms[0] == pytest.approx(np.linalg.norm(gradient))  # before clipping
    if 0 < max_grad_norm < np.linalg.norm(gradient):
        gradient = gradient * max_grad_norm / np.linalg.norm(gradient)
    expected = numpy_rmsprop_step(W0, gradient, config, rates[0])
    np.testing.assert_allclose(w, expected, rtol=1e-5)
    unclipped = numpy_rmsprop_step(W0, SCALE * W0, config, rates[0])
    # The check can fail: a clipped step differs from the unclipped one.
    assert np.allclose(w, unclipped, rtol=1e-5) == (max_grad_norm != 5.0)


def test_the_learning_rate_decays_linearly_to_zero_with_the_frame_count():
    config = learner_config()
    _, frames, rates, _ = run_updates(config, steps=11)
    assert frames == 11 * config.frames_per_update == 440
    # 40 of 400 frames per update: a tenth of the rate each time, then 0.
    expected = [0.01 * (1 - k / 10) for k in range(10)] + [0.0]
    np.testing.assert_allclose(rates, expected, atol=1e-9)


def test_learning_rate_decay_frames_sets_the_horizon():
    config = learner_config(learning_rate_decay_frames=80)
    _, _, rates, _ = run_updates(config, steps=3)
    np.testing.assert_allclose(rates, [0.01, 0.005, 0.0], atol=1e-9)


def test_after_step_runs_after_the_optimiser_step_and_before_the_count():
    """PopArt's statistics update (after_step) sees the updated variables
    and the frame count of before the update, once per update."""
    seen = []

    def after_step():
        graph = tf.compat.v1.get_default_graph()
        w = graph.get_tensor_by_name("w:0")
        frames = tf.compat.v1.train.get_global_step()

        def record(w_value, frames_value):
            seen.append((w_value.copy(), int(frames_value)))
            return np.int64(0)

        w_read = tf.raw_ops.ReadVariableOp(resource=w, dtype=tf.float32)
        return tf.compat.v1.py_func(record, [w_read, frames.read_value()], tf.int64)

    config = learner_config()
    w, frames, _, _ = run_updates(config, steps=2, after_step=after_step)
    assert [f for _, f in seen] == [0, 40]
    np.testing.assert_allclose(seen[-1][0], w)  # the variables after the step
    assert not np.allclose(seen[0][0], W0)
    assert frames == 80


def test_guard_finite_update_blocks_the_update(tmp_path):
    with tf.Graph().as_default():
        frames = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.Variable([1.0, 2.0], name="weights")
        x = tf.compat.v1.placeholder(tf.float32, [2])
        loss = tf.reduce_sum(weights * x)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        gradients, variables = zip(*optimizer.compute_gradients(loss), strict=True)
        gradients = guard_finite_update(
            loss, gradients, tf.linalg.global_norm(gradients), frames
        )
        train_op = optimizer.apply_gradients(zip(gradients, variables, strict=True))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, {x: [1.0, 1.0]})
            good = session.run(weights)
            np.testing.assert_allclose(good, [0.9, 1.9])
            for bad in ([np.nan, 1.0], [np.inf, 0.0]):
                with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                    session.run(train_op, {x: bad})
                np.testing.assert_array_equal(session.run(weights), good)
                update = non_finite_update(raised.value)
                assert update.num_env_frames == "0"
                assert update.total_loss in ("nan", "inf")
                with pytest.raises(
                    errors.NonFiniteUpdateError, match="at 0 environment frames"
                ):
                    loop.raise_if_non_finite(raised.value, str(tmp_path))


def test_a_non_finite_loss_moves_neither_the_variables_nor_the_frame_count():
    config = learner_config()
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(W0, name="w", use_resource=True)
        poison = tf.compat.v1.placeholder(tf.float32, [])
        loss = tf.reduce_sum(SCALE * tf.square(w) / 2) * poison
        update = build_update([loss], [w], config)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert session.run(update.train_and_count, {poison: 1.0}) == 40
            kept = session.run(w)
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                session.run(update.train_and_count, {poison: np.nan})
            np.testing.assert_array_equal(session.run(w), kept)
            assert session.run(update.num_env_frames) == 40
            assert non_finite_update(raised.value).num_env_frames == "40"
