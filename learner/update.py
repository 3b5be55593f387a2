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

The NaN guard is nan_guard.py's, the per-level summaries
level_summaries.py's.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Sequence

import sonnet as snt
import tensorflow as tf

import agent as agent_lib
from config import LearnerConfig
from learner import popart as popart_lib
from learner.hyperparameters import MutableHyperparameters
from learner.level_summaries import level_summaries, level_terms
from learner.loss import Losses, compute_loss
from learner.nan_guard import guard_finite_update
from trajectory import ActorOutput

LearnerOutputs = collections.namedtuple(
    "LearnerOutputs",
    "train_and_count done info num_env_frames losses learning_rate vtrace_returns "
    "level_name policy_lag hyperparameters",
)

# The policy lag of a batch's unrolls, in learner updates: how many updates
# the learner made between the parameters an unroll was acted with and those
# this update starts from; fresh [N * (B - R)] and replayed [N * R] float32.
PolicyLag = collections.namedtuple("PolicyLag", "fresh replayed")

# The optimiser step of build_update: train_and_count runs the update, then
# adds the batch's frames to the global step (num_env_frames) and returns it.
Update = collections.namedtuple(
    "Update", "train_and_count num_env_frames learning_rate global_norm"
)


def build_update(
    tower_losses: Sequence[tf.Tensor],
    variables: list,
    config: LearnerConfig,
    after_step=None,
    devices: Sequence[str | None] | None = None,
    reads_before_count: Sequence[tf.Tensor] = (),
    hyperparameters: MutableHyperparameters | None = None,
) -> Update:
    """One optimiser step on the sum of `tower_losses` over `variables`.

    Each tower's gradients are computed on its device (`devices[i]`, or where
    its loss is), then summed into one update: the losses are sums over time
    and batch, so the summed gradients are those of one learner on all the
    towers' batches together, and --learning_rate means what it means for
    one learner with that batch. With one tower the graph is the
    single-learner one.

    The learning rate decays linearly from config.learning_rate to 0 over
    config.decay_frames environment frames. A NaN or infinite loss or
    gradient fails the step before any variable changes (guard_finite_update);
    gradients are clipped to config.max_grad_norm when it is positive. The
    global step (created here if needed) counts environment frames: each
    update adds config.frames_per_update (all towers' frames). `after_step`:
    optional () -> op, built under a dependency on the optimiser step and run
    before the frame count moves (PopArt's statistics update).
    `reads_before_count`: tensors that read the frame count, run before it
    moves (the policy lag's). `hyperparameters`: the learning rate, epsilon
    and clip come from its variables (a run can change them between
    updates) instead of `config`'s numbers; whether gradients are clipped at
    all stays `config`'s.
    """
    values = hyperparameters.config_with_tensors(config) if hyperparameters else config
    num_env_frames = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.compat.v1.train.polynomial_decay(
        values.learning_rate,
        num_env_frames,
        max(config.decay_frames, 1),
        end_learning_rate=0.0,
    )
    optimizer = make_optimizer(values, learning_rate)
    devices = list(devices or [None] * len(tower_losses))
    if len(tower_losses) == 1:
        total_loss = tower_losses[0]
        grads_and_vars = optimizer.compute_gradients(total_loss, var_list=variables)
        gradients, variables = zip(*grads_and_vars, strict=True)
    else:
        total_loss = tf.add_n(list(tower_losses))
        gradients = sum_tower_gradients(tower_losses, variables, devices)
    global_norm = tf.linalg.global_norm(gradients)
    # A NaN/Inf loss or gradient stops the step before any variable changes.
    gradients = guard_finite_update(total_loss, gradients, global_norm, num_env_frames)
    if config.max_grad_norm > 0:
        gradients, _ = tf.clip_by_global_norm(
            gradients, values.max_grad_norm, use_norm=global_norm
        )
    train_op = optimizer.apply_gradients(zip(gradients, variables, strict=True))

    # The update and the frame count move together: global step = frames.
    if after_step is not None:
        with tf.control_dependencies([train_op]):
            train_op = after_step()
    with tf.control_dependencies([train_op, *reads_before_count]):
        train_and_count = num_env_frames.assign_add(config.frames_per_update)
    return Update(train_and_count, num_env_frames, learning_rate, global_norm)


