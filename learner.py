"""The IMPALA learner: the V-trace actor-critic loss and its update.

Three pieces, each usable on its own:
- `compute_loss`: a pure function (no variables, no side effects) from the
  learner's outputs, the actors' outputs and the environment's outputs of
  one time-major batch to the paper's loss terms and the V-trace targets.
  Change the loss here.
- `build_update`: the optimiser step on a loss: RMSProp (or Adam,
  config.optimizer; the paper's is RMSProp) with a learning rate that decays
  linearly to zero over the run's environment frames (or over
  `learning_rate_decay_frames`, then stays zero), gradient clipping, the
  NaN guard, and the global step, which counts environment frames.
- `build_learner`: the agent unrolled over a batch, then the two above, and
  the learner's TensorBoard summaries. Where the batch comes from (queues,
  staging) and the training loop are pipeline.py's business.

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
import popart as popart_lib
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


REWARD_CLIPPINGS = ("abs_one", "soft_asymmetric", "none")


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
    logits: tf.Tensor, actions: tf.Tensor, advantages: tf.Tensor
) -> tf.Tensor:
    """-sum log pi(a|x) * advantage over [T, B]; advantages get no gradient."""
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=actions, logits=logits
    )
    return tf.reduce_sum(cross_entropy * tf.stop_gradient(advantages))


LossOutputs = collections.namedtuple(
    "LossOutputs", "losses vtrace_returns policy_entropy"
)
# The optimiser step of build_update: train_and_count runs the update, then
# adds the batch's frames to the global step (num_env_frames) and returns it.
Update = collections.namedtuple(
    "Update", "train_and_count num_env_frames learning_rate global_norm"
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
      config: reward_clipping, discounting, baseline_cost, entropy_cost.
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
      (vtrace.VTraceFromLogitsReturns, [T, B] each) and policy_entropy (the
      mean entropy of the learner's policy per step, a scalar).
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

    # V-trace's sequential recursion is faster on the CPU.
    with tf.device("/cpu:0"):
        vtrace_returns = vtrace.from_logits(
            behaviour_policy_logits=behaviour_logits,
            target_policy_logits=logits,
            actions=actions,
            discounts=discounts,
            rewards=clipped_rewards,
            values=values,
            bootstrap_value=bootstrap_value,
        )

    pg_advantages = vtrace_returns.pg_advantages
    baseline_advantages = vtrace_returns.vs - values
    if popart_batch is not None:
        pg_advantages = pg_advantages / scale
        baseline_advantages = (vtrace_returns.vs - mean) / scale - normalised[:-1]
    pg_loss = compute_policy_gradient_loss(logits, actions, pg_advantages)
    baseline_loss = config.baseline_cost * compute_baseline_loss(baseline_advantages)
    entropy_loss = config.entropy_cost * compute_entropy_loss(logits)
    total_loss = pg_loss + baseline_loss + entropy_loss
    policy_entropy = -compute_entropy_loss(logits) / tf.cast(tf.size(done), tf.float32)
    return LossOutputs(
        losses=Losses(total_loss, pg_loss, baseline_loss, entropy_loss),
        vtrace_returns=vtrace_returns,
        policy_entropy=policy_entropy,
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
