"""Per-level summaries of a run of several levels: how hard each level's
trajectories push the policy and what share of the loss's gradient each
takes (update.py builds them beside the training step, never into it).
"""

from __future__ import annotations

import collections

import tensorflow as tf

import agent as agent_lib

# A tower's per-level sums [L] for level_summaries: the trajectories, their
# mean |policy-gradient advantage|, and the squared norm of the loss's
# gradient with respect to the network's outputs (policy logits, values).
LevelTerms = collections.namedtuple(
    "LevelTerms", "trajectories abs_pg_advantage output_gradient_sq"
)


def level_terms(
    level_ids: tf.Tensor,
    num_levels: int,
    pg_advantages: tf.Tensor,
    total_loss: tf.Tensor,
    learner_outputs: agent_lib.AgentOutput,
) -> LevelTerms:
    """Per-level sums over a batch's trajectories (level_ids [B],
    pg_advantages [T, B]); built for the summaries only, so the training step
    never computes them."""
    logits_gradient, values_gradient = tf.gradients(
        total_loss, [learner_outputs.policy_logits, learner_outputs.baseline]
    )

    def per_trajectory_sq(gradient):  # [T + 1, B, ...] -> [B]
        if gradient is None:
            return tf.zeros_like(tf.cast(level_ids, tf.float32))
        squares = tf.square(gradient)
        return tf.reduce_sum(squares, axis=[0, *range(2, squares.shape.rank)])

    def by_level(values):  # [B] -> [L]
        return tf.math.unsorted_segment_sum(values, level_ids, num_levels)

    return LevelTerms(
        trajectories=by_level(tf.ones_like(tf.cast(level_ids, tf.float32))),
        abs_pg_advantage=by_level(tf.reduce_mean(tf.abs(pg_advantages), axis=0)),
        output_gradient_sq=by_level(
            per_trajectory_sq(logits_gradient) + per_trajectory_sq(values_gradient)
        ),
    )


def level_summaries(level_names, towers_terms: list[LevelTerms]) -> None:
    """TensorBoard, for each level of a run of several:
    `levels/<level>/mean_abs_pg_advantage` (the mean |advantage| its
    trajectories push the policy with; PopArt divides it by the level's
    scale) and `levels/<level>/gradient_share` (its share of the norm of the
    loss's gradient with respect to the network's outputs, the policy logits
    and the values: the levels' shares add up to 1; without PopArt and
    without clipping the large-reward level takes most of it). Both are of
    the summary step's batch, all learners' together; 0 for a level absent
    from it."""
    terms = LevelTerms(
        *(tf.add_n(list(parts)) for parts in zip(*towers_terms, strict=True))
    )
    mean_abs = terms.abs_pg_advantage / tf.maximum(terms.trajectories, 1.0)
    norms = tf.sqrt(terms.output_gradient_sq)
    shares = norms / tf.maximum(tf.reduce_sum(norms), 1e-12)
    for i, level in enumerate(level_names):
        tf.compat.v1.summary.scalar(
            f"levels/{level}/mean_abs_pg_advantage", mean_abs[i]
        )
        tf.compat.v1.summary.scalar(f"levels/{level}/gradient_share", shares[i])
