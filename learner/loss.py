"""The IMPALA loss: V-trace actor-critic on one time-major batch.

`compute_loss` is a pure function (no variables, no side effects, no device
placement) from the learner's outputs, the actors' outputs and the
environment's outputs of a batch ([T + 1, B, ...]) to the paper's three loss
terms and their targets (V-trace, or one of the paper's alternatives,
`off_policy_targets`); each term has its own function, tested term
by term against NumPy (tests/loss_test.py). Change the loss here; the
optimiser step that applies it is update.py.
"""

from __future__ import annotations

import collections

import tensorflow as tf

import agent as agent_lib
import vtrace
from config import LearnerConfig
from families.contract import StepOutput
from learner import popart as popart_lib

Losses = collections.namedtuple("Losses", "total policy_gradient baseline entropy")


REWARD_CLIPPINGS = ("abs_one", "soft_asymmetric", "none")

# The off-policy corrections of the paper's section 5.2.2 (its Table 2), with
# rho_s = pi(a_s|x_s) / mu(a_s|x_s) (learner over actor), rho-bar and c-bar
# the clipping thresholds (--rho_bar, --c_bar; --vtrace_lambda scales every
# c_i by lambda, 1 by default):
#   vtrace: V-trace (section 4): v_s = V(x_s) + sum_t (prod_i gamma_i c_i)
#     delta_t, delta_t = min(rho-bar, rho_t)(r_t + gamma_t V(x_{t+1}) -
#     V(x_t)), c_i = min(c-bar, rho_i); pg_advantage_s = min(rho-bar, rho_s)
#     (r_s + gamma_s v_{s+1} - V(x_s)).
#   no_correction: the same with every rho = 1, as if the actor's policy
#     were the learner's: v_s are n-step bootstrapped returns.
#   epsilon_correction: no_correction's targets, and the policy gradient
#     through log(pi(a_s|x_s) + epsilon), epsilon = 1e-6 (the paper, after
#     GA3C: it keeps log pi finite where pi(a) is tiny).
#   one_step_is: 1-step importance sampling: no_correction's value targets;
#     each step's policy-gradient advantage times min(rho-bar, rho_s).
OFF_POLICY_CORRECTIONS = (
    "vtrace",
    "no_correction",
    "epsilon_correction",
    "one_step_is",
)
EPSILON_CORRECTION = 1e-6


def clip_rewards(rewards: tf.Tensor, mode: str) -> tf.Tensor:
    """abs_one: clip to [-1, 1]. soft_asymmetric: 5 tanh(r / 5), negatives
    x0.3. none: the rewards as they are (what PopArt is for)."""
    if mode == "none":
        return rewards
    if mode == "abs_one":
        return tf.clip_by_value(rewards, -1.0, 1.0)
    if mode == "soft_asymmetric":
        squeezed = tf.tanh(rewards / 5.0)
        # Negative rewards count less, which keeps agents from over-avoiding.
        return tf.where(rewards < 0.0, 0.3 * squeezed, squeezed) * 5.0
    raise ValueError(f"Unknown reward clipping {mode!r}.")


def compute_baseline_loss(advantages: tf.Tensor) -> tf.Tensor:
    """Half the summed squared advantages (vs - V) over [T, B]."""
    return 0.5 * tf.reduce_sum(tf.square(advantages))


def compute_entropy_loss(logits: tf.Tensor) -> tf.Tensor:
    """Negative entropy of the policy, summed over [T, B]."""
    policy = tf.nn.softmax(logits)
    log_policy = tf.nn.log_softmax(logits)
    return tf.reduce_sum(policy * log_policy)


def compute_policy_gradient_loss(
    logits: tf.Tensor,
    actions: tf.Tensor,
    advantages: tf.Tensor,
    epsilon: float = 0.0,
) -> tf.Tensor:
    """-sum log pi(a|x) * advantage over [T, B]; advantages get no gradient.
    With `epsilon` > 0, log(pi(a|x) + epsilon) instead (epsilon_correction)."""
    if epsilon:
        policy = tf.nn.softmax(logits)
        taken = tf.gather(policy, actions, batch_dims=2)  # [T, B]
        cross_entropy = -tf.math.log(taken + epsilon)
    else:
        cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=actions, logits=logits
        )
    return tf.reduce_sum(cross_entropy * tf.stop_gradient(advantages))


def off_policy_targets(
    correction: str,
    behaviour_logits: tf.Tensor,
    logits: tf.Tensor,
    actions: tf.Tensor,
    discounts: tf.Tensor,
    rewards: tf.Tensor,
    values: tf.Tensor,
    bootstrap_value: tf.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    vtrace_lambda: float = 1.0,
) -> vtrace.VTraceFromLogitsReturns:
    """The value targets `vs` and `pg_advantages` [T, B] of one of
    OFF_POLICY_CORRECTIONS (see above), from the actors' and the learner's
    logits [T, B, A], the actions, discounts, rewards, values [T, B] and the
    bootstrap value [B]. `log_rhos` and the log-probabilities are the real
    ones whatever the correction (the summaries show the policy lag's
    effect)."""
    if correction not in OFF_POLICY_CORRECTIONS:
        raise ValueError(
            f"Unknown off-policy correction {correction!r}: one of "
            f"{', '.join(OFF_POLICY_CORRECTIONS)}."
        )
    corrected = vtrace.from_logits(
        behaviour_policy_logits=behaviour_logits,
        target_policy_logits=logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=rho_bar,
        clip_c_threshold=c_bar,
        lambda_=vtrace_lambda,
    )
    if correction == "vtrace":
        return corrected
    # Every importance weight 1: the targets as if mu were pi.
    uncorrected = vtrace.from_importance_weights(
        log_rhos=tf.zeros_like(corrected.log_rhos),
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        lambda_=vtrace_lambda,
    )
    pg_advantages = uncorrected.pg_advantages
    if correction == "one_step_is":
        rhos = tf.minimum(tf.exp(corrected.log_rhos), rho_bar)
        pg_advantages = tf.stop_gradient(rhos * pg_advantages)
    return corrected._replace(vs=uncorrected.vs, pg_advantages=pg_advantages)


