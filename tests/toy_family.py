"""A tiny environment family, registered by a test: the seam's proof.

`toy/corridor_<n>`: the agent stands in a corridor of n cells (n in 3..9)
and steps left (action 0) or right (action 1); reaching the right end pays
the goal reward (the family's own flag, --toy_goal_reward, 1 by default) and
ends the episode, and an episode also ends after 4 n steps. The frame
is a 24x24 RGB picture of the corridor with the agent's cell lit. `toy2` is
a suite of two corridors. docs/adding-an-environment.md walks through this
module; it is everything a family needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from families.contract import (
    EnvironmentFamily,
    FamilyFlag,
    UnknownLevelError,
    environment_tensor_specs,
)

PREFIX = "toy/corridor_"
SUITE = "toy2"
FRAME_SHAPE = (24, 24, 3)
LENGTHS = range(3, 10)


class ToyCorridor:
    """The environment class: runs in a py_process child. initial() and
    step(action) return what environment_tensor_specs describes."""

    def __init__(
        self,
        length: int,
        seed: int,
        num_action_repeats: int = 1,
        goal_reward: float = 1.0,
    ):
        self._length = length
        self._goal_reward = goal_reward
        self._rng = np.random.RandomState(seed)
        self._position = 0
        self._steps = 0

    def _observation(self) -> tuple[np.ndarray, str]:
        frame = np.zeros(FRAME_SHAPE, np.uint8)
        width = FRAME_SHAPE[1] // self._length
        frame[8:16, :, 2] = 60  # the corridor
        frame[8:16, self._position * width : (self._position + 1) * width] = 255
        return frame, ""

    def _start(self) -> None:
        self._position = self._rng.randint(self._length - 1)
        self._steps = 0

    def initial(self) -> tuple[np.ndarray, str]:
        self._start()
        return self._observation()

    def step(self, action) -> tuple[np.float32, np.bool_, tuple[np.ndarray, str]]:
        move = 1 if int(action) == 1 else -1
        self._position = min(max(self._position + move, 0), self._length - 1)
        self._steps += 1
        reward = self._goal_reward if self._position == self._length - 1 else 0.0
        done = reward > 0 or self._steps >= 4 * self._length
        if done:
            self._start()  # the observation after done starts the next episode
        return np.float32(reward), np.bool_(done), self._observation()

    def close(self) -> None:
        pass

    @staticmethod
    def _tensor_specs(method_name, unused_kwargs, unused_constructor_kwargs):
        return environment_tensor_specs(method_name, list(FRAME_SHAPE))


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    """The family's settings, from its flags."""

    goal_reward: float = 1.0


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0 (the reward at the corridor's end)."


class ToyFamily(EnvironmentFamily):
    name = "Toy"
    suites = (SUITE,)
    level_forms = "'toy/corridor_<3 to 9>', 'toy2'"
    # The family's own flag: experiment.py defines and checks it, `options`
    # reads it, `run_options` hands it to the environment class.
    flags = (
        FamilyFlag(
            "toy_goal_reward",
            ToyOptions.goal_reward,
            "Reward at a toy corridor's right end.",
            _positive,
        ),
    )

    def owns(self, level_name: str) -> bool:
        return level_name == SUITE or level_name.startswith(PREFIX)

    def expand(self, level_name: str, is_test: bool = False) -> list[str]:
        if level_name == SUITE:
            return [PREFIX + "3", PREFIX + "5"]
        suffix = level_name[len(PREFIX) :]
        if suffix.isdigit() and int(suffix) in LENGTHS:
            return [level_name]
        raise UnknownLevelError("toy corridors are 3 to 9 cells long.")

    def suggestions(self) -> dict[str, str]:
        return {PREFIX + str(n): PREFIX + str(n) for n in LENGTHS}

    def num_actions(self, level_names) -> int:
        return 2

    def options(self, values) -> ToyOptions:
        return ToyOptions(goal_reward=values["toy_goal_reward"])

    def run_options(self, environment, is_test: bool) -> dict[str, Any]:
        options = environment.options or ToyOptions()
        return {
            "num_action_repeats": environment.num_action_repeats,
            "goal_reward": options.goal_reward,
        }

    def environment_class(
        self, level_name: str, seed: int, is_test: bool = False, **options: Any
    ) -> tuple[type, dict]:
        self.expand(level_name)  # an unknown corridor raises here
        return ToyCorridor, dict(
            length=int(level_name[len(PREFIX) :]),
            seed=seed,
            num_action_repeats=options.get("num_action_repeats", 1),
            goal_reward=options.get("goal_reward", ToyOptions.goal_reward),
        )

    def suite_scores(self, suite: str, level_returns) -> dict[str, float]:
        means = [np.mean(r) for r in level_returns.values() if len(r)]
        return {"mean_return": float(np.mean(means))} if means else {}


FAMILY = ToyFamily()
