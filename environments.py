"""Environments: the registry of environment families and FlowEnvironment.

An environment family (Atari, ViZDoom, DeepMind Lab: families/atari.py,
doom.py, dmlab.py) is one module with a `families.contract.EnvironmentFamily`:
the level names it accepts, its suites, its action count, its environment
class for py_process, its flags and options and its suite scores. This module registers the
built-in families and answers every question about a level name by asking
the family that owns it, so nothing outside the families tests which family
a level is. To add a family, write its module and `register` it (here, or
from a script of your own before experiment.main runs):
docs/adding-an-environment.md.

- `FlowEnvironment` turns an environment proxy (a `py_process.PyProcess`
  proxy whose class has `initial()` and `step(action)`) into TensorFlow ops
  with episode bookkeeping (`StepOutput`).
- Level names: `family_of`, `expand_level_names`, `num_actions`,
  `has_instructions`, `resolve_levels` (with `resolve_level_name`: the
  default level and its fallback), `suite_scores`, `level_score`.
- Processes: `create_environment` (one environment in a process) and
  `create_environment_vector` (several in one process), with a family's own
  options or a run's (`run_options`).

The environment classes run in spawned child processes that import their
family's module, never this one's TensorFlow: TensorFlow is imported lazily
(inside FlowEnvironment's methods), so children start fast and stay small.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np

from families import atari, dmlab, doom
from families.contract import (
    EnvironmentFamily,
    StepOutput,
    StepOutputInfo,
    UnknownLevelError,
)
from runtime.settings import DEFAULTS

__all__ = [
    "EnvironmentFamily",
    "FlowEnvironment",
    "StepOutput",
    "StepOutputInfo",
    "register",
]

_FAMILIES: list[EnvironmentFamily] = []


def register(
    family: EnvironmentFamily, replace: EnvironmentFamily | None = None
) -> EnvironmentFamily:
    """Adds a family to the registry (once; a family that claims every other
    name, `catch_all`, is asked last). Returns it.

    `replace`: a registered family that `family` takes the place of, e.g. a
    subclass of atari.AtariFamily whose environment class wraps Atari's (a
    reward transform, a recording) for the same level names.
    """
    if replace is not None:
        if replace not in _FAMILIES:
            raise ValueError(f"cannot replace {replace.name}: it is not registered")
        # In its place: the order of registration decides who owns a name.
        _FAMILIES[_FAMILIES.index(replace)] = family
    if family not in _FAMILIES:
        _FAMILIES.append(family)
        _FAMILIES.sort(key=lambda f: f.catch_all)  # stable: the order of calls
    return family


def families() -> tuple[EnvironmentFamily, ...]:
    return tuple(_FAMILIES)


register(atari.FAMILY)
register(doom.FAMILY)
register(dmlab.FAMILY)


class FlowEnvironment:
    """An environment as TensorFlow ops, with per-episode return and length.

    `env` is a proxy (e.g. `py_process.PyProcess(...).proxy`) whose
    `initial()` op returns an observation and `step(action)` op returns
    (reward, done, observation). All tensors here are unbatched: reward
    float32 [], done bool [], observation = (frame uint8 [H, W, C],
    instruction string []).

    The state, (flow int64 [], StepOutputInfo(episode_return float32 [],
    episode_step int32 [])), carries the running episode's return and length
    and, through control dependencies on `flow`, orders the steps: a step op
    runs only after the op that produced its state. At an episode's end
    (done=True) the output's info holds the finished episode's return and
    length (this step's reward included), its observation is the first of the
    next episode, and the returned state restarts at 0.

    With `num_envs=M` the proxy runs M environments (an
    vector.EnvironmentVector): every tensor above, state
    included, gains a leading axis of M (actions int32 [M]), and each
    environment's episode bookkeeping is its own.
    """

    def __init__(self, env: Any, num_envs: int | None = None):
        self._env = env
        self.num_envs = num_envs

    def initial(self) -> tuple[StepOutput, tuple]:
        """Returns (StepOutput, state): done=True, reward 0, return/step 0."""
        import tensorflow as tf

        shape = [] if self.num_envs is None else [self.num_envs]
        with tf.name_scope("flow_environment_initial"):
            initial_reward = tf.zeros(shape)
            initial_info = StepOutputInfo(tf.zeros(shape), tf.zeros(shape, tf.int32))
            initial_done = tf.ones(shape, tf.bool)
            initial_observation = self._env.initial()

            initial_output = StepOutput(
                initial_reward, initial_info, initial_done, initial_observation
            )

            # The next step may only run after the initial observation exists.
            with tf.control_dependencies(tf.nest.flatten(initial_output)):
                initial_flow = tf.constant(0, dtype=tf.int64)
            initial_state = (initial_flow, initial_info)
            return initial_output, initial_state

    def step(self, action, state: tuple) -> tuple[StepOutput, tuple]:
        """One environment step: action int32 [] ([M] with num_envs=M).

        Returns (StepOutput, state).
        """
        import tensorflow as tf

        with tf.name_scope("flow_environment_step"):
            flow, info = tf.nest.map_structure(tf.convert_to_tensor, state)
            info = StepOutputInfo(*info)

            # The previous step must have run before this one.
            with tf.control_dependencies([flow]):
                reward, done, observation = self._env.step(action)

            with tf.control_dependencies(tf.nest.flatten(observation)):
                new_flow = tf.add(flow, 1)

            # The output's info includes this step's reward even when the
            # episode ends; the state for the next step then starts at zero.
            new_info = StepOutputInfo(
                info.episode_return + reward, info.episode_step + 1
            )
            new_state = (
                new_flow,
                tf.nest.map_structure(
                    lambda value: tf.where(done, tf.zeros_like(value), value),
                    new_info,
                ),
            )

            output = StepOutput(reward, new_info, done, observation)
            return output, new_state


# -- level names ----------------------------------------------------------------


def _unknown_level_error(level_name: str, reason: str) -> ValueError:
    candidates: dict[str, str] = {}
    for family in _FAMILIES:
        for spelling, name in family.suggestions().items():
            candidates.setdefault(spelling, name)
    query = level_name.lower()
    matches = difflib.get_close_matches(query, list(candidates), n=8, cutoff=0.6)
    close = list(dict.fromkeys(candidates[m] for m in matches))[:5]
    suggestion = (
        f"Closest valid names: {', '.join(close)}." if close else "No close valid name."
    )
    valid = ", ".join(f.level_forms for f in _FAMILIES if f.level_forms)
    return ValueError(
        f"Unknown --level_name={level_name!r}: {reason} {suggestion} Valid: {valid}."
    )


# `--level_name=atari/pong,atari/breakout`: a run on a list of levels (or
# suites) of one family, as a suite is: actors round-robin over them, one
# agent, the list's scores the median and mean of its levels' scores.
LIST_SEPARATOR = ","


def level_list(level_name: str) -> list[str]:
    """The names of a comma-separated level list, each stripped.

    Raises:
      ValueError: an empty entry.
    """
    names = [name.strip() for name in level_name.split(LIST_SEPARATOR)]
    if not all(names):
        raise ValueError(
            f"--level_name={level_name!r} has an empty entry; separate level "
            f"names with single commas, e.g. atari/pong,atari/breakout."
        )
    return names


def family_of(level_name: str) -> EnvironmentFamily:
    """The family that owns `level_name` (a level or a suite).

    Raises:
      ValueError: no family owns it; the message lists the closest names.
    """
    if not isinstance(level_name, str) or not level_name:
        raise ValueError(
            f"--level_name must be a non-empty string, got {level_name!r}."
        )
    if LIST_SEPARATOR in level_name:
        return _family_of_all(level_list(level_name))
    for family in _FAMILIES:
        if family.owns(level_name):
            return family
    hints = " ".join(h for f in _FAMILIES if (h := f.unknown_level_hint()))
    reason = "not a level known here" + (f", and {hints}" if hints else ".")
    raise _unknown_level_error(level_name, reason)


# experiment.py's default level, and what it falls back to where its family's
# library is not installed (which then trains with Atari's defaults, the
# tested Pong command: EnvironmentFamily.default_flagfiles).
DEFAULT_LEVEL = DEFAULTS["level_name"]
FALLBACK_LEVEL = "atari/pong"


def resolve_level_name(
    level_name: str, is_default: bool, default_available: bool
) -> tuple[str, str | None]:
    """Returns (level name to use, warning or None).

    The default level is a DeepMind Lab level; where DeepMind Lab is not
    installed (`default_available` False) the default falls back to
    atari/pong so that a fresh machine can train right away. A DeepMind Lab
    level named explicitly stays an error later on.
    """
    if is_default and not default_available:
        return FALLBACK_LEVEL, (
            f"DeepMind Lab is not installed, so the default level "
            f"{DEFAULT_LEVEL!r} cannot run: using {FALLBACK_LEVEL!r} "
            f"instead. {dmlab.INSTALL_DEEPMIND_LAB} Or choose a level with "
            f"--level_name."
        )
    return level_name, None


def default_level_available() -> bool:
    """Whether the default level's family is installed here."""
    return family_of(DEFAULT_LEVEL).available()


def resolve_levels(
    level_name: str, is_default: bool, is_test: bool = False
) -> tuple[str, list[str], str | None]:
    """(the level name to run, the names it expands to, a warning or None)
    for `--level_name=level_name`; `is_default`: the flag was not given (the
    default falls back where its family is missing: resolve_level_name).

    Raises:
      ValueError: an unknown name, or a level whose family is not installed
        here (the family's own message, saying how to install it).
    """
    level_name, warning = resolve_level_name(
        level_name, is_default, default_level_available()
    )
    level_names = expand_level_names(level_name, is_test)
    family = family_of(level_name)
    if not family.available():
        raise ValueError(family.not_available_message(level_name))
    return level_name, level_names, warning


def expand_level_names(level_name: str, is_test: bool = False) -> list[str]:
    """The level names that `--level_name=level_name` trains (or tests) on.

    'dmlab30' -> the 30 'contributed/dmlab30/<level>' names: training levels,
    or test levels when is_test. 'atari57' -> the 57 'atari/<game>' names.
    'a,b' (a level list) -> the names of a, then of b, each once. Any other
    valid name -> [level_name].

    Raises:
      ValueError: unknown name; the message lists the closest valid names.
    """
    if LIST_SEPARATOR in level_name:
        family_of(level_name)  # one family, or a ValueError naming them
        names = [
            name
            for part in level_list(level_name)
            for name in expand_level_names(part, is_test)
        ]
        if len(set(names)) != len(names):
            raise ValueError(f"--level_name={level_name!r} names a level twice.")
        return names
    family = family_of(level_name)
    try:
        return family.expand(level_name, is_test)
    except UnknownLevelError as e:
        raise _unknown_level_error(level_name, str(e)) from None


def _family_of_all(level_names) -> EnvironmentFamily:
    level_names = list(level_names)
    if not level_names:
        raise ValueError("Needs at least one level name.")
    found = {id(f): f for f in map(family_of, level_names)}
    if len(found) > 1:
        names = " and ".join(f.name for f in found.values())
        raise ValueError(f"Cannot mix {names} levels in one run: {level_names}.")
    return next(iter(found.values()))


def num_actions(level_names) -> int:
    """Number of agent actions for these levels (all of one family): 9 for
    DeepMind Lab; for Atari the game's minimal action set when there is one
    game, 18 when there are several."""
    level_names = list(level_names)
    return _family_of_all(level_names).num_actions(level_names)


def has_instructions(level_names) -> bool:
    """Whether any level may give a text instruction (DeepMind Lab's may;
    Atari's never do)."""
    level_names = list(level_names)
    return _family_of_all(level_names).has_instructions(level_names)


def frame_stack_settings(level_names, given: int = 0) -> dict[str, Any]:
    """AgentConfig's `frame_stack` and `frame_shape` for these levels (all
    of one family): --frame_stack=`given`, or the family's depth where it
    is 0 (Atari: 4 frames of [84, 84, 1]; DeepMind Lab and ViZDoom: 1).

    Raises:
      ValueError: a depth above 1 for a family whose frames are not stacked
        (its message names the flag).
    """
    level_names = list(level_names)
    family = _family_of_all(level_names)
    depth = given or family.frame_stack  # validate_flags refuses a negative
    if depth > 1 and not family.frame_shape:
        raise ValueError(
            f"--frame_stack={given}: {family.name} has no frame stack (its "
            f"agent sees one frame a step); leave --frame_stack out, or give 1."
        )
    return {
        "frame_stack": depth,
        "frame_shape": tuple(family.frame_shape) if depth > 1 else (),
    }


def suite_scores(suite: str, level_returns) -> dict[str, float]:
    """A suite's human-normalised scores ('dmlab30': no_cap and cap_100;
    'atari57': median and mean; a level list: the median and mean of its
    levels' scores, where they have them) from {level: returns}."""
    if LIST_SEPARATOR in suite:
        scores = [
            score
            for level, returns in level_returns.items()
            if (score := level_score(level, returns)) is not None
        ]
        if not scores:
            return {}
        return {"median": float(np.median(scores)), "mean": float(np.mean(scores))}
    return family_of(suite).suite_scores(suite, level_returns)


def level_score(level: str, returns) -> float | None:
    """One level's human-normalised score, or None when it has no published
    human and random scores."""
    try:
        return family_of(level).level_score(level, returns)
    except (KeyError, ValueError):
        return None


# -- environment processes --------------------------------------------------------


def run_options(level_name: str, environment, is_test: bool = False) -> dict:
    """The environment options of a run (config.EnvironmentConfig) for
    `create_environment`."""
    return family_of(level_name).run_options(environment, is_test)


def environment_class(
    level_name: str, seed: int, is_test: bool = False, **options: Any
) -> tuple[type, dict]:
    """The environment class running `level_name` and its constructor's
    keyword arguments; `options` are its family's (see each family's
    `environment_class`)."""
    family = family_of(level_name)
    if level_name in family.suites:
        raise ValueError(
            f"{level_name!r} is a suite: create one environment per name of "
            f"expand_level_names({level_name!r})."
        )
    try:
        return family.environment_class(level_name, seed, is_test, **options)
    except UnknownLevelError as e:
        raise _unknown_level_error(level_name, str(e)) from None


def create_environment(
    level_name: str, seed: int, is_test: bool = False, **options: Any
):
    """A `py_process.PyProcess` (not started) running one level; wrap its
    `.proxy` in a FlowEnvironment. `options`: the family's (Atari:
    num_action_repeats, full_action_space, episode_life,
    repeat_action_probability, noop_max, max_episode_frames; DeepMind Lab:
    num_action_repeats, width, height, dataset_path, level_cache,
    level_cache_dir), or a run's from `run_options`.

    Raises:
      dmlab.DeepMindLabNotInstalledError: a DeepMind Lab level without it.
      ValueError: an unknown level, or a suite's name.
    """
    import py_process

    env_type, kwargs = environment_class(level_name, seed, is_test, **options)
    return py_process.PyProcess(env_type, **kwargs)


def create_environment_vector(
    level_name: str, seeds: list[int], is_test: bool = False, **options: Any
):
    """A `py_process.PyProcess` (not started) running len(seeds) environments
    of one level in one process (vector.EnvironmentVector), the
    k-th with seed seeds[k]; options as for `create_environment`.

    Wrap its `.proxy` in a FlowEnvironment with num_envs=len(seeds).
    """
    import py_process
    from families import vector

    env_type, env_kwargs = None, []
    for seed in seeds:
        env_type, kwargs = environment_class(level_name, seed, is_test, **options)
        env_kwargs.append(kwargs)
    return py_process.PyProcess(
        vector.EnvironmentVector, env_type=env_type, env_kwargs=env_kwargs
    )
