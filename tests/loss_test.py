"""learner.compute_loss, term by term, against NumPy on small hand-made
batches: each loss term's value and its gradient with respect to the
learner's logits and baselines, the V-trace targets it feeds them, and the
alignment of steps (the learner's output at t with the action recorded at
t + 1). All inputs are time-major, [T + 1, B, ...], as the learner gets
them.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf
from vtrace_test import numpy_log_softmax, numpy_vtrace

import agent as agent_lib
from config import LearnerConfig
from families.contract import StepOutput
from learner.loss import compute_loss

T, B, A = 5, 3, 4
DISCOUNTING = 0.9


def config(**overrides) -> LearnerConfig:
    values = dict(
        batch_size=B,
        unroll_length=T,
        num_action_repeats=4,
        total_environment_frames=10**6,
        discounting=DISCOUNTING,
        baseline_cost=0.5,
        entropy_cost=0.01,
    )
    values.update(overrides)
    return LearnerConfig(**values)


def batch(seed: int) -> dict:
    """A hand-made batch: rewards beyond [-1, 1] (clipping shows), episode
    ends at known places, behaviour logits unlike the learner's."""
    rng = np.random.default_rng(seed)
    done = np.zeros([T + 1, B], bool)
    done[2, 0] = done[4, 1] = True
    return dict(
        learner_logits=rng.normal(size=[T + 1, B, A]),
        baseline=rng.normal(size=[T + 1, B]),
        behaviour_logits=rng.normal(size=[T + 1, B, A]),
        actions=rng.integers(0, A, size=[T + 1, B]).astype(np.int32),
        rewards=rng.normal(scale=3.0, size=[T + 1, B]),
        done=done,
    )


def run_loss(data: dict, learner_config: LearnerConfig, popart: bool = False) -> dict:
    """compute_loss on `data`, its terms and their gradients with respect to
    the learner's logits and baselines, as NumPy. With `popart`, `data` also
    holds the PopArtBatch's level_ids, mean and scale (popart_test.py)."""
    from learner import popart as popart_lib

    with tf.Graph().as_default():
        logits = tf.constant(data["learner_logits"], tf.float32)
        baseline = tf.constant(data["baseline"], tf.float32)
        actions = tf.constant(data["actions"])
        learner_outputs = agent_lib.AgentOutput(actions, logits, baseline)
        agent_outputs = agent_lib.AgentOutput(
            actions, tf.constant(data["behaviour_logits"], tf.float32), baseline
        )
        env_outputs = StepOutput(
            tf.constant(data["rewards"], tf.float32),
            None,
            tf.constant(data["done"]),
            None,
        )
        stats = None
        if popart:
            stats = popart_lib.PopArtBatch(
                tf.constant(data["level_ids"]),
                tf.constant(data["mean"], tf.float32),
                tf.constant(data["scale"], tf.float32),
            )
        out = compute_loss(
            learner_outputs, agent_outputs, env_outputs, learner_config, stats
        )
        losses = out.losses
        fetches = {
            "total": losses.total,
            "policy_gradient": losses.policy_gradient,
            "baseline": losses.baseline,
            "entropy": losses.entropy,
            "policy_entropy": out.policy_entropy,
            "vs": out.vtrace_returns.vs,
            "pg_advantages": out.vtrace_returns.pg_advantages,
        }
        for name in ("total", "policy_gradient", "baseline", "entropy"):
            d_logits, d_baseline = tf.gradients(
                fetches[name], [logits, baseline], unconnected_gradients="zero"
            )
            fetches[f"d_{name}/d_logits"] = d_logits
            fetches[f"d_{name}/d_baseline"] = d_baseline
        with tf.compat.v1.Session() as session:
            return session.run(fetches)


