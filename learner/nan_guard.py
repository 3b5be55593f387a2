"""The learner's NaN guard, whole: `guard_finite_update` fails a step whose
loss or gradients are not finite with a TensorFlow error, before any
variable (or the frame count) changes, and `non_finite_update` reads that
error back into a `NonFiniteUpdate` (the error crosses `session.run` as
text, so its encoding and decoding stay together). update.py builds the
guard into the optimiser step; loop.py turns the error into a
NonFiniteUpdateError.
"""

from __future__ import annotations

import collections
import re

import tensorflow as tf

# In the message of the step that guard_finite_update stops.
NON_FINITE_MARKER = "NaN or infinite loss or gradient"
# What that message says of the step (the Assert's data, in this order).
NonFiniteUpdate = collections.namedtuple(
    "NonFiniteUpdate", "num_env_frames total_loss global_norm"
)
_NON_FINITE_FIELDS = ("frames:", "total loss:", "gradient global norm:")


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
