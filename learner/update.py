"""The IMPALA learner's update: the loss (loss.py) applied by one optimiser
step.

- `build_update`: the optimiser step on a loss: RMSProp (or Adam,
  config.optimizer; the paper's is RMSProp) with a learning rate that decays
  linearly to zero over the run's environment frames (or over
  `learning_rate_decay_frames`, then stays zero), gradient clipping, the
  NaN guard, and the global step, which counts environment frames.
- `build_learner`: the agent unrolled over a batch, its loss and the update,
  and the learner's TensorBoard summaries. Where the batch comes from
  (queues, staging) is pipeline.py's business, the training loop loop.py's.

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
from config import LearnerConfig
from families.contract import StepOutput
from learner import popart as popart_lib
from learner.loss import compute_loss

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

# The optimiser step of build_update: train_and_count runs the update, then
# adds the batch's frames to the global step (num_env_frames) and returns it.
Update = collections.namedtuple(
    "Update", "train_and_count num_env_frames learning_rate global_norm"
)


def build_update(
    total_loss: tf.Tensor,
    variables: list,
    config: LearnerConfig,
    after_step=None,
) -> Update:
    """One optimiser step on `total_loss` over `variables`.

    The learning rate decays linearly from config.learning_rate to 0 over
    config.decay_frames environment frames. A NaN or infinite loss or
    gradient fails the step before any variable changes (guard_finite_update);
    gradients are clipped to config.max_grad_norm when it is positive. The
    global step (created here if needed) counts environment frames: each
    update adds config.frames_per_update. `after_step`: optional () -> op,
    built under a dependency on the optimiser step and run before the frame
    count moves (PopArt's statistics update).
    """
    num_env_frames = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.compat.v1.train.polynomial_decay(
        config.learning_rate,
        num_env_frames,
        max(config.decay_frames, 1),
        end_learning_rate=0.0,
    )
    optimizer = make_optimizer(config, learning_rate)
    grads_and_vars = optimizer.compute_gradients(total_loss, var_list=variables)
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
    if after_step is not None:
        with tf.control_dependencies([train_op]):
            train_op = after_step()
    with tf.control_dependencies([train_op]):
        train_and_count = num_env_frames.assign_add(config.frames_per_update)
    return Update(train_and_count, num_env_frames, learning_rate, global_norm)


def build_learner(
    agent: agent_lib.Agent,
    agent_state,
    env_outputs: StepOutput,
    agent_outputs: agent_lib.AgentOutput,
    config: LearnerConfig,
    level_name: tf.Tensor | None = None,
) -> LearnerOutputs:
    """The agent unrolled over a time-major batch, its loss and one update.

    Args:
      agent_state: core state [B, 256] before step 0 of each unroll.
      env_outputs: StepOutput of [T + 1, B, ...] tensors.
      agent_outputs: AgentOutput of [T + 1, B, ...] (the actors' outputs).
      config: LearnerConfig.
      level_name: [B] string, each unroll's level; needed with config.popart
        (the statistics variables popart/* are created here then).

    Returns:
      LearnerOutputs: train_and_count (runs the update, then returns the new
      frame count int64), done / info [T, B] of the batch (for episode
      logging), num_env_frames (the global step variable), losses (Losses:
      total and each weighted term, scalars), learning_rate and
      vtrace_returns (vtrace.VTraceFromLogitsReturns, [T, B] each).
    """
    learner_outputs, _ = agent.unroll(agent_outputs.action, env_outputs, agent_state)
    popart, popart_batch, after_step = None, None, None
    if config.popart:
        popart = popart_lib.PopArt(config.level_names, config.popart_beta)
        popart_batch = popart.batch(level_name)
    # V-trace's sequential recursion is faster on the CPU.
    with tf.device("/cpu:0"):
        loss = compute_loss(
            learner_outputs, agent_outputs, env_outputs, config, popart_batch
        )
    losses, vtrace_returns = loss.losses, loss.vtrace_returns
    if popart is not None:
        head = agent.value_head

        def after_step():
            return popart.update(vtrace_returns.vs, popart_batch, head.w, head.b)

    update = build_update(losses.total, agent.trainable_variables, config, after_step)

    summary = tf.compat.v1.summary
    summary.scalar("learning_rate", update.learning_rate)
    summary.scalar("total_loss", losses.total)
    summary.scalar("loss/policy_gradient", losses.policy_gradient)
    summary.scalar("loss/baseline", losses.baseline)
    summary.scalar("loss/entropy", losses.entropy)
    summary.scalar("policy_entropy", loss.policy_entropy)
    summary.scalar("gradient_global_norm", update.global_norm)
    # 0 when the learner's policy is the actors' (no update in between); it
    # grows with the policy lag, and any misalignment of actions, states or
    # observations on their way through the queue shows here.
    summary.scalar(
        "vtrace/mean_abs_log_rho", tf.reduce_mean(tf.abs(vtrace_returns.log_rhos))
    )
    if popart is not None:
        popart.summaries()
    return LearnerOutputs(
        train_and_count=update.train_and_count,
        done=env_outputs.done[1:],
        info=tf.nest.map_structure(lambda t: t[1:], env_outputs.info),
        num_env_frames=update.num_env_frames,
        losses=losses,
        learning_rate=update.learning_rate,
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
