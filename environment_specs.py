"""What every environment class gives back: the step output and its specs.

A leaf module (it imports no other module of this project, and TensorFlow
only inside `environment_tensor_specs`), so that the environment classes
(atari.py, environments.py) and everything that consumes their outputs can
share it without importing each other.
"""

from __future__ import annotations

import collections

# The running episode's return (float32) and length in agent steps (int32).
StepOutputInfo = collections.namedtuple("StepOutputInfo", "episode_return episode_step")
# One environment step as FlowEnvironment returns it (see environments.py).
StepOutput = collections.namedtuple("StepOutput", "reward info done observation")


def environment_tensor_specs(method_name: str, frame_shape):
    """py_process specs of an environment class's `initial` and `step`.

    The contract every environment class here keeps (FlowEnvironment relies
    on it): `initial()` returns observation = (frame uint8 frame_shape,
    instruction string []), `step(action)` returns (reward float32 [],
    done bool [], observation); any other method returns nothing (None).
    """
    import tensorflow as tf

    observation_spec = (
        tf.TensorSpec(frame_shape, tf.uint8),
        tf.TensorSpec([], tf.string),
    )
    if method_name == "initial":
        return observation_spec
    if method_name == "step":
        return (
            tf.TensorSpec([], tf.float32),
            tf.TensorSpec([], tf.bool),
            observation_spec,
        )
    return None