def numpy_loss(data: dict, learner_config: LearnerConfig) -> dict:
    """The same terms and gradients by their definitions, in float64."""
    # Alignment: transitions are steps 1..T; the learner's output at t chose
    # the action recorded at t + 1; its baseline at T bootstraps.
    logits = data["learner_logits"][:-1]
    values = data["baseline"][:-1]
    bootstrap = data["baseline"][-1]
    actions = data["actions"][1:]
    behaviour = data["behaviour_logits"][1:]
    rewards = np.clip(data["rewards"][1:], -1, 1)
    discounts = (~data["done"][1:]) * learner_config.discounting

    log_policy = numpy_log_softmax(logits)
    policy = np.exp(log_policy)
    take = np.take_along_axis
    log_pi = take(log_policy, actions[..., None], -1)[..., 0]
    log_mu = take(numpy_log_softmax(behaviour), actions[..., None], -1)[..., 0]
    vs, pg_advantages = numpy_vtrace(
        log_pi - log_mu, discounts, rewards, values, bootstrap
    )
    one_hot = np.eye(A)[actions]

    baseline_cost = learner_config.baseline_cost
    entropy_cost = learner_config.entropy_cost
    neg_entropy = (policy * log_policy).sum(-1)  # [T, B]
    out = {
        "vs": vs,
        "pg_advantages": pg_advantages,
        "policy_gradient": -(log_pi * pg_advantages).sum(),
        "baseline": baseline_cost * 0.5 * ((vs - values) ** 2).sum(),
        "entropy": entropy_cost * neg_entropy.sum(),
        "policy_entropy": -neg_entropy.mean(),
    }
    out["total"] = out["policy_gradient"] + out["baseline"] + out["entropy"]

    # Gradients. The targets (vs, pg_advantages) are constants: V-trace
    # stops their gradients, so no term reaches the bootstrap value.
    zero_logits = np.zeros([T + 1, B, A])
    zero_baseline = np.zeros([T + 1, B])
    d_pg = zero_logits.copy()
    d_pg[:-1] = (policy - one_hot) * pg_advantages[..., None]
    d_entropy = zero_logits.copy()
    d_entropy[:-1] = entropy_cost * policy * (log_policy - neg_entropy[..., None])
    d_baseline = zero_baseline.copy()
    d_baseline[:-1] = -baseline_cost * (vs - values)
    out.update(
        {
            "d_policy_gradient/d_logits": d_pg,
            "d_policy_gradient/d_baseline": zero_baseline,
            "d_baseline/d_logits": zero_logits,
            "d_baseline/d_baseline": d_baseline,
            "d_entropy/d_logits": d_entropy,
            "d_entropy/d_baseline": zero_baseline,
            "d_total/d_logits": d_pg + d_entropy,
            "d_total/d_baseline": d_baseline,
        }
    )
    return out


@functools.cache
def both(seed: int) -> tuple[dict, dict]:
    """(compute_loss's, NumPy's) terms and gradients on batch(seed)."""
    data, learner_config = batch(seed), config()
    return run_loss(data, learner_config), numpy_loss(data, learner_config)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "term",
    ["vs", "pg_advantages", "policy_gradient", "baseline", "entropy", "total"],
)
def test_each_term_matches_numpy(seed, term):
    got, expected = both(seed)
    np.testing.assert_allclose(got[term], expected[term], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("term", ["policy_gradient", "baseline", "entropy", "total"])
@pytest.mark.parametrize("wrt", ["logits", "baseline"])
def test_each_gradient_matches_numpy(seed, term, wrt):
    name = f"d_{term}/d_{wrt}"
    got, expected = both(seed)
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)


def test_policy_entropy_is_the_mean_entropy_per_step():
    data, learner_config = batch(3), config()
    got, expected = run_loss(data, learner_config), numpy_loss(data, learner_config)
    np.testing.assert_allclose(got["policy_entropy"], expected["policy_entropy"], 1e-5)
    assert 0 < got["policy_entropy"] <= np.log(A)


def test_costs_scale_their_terms_only():
    data = batch(4)
    base = run_loss(data, config())
    scaled = run_loss(data, config(baseline_cost=1.0, entropy_cost=0.02))
    np.testing.assert_allclose(scaled["baseline"], 2 * base["baseline"], rtol=1e-5)
    np.testing.assert_allclose(scaled["entropy"], 2 * base["entropy"], rtol=1e-5)
    np.testing.assert_allclose(scaled["policy_gradient"], base["policy_gradient"])