LossOutputs = collections.namedtuple(
    "LossOutputs", "losses vtrace_returns policy_entropy pg_advantages"
)


def compute_loss(
    learner_outputs: agent_lib.AgentOutput,
    agent_outputs: agent_lib.AgentOutput,
    env_outputs: StepOutput,
    config: LearnerConfig,
    popart_batch: popart_lib.PopArtBatch | None = None,
) -> LossOutputs:
    """The paper's loss on one time-major batch of unrolls.

    Step 0 of each unroll repeats the last step of the previous unroll, so
    the T transitions of an unroll are steps 1..T. The learner's output at t
    (computed from env output t) chose the action the actor recorded at
    t + 1, which produced env output t + 1; its baseline at T bootstraps.

    Args:
      learner_outputs: AgentOutput of [T + 1, B, ...]: the learner's
        `policy_logits` [T + 1, B, A] and `baseline` [T + 1, B] for the batch
        (its `action` is not used).
      agent_outputs: AgentOutput of [T + 1, B, ...]: the actors' `action`
        [T + 1, B] (int32) and behaviour `policy_logits` [T + 1, B, A].
      env_outputs: StepOutput of [T + 1, B, ...]: `reward` [T + 1, B] float32
        and `done` [T + 1, B] bool (info and observation are not used).
      config: reward_clipping, discounting, baseline_cost, entropy_cost, and
        the off-policy correction with its rho_bar and c_bar.
      popart_batch: None for the paper's loss. With PopArt (popart.py): the
        learner's `baseline` is [T + 1, B, L] normalised values, and this
        gives each trajectory's level `level_ids` [B] and the statistics
        `mean` and `scale` [L]: V-trace runs on the level's unnormalised
        values, the baseline loss is on normalised targets and the
        advantages are divided by the level's scale. With mean 0 and scale 1
        the loss is the paper's.

    Returns:
      LossOutputs: losses (Losses of scalars: total, and each term with its
      cost applied: policy_gradient, baseline, entropy), vtrace_returns
      (vtrace.VTraceFromLogitsReturns, [T, B] each), policy_entropy (the
      mean entropy of the learner's policy per step, a scalar) and
      pg_advantages [T, B] (the advantages the policy gradient uses: with
      PopArt, divided by the level's scale).
    """
    bootstrap_value = learner_outputs.baseline[-1]
    actions = agent_outputs.action[1:]
    behaviour_logits = agent_outputs.policy_logits[1:]
    rewards, done = env_outputs.reward[1:], env_outputs.done[1:]
    logits = learner_outputs.policy_logits[:-1]
    values = learner_outputs.baseline[:-1]
    if popart_batch is not None:
        # [T + 1, B, L] -> the trajectory's level: [T + 1, B], normalised.
        num_levels = learner_outputs.baseline.shape[-1]
        one_hot = tf.one_hot(popart_batch.level_ids, num_levels)  # [B, L]
        normalised = tf.reduce_sum(learner_outputs.baseline * one_hot, axis=-1)
        mean = tf.gather(popart_batch.mean, popart_batch.level_ids)  # [B]
        scale = tf.gather(popart_batch.scale, popart_batch.level_ids)  # [B]
        bootstrap_value = scale * normalised[-1] + mean
        values = scale * normalised[:-1] + mean

    clipped_rewards = clip_rewards(rewards, config.reward_clipping)
    discounts = tf.cast(~done, tf.float32) * config.discounting

    vtrace_returns = off_policy_targets(
        config.off_policy_correction,
        behaviour_logits,
        logits,
        actions,
        discounts,
        clipped_rewards,
        values,
        bootstrap_value,
        rho_bar=config.rho_bar,
        c_bar=config.c_bar,
        vtrace_lambda=config.vtrace_lambda,
    )

    pg_advantages = vtrace_returns.pg_advantages
    baseline_advantages = vtrace_returns.vs - values
    if popart_batch is not None:
        pg_advantages = pg_advantages / scale
        baseline_advantages = (vtrace_returns.vs - mean) / scale - normalised[:-1]
    epsilon = (
        EPSILON_CORRECTION
        if config.off_policy_correction == "epsilon_correction"
        else 0
    )
    pg_loss = compute_policy_gradient_loss(logits, actions, pg_advantages, epsilon)
    baseline_loss = config.baseline_cost * compute_baseline_loss(baseline_advantages)
    entropy_loss = config.entropy_cost * compute_entropy_loss(logits)
    total_loss = pg_loss + baseline_loss + entropy_loss
    policy_entropy = -compute_entropy_loss(logits) / tf.cast(tf.size(done), tf.float32)
    return LossOutputs(
        losses=Losses(total_loss, pg_loss, baseline_loss, entropy_loss),
        vtrace_returns=vtrace_returns,
        policy_entropy=policy_entropy,
        pg_advantages=pg_advantages,
    )