def sum_tower_gradients(
    tower_losses: Sequence[tf.Tensor],
    variables: list,
    devices: Sequence[str | None],
) -> list[tf.Tensor | tf.IndexedSlices]:
    """d(sum of tower_losses)/d(variables), tower i's part computed on
    devices[i] and the parts added where each variable lives (one transfer of
    each tower's gradients, none of its activations).

    A variable that the towers use sparsely (an embedding's lookups: its
    gradients are tf.IndexedSlices) gets their rows side by side, still
    sparse: what one learner on all the towers' batches gets, so the
    optimiser updates only the rows used, slots included, and the global
    norm counts the same rows. A dense sum would decay every row's RMSProp
    slot at every update."""
    per_tower = []
    for loss, device in zip(tower_losses, devices, strict=True):
        with _device(device):
            per_tower.append(
                tf.compat.v1.gradients(
                    loss, variables, colocate_gradients_with_ops=True
                )
            )
    summed = []
    for variable, parts in zip(variables, zip(*per_tower, strict=True), strict=True):
        parts = [p for p in parts if p is not None]
        with tf.device(variable.device):
            if not parts:
                summed.append(None)
            elif all(isinstance(p, tf.IndexedSlices) for p in parts):
                summed.append(
                    tf.IndexedSlices(
                        tf.concat([p.values for p in parts], axis=0),
                        tf.concat([p.indices for p in parts], axis=0),
                        parts[0].dense_shape,
                    )
                )
            else:
                summed.append(tf.add_n([tf.convert_to_tensor(p) for p in parts]))
    return summed