def test_an_episode_end_cuts_the_targets():
    """With done at step t + 1 the return from step t is that transition's
    reward alone (discount 0): no value of the next episode leaks in."""
    data = batch(5)
    # On-policy: the learner's output at t is the behaviour at t + 1.
    data["learner_logits"][:-1] = data["behaviour_logits"][1:]
    got = run_loss(data, config())
    # done[2, 0]: the transition into step 2 (index 1 of [T, B]) ends.
    np.testing.assert_allclose(
        got["vs"][1, 0], np.clip(data["rewards"][2, 0], -1, 1), rtol=1e-5
    )


def test_rewards_are_clipped_as_configured():
    data = batch(6)
    abs_one = run_loss(data, config())
    soft = run_loss(data, config(reward_clipping="soft_asymmetric"))
    assert not np.allclose(abs_one["vs"], soft["vs"])
    np.testing.assert_allclose(
        abs_one["vs"], numpy_loss(data, config())["vs"], rtol=1e-4, atol=1e-5
    )


def test_compute_loss_places_nothing_on_a_device():
    """A pure function: where it runs is its caller's choice (build_learner
    puts it on the CPU, where V-trace's recursion is fastest)."""
    data = batch(0)
    with tf.Graph().as_default() as graph:
        logits = tf.constant(data["learner_logits"], tf.float32)
        baseline = tf.constant(data["baseline"], tf.float32)
        actions = tf.constant(data["actions"])
        compute_loss(
            agent_lib.AgentOutput(actions, logits, baseline),
            agent_lib.AgentOutput(actions, logits, baseline),
            StepOutput(
                tf.constant(data["rewards"], tf.float32),
                None,
                tf.constant(data["done"]),
                None,
            ),
            config(),
        )
        devices = {op.device for op in graph.get_operations()}
        assert devices == {""}, devices
        # The check can fail: a placement inside would show.
        with tf.device("/cpu:0"):
            tf.constant(1.0)
        assert {op.device for op in graph.get_operations()} != {""}


# -- the paper's off-policy corrections (section 5.2.2) ---------------------------

CORRECTIONS = ("vtrace", "no_correction", "epsilon_correction", "one_step_is")


def numpy_corrected(data: dict, learner_config: LearnerConfig) -> dict:
    """vs, pg_advantages and the loss terms of `learner_config`'s correction
    by their definitions (learner/loss.py's table), float64."""
    logits = data["learner_logits"][:-1]
    values = data["baseline"][:-1]
    bootstrap = data["baseline"][-1]
    actions = data["actions"][1:]
    rewards = np.clip(data["rewards"][1:], -1, 1)
    discounts = (~data["done"][1:]) * learner_config.discounting
    log_policy = numpy_log_softmax(logits)
    take = np.take_along_axis
    log_pi = take(log_policy, actions[..., None], -1)[..., 0]
    log_mu = take(
        numpy_log_softmax(data["behaviour_logits"][1:]), actions[..., None], -1
    )[..., 0]
    rho_bar, c_bar = learner_config.rho_bar, learner_config.c_bar
    lambda_ = learner_config.vtrace_lambda
    correction = learner_config.off_policy_correction
    if correction == "vtrace":
        vs, pg = numpy_vtrace(
            log_pi - log_mu,
            discounts,
            rewards,
            values,
            bootstrap,
            rho_bar,
            rho_bar,
            c_bar,
            lambda_,
        )
    else:
        vs, pg = numpy_vtrace(
            np.zeros_like(log_pi),
            discounts,
            rewards,
            values,
            bootstrap,
            lambda_=lambda_,
        )
        if correction == "one_step_is":
            pg = np.minimum(rho_bar, np.exp(log_pi - log_mu)) * pg
    if correction == "epsilon_correction":
        log_taken = np.log(np.exp(log_pi) + 1e-6)
    else:
        log_taken = log_pi
    policy_gradient = -(log_taken * pg).sum()
    baseline = learner_config.baseline_cost * 0.5 * ((vs - values) ** 2).sum()
    entropy = learner_config.entropy_cost * (np.exp(log_policy) * log_policy).sum()
    return {
        "vs": vs,
        "pg_advantages": pg,
        "policy_gradient": policy_gradient,
        "baseline": baseline,
        "total": policy_gradient + baseline + entropy,
    }


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize(
    "rho_bar,c_bar,vtrace_lambda", [(1.0, 1.0, 1.0), (10.0, 0.5, 1.0), (1.0, 1.0, 0.9)]
)
def test_each_correction_matches_numpy_term_by_term(
    correction, rho_bar, c_bar, vtrace_lambda
):
    data = batch(3)
    learner_config = config(
        off_policy_correction=correction,
        rho_bar=rho_bar,
        c_bar=c_bar,
        vtrace_lambda=vtrace_lambda,
    )
    got, want = run_loss(data, learner_config), numpy_corrected(data, learner_config)
    for term in ("vs", "pg_advantages", "policy_gradient", "baseline", "total"):
        np.testing.assert_allclose(
            got[term], want[term], rtol=1e-4, atol=1e-4, err_msg=term
        )


