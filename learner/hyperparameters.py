"""The hyperparameters a running learner can change without a restart:
learning rate, entropy cost, the optimiser's epsilon and the gradient-norm
clip (what Population Based Training evolves, the paper's appendix F).

Each is a local variable on the learner, initialised from the run's
LearnerConfig when the session starts, read by the update that uses it (the
learning rate's decay, the loss's entropy term, RMSProp's or Adam's
epsilon, the clip) and summarised to TensorBoard under
`hyperparameters/<name>`. `assign` sets new values between two updates:
the next update uses them. Local variables are never checkpointed: a run
that changed them sets them again after each new session (PBT's member does,
from its record), and checkpoints stay those of any other run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import tensorflow as tf

from config import LearnerConfig

MUTABLE = ("learning_rate", "entropy_cost", "epsilon", "max_grad_norm")


class MutableHyperparameters:
    """The MUTABLE hyperparameters of a learner as local float32 variables.

    Build inside the learner's graph (and device scope); `config` gives the
    initial values. `config_with_tensors(config)` is the config whose
    MUTABLE fields are these variables' values, for the loss and update.
    """

    def __init__(self, config: LearnerConfig):
        # Not "hyperparameters": the summaries below take those names as
        # their tags, and a name the graph already holds would get a suffix
        # ("hyperparameters/learning_rate_1" in TensorBoard).
        with tf.name_scope("mutable_hyperparameters"):
            self.variables = {
                name: tf.compat.v1.Variable(
                    float(getattr(config, name)),
                    dtype=tf.float32,
                    trainable=False,
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                    use_resource=True,
                    name=name,
                )
                for name in MUTABLE
            }
            self._placeholders = {
                name: tf.compat.v1.placeholder(tf.float32, [], name=f"new_{name}")
                for name in MUTABLE
            }
            self._assign = {
                name: self.variables[name].assign(self._placeholders[name]).op
                for name in MUTABLE
            }
        for name, variable in self.variables.items():
            tf.compat.v1.summary.scalar(f"hyperparameters/{name}", variable)

    def config_with_tensors(self, config: LearnerConfig) -> LearnerConfig:
        """`config` with each MUTABLE field the variable's current value (a
        scalar tensor, read where it is used)."""
        return dataclasses.replace(
            config,
            **{name: v.read_value() for name, v in self.variables.items()},
        )

    def assign(self, session, values: Mapping[str, float]) -> None:
        """Sets the named hyperparameters (a subset of MUTABLE) in `session`
        (between updates: the next update uses them)."""
        unknown = sorted(set(values) - set(MUTABLE))
        if unknown:
            raise ValueError(f"not mutable: {unknown}; these are {list(MUTABLE)}")
        session.run(
            [self._assign[name] for name in values],
            {self._placeholders[name]: float(v) for name, v in values.items()},
        )

    def read(self, session) -> dict[str, float]:
        return {k: float(v) for k, v in session.run(self.variables).items()}
