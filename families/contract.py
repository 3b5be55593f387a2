"""The contracts of environments: what every environment class gives back
(the step output and its specs) and what every environment family tells the
registry (`EnvironmentFamily`).

A leaf module (it imports no other module of this project, and TensorFlow
only inside `environment_tensor_specs`), so that the families (atari.py,
dmlab.py), the registry (environments.py) and everything that consumes
their outputs can share it without importing each other.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

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


def importable(module_name: str) -> bool:
    """Whether `import module_name` can work, for a family's `available()`.
    Imports nothing and never raises: a module set to None in sys.modules
    (how tests hide one) or a broken package reads as "not available"."""
    import importlib.util
    import sys

    try:
        if sys.modules.get(module_name) is not None:
            return True
        return importlib.util.find_spec(module_name) is not None
    except Exception:  # noqa: BLE001 - ValueError, ImportError, a broken finder
        return False


@dataclasses.dataclass(frozen=True)
class FamilyFlag:
    """A command-line flag that a family declares and owns.

    experiment.py defines it (an integer, float, string or boolean flag, as
    `default` is), checks its value with `check` before anything is built
    (`check(value)` returns what is wrong, or None) and hands the values of
    the run's family's flags to `EnvironmentFamily.options`.
    """

    name: str
    default: int | float | str | bool
    help: str
    check: Callable[[Any], str | None] | None = None


class UnknownLevelError(ValueError):
    """A level name that a family owns but has no level of; the message is
    the reason (the registry adds the closest valid names)."""


class EnvironmentFamily:
    """One environment family (Atari, DeepMind Lab, ...): what the registry in
    environments.py asks of it. A family's module subclasses this, creates
    one instance and environments.py registers it (or a script of the
    user's calls `environments.register`); docs/adding-an-environment.md
    walks through an example.

    Class attributes:
      name: the family's name in messages ("Atari").
      suites: names that expand to several levels ("atari57").
      level_forms: the family's level names as the error for an unknown
        name lists them ("'atari/<game>' (...), 'atari57'"); "" for none.
      catch_all: whether the family also takes names no other family claims
        (DeepMind Lab: a user's custom levels). At most one family should.
      max_envs_per_process: how many of its environments may share one
        process (--envs_per_process); None for no limit.
      flags: the family's own command-line flags (FamilyFlag), which
        `options` turns into its settings.
      frame_stack: how many of its latest frames the agent stacks into one
        observation (agent.py builds the stack in the graph, so each frame
        leaves the environment once); 1, no stack: the agent sees each
        frame alone.
      frame_shape: the shape of one frame its environments return, [H, W,
        C], which a stacking agent needs before the first step (the state
        it keeps); () where frame_stack is 1.
      default_flagfiles: the flag files of the family's tested commands
        (flagfiles/...), the first its default: a single-machine training
        run of the family's levels takes their values for every flag it
        does not set (config.family_defaults: the file whose --agent is the
        run's, else the first; its frame targets per level). () keeps the
        flags' own defaults, the reference's.
    """

    name = ""
    suites: tuple[str, ...] = ()
    level_forms = ""
    catch_all = False
    max_envs_per_process: int | None = None
    flags: tuple[FamilyFlag, ...] = ()
    frame_stack: int = 1
    frame_shape: tuple[int, ...] = ()
    default_flagfiles: tuple[str, ...] = ()

    def owns(self, level_name: str) -> bool:
        """Whether `level_name` is this family's (valid or not: `expand`
        says which)."""
        raise NotImplementedError

    def expand(self, level_name: str, is_test: bool = False) -> list[str]:
        """The levels `--level_name=level_name` trains (or tests) on.

        Raises:
          ValueError: the name is this family's but no level of it.
        """
        raise NotImplementedError

    def suggestions(self) -> dict[str, str]:
        """Spellings to suggest for a mistyped name: spelling -> level name."""
        return {}

    def available(self) -> bool:
        """Whether its library is installed here."""
        return True

    def not_available_message(self, level_name: str) -> str:
        """The flag error for `level_name` when `available()` is False."""
        return f"--level_name={level_name}: {self.name} is not installed."

    def unknown_level_hint(self) -> str:
        """A sentence added to the error for a name no family knows."""
        return ""

    def num_actions(self, level_names: list[str]) -> int:
        """The agent's action count for these levels (all of this family)."""
        raise NotImplementedError

    def has_instructions(self, level_names: list[str]) -> bool:
        """Whether any of the levels may give a text instruction."""
        return False

    def envs_per_process_problem(self, envs: int, level_name: str) -> str | None:
        """The flag error for --envs_per_process=`envs` above
        max_envs_per_process, or None."""
        limit = self.max_envs_per_process
        if limit is None or envs <= limit:
            return None
        return (
            f"--envs_per_process={envs}: {self.name} runs "
            f"{'one level' if limit == 1 else f'{limit} levels'} per process, and "
            f"--level_name={level_name} has {self.name} levels; use "
            f"--envs_per_process={limit} (several environments to a process "
            f"are for families that allow it, such as Atari)."
        )

    def options(self, values: Mapping[str, Any]) -> Any:
        """The family's settings from the values of its `flags` (flag name
        -> value; a frozen dataclass or None); may raise errors.FlagError."""
        return None

    def environment_class(
        self, level_name: str, seed: int, is_test: bool = False, **options: Any
    ) -> tuple[type, dict]:
        """The class that runs `level_name` in a py_process child, and its
        constructor's keyword arguments. `options` are the family's own
        (`run_options` gives a run's). The class keeps the contract of
        `environment_tensor_specs`.

        Raises:
          ValueError: `level_name` is no level of this family.
        """
        raise NotImplementedError

    def run_options(self, environment: Any, is_test: bool) -> dict[str, Any]:
        """`environment_class`'s options for a run: `environment` is its
        config.EnvironmentConfig (level_names, num_action_repeats, and this
        family's `options`)."""
        return {"num_action_repeats": environment.num_action_repeats}

    def suite_scores(self, suite: str, level_returns) -> dict[str, float]:
        """A suite's headline scores from {level: returns}; {} for none."""
        return {}

    def level_score(self, level: str, returns) -> float | None:
        """A level's human-normalised score, or None when it has none."""
        return None
