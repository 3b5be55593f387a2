"""PopArt (popart.py, learner.compute_loss with a PopArtBatch): the
normalised loss and its gradients against NumPy on hand-made batches of two
levels, the outputs preserved by every statistics update, the statistics of
one level untouched by another's trajectories, and the paper's loss
unchanged when the statistics are at mean 0 and scale 1 (and when --popart
is off, bit for bit); the statistics' warm-up (a level's n-th update steps
by max(beta, 1/n)); one whole learner step (the optimiser's, then the
statistics' with the rescale) against the post-gradient network; and the
per-level summaries that show what PopArt changes. The end-to-end runs (two Atari levels, checkpoint and
resume, test mode) are in tests/popart_run_test.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from loss_test import A, B, T, config, numpy_loss, run_loss
from loss_test import batch as loss_batch
from run_helpers import random_unrolls, small_config
from vtrace_test import numpy_log_softmax, numpy_vtrace

import agent as agent_lib
import trajectory
from actor.unroll import actor_output_specs
from config import LearnerConfig
from learner import popart
from learner.update import build_learner

L = 2  # levels in the batch
LEVELS = ("atari/pong", "atari/seaquest")


def popart_batch_data(seed: int) -> dict:
    """loss_test's batch with [T + 1, B, L] normalised values, each
    trajectory's level (both levels present) and statistics of very
    different scales."""
    rng = np.random.default_rng(100 + seed)
    data = loss_batch(seed)
    data["baseline"] = rng.normal(size=[T + 1, B, L])
    data["level_ids"] = np.array([0, 1, 1], np.int32)[:B]
    data["rewards"] = data["rewards"] * np.array([1.0, 300.0, 300.0])[:B]
    data["mean"] = np.array([0.5, 120.0])
    data["scale"] = np.array([2.0, 400.0])
    return data


def run_popart_loss(data: dict, learner_config) -> dict:
    """loss_test.run_loss with a PopArtBatch: the terms and their gradients
    with respect to the logits and the normalised values ("d_values")."""
    got = run_loss(data, learner_config, popart=True)
    return {
        key.replace("/d_baseline", "/d_values"): value for key, value in got.items()
    }


def numpy_popart_loss(data: dict, learner_config) -> dict:
    """The PopArt terms and gradients by their definitions, in float64."""
    ids = data["level_ids"]
    mean, scale = data["mean"][ids], data["scale"][ids]  # [B]
    normalised = np.take_along_axis(
        data["baseline"], np.broadcast_to(ids[None, :, None], [T + 1, B, 1]), -1
    )[..., 0]  # [T + 1, B]
    unnormalised = scale * normalised + mean
    logits = data["learner_logits"][:-1]
    actions = data["actions"][1:]
    rewards = data["rewards"][1:]
    if learner_config.reward_clipping == "abs_one":
        rewards = np.clip(rewards, -1, 1)
    discounts = (~data["done"][1:]) * learner_config.discounting
    log_policy = numpy_log_softmax(logits)
    policy = np.exp(log_policy)
    take = np.take_along_axis
    log_pi = take(log_policy, actions[..., None], -1)[..., 0]
    behaviour = numpy_log_softmax(data["behaviour_logits"][1:])
    log_mu = take(behaviour, actions[..., None], -1)[..., 0]
    vs, pg_advantages = numpy_vtrace(
        log_pi - log_mu, discounts, rewards, unnormalised[:-1], unnormalised[-1]
    )
    advantages = pg_advantages / scale
    normalised_error = (vs - mean) / scale - normalised[:-1]
    cost = learner_config.baseline_cost
    out = {
        "vs": vs,
        "policy_gradient": -(log_pi * advantages).sum(),
        "baseline": cost * 0.5 * (normalised_error**2).sum(),
    }
    d_pg = np.zeros([T + 1, B, A])
    d_pg[:-1] = (policy - np.eye(A)[actions]) * advantages[..., None]
    d_values = np.zeros([T + 1, B, L])
    for b in range(B):
        d_values[:-1, b, ids[b]] = -cost * normalised_error[:, b]
    out["d_policy_gradient/d_logits"] = d_pg
    out["d_policy_gradient/d_values"] = np.zeros([T + 1, B, L])
    out["d_baseline/d_logits"] = np.zeros([T + 1, B, A])
    out["d_baseline/d_values"] = d_values
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("clipping", ["none", "abs_one"])
@pytest.mark.parametrize(
    "name",
    [
        "vs",
        "policy_gradient",
        "baseline",
        "d_policy_gradient/d_logits",
        "d_policy_gradient/d_values",
        "d_baseline/d_logits",
        "d_baseline/d_values",
    ],
)
def test_normalised_loss_and_gradients_match_numpy(seed, clipping, name):
    data = popart_batch_data(seed)
    learner_config = config(reward_clipping=clipping)
    got = run_popart_loss(data, learner_config)
    expected = numpy_popart_loss(data, learner_config)
    scale = np.abs(expected[name]).max() + 1e-3
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("clipping", ["abs_one", "none"])
def test_at_mean_zero_and_scale_one_the_loss_is_the_papers_exactly(clipping):
    """One level, statistics at their start (mean 0, second moment 1): every
    term and gradient equals the loss without PopArt, bit for bit."""
    data = loss_batch(7)
    learner_config = config(reward_clipping=clipping)
    plain = run_loss(data, learner_config)
    with_popart = dict(data, baseline=data["baseline"][..., None])
    with_popart["level_ids"] = np.zeros([B], np.int32)
    with_popart["mean"] = np.zeros([1])
    with_popart["scale"] = popart.scale_from_moments(np.zeros(1), np.ones(1))
    got = run_popart_loss(with_popart, learner_config)
    for name in ("total", "policy_gradient", "baseline", "entropy", "vs"):
        np.testing.assert_array_equal(got[name], plain[name], err_msg=name)
    np.testing.assert_array_equal(
        got["d_total/d_values"][..., 0], plain["d_total/d_baseline"]
    )
    np.testing.assert_array_equal(got["d_total/d_logits"], plain["d_total/d_logits"])


def test_unclipped_rewards_reach_the_targets_as_they_are():
    data = loss_batch(8)
    got = run_loss(data, config(reward_clipping="none"))
    expected = numpy_loss(data, config(reward_clipping="abs_one"))
    assert not np.allclose(got["vs"], expected["vs"])
    assert np.abs(data["rewards"]).max() > 1.0
    # On-policy, a constant reward of 5, every step an episode's end: the
    # targets are the rewards themselves.
    rewards = np.full([T + 1, B], 5.0)
    done = np.ones([T + 1, B], bool)
    data["learner_logits"][:-1] = data["behaviour_logits"][1:]
    got = run_loss(
        dict(data, rewards=rewards, done=done), config(reward_clipping="none")
    )
    np.testing.assert_allclose(got["vs"], 5.0, rtol=1e-6)


# -- the statistics and the preserved outputs ----------------------------------


def run_update(
    vs: np.ndarray,
    level_ids: np.ndarray,
    mean: np.ndarray,
    second: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    beta: float,
    features: np.ndarray,
    updates: float = 1e6,
) -> dict:
    """PopArt.update in a graph: the statistics and the head after one
    update, and the head's unnormalised outputs on `features` before and
    after it. `updates`: each level's updates so far (by default far past
    the warm-up, so the step is `beta`)."""
    num_levels = len(mean)
    levels = [f"level_{i}" for i in range(num_levels)]
    with tf.Graph().as_default():
        stats = popart.PopArt(levels, beta)
        w_var = tf.compat.v1.Variable(w, dtype=tf.float32)
        b_var = tf.compat.v1.Variable(b, dtype=tf.float32)
        names = tf.constant([levels[i] for i in level_ids])
        batch = stats.batch(names)
        x = tf.constant(features, tf.float32)

        def unnormalised():
            normalised = tf.matmul(x, w_var) + b_var  # [N, L]
            return normalised * stats.scale() + stats.mean

        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(
                [
                    stats.mean.assign(mean),
                    stats.second_moment.assign(second),
                    stats.count.assign(np.full(num_levels, updates, np.float32)),
                ]
            )
            before = session.run(unnormalised())
            got_ids = session.run(batch.level_ids)
            session.run(stats.update(tf.constant(vs, tf.float32), batch, w_var, b_var))
            after = session.run(unnormalised())
            return dict(
                level_ids=got_ids,
                mean=session.run(stats.mean),
                second=session.run(stats.second_moment),
                w=session.run(w_var),
                b=session.run(b_var),
                before=before,
                after=after,
            )


def random_statistics(rng, num_levels: int):
    mean = rng.normal(scale=50.0, size=num_levels)
    scale = np.exp(rng.uniform(np.log(0.01), np.log(1000.0), size=num_levels))
    return mean, mean**2 + scale**2


@pytest.mark.parametrize("seed", range(5))
def test_every_update_preserves_every_levels_unnormalised_outputs(seed):
    """Random statistics, random targets of wildly different scales on all
    levels: the head's unnormalised outputs stay what they were (float32
    tolerance), while its normalised outputs and the statistics change."""
    rng = np.random.default_rng(seed)
    num_levels, hidden = 4, 8
    mean, second = random_statistics(rng, num_levels)
    ids = np.array([0, 1, 2, 3, 1, 2], np.int32)
    vs = rng.normal(size=[T, len(ids)]) * rng.choice([0.1, 10.0, 3000.0], len(ids))
    w, b = rng.normal(size=[hidden, num_levels]), rng.normal(size=num_levels)
    features = rng.normal(size=[16, hidden])
    got = run_update(vs, ids, mean, second, w, b, 0.3, features)
    np.testing.assert_allclose(
        got["after"], got["before"], rtol=2e-4, atol=2e-4 * np.abs(got["before"]).max()
    )
    assert not np.allclose(got["mean"], mean)
    assert not np.allclose(got["w"], w)


def test_statistics_follow_their_levels_targets_and_no_other():
    """Two levels in a batch, a third absent: each present level's mean and
    second moment move by beta towards the moments of its own trajectories'
    targets; the absent one keeps its statistics and its head column."""
    rng = np.random.default_rng(11)
    mean, second = np.array([1.0, -2.0, 7.0]), np.array([5.0, 8.0, 50.0])
    ids = np.array([0, 1, 1, 0], np.int32)
    vs = np.stack(
        [np.full(T, 10.0), np.full(T, -400.0), np.full(T, -200.0), np.full(T, 30.0)], 1
    )
    w, b = rng.normal(size=[3, 3]), rng.normal(size=3)
    beta = 0.25
    got = run_update(vs, ids, mean, second, w, b, beta, rng.normal(size=[2, 3]))
    np.testing.assert_array_equal(got["level_ids"], ids)
    expected_mean = [
        (1 - beta) * 1.0 + beta * 20.0,
        (1 - beta) * -2.0 + beta * -300.0,
        7.0,
    ]
    expected_second = [
        (1 - beta) * 5.0 + beta * (100.0 + 900.0) / 2,
        (1 - beta) * 8.0 + beta * (160000.0 + 40000.0) / 2,
        50.0,
    ]
    np.testing.assert_allclose(got["mean"], expected_mean, rtol=1e-6)
    np.testing.assert_allclose(got["second"], expected_second, rtol=1e-6)
    np.testing.assert_array_equal(got["w"][:, 2], w[:, 2].astype(np.float32))
    np.testing.assert_array_equal(got["b"][2], np.float32(b[2]))


def test_a_levels_statistics_do_not_depend_on_another_levels_trajectories():
    rng = np.random.default_rng(12)
    mean, second = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    ids = np.array([0, 1], np.int32)
    w, b = rng.normal(size=[2, 2]), rng.normal(size=2)
    vs = rng.normal(size=[T, 2])
    other = vs.copy()
    other[:, 1] *= 1000.0  # only level 1's targets change
    first = run_update(vs, ids, mean, second, w, b, 0.1, np.eye(2))
    second_run = run_update(other, ids, mean, second, w, b, 0.1, np.eye(2))
    assert first["mean"][0] == second_run["mean"][0]
    assert first["second"][0] == second_run["second"][0]
    np.testing.assert_array_equal(first["w"][:, 0], second_run["w"][:, 0])
    assert first["mean"][1] != second_run["mean"][1]


def test_a_levels_first_updates_average_its_batches_then_decay_by_beta():
    """The warm-up: a level's n-th update steps by max(beta, 1/n), so after
    its first k <= 1/beta updates its statistics are the plain average of
    the k batches' moments, whatever they started from; a level absent from
    a batch neither moves nor counts it. Past 1/beta updates the step is
    beta (test_statistics_follow_their_levels_targets_and_no_other)."""
    beta, targets = 0.1, [4.0, -8.0, 40.0, 10.0]
    levels = ["level_0", "level_1"]
    with tf.Graph().as_default():
        stats = popart.PopArt(levels, beta)
        w = tf.compat.v1.Variable(np.ones([3, 2]), dtype=tf.float32)
        b = tf.compat.v1.Variable(np.zeros(2), dtype=tf.float32)
        vs = tf.compat.v1.placeholder(tf.float32, [T, 1])
        batch = stats.batch(tf.constant(["level_0"]))
        update = stats.update(vs, batch, w, b)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            means = []
            for target in targets:
                session.run(update, {vs: np.full([T, 1], target)})
                means.append(session.run(stats.mean))
            count, second = session.run((stats.count, stats.second_moment))
    averages = np.cumsum(targets) / np.arange(1, len(targets) + 1)
    np.testing.assert_allclose([m[0] for m in means], averages, rtol=1e-6)
    np.testing.assert_allclose(second[0], np.mean(np.square(targets)), rtol=1e-6)
    # Level 1 was in no batch: its statistics and count are the initial ones.
    assert [m[1] for m in means] == [0.0] * len(targets)
    np.testing.assert_array_equal(count, [len(targets), 0])
    # The step sizes: 1/n while 1/n > beta, then beta.
    np.testing.assert_allclose(
        popart.step_sizes(np.array([0, 1, 9, 10, 1000]), beta),
        [1.0, 0.5, 0.1, 0.1, 0.1],
    )


def test_scale_is_clamped():
    np.testing.assert_allclose(
        popart.scale_from_moments(np.array([3.0, 0.0]), np.array([9.0, 1e14])),
        [popart.MIN_SCALE, popart.MAX_SCALE],
    )
    assert popart.scale_from_moments(np.array([0.0]), np.array([1.0]))[0] == 1.0


def test_a_trajectory_of_a_level_outside_the_run_fails_the_step():
    with tf.Graph().as_default():
        ids = popart.level_ids(tf.constant(["atari/pong", "atari/qbert"]), LEVELS)
        with tf.compat.v1.Session() as session:
            with pytest.raises(tf.errors.InvalidArgumentError, match="not in the run"):
                session.run(ids)


def test_beta_outside_its_range_is_refused():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="beta=0"):
        popart.PopArt(LEVELS, 0.0)


# -- one whole learner step -----------------------------------------------------


def whole_step_values(unrolls, start=None):
    """A PopArt learner (build_learner: the optimiser step, then the
    statistics update and the rescale) on a fixed batch of two levels: each
    trajectory's unnormalised values, sigma * n(x) + mu in its level's
    column, before and after one step; the variables' initial values (from
    `start` when given); PopArt's means after the step."""
    agent_config = dataclasses.replace(small_config().agent, num_values=len(LEVELS))
    config = LearnerConfig(
        batch_size=len(unrolls),
        unroll_length=4,
        num_action_repeats=4,
        total_environment_frames=10**6,
        learning_rate=0.05,
        reward_clipping="none",
        popart=True,
        popart_beta=0.3,
        level_names=LEVELS,
    )
    with tf.Graph().as_default():
        agent = agent_lib.create_agent(agent_config)
        batch = trajectory.stack_unrolls(
            [tf.nest.map_structure(tf.constant, u) for u in unrolls]
        )
        learner = build_learner(agent, [batch], config)
        outputs, _ = agent.unroll(
            batch.agent_outputs.action, batch.env_outputs, batch.agent_state
        )
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        mean = by_name["popart/mean"].read_value()
        second = by_name["popart/second_moment"].read_value()
        scale = popart.scale_from_moments(mean, second)
        column = tf.one_hot(popart.level_ids(batch.level_name, LEVELS), len(LEVELS))
        values = tf.reduce_sum((outputs.baseline * scale + mean) * column, axis=-1)
        with tf.compat.v1.Session() as session:
            session.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            if start is not None:
                for name, v in by_name.items():
                    v.load(start[name], session)
            initial = {name: session.run(v) for name, v in by_name.items()}
            before = session.run(values)
            session.run(learner.train_and_count)
            after, moved = session.run((values, mean))
    return before, after, initial, moved


