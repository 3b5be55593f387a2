"""The IMPALA learner: the V-trace actor-critic loss and its RMSProp update.

`build_learner` takes a time-major batch of the actors' unrolls
(`[T + 1, B, ...]`, step 0 being the last step of the previous unroll),
unrolls the agent over it, computes V-trace targets (vtrace.py) and the
paper's loss, and applies one RMSProp step (or Adam's, config.optimizer;
the paper's is RMSProp) whose learning rate decays
linearly to zero over the run's environment frames (or over
`learning_rate_decay_frames`, then stays zero). The global step counts
environment frames. Where the batch comes from (queues, staging) is
pipeline.py's business.

The NaN guard's contract lives here whole: `guard_finite_update` fails a
step whose loss or gradients are not finite with a TensorFlow error, and
`non_finite_update` reads that error back into a `NonFiniteUpdate` (the
error crosses `session.run` as text, so its encoding and decoding stay
together).
"""

from __future__ import annotations

import collections
import re

import tensorflow as tf

import agent as agent_lib
import vtrace
from config import LearnerConfig
from environment_specs import StepOutput

Losses = collections.namedtuple("Losses", "total policy_gradient baseline entropy")
LearnerOutputs = collections.namedtuple(
    "LearnerOutputs",
    "train_and_count done info num_env_frames losses learning_rate vtrace_returns",
)

# In the message of the step that guard_finite_update stops.
NON_FINITE_MARKER = "NaN or infinite loss or gradient"
# What that message says of the step (the Assert's data, in this order).
NonFiniteUpdate = collections.namedtuple(
    "NonFiniteUpdate", "num_env_frames total_loss global_norm"
)
_NON_FINITE_FIELDS = ("frames:", "total loss:", "gradient global norm:")


def clip_rewards(rewards: tf.Tensor, mode: str) -> tf.Tensor:
    """abs_one: clip to [-1, 1]. soft_asymmetric: 5 tanh(r / 5), negatives x0.3."""
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
    logits: tf.Tensor, actions: tf.Tensor, advantages: tf.Tensor
) -> tf.Tensor:
    """-sum log pi(a|x) * advantage over [T, B]; advantages get no gradient."""
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=actions, logits=logits
    )
    return tf.reduce_sum(cross_entropy * tf.stop_gradient(advantages))


def build_learner(
    agent: agent_lib.Agent,
    agent_state,
    env_outputs: StepOutput,
    agent_outputs: agent_lib.AgentOutput,
    config: LearnerConfig,
) -> LearnerOutputs:
    """The V-trace loss and one RMSProp update on a time-major batch.

    Args:
      agent_state: core state [B, 256] before step 0 of each unroll.
      env_outputs: StepOutput of [T + 1, B, ...] tensors.
      agent_outputs: AgentOutput of [T + 1, B, ...] (the actors' outputs).
      config: LearnerConfig.

    Returns:
      LearnerOutputs: train_and_count (runs the update, then returns the new
      frame count int64), done / info [T, B] of the batch (for episode
      logging), num_env_frames (the global step variable), losses (Losses:
      total and each weighted term, scalars), learning_rate and
      vtrace_returns (vtrace.VTraceFromLogitsReturns, [T, B] each).
    """
    learner_outputs, _ = agent.unroll(agent_outputs.action, env_outputs, agent_state)
    # The value of the state after the last transition, for bootstrapping.
    bootstrap_value = learner_outputs.baseline[-1]

    # Align: the learner's output at t (computed from env output t) chose the
    # action the actor recorded at t + 1, which produced env output t + 1.
    agent_outputs = tf.nest.map_structure(lambda t: t[1:], agent_outputs)
    rewards, infos, done, _ = tf.nest.map_structure(lambda t: t[1:], env_outputs)
    learner_outputs = tf.nest.map_structure(lambda t: t[:-1], learner_outputs)

    clipped_rewards = clip_rewards(rewards, config.reward_clipping)
    discounts = tf.cast(~done, tf.float32) * config.discounting

    # V-trace's sequential recursion is faster on the CPU.
    with tf.device("/cpu:0"):
        vtrace_returns = vtrace.from_logits(
            behaviour_policy_logits=agent_outputs.policy_logits,
            target_policy_logits=learner_outputs.policy_logits,
            actions=agent_outputs.action,
            discounts=discounts,
            rewards=clipped_rewards,
            values=learner_outputs.baseline,
            bootstrap_value=bootstrap_value,
        )

    pg_loss = compute_policy_gradient_loss(
        learner_outputs.policy_logits,
        agent_outputs.action,
        vtrace_returns.pg_advantages,
    )
    baseline_loss = config.baseline_cost * compute_baseline_loss(
        vtrace_returns.vs - learner_outputs.baseline
    )
    entropy_loss = config.entropy_cost * compute_entropy_loss(
        learner_outputs.policy_logits
    )
    total_loss = pg_loss + baseline_loss + entropy_loss

    num_env_frames = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.compat.v1.train.polynomial_decay(
        config.learning_rate,
        num_env_frames,
        max(config.decay_frames, 1),
        end_learning_rate=0.0,
    )
    optimizer = make_optimizer(config, learning_rate)
    grads_and_vars = optimizer.compute_gradients(
        total_loss, var_list=agent.trainable_variables
    )
    gradients, variables = zip(*grads_and_vars, strict=True)
    global_norm = tf.linalg.global_norm(gradients)
    # A NaN/Inf loss or gradient stops the step before any variable changes.
    gradients = guard_finite_update(total_loss, gradients, global_norm, num_env_frames)
    if config.max_grad_norm > 0:
        gradients, _ = tf.clip_by_global_norm(
            gradients, config.max_grad_norm, use_norm=global_norm
        )
    train_op = optimizer.apply_gradients(zip(gradients, variables, strict=True))

    # The update and the frame count move together: global step = frames.
    with tf.control_dependencies([train_op]):
        train_and_count = num_env_frames.assign_add(config.frames_per_update)

    entropy = -compute_entropy_loss(learner_outputs.policy_logits) / tf.cast(
        tf.size(done), tf.float32
    )
    summary = tf.compat.v1.summary
    summary.scalar("learning_rate", learning_rate)
    summary.scalar("total_loss", total_loss)
    summary.scalar("loss/policy_gradient", pg_loss)
    summary.scalar("loss/baseline", baseline_loss)
    summary.scalar("loss/entropy", entropy_loss)
    summary.scalar("policy_entropy", entropy)
    summary.scalar("gradient_global_norm", global_norm)
    # 0 when the learner's policy is the actors' (no update in between); it
    # grows with the policy lag, and any misalignment of actions, states or
    # observations on their way through the queue shows here.
    summary.scalar(
        "vtrace/mean_abs_log_rho", tf.reduce_mean(tf.abs(vtrace_returns.log_rhos))
    )
    return LearnerOutputs(
        train_and_count=train_and_count,
        done=done,
        info=infos,
        num_env_frames=num_env_frames,
        losses=Losses(total_loss, pg_loss, baseline_loss, entropy_loss),
        learning_rate=learning_rate,
        vtrace_returns=vtrace_returns,
    )


