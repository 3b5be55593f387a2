"""Atari that gives a NaN reward: the environment side of the NaN-guard test.

Real environments never give a NaN reward, so tests/fault_test.py trains Pong
with this family in Atari's place (tests/train_with_nan_rewards.py registers
it): every environment process gives a NaN reward at its step
NAN_REWARD_AT_STEP (an environment variable of the run), once.

Make that step the last of an unroll (a multiple of --unroll_length): the
agent takes the last reward as an input, so the step after a NaN reward
has NaN logits and samples an action out of range, which fails the
environment and drops the unroll in flight; the NaN reward then reaches the
learner only in an unroll that it ends. TF-free: the environment class is
imported by the environment's child process.
"""

from __future__ import annotations

import os

import numpy as np

from families import atari

AT_STEP_VARIABLE = "NAN_REWARD_AT_STEP"


class NanRewardAtari(atari.PyProcessAtari):
    """PyProcessAtari whose reward is NaN at step `nan_at_step`."""

    def __init__(self, *args, nan_at_step: int, **kwargs):
        super().__init__(*args, **kwargs)
        self._nan_at_step = nan_at_step
        self._steps = 0

    def step(self, action):
        reward, done, observation = super().step(action)
        self._steps += 1
        if self._steps == self._nan_at_step:
            reward = np.float32(np.nan)
        return reward, done, observation


class NanRewardAtariFamily(atari.AtariFamily):
    """Atari's levels, with NanRewardAtari as their environment class."""

    def environment_class(self, level_name, seed, is_test=False, **options):
        env_type, kwargs = super().environment_class(
            level_name, seed, is_test, **options
        )
        assert env_type is atari.PyProcessAtari
        kwargs["nan_at_step"] = int(os.environ[AT_STEP_VARIABLE])
        return NanRewardAtari, kwargs


FAMILY = NanRewardAtariFamily()