def build_learner(
    agent: agent_lib.Agent,
    batches: Sequence[ActorOutput],
    config: LearnerConfig,
    devices: Sequence[str | None] | None = None,
) -> LearnerOutputs:
    """The agent unrolled over each tower's time-major batch, their losses
    and one update from all of them.

    Args:
      batches: one ActorOutput per tower (learner), time-major:
        env_outputs and agent_outputs [T + 1, B, ...] (the actors' outputs),
        agent_state [B, 256] (the core state before step 0 of each unroll),
        level_name [B] (each unroll's level; PopArt needs it).
      config: LearnerConfig.
      devices: tower i's device (its unroll, loss and gradients); None: the
        current device scope. The loss itself runs on that device's CPU.

    Returns:
      LearnerOutputs: train_and_count (runs the update, then returns the new
      frame count int64), done / info [T, N * F] and level_name [N * F] of
      the towers' fresh unrolls side by side (F = B - R of each batch of B,
      R replayed; for episode logging, which must not count a replayed
      episode again), num_env_frames (the global step variable), losses
      (Losses: total and each weighted term, scalars, summed over towers),
      learning_rate, vtrace_returns (vtrace.VTraceFromLogitsReturns,
      [T, N * B] each), policy_lag (PolicyLag) and hyperparameters
      (hyperparameters.MutableHyperparameters: the learning rate, entropy
      cost, epsilon and clip the next update uses).
    """
    devices = list(devices or [None] * len(batches))
    num_env_frames = tf.compat.v1.train.get_or_create_global_step()
    policy_lag = _policy_lag(batches, num_env_frames, config)
    hyperparameters = MutableHyperparameters(config)
    # The loss reads the entropy cost from its variable.
    loss_config = hyperparameters.config_with_tensors(config)
    popart, towers = None, []
    for batch, device in zip(batches, devices, strict=True):
        # Several towers: each reads the parameters once per update (below).
        # The first tower may create the variables (Sonnet makes them at the
        # first call): it runs where they live.
        variables = _made_variables(agent) if len(batches) > 1 else ()
        with _device(device), parameters_read_once(variables, device):
            learner_outputs, _ = agent.unroll(
                batch.agent_outputs.action, batch.env_outputs, batch.agent_state
            )
        if config.popart and popart is None:  # after the agent's variables
            popart = popart_lib.PopArt(config.level_names, config.popart_beta)
        with _device(device):
            towers.append(_tower(learner_outputs, batch, loss_config, popart, device))
    losses = Losses(*map(_sum, zip(*(t.losses for t in towers), strict=True)))
    vtrace_returns = _side_by_side([t.vtrace_returns for t in towers])
    after_step = None
    if popart is not None:
        head = agent.value_head
        popart_batch = popart_lib.PopArtBatch(
            tf.concat([t.popart_batch.level_ids for t in towers], axis=0),
            towers[0].popart_batch.mean,
            towers[0].popart_batch.scale,
        )

        def after_step():
            # The statistics move once, from every tower's targets together.
            return popart.update(vtrace_returns.vs, popart_batch, head.w, head.b)

    update = build_update(
        [t.losses.total for t in towers],
        agent.trainable_variables,
        config,
        after_step,
        devices,
        reads_before_count=list(policy_lag),
        hyperparameters=hyperparameters,
    )

    summary = tf.compat.v1.summary
    summary.scalar("learning_rate", update.learning_rate)
    summary.scalar("total_loss", losses.total)
    summary.scalar("loss/policy_gradient", losses.policy_gradient)
    summary.scalar("loss/baseline", losses.baseline)
    summary.scalar("loss/entropy", losses.entropy)
    # A mean over the towers' batches, each one's a mean over its own.
    summary.scalar(
        "policy_entropy",
        _sum([t.policy_entropy / len(towers) for t in towers])
        if len(towers) > 1
        else towers[0].policy_entropy,
    )
    summary.scalar("gradient_global_norm", update.global_norm)
    # 0 when the learner's policy is the actors' (no update in between); it
    # grows with the policy lag, and any misalignment of actions, states or
    # observations on their way through the queue shows here.
    summary.scalar(
        "vtrace/mean_abs_log_rho", tf.reduce_mean(tf.abs(vtrace_returns.log_rhos))
    )
    if popart is not None:
        popart.summaries()
    if len(config.level_names) > 1:
        level_summaries(config.level_names, [t.level_terms for t in towers])
    summary.scalar("policy_lag/fresh_mean", tf.reduce_mean(policy_lag.fresh))
    summary.scalar("policy_lag/fresh_max", tf.reduce_max(policy_lag.fresh))
    if config.num_replayed:
        summary.scalar("policy_lag/replayed_mean", tf.reduce_mean(policy_lag.replayed))
        summary.scalar("policy_lag/replayed_max", tf.reduce_max(policy_lag.replayed))
    fresh = config.num_fresh
    env_outputs = [batch.env_outputs for batch in batches]
    return LearnerOutputs(
        train_and_count=update.train_and_count,
        done=tf.concat([e.done[1:, :fresh] for e in env_outputs], axis=1),
        info=_side_by_side(
            [
                tf.nest.map_structure(lambda t: t[1:, :fresh], e.info)
                for e in env_outputs
            ]
        ),
        num_env_frames=update.num_env_frames,
        losses=losses,
        learning_rate=update.learning_rate,
        vtrace_returns=vtrace_returns,
        level_name=tf.concat([b.level_name[:fresh] for b in batches], axis=0),
        policy_lag=policy_lag,
        hyperparameters=hyperparameters,
    )


def _policy_lag(
    batches: Sequence[ActorOutput], num_env_frames: tf.Variable, config: LearnerConfig
) -> PolicyLag:
    """Each unroll's lag in updates: (the frame count now - its
    policy_frames) / frames per update; each batch's first B - R unrolls are
    fresh, the rest replayed. Read before the update moves the count
    (build_update's reads_before_count)."""
    now = num_env_frames.read_value()
    lags = [
        tf.cast(now - batch.policy_frames, tf.float32) / config.frames_per_update
        for batch in batches
    ]
    fresh = config.num_fresh
    return PolicyLag(
        fresh=tf.concat([lag[:fresh] for lag in lags], axis=0),
        replayed=tf.concat([lag[fresh:] for lag in lags], axis=0),
    )