def test_the_four_corrections_agree_when_the_policies_are_equal():
    data = batch(4)
    # The actor's logits at t + 1 are the learner's at t (the alignment).
    data["behaviour_logits"][1:] = data["learner_logits"][:-1]
    outs = {c: run_loss(data, config(off_policy_correction=c)) for c in CORRECTIONS}
    for correction, out in outs.items():
        for term in ("vs", "pg_advantages", "baseline"):
            np.testing.assert_allclose(
                out[term],
                outs["vtrace"][term],
                rtol=1e-5,
                atol=1e-6,
                err_msg=correction,
            )
        # epsilon_correction's log(pi + 1e-6) moves the policy term a hair.
        np.testing.assert_allclose(
            out["total"], outs["vtrace"]["total"], rtol=1e-4, err_msg=correction
        )


def test_no_correction_differs_from_vtrace_when_the_policies_differ():
    data = batch(5)
    vtrace_out = run_loss(data, config(off_policy_correction="vtrace"))
    plain = run_loss(data, config(off_policy_correction="no_correction"))
    assert not np.allclose(plain["vs"], vtrace_out["vs"], atol=1e-3)
    assert not np.allclose(
        plain["pg_advantages"], vtrace_out["pg_advantages"], atol=1e-3
    )


def test_one_step_is_weights_the_uncorrected_advantages_by_the_clipped_rhos():
    """1-step importance sampling: V-trace's policy-gradient term (its rho
    clipped at rho-bar) with the value targets uncorrected."""
    data = batch(6)
    one_step = run_loss(data, config(off_policy_correction="one_step_is"))
    plain = run_loss(data, config(off_policy_correction="no_correction"))
    actions = data["actions"][1:, ..., None]
    log_pi = np.take_along_axis(
        numpy_log_softmax(data["learner_logits"][:-1]), actions, -1
    )
    log_mu = np.take_along_axis(
        numpy_log_softmax(data["behaviour_logits"][1:]), actions, -1
    )
    rhos = np.minimum(1.0, np.exp(log_pi - log_mu))[..., 0]
    np.testing.assert_allclose(one_step["vs"], plain["vs"], rtol=1e-6)
    np.testing.assert_allclose(
        one_step["pg_advantages"], rhos * plain["pg_advantages"], rtol=1e-4, atol=1e-6
    )
    assert np.any(rhos < 0.99)  # the weights did something


def test_an_unknown_correction_is_named():
    from learner.loss import off_policy_targets

    with tf.Graph().as_default(), pytest.raises(ValueError, match="'retrace'"):
        off_policy_targets("retrace", *[tf.zeros([1, 1, 2])] * 2, *[None] * 5)
