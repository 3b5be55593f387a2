"""The paper's PBT rule, pure Python with an explicit random generator.

A member is *ready* once it has trained `burn_in_frames` frames and played
`ready_episodes` episodes since its last evolution. A ready member picks one
other member uniformly at random; it copies that member's weights and
hyperparameters when the other's fitness is higher than its own by more
than `copy_threshold` (in the fitness's units: percentage points of the
capped human-normalised score, or return). Copied or not, each evolving
hyperparameter is then perturbed with probability `perturb_probability`:
multiplied by `perturb_factor` or divided by it, each with probability 1/2;
a hyperparameter with a set of choices (RMSProp's epsilon) moves one
choice up or down instead, staying at the ends.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Prior:
    """Where a hyperparameter's initial value is drawn from: log-uniform in
    [low, high], or one of `choices` (uniformly)."""

    name: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[float, ...] = ()

    def problem(self) -> str | None:
        """Why this prior is not one, or None."""
        if self.choices:
            if any(not (c > 0) for c in self.choices):
                return f"{self.name}: choices must be positive, not {self.choices}"
            return None
        if not (0 < self.low <= self.high):
            return (
                f"{self.name}: a log-uniform prior needs 0 < low <= high, not "
                f"[{self.low}, {self.high}]"
            )
        return None

    def draw(self, rng: random.Random) -> float:
        if self.choices:
            return rng.choice(self.choices)
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def perturb(self, value: float, rng: random.Random, factor: float) -> float:
        """One perturbation: x factor or / factor; a choice moves one step
        up or down its sorted choices (staying at the ends)."""
        up = rng.random() < 0.5
        if self.choices:
            ordered = sorted(self.choices)
            index = min(range(len(ordered)), key=lambda i: abs(ordered[i] - value))
            index = min(index + 1, len(ordered) - 1) if up else max(index - 1, 0)
            return ordered[index]
        return value * factor if up else value / factor


# The paper's priors (Table D.1): entropy cost and learning rate
# log-uniform, RMSProp epsilon one of four; the Atari agent also evolved the
# gradient-norm clip (its prior is not given: 10 to 100 around Atari's 40).
PAPER_PRIORS = {
    "entropy_cost": Prior("entropy_cost", 5e-5, 1e-2),
    "learning_rate": Prior("learning_rate", 5e-6, 5e-3),
    "epsilon": Prior("epsilon", choices=(1e-1, 1e-3, 1e-5, 1e-7)),
    "max_grad_norm": Prior("max_grad_norm", 10.0, 100.0),
}


@dataclasses.dataclass(frozen=True)
class Rule:
    burn_in_frames: int = 20_000_000
    ready_episodes: int = 5_000
    copy_threshold: float = 5.0
    perturb_probability: float = 0.33
    perturb_factor: float = 1.2


@dataclasses.dataclass(frozen=True)
class MemberState:
    """What a member's record says of it (records.py)."""

    member: int
    frames: int
    fitness: float | None
    episodes_since_evolution: int
    hyperparameters: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Decision:
    """One evolution: the member copied (None: kept its own weights), the
    hyperparameters after it, and the names perturbed."""

    copied_from: int | None
    hyperparameters: dict[str, float]
    perturbed: tuple[str, ...]


def draw_initial(priors: Sequence[Prior], rng: random.Random) -> dict[str, float]:
    """A new member's hyperparameters, each from its prior, in order."""
    return {prior.name: prior.draw(rng) for prior in priors}


def is_ready(state: MemberState, rule: Rule) -> bool:
    return (
        state.frames >= rule.burn_in_frames
        and state.episodes_since_evolution >= rule.ready_episodes
        and state.fitness is not None
    )


def should_copy(own: float, other: float | None, threshold: float) -> bool:
    """The paper's test: the other is better by more than the threshold."""
    return other is not None and other > own + threshold


def evolve(
    mine: MemberState,
    others: Sequence[MemberState],
    priors: Sequence[Prior],
    rule: Rule,
    rng: random.Random,
) -> Decision | None:
    """The rule for a member (None when it is not ready or has nobody to
    compare with): compare with one other member drawn uniformly, copy its
    hyperparameters when it is better by more than the threshold, then
    perturb each evolving hyperparameter (`priors`) with the rule's
    probability."""
    candidates = [o for o in others if o.member != mine.member]
    if not is_ready(mine, rule) or not candidates:
        return None
    other = rng.choice(candidates)
    copied = should_copy(mine.fitness, other.fitness, rule.copy_threshold)
    source = other.hyperparameters if copied else mine.hyperparameters
    hyperparameters = {name: float(value) for name, value in source.items()}
    perturbed = []
    for prior in priors:
        if rng.random() < rule.perturb_probability:
            hyperparameters[prior.name] = prior.perturb(
                hyperparameters[prior.name], rng, rule.perturb_factor
            )
            perturbed.append(prior.name)
    return Decision(other.member if copied else None, hyperparameters, tuple(perturbed))
