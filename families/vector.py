"""Several environments in one process: `EnvironmentVector`.

An environment class for `py_process.PyProcess` that holds M environments of
one class (PyProcessAtari, PyProcessDmLab) and steps them one after another
in a single call: `initial()` and `step(actions [M])` return the M results
stacked on a leading axis. One actor with --envs_per_actor=K and
--envs_per_process=M then has K / M such processes instead of K, and pays
the py_func call, the pipe round trip, the pickling and the child's wake-up
once per M environment steps.

The trade-offs, against one environment per process:
- the M environments of a process step in sequence, not at the same time:
  a step of the vector takes M times one environment's step, so it pays
  only where more environments than cores are stepping anyway;
- they fail together: an exception in one of them (or the process dying)
  ends the process, and the actor restarts it, so the episodes of the M
  environments in it start again (those of the actor's other processes too:
  the actor resets its whole state);
- memory: one interpreter and one copy of the emulator's libraries for M
  environments (each Atari process holds ~60 MiB, BENCHMARKS.md "Memory").

Like atari.py this module must not import TensorFlow at module level: it
runs in the child process.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class EnvironmentVector:
    """M environments of `env_type`, the k-th built with `env_kwargs[k]`.

    Keeps the contract of contract.environment_tensor_specs with a
    leading axis of M on every output: initial() -> (frames uint8 [M, ...],
    instructions string [M]); step(actions [M]) -> (rewards float32 [M],
    dones bool [M], (frames, instructions)). Each environment resets itself
    at the end of its episodes, as a single one does.
    """

    def __init__(self, env_type: type, env_kwargs: list[dict]):
        if not env_kwargs:
            raise ValueError("EnvironmentVector needs at least one environment.")
        self._envs = []
        try:
            for kwargs in env_kwargs:
                self._envs.append(env_type(**kwargs))
        except BaseException:
            self.close()  # The ones already built (their engines, files).
            raise

    def initial(self) -> tuple[np.ndarray, np.ndarray]:
        return _stack_observations([env.initial() for env in self._envs])

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, tuple]:
        actions = np.asarray(actions)
        if len(actions) != len(self._envs):
            raise ValueError(
                f"EnvironmentVector of {len(self._envs)} environments got "
                f"{len(actions)} actions."
            )
        rewards = np.empty(len(self._envs), np.float32)
        dones = np.empty(len(self._envs), np.bool_)
        observations = []
        for k, (env, action) in enumerate(zip(self._envs, actions, strict=True)):
            rewards[k], dones[k], observation = env.step(action)
            observations.append(observation)
        return rewards, dones, _stack_observations(observations)

    def close(self) -> None:
        errors = []
        for env in self._envs:
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 - close the others first
                errors.append(e)
        self._envs = []
        if errors:
            raise errors[0]

    @staticmethod
    def _tensor_specs(method_name: str, kwargs: dict, constructor_kwargs: dict) -> Any:
        """The inner class's specs with a leading axis of M (TF, lazily)."""
        import tensorflow as tf

        env_type = constructor_kwargs["env_type"]
        env_kwargs = constructor_kwargs["env_kwargs"]
        inner = env_type._tensor_specs(method_name, {}, env_kwargs[0])  # noqa: SLF001
        if inner is None:
            return None  # close() and other methods without outputs
        num_envs = len(env_kwargs)
        return tf.nest.map_structure(
            lambda spec: tf.TensorSpec([num_envs, *spec.shape], spec.dtype), inner
        )


def _stack_observations(observations: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """[(frame, instruction), ...] -> (frames [M, ...], instructions [M])."""
    frames = np.stack([frame for frame, _ in observations])
    instructions = np.array([instruction for _, instruction in observations], object)
    return frames, instructions
