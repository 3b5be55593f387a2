"""A member's fitness: the mean capped human-normalised score of its
episodes since its last evolution where every level of the run has
published human and random scores (Atari-57, DMLab-30), in percent capped
at 100 per episode; the mean return otherwise (ViZDoom). The rule's copy
threshold is in the same units (the paper's 5: percentage points)."""

from __future__ import annotations

import environments

CAP = 100.0


class Fitness:
    """The episodes since the last evolution, and their fitness."""

    def __init__(self, level_names):
        self._levels = list(level_names)
        self.normalised = all(
            environments.level_score(level, [0.0]) is not None for level in self._levels
        )
        self._values: list[float] = []

    @property
    def episodes(self) -> int:
        return len(self._values)

    def add(self, level: str, episode_return: float) -> None:
        if self.normalised:
            score = environments.level_score(level, [episode_return])
            self._values.append(min(score, CAP))
        else:
            self._values.append(float(episode_return))

    def value(self) -> float | None:
        """The mean over the episodes since the last reset; None before one."""
        if not self._values:
            return None
        return sum(self._values) / len(self._values)

    def reset(self) -> None:
        self._values = []

    @property
    def units(self) -> str:
        return "capped human-normalised score (%)" if self.normalised else "return"
