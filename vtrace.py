"""V-trace off-policy actor-critic targets (Espeholt et al. 2018, section 4).

All tensors are time-major: the leading dimension is time T, the next is the
batch B, and any further dimensions (e.g. K value heads) broadcast.

For s = 0 .. T-1, with rho_s = exp(log_rho_s) = pi(a_s|x_s) / mu(a_s|x_s):

    clipped rho_s  = min(clip_rho_threshold, rho_s)
    c_s            = min(clip_c_threshold, rho_s)  (trace cutting; the paper's c-bar is 1)
    delta_s        = clipped rho_s * (r_s + gamma_s V(x_{s+1}) - V(x_s))
    v_s            = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
    pg_advantage_s = clipped pg rho_s * (r_s + gamma_s v_{s+1} - V(x_s))

with V(x_T) = v_T = bootstrap_value. The sum is computed backwards with the
recursion v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})) in a
reverse `tf.scan`, so T may be unknown until run time.

Works in tf.compat.v1 graph mode (inside `with tf.Graph().as_default():`) and
eagerly. `vs` and `pg_advantages` are targets: gradients do not flow through
them.
"""

from __future__ import annotations

import collections

import tensorflow as tf

VTraceFromLogitsReturns = collections.namedtuple(
    "VTraceFromLogitsReturns",
    [
        "vs",
        "pg_advantages",
        "log_rhos",
        "behaviour_action_log_probs",
        "target_action_log_probs",
    ],
)

VTraceReturns = collections.namedtuple("VTraceReturns", "vs pg_advantages")


def _require_rank(tensor: tf.Tensor, rank: int, arg_name: str, expected: str) -> None:
    """Raises ValueError unless `tensor` has the static rank `rank`."""
    actual = tensor.shape.rank
    if actual is None:
        raise ValueError(
            f"{arg_name} must have a statically known rank {rank} ({expected}), "
            f"got a tensor of unknown rank; give the placeholder a shape such as "
            f"[None] * {rank}."
        )
    if actual != rank:
        raise ValueError(
            f"{arg_name} must have rank {rank} ({expected}), got rank {actual} "
            f"with shape {tensor.shape}."
        )


def _require_broadcastable(
    a: tf.Tensor, a_name: str, b: tf.Tensor, b_name: str
) -> None:
    """Raises ValueError unless `a` and `b` broadcast, with equal time dims."""
    try:
        tf.broadcast_static_shape(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"{a_name} with shape {a.shape} and {b_name} with shape {b.shape} do "
            f"not broadcast; shapes must agree in each dimension or be 1 there "
            f"(e.g. log_rhos [T, B, 1] with values [T, B, K])."
        ) from None
    # The scan walks the time dimension of every input together, so time is
    # never broadcast.
    t_a, t_b = a.shape[0], b.shape[0]
    if t_a is not None and t_b is not None and t_a != t_b:
        raise ValueError(
            f"{a_name} and {b_name} must have the same time dimension (dim 0), got "
            f"shapes {a.shape} and {b.shape}."
        )


def log_probs_from_logits_and_actions(
    policy_logits: tf.Tensor, actions: tf.Tensor
) -> tf.Tensor:
    """Log-probabilities of `actions` under the softmax policy `policy_logits`.

    Args:
      policy_logits: float [T, B, NUM_ACTIONS] unnormalised log-probabilities.
      actions: int [T, B] indices in [0, NUM_ACTIONS).

    Returns:
      float [T, B]: log pi(actions | x) = log_softmax(policy_logits)[actions].

    Raises:
      ValueError: if the ranks are not 3 and 2 or T, B disagree statically.
    """
    policy_logits = tf.convert_to_tensor(policy_logits, dtype_hint=tf.float32)
    actions = tf.convert_to_tensor(actions, dtype_hint=tf.int32)
    _require_rank(policy_logits, 3, "policy_logits", "[T, B, NUM_ACTIONS]")
    _require_rank(actions, 2, "actions", "[T, B]")
    if not policy_logits.shape[:2].is_compatible_with(actions.shape):
        raise ValueError(
            f"policy_logits {policy_logits.shape} and actions {actions.shape} must "
            f"share their leading [T, B] dimensions."
        )
    # Cross-entropy against the taken action is exactly -log softmax[action],
    # computed stably in one fused kernel.
    return -tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=actions, logits=policy_logits
    )