_Tower = collections.namedtuple(
    "_Tower", "losses vtrace_returns policy_entropy popart_batch level_terms"
)


def _tower(
    learner_outputs: agent_lib.AgentOutput,
    batch: ActorOutput,
    config: LearnerConfig,
    popart,
    device,
) -> _Tower:
    """One tower's loss on its batch and the agent's outputs for it, under
    its device scope."""
    popart_batch = popart.batch(batch.level_name) if popart is not None else None
    # V-trace's sequential recursion is faster on the CPU (the tower's).
    with tf.device(cpu_of(device)):
        loss = compute_loss(
            learner_outputs,
            batch.agent_outputs,
            batch.env_outputs,
            config,
            popart_batch,
        )
    terms = None
    if len(config.level_names) > 1:
        ids = (
            popart_batch.level_ids
            if popart_batch is not None
            else popart_lib.level_ids(batch.level_name, config.level_names)
        )
        terms = level_terms(
            ids,
            len(config.level_names),
            loss.pg_advantages,
            loss.losses.total,
            learner_outputs,
        )
    return _Tower(
        loss.losses, loss.vtrace_returns, loss.policy_entropy, popart_batch, terms
    )


def cpu_of(device: str | None) -> str:
    """The CPU of `device`'s task: '/job:learner/task:1/device:GPU:0' ->
    '/job:learner/task:1/device:CPU:0'; None -> '/cpu:0' (which an enclosing
    device scope completes with its job and task)."""
    if not device:
        return "/cpu:0"
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(device_type="CPU", device_index=0).to_string()


@contextlib.contextmanager
def parameters_read_once(variables: Sequence[tf.Variable], device: str | None):
    """Inside: every use of `variables` by the agent's modules reads the value
    they had when the step began from one read each, made for `device` (a
    tower's copy of the parameters for this update).

    Otherwise each use of a resource variable reads it again: the agent's
    unroll uses the core's weights at each of its T + 1 steps, and when the
    variables live on another task (a tower on learner task k) or device
    (a tower on a GPU), each read is a transfer, 21 copies of the core per
    update instead of one. A variable's own `caching_device` is one device
    fixed at creation; a tower needs its own, so Sonnet's public
    `snt.custom_variable_getter` hands the modules the tower's reads instead
    of the variables while the tower is built. The gradients flow through a
    read to its variable as through any read.
    """
    if not variables:
        yield
        return
    with _device(device):
        reads = {
            v.ref(): tf.identity(v.read_value(), name="tower_read") for v in variables
        }
    with snt.custom_variable_getter(lambda v: reads.get(v.ref(), v)):
        yield


def _made_variables(agent: agent_lib.Agent) -> tuple:
    """The agent's trainable variables, or () before its first call."""
    try:
        return agent.trainable_variables
    except ValueError:  # Sonnet: no variables yet
        return ()


def _device(device: str | None):
    """tf.device(device), or no scope for None (tf.device(None) would clear
    the enclosing scopes, which place a single learner)."""
    return contextlib.nullcontext() if device is None else tf.device(device)


def _sum(tensors) -> tf.Tensor:
    """Their sum; one tensor is itself (one tower: the single learner's graph)."""
    tensors = list(tensors)
    return tensors[0] if len(tensors) == 1 else tf.add_n(tensors)


def _side_by_side(structures: list):
    """Structures of [T, B_i, ...] tensors -> one of [T, sum B_i, ...]."""
    if len(structures) == 1:
        return structures[0]
    return tf.nest.map_structure(lambda *t: tf.concat(t, axis=1), *structures)


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