OPTIMIZERS = ("rmsprop", "adam")


def make_optimizer(config: LearnerConfig, learning_rate: tf.Tensor):
    """RMSProp (decay, momentum; epsilon inside the square root, and its mean
    squares start at 1, as TensorFlow's v1 optimiser does) or Adam (TF's
    default betas 0.9 and 0.999; epsilon outside the square root)."""
    if config.optimizer == "rmsprop":
        return tf.compat.v1.train.RMSPropOptimizer(
            learning_rate, config.decay, config.momentum, config.epsilon
        )
    if config.optimizer == "adam":
        return tf.compat.v1.train.AdamOptimizer(learning_rate, epsilon=config.epsilon)
    raise ValueError(f"optimizer={config.optimizer!r} is not one of {OPTIMIZERS}")


def guard_finite_update(
    loss: tf.Tensor, gradients, global_norm: tf.Tensor, num_env_frames: tf.Tensor
) -> list:
    """`gradients`, gated on the loss and every gradient being finite.

    The returned gradients (same structure; tf.IndexedSlices stay so) depend
    on one tf.debugging.Assert over the loss and all gradients, so no
    variable update can run (nor the frame count increment that follows the
    update) when any of them holds a NaN or an infinity: the step fails with
    an InvalidArgumentError whose message contains NON_FINITE_MARKER, the
    frame count, the loss and the gradients' global norm, which
    `non_finite_update` reads back. The session then closes without saving
    (its hooks' `end` only runs on a normal exit).
    """

    def values(gradient):
        return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient

    finite = [tf.reduce_all(tf.math.is_finite(loss))] + [
        tf.reduce_all(tf.math.is_finite(values(g))) for g in gradients if g is not None
    ]
    check = tf.debugging.Assert(
        tf.reduce_all(tf.stack(finite)),
        [
            NON_FINITE_MARKER,
            _NON_FINITE_FIELDS[0],
            num_env_frames,
            _NON_FINITE_FIELDS[1],
            loss,
            _NON_FINITE_FIELDS[2],
            global_norm,
        ],
        name="check_finite_update",
    )

    def gated(gradient):
        if gradient is None:
            return None
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.identity(gradient.values), gradient.indices, gradient.dense_shape
            )
        return tf.identity(gradient)

    with tf.control_dependencies([check]):
        return [gated(g) for g in gradients]


def non_finite_update(error: tf.errors.OpError) -> NonFiniteUpdate | None:
    """What guard_finite_update's failed step says; None for any other error.

    The Assert prints each of its data as `[value]`, so the message reads
    `[NaN or infinite ...] [frames:] [960] [total loss:] [nan] ...`. A field
    that cannot be read is '?'.
    """
    text = error.message or ""
    if NON_FINITE_MARKER not in text:
        return None

    def field(name: str) -> str:
        match = re.search(rf"\[{re.escape(name)}\] \[([^\]]*)\]", text)
        return match.group(1) if match else "?"

    return NonFiniteUpdate(*(field(name) for name in _NON_FINITE_FIELDS))
