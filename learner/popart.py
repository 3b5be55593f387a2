"""PopArt: per-level value normalisation for multi-task IMPALA.

Hessel et al., "Multi-task Deep Reinforcement Learning with PopArt" (AAAI
2019), after van Hasselt et al., "Learning values across many orders of
magnitude" (NeurIPS 2016). With `--popart` the agent's value head outputs one
normalised value n_i per level i of the run, and the learner keeps for each
level a running mean mu_i and second moment nu_i of its V-trace targets,
with the scale sigma_i = sqrt(nu_i - mu_i^2) clamped to [1e-4, 1e6]:

  unnormalised value   v = sigma_i * n_i + mu_i   (what V-trace sees)
  baseline loss        0.5 * sum(((vs - mu_i) / sigma_i - n_i)^2)
  policy gradient      advantages / sigma_i

After each optimiser step the statistics of the levels in the batch move
towards that batch's targets (levels absent from the batch keep theirs), and
the value head's weights and bias of each level are rescaled so that its
unnormalised outputs are what they were ("Preserving Outputs Precisely"):

  w_i <- w_i * sigma_i / sigma_i'
  b_i <- (sigma_i * b_i + mu_i - mu_i') / sigma_i'

With mu = 0 and sigma = 1 every formula above is plain IMPALA's.

The step size of a level's n-th update is max(beta, 1 / n) (`step_sizes`):
for its first 1 / beta updates the statistics are the plain average of the
batch moments seen so far, after that the paper's exponential average with
decay beta. With beta alone from mean 0 and second moment 1 a level seen in
400 learner steps would have its statistics only 1 - (1 - 3e-4)^400 = 11 %
of the way to its data (38 % at 1,600 steps, 70 % at 4,000): PopArt only
partly on for most of a run of a few million frames. The warm-up changes
nothing after 1 / beta updates of a level.

The statistics are the learner's variables `popart/mean`,
`popart/second_moment` and `popart/count` (updates of each level) [L]:
checkpointed with the rest, restored on resume.
Test mode does not need them (it acts from the policy only).

`scale_from_moments` also takes NumPy arrays (tests and benchmarks read
checkpointed statistics with it).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

MIN_SCALE = 1e-4
MAX_SCALE = 1e6
DEFAULT_BETA = 3e-4

# What compute_loss needs for a batch: each trajectory's level index [B]
# (int32) and the statistics' mean and scale [L] before this step.
PopArtBatch = collections.namedtuple("PopArtBatch", "level_ids mean scale")


def scale_from_moments(mean, second_moment):
    """sigma = sqrt(nu - mu^2), clamped to [MIN_SCALE, MAX_SCALE] (NumPy or TF)."""
    if isinstance(mean, tf.Tensor | tf.Variable):
        variance = tf.maximum(second_moment - tf.square(mean), 0.0)
        return tf.clip_by_value(tf.sqrt(variance), MIN_SCALE, MAX_SCALE)
    variance = np.maximum(np.asarray(second_moment) - np.square(mean), 0.0)
    return np.clip(np.sqrt(variance), MIN_SCALE, MAX_SCALE)


def level_ids(level_names: tf.Tensor, run_levels: Sequence[str]) -> tf.Tensor:
    """Each trajectory's index in `run_levels`: level_names [B] string -> [B]
    int32. A name not in `run_levels` cannot happen (actors take their levels
    from the same list); it would fail the step rather than pick a level."""
    known = tf.constant(list(run_levels))
    matches = tf.equal(level_names[:, None], known[None, :])
    check = tf.debugging.Assert(
        tf.reduce_all(tf.reduce_any(matches, axis=1)),
        ["PopArt: a trajectory of a level not in the run:", level_names],
    )
    with tf.control_dependencies([check]):
        return tf.argmax(tf.cast(matches, tf.int32), axis=1, output_type=tf.int32)


def batch_moments(vs: tf.Tensor, ids: tf.Tensor, num_levels: int):
    """Per-level means of vs and vs^2 over time and the level's trajectories:
    vs [T, B], ids [B] -> (mean [L], second moment [L], count [L] of
    trajectories)."""
    per_trajectory = tf.reduce_mean(vs, axis=0)
    per_trajectory_sq = tf.reduce_mean(tf.square(vs), axis=0)
    count = tf.math.unsorted_segment_sum(tf.ones_like(per_trajectory), ids, num_levels)
    safe = tf.maximum(count, 1.0)
    mean = tf.math.unsorted_segment_sum(per_trajectory, ids, num_levels) / safe
    second = tf.math.unsorted_segment_sum(per_trajectory_sq, ids, num_levels) / safe
    return mean, second, count


def updated_moments(mean, second_moment, batch_mean, batch_second, count, beta):
    """The statistics after one step: levels with count > 0 move by `beta`
    (a scalar, or [L]: each level's step size) towards the batch's moments;
    the others stay."""
    new_mean = (1.0 - beta) * mean + beta * batch_mean
    new_second = (1.0 - beta) * second_moment + beta * batch_second
    present = count > 0
    return (
        tf.where(present, new_mean, mean),
        tf.where(present, new_second, second_moment),
    )


def step_sizes(count, beta: float):
    """The step size of each level's next update, [L]: max(beta, 1 / n) for
    its n-th update (n = count + 1; NumPy or TF)."""
    if isinstance(count, tf.Tensor | tf.Variable):
        return tf.maximum(beta, 1.0 / (count + 1.0))
    return np.maximum(beta, 1.0 / (np.asarray(count) + 1.0))


def preserved_head(w, b, old_mean, old_scale, new_mean, new_scale):
    """The value head's weights w [H, L] and bias b [L] whose
    unnormalised outputs under the new statistics equal the old ones'."""
    ratio = old_scale / new_scale
    return w * ratio, (old_scale * b + old_mean - new_mean) / new_scale


class PopArt:
    """The learner's per-level statistics and the step that updates them.

    Create it inside the learner's graph (its variables are global, so the
    checkpoint saver holds them); `batch(level_names)` gives compute_loss its
    PopArtBatch, `update(vs, batch, w, b)` the op to run after the optimiser
    step.
    """

    def __init__(self, run_levels: Sequence[str], beta: float = DEFAULT_BETA):
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"PopArt beta={beta} is not in (0, 1]")
        self.run_levels = tuple(run_levels)
        self.beta = beta
        num_levels = len(self.run_levels)
        with tf.compat.v1.variable_scope("popart"):
            self.mean, self.second_moment = (
                tf.compat.v1.get_variable(
                    name,
                    [num_levels],
                    tf.float32,
                    initializer,
                    trainable=False,
                )
                for name, initializer in (
                    ("mean", tf.compat.v1.zeros_initializer()),
                    ("second_moment", tf.compat.v1.ones_initializer()),
                )
            )
            self.count = tf.compat.v1.get_variable(
                "count",
                [num_levels],
                tf.float32,
                tf.compat.v1.zeros_initializer(),
                trainable=False,
            )

    @property
    def num_levels(self) -> int:
        return len(self.run_levels)

    def scale(self) -> tf.Tensor:
        return scale_from_moments(self.mean, self.second_moment)

    def batch(self, level_names: tf.Tensor) -> PopArtBatch:
        """level_names [B] -> PopArtBatch of this batch's levels and the
        statistics as they are before the step."""
        return PopArtBatch(
            level_ids(level_names, self.run_levels),
            tf.identity(self.mean),
            self.scale(),
        )

    def update(self, vs: tf.Tensor, batch: PopArtBatch, w, b) -> tf.Operation:
        """New statistics from the V-trace targets vs [T, B], and the value
        head (w [H, L], b [L] variables) rescaled to preserve its outputs.

        Run it after the optimiser step (put it under a control dependency
        on the step), so the rescaling applies to the updated weights.
        `batch` is what `batch()` gave this step's loss.
        """
        batch_mean, batch_second, count = batch_moments(
            tf.stop_gradient(vs), batch.level_ids, self.num_levels
        )
        updates = self.count.read_value()
        new_mean, new_second = updated_moments(
            batch.mean,
            self.second_moment.read_value(),
            batch_mean,
            batch_second,
            count,
            step_sizes(updates, self.beta),
        )
        new_scale = scale_from_moments(new_mean, new_second)
        old_w, old_b = w.read_value(), b.read_value()
        new_w, new_b = preserved_head(
            old_w, old_b, batch.mean, batch.scale, new_mean, new_scale
        )
        # A level absent from the batch keeps its column exactly (its
        # statistics did not move, and the formula is exact only up to rounding).
        present = count > 0
        new_w = tf.where(present[None, :], new_w, old_w)
        new_b = tf.where(present, new_b, old_b)
        new_updates = updates + tf.cast(present, tf.float32)
        # Every read (the statistics before, the head after the optimiser
        # step) before any write: the variables are resource variables,
        # which order nothing by themselves.
        with tf.control_dependencies([new_mean, new_second, new_w, new_b, new_updates]):
            return tf.group(
                self.mean.assign(new_mean),
                self.second_moment.assign(new_second),
                self.count.assign(new_updates),
                w.assign(new_w),
                b.assign(new_b),
            )

    def summaries(self) -> None:
        """TensorBoard: popart/<level>/mean and popart/<level>/scale."""
        scale = self.scale()
        for i, level in enumerate(self.run_levels):
            tf.compat.v1.summary.scalar(f"popart/{level}/mean", self.mean[i])
            tf.compat.v1.summary.scalar(f"popart/{level}/scale", scale[i])