def from_logits(
    behaviour_policy_logits: tf.Tensor,
    target_policy_logits: tf.Tensor,
    actions: tf.Tensor,
    discounts: tf.Tensor,
    rewards: tf.Tensor,
    values: tf.Tensor,
    bootstrap_value: tf.Tensor,
    clip_rho_threshold: float | tf.Tensor | None = 1.0,
    clip_pg_rho_threshold: float | tf.Tensor | None = 1.0,
    name: str = "vtrace_from_logits",
    *,
    clip_c_threshold: float | tf.Tensor | None = 1.0,
    lambda_: float | tf.Tensor = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace targets for softmax policies given as logits.

    The importance weights are log_rhos = log pi(a|x) - log mu(a|x), with pi
    the target (learner) policy and mu the behaviour (actor) policy.

    Args:
      behaviour_policy_logits: float [T, B, NUM_ACTIONS], the actors' logits.
      target_policy_logits: float [T, B, NUM_ACTIONS], the learner's logits.
        Gradients flow from `target_action_log_probs` back to these.
      actions: int [T, B], the actions taken by the behaviour policy.
      discounts: float [T, B], gamma_s (0 at episode ends).
      rewards: float [T, B], r_s.
      values: float [T, B], V(x_s) under the learner's value function.
      bootstrap_value: float [B], V(x_T).
      clip_rho_threshold: scalar, rho-bar; None disables clipping.
      clip_pg_rho_threshold: scalar, clip for the rhos of the policy-gradient
        advantages; None disables clipping.
      name: name scope for the ops.
      clip_c_threshold: (keyword only, beyond the reference's API) scalar
        c-bar, the clip of the trace coefficients c_s; None disables it.
      lambda_: (keyword only, beyond the reference's API) scalar lambda in
        [0, 1] that scales the traces, c_s = lambda min(c-bar, rho_s) (the
        paper's remark on mixing 1-step and n-step targets); 1 is V-trace.

    Returns:
      VTraceFromLogitsReturns with
        vs: float [T, B] V-trace value targets (no gradient).
        pg_advantages: float [T, B] policy-gradient advantages (no gradient).
        log_rhos: float [T, B] log importance weights.
        behaviour_action_log_probs: float [T, B] log mu(a_s|x_s).
        target_action_log_probs: float [T, B] log pi(a_s|x_s).

    Raises:
      ValueError: on inconsistent ranks (at graph-build time).
    """
    behaviour_policy_logits = tf.convert_to_tensor(
        behaviour_policy_logits, dtype_hint=tf.float32
    )
    target_policy_logits = tf.convert_to_tensor(
        target_policy_logits, dtype_hint=tf.float32
    )
    actions = tf.convert_to_tensor(actions, dtype_hint=tf.int32)
    _require_rank(
        behaviour_policy_logits, 3, "behaviour_policy_logits", "[T, B, NUM_ACTIONS]"
    )
    _require_rank(
        target_policy_logits, 3, "target_policy_logits", "[T, B, NUM_ACTIONS]"
    )
    _require_rank(actions, 2, "actions", "[T, B]")

    with tf.compat.v1.name_scope(
        name,
        values=[
            behaviour_policy_logits,
            target_policy_logits,
            actions,
            discounts,
            rewards,
            values,
            bootstrap_value,
        ],
    ):
        target_action_log_probs = log_probs_from_logits_and_actions(
            target_policy_logits, actions
        )
        behaviour_action_log_probs = log_probs_from_logits_and_actions(
            behaviour_policy_logits, actions
        )
        log_rhos = target_action_log_probs - behaviour_action_log_probs
        vtrace_returns = from_importance_weights(
            log_rhos=log_rhos,
            discounts=discounts,
            rewards=rewards,
            values=values,
            bootstrap_value=bootstrap_value,
            clip_rho_threshold=clip_rho_threshold,
            clip_pg_rho_threshold=clip_pg_rho_threshold,
            clip_c_threshold=clip_c_threshold,
            lambda_=lambda_,
        )
        return VTraceFromLogitsReturns(
            vs=vtrace_returns.vs,
            pg_advantages=vtrace_returns.pg_advantages,
            log_rhos=log_rhos,
            behaviour_action_log_probs=behaviour_action_log_probs,
            target_action_log_probs=target_action_log_probs,
        )


def _threshold(
    threshold: float | tf.Tensor | None, arg_name: str, dtype: tf.DType
) -> tf.Tensor | None:
    """Converts a clipping threshold to a scalar tensor (None stays None)."""
    if threshold is None:
        return None
    threshold = tf.convert_to_tensor(threshold, dtype_hint=dtype, name=arg_name)
    # A threshold is a hyperparameter, so a float32 one may clip float64 rhos.
    if threshold.dtype != dtype:
        threshold = tf.cast(threshold, dtype)
    if threshold.shape.rank is not None and threshold.shape.rank != 0:
        raise ValueError(
            f"{arg_name} must be a scalar (or None for no clipping), got shape "
            f"{threshold.shape}."
        )
    return threshold


def from_importance_weights(
    log_rhos: tf.Tensor,
    discounts: tf.Tensor,
    rewards: tf.Tensor,
    values: tf.Tensor,
    bootstrap_value: tf.Tensor,
    clip_rho_threshold: float | tf.Tensor | None = 1.0,
    clip_pg_rho_threshold: float | tf.Tensor | None = 1.0,
    name: str = "vtrace_from_importance_weights",
    *,
    clip_c_threshold: float | tf.Tensor | None = 1.0,
    lambda_: float | tf.Tensor = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance weights.

    Shapes below are for the usual rank-2 case; every input may carry extra
    trailing dimensions that broadcast, e.g. log_rhos and discounts [T, B, 1]
    with rewards and values [T, B, K] and bootstrap_value [B, K]. All inputs
    must have the same rank (bootstrap_value one less), and the time dimension
    is never broadcast. T may be dynamic (None).

    Args:
      log_rhos: float [T, B], log(pi(a_s|x_s) / mu(a_s|x_s)).
      discounts: float [T, B], gamma_s (0 at episode ends).
      rewards: float [T, B], r_s.
      values: float [T, B], V(x_s).
      bootstrap_value: float [B], V(x_T); shape values.shape[1:].
      clip_rho_threshold: scalar rho-bar for the rhos in the value targets;
        None disables clipping.
      clip_pg_rho_threshold: scalar clip for the rhos that weight the
        policy-gradient advantages; None disables clipping.
      name: name scope for the ops.
      clip_c_threshold: (keyword only, beyond the reference's API) scalar
        c-bar for the trace coefficients c_s (the paper's 1); None disables
        clipping.
      lambda_: (keyword only, beyond the reference's API) scalar lambda in
        [0, 1]: c_s = lambda min(c-bar, rho_s), the paper's remark on mixing
        1-step (0) and n-step (1) bootstrapping, as GAE's lambda does for
        on-policy targets; 1 (the default) is the paper's V-trace.

    Returns:
      VTraceReturns(vs, pg_advantages), both float with the broadcast shape of
      the inputs ([T, B] in the usual case) and wrapped in tf.stop_gradient.

    Raises:
      ValueError: on inconsistent ranks or shapes (at graph-build time).
    """
    # The value estimates fix the floating dtype; everything else follows it
    # so float64 inputs give float64 targets.
    values = tf.convert_to_tensor(values, dtype_hint=tf.float32, name="values")
    dtype = values.dtype
    if not dtype.is_floating:
        raise ValueError(f"values must be a floating-point tensor, got dtype {dtype}.")
    log_rhos = tf.convert_to_tensor(log_rhos, dtype=dtype, name="log_rhos")
    discounts = tf.convert_to_tensor(discounts, dtype=dtype, name="discounts")
    rewards = tf.convert_to_tensor(rewards, dtype=dtype, name="rewards")
    bootstrap_value = tf.convert_to_tensor(
        bootstrap_value, dtype=dtype, name="bootstrap_value"
    )
    clip_rho_threshold = _threshold(clip_rho_threshold, "clip_rho_threshold", dtype)
    clip_pg_rho_threshold = _threshold(
        clip_pg_rho_threshold, "clip_pg_rho_threshold", dtype
    )
    clip_c_threshold = _threshold(clip_c_threshold, "clip_c_threshold", dtype)
    lambda_ = _threshold(lambda_, "lambda_", dtype)
    if lambda_ is None:
        raise ValueError("lambda_ must be a scalar in [0, 1], not None.")

    # --- Build-time shape checks, so mistakes fail here and not in a session.
    rank = log_rhos.shape.rank
    if rank is None:
        raise ValueError(
            "log_rhos must have a statically known rank (>= 1, usually [T, B]); "
            "give the placeholder a shape such as [None, None]."
        )
    if rank < 1:
        raise ValueError(
            f"log_rhos must have rank >= 1 (time-major [T, B, ...]), got shape "
            f"{log_rhos.shape}."
        )
    expected = "the rank of log_rhos"
    _require_rank(discounts, rank, "discounts", expected)
    _require_rank(rewards, rank, "rewards", expected)
    _require_rank(values, rank, "values", expected)
    _require_rank(bootstrap_value, rank - 1, "bootstrap_value", "rank of values - 1")
    _require_broadcastable(log_rhos, "log_rhos", discounts, "discounts")
    _require_broadcastable(log_rhos, "log_rhos", rewards, "rewards")
    _require_broadcastable(log_rhos, "log_rhos", values, "values")
    _require_broadcastable(discounts, "discounts", rewards, "rewards")
    _require_broadcastable(discounts, "discounts", values, "values")
    _require_broadcastable(rewards, "rewards", values, "values")
    if not bootstrap_value.shape.is_compatible_with(values.shape[1:]):
        raise ValueError(
            f"bootstrap_value must have shape values.shape[1:] = {values.shape[1:]}, "
            f"got {bootstrap_value.shape}."
        )

    with tf.compat.v1.name_scope(
        name, values=[log_rhos, discounts, rewards, values, bootstrap_value]
    ):
        rhos = tf.exp(log_rhos)
        if clip_rho_threshold is not None:
            clipped_rhos = tf.minimum(clip_rho_threshold, rhos, name="clipped_rhos")
        else:
            clipped_rhos = rhos
        if clip_c_threshold is not None:
            cs = tf.minimum(clip_c_threshold, rhos)
        else:
            cs = rhos
        cs = tf.multiply(lambda_, cs, name="cs")

        # V(x_{s+1}) for s = 0 .. T-1, with V(x_T) = bootstrap_value.
        values_t_plus_1 = tf.concat(
            [values[1:], tf.expand_dims(bootstrap_value, 0)], axis=0
        )
        # deltas involves every input, so it has the full broadcast shape.
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
        full_shape = tf.shape(deltas)
        discounted_cs = discounts * cs

        def backward_step(acc: tf.Tensor, elems: tuple[tf.Tensor, tf.Tensor]):
            # acc = v_{s+1} - V(x_{s+1}); returns v_s - V(x_s).
            discount_c, delta = elems
            return delta + discount_c * acc

        initial = tf.zeros(full_shape[1:], dtype=dtype)
        vs_minus_v_xs = tf.scan(
            backward_step,
            (discounted_cs, deltas),
            initializer=initial,
            reverse=True,
            name="vs_minus_v_xs",
        )
        vs = tf.add(vs_minus_v_xs, values, name="vs")

        # v_{s+1} for s = 0 .. T-1, with v_T = bootstrap_value.
        bootstrap_full = tf.broadcast_to(bootstrap_value, full_shape[1:])
        vs_t_plus_1 = tf.concat([vs[1:], tf.expand_dims(bootstrap_full, 0)], axis=0)
        if clip_pg_rho_threshold is not None:
            clipped_pg_rhos = tf.minimum(
                clip_pg_rho_threshold, rhos, name="clipped_pg_rhos"
            )
        else:
            clipped_pg_rhos = rhos
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)

        # Targets only: the learner must not push gradients through them.
        return VTraceReturns(
            vs=tf.stop_gradient(vs, name="vs_stop_gradient"),
            pg_advantages=tf.stop_gradient(
                pg_advantages, name="pg_advantages_stop_gradient"
            ),
        )