def test_a_whole_learner_step_preserves_the_post_gradient_networks_values(
    monkeypatch,
):
    """build_learner's PopArt step on a fixed batch: after the optimiser step
    and then the statistics update with the rescale, every unnormalised value
    equals the post-gradient network's under the old statistics (the same
    step from the same variables with the statistics update left out). The
    step did move the values and the statistics, so the comparison can fail
    (as it would with the rescale before the optimiser step, or none)."""
    agent_config = dataclasses.replace(small_config().agent, num_values=len(LEVELS))
    environment = dataclasses.replace(small_config().environment, level_names=LEVELS)
    specs = actor_output_specs(environment, agent_config, 4)
    unrolls = random_unrolls(specs, 4, agent_config.num_actions, LEVELS, seed=3)
    for i, unroll in enumerate(unrolls):  # rewards of two scales
        unroll.env_outputs.reward[:] *= 1.0 if i % 2 == 0 else 100.0
    before, after, initial, moved = whole_step_values(unrolls)
    monkeypatch.setattr(popart.PopArt, "update", lambda self, *args: tf.no_op())
    _, expected, _, unmoved = whole_step_values(unrolls, start=initial)
    np.testing.assert_array_equal(unmoved, initial["popart/mean"])
    assert not np.allclose(moved, initial["popart/mean"], atol=1e-3)
    assert not np.allclose(expected, before, rtol=1e-3)
    np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-3)


def level_summary_values(unrolls, use_popart: bool, scales=None) -> dict:
    """build_learner's per-level summaries on a fixed batch of two levels
    without reward clipping: {tag: value} of `levels/...`; with PopArt, its
    statistics at mean 0 and the given scales."""
    agent_config = dataclasses.replace(
        small_config().agent, num_values=len(LEVELS) if use_popart else 0
    )
    config = LearnerConfig(
        batch_size=len(unrolls),
        unroll_length=4,
        num_action_repeats=4,
        total_environment_frames=10**6,
        reward_clipping="none",
        popart=use_popart,
        level_names=LEVELS,
    )
    with tf.Graph().as_default():
        agent = agent_lib.create_agent(agent_config)
        batch = trajectory.stack_unrolls(
            [tf.nest.map_structure(tf.constant, u) for u in unrolls]
        )
        build_learner(agent, [batch], config)
        summaries = tf.compat.v1.summary.merge_all()
        with tf.compat.v1.Session() as session:
            session.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            if scales is not None:
                by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
                by_name["popart/second_moment"].load(np.square(scales), session)
            proto = tf.compat.v1.Summary.FromString(session.run(summaries))
    return {v.tag: v.simple_value for v in proto.value if v.tag.startswith("levels/")}


def test_level_summaries_show_the_large_reward_level_dominate_without_popart():
    """Rewards 100x larger on one level: without PopArt (no clipping) that
    level takes nearly all of the gradient with respect to the network's
    outputs and its advantages are ~100x the other's; with PopArt at scales
    matching the rewards the shares come close to each other."""
    agent_config = small_config().agent
    environment = dataclasses.replace(small_config().environment, level_names=LEVELS)
    specs = actor_output_specs(environment, agent_config, 4)
    unrolls = random_unrolls(specs, 4, agent_config.num_actions, LEVELS, seed=5)
    for i, unroll in enumerate(unrolls):  # level 1 (odd unrolls): 100x rewards
        unroll.env_outputs.reward[:] *= 1.0 if i % 2 == 0 else 100.0
    plain = level_summary_values(unrolls, use_popart=False)
    small, large = LEVELS
    shares = [plain[f"levels/{level}/gradient_share"] for level in LEVELS]
    assert sum(shares) == pytest.approx(1.0, rel=1e-5)
    assert shares[1] > 0.9, plain
    ratio = (
        plain[f"levels/{large}/mean_abs_pg_advantage"]
        / plain[f"levels/{small}/mean_abs_pg_advantage"]
    )
    assert ratio > 20, plain
    normalised = level_summary_values(unrolls, use_popart=True, scales=[1.0, 100.0])
    shares = [normalised[f"levels/{level}/gradient_share"] for level in LEVELS]
    assert 0.2 < shares[0] < 0.8, normalised
