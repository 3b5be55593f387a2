"""Environments: DeepMind Lab and Atari behind one FlowEnvironment.

- `FlowEnvironment` turns an environment proxy (a `py_process.PyProcess`
  proxy whose class has `initial()` and `step(action)`) into TensorFlow ops
  with episode bookkeeping (`StepOutput`).
- `PyProcessDmLab`: DeepMind Lab (the reference's wrapper). `deepmind_lab` is
  imported lazily, in the child process that runs the level.
- `atari.PyProcessAtari`: Atari games through ale_py (see atari.py).
- Level-name helpers used by experiment.py: `expand_level_names`,
  `is_atari_level`, `deepmind_lab_available`, `num_actions`,
  `uses_full_action_space`, `create_environment` (one environment in a
  process) and `create_environment_vector` (several in one process).

The environment classes run in spawned child processes that import this
module; TensorFlow is therefore imported lazily (inside FlowEnvironment's
methods and `_tensor_specs`), so children start fast and stay small.

Level names:
- 'atari/<game>' for any ROM shipped by ale_py ('atari/pong',
  'atari/space_invaders'; the names of atari57.GAMES), and 'atari57' for the
  57 games.
- DeepMind Lab: 'dmlab30' for the 30 DMLab-30 levels; a DMLab-30 level by its
  short name ('explore_goal_locations_small', mapped to
  'contributed/dmlab30/explore_goal_locations_small' as the reference does) or
  full path; DeepMind Lab's standard levels; and, when deepmind_lab is
  installed, any other name (custom levels), which DeepMind Lab checks.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import sys
import tempfile
from typing import Any

import numpy as np

import atari
import atari57
import dmlab30
from environment_specs import StepOutput, StepOutputInfo, environment_tensor_specs

ATARI_PREFIX = "atari/"
DMLAB30_PREFIX = dmlab30.LEVEL_PREFIX  # 'contributed/dmlab30/'

# DeepMind Lab's standard levels (game_scripts/levels/*.lua), known so that a
# typo gets suggestions even when DeepMind Lab is not installed.
_DMLAB_STANDARD_LEVELS = (
    "lt_chasm",
    "lt_hallway_slope",
    "lt_horseshoe_color",
    "lt_space_bounce_hard",
    "nav_maze_random_goal_01",
    "nav_maze_random_goal_02",
    "nav_maze_random_goal_03",
    "nav_maze_static_01",
    "nav_maze_static_02",
    "nav_maze_static_03",
    "seekavoid_arena_01",
    "stairway_to_melon",
)

# Every DeepMind Lab level name this module knows without asking DeepMind Lab.
KNOWN_DEEPMIND_LAB_LEVELS: frozenset[str] = (
    dmlab30.ALL_LEVELS
    | frozenset(DMLAB30_PREFIX + name for name in dmlab30.ALL_LEVELS)
    | frozenset(_DMLAB_STANDARD_LEVELS)
)

# DeepMind Lab's 9 actions of the IMPALA paper. Each is DeepMind Lab's native
# action: (LOOK_LEFT_RIGHT_PIXELS_PER_FRAME, LOOK_DOWN_UP_PIXELS_PER_FRAME,
# STRAFE_LEFT_RIGHT, MOVE_BACK_FORWARD, FIRE, JUMP, CROUCH).
DEFAULT_ACTION_SET = (
    (0, 0, 0, 1, 0, 0, 0),  # Forward
    (0, 0, 0, -1, 0, 0, 0),  # Backward
    (0, 0, -1, 0, 0, 0, 0),  # Strafe Left
    (0, 0, 1, 0, 0, 0, 0),  # Strafe Right
    (-20, 0, 0, 0, 0, 0, 0),  # Look Left
    (20, 0, 0, 0, 0, 0, 0),  # Look Right
    (-20, 0, 0, 1, 0, 0, 0),  # Look Left + Forward
    (20, 0, 0, 1, 0, 0, 0),  # Look Right + Forward
    (0, 0, 0, 0, 1, 0, 0),  # Fire
)


# How a user gets DeepMind Lab; this project does not build it.
INSTALL_DEEPMIND_LAB = (
    "Install DeepMind Lab from its own project following its documentation "
    "(https://github.com/google-deepmind/lab), with dm-env, so that `import "
    "deepmind_lab` works; for the Docker image, put its wheel in wheels/ "
    "before `docker build`."
)


class DeepMindLabNotInstalledError(ImportError):
    """DeepMind Lab was asked for but its Python module cannot be imported."""


def _deepmind_lab_missing_message(level_name: str | None = None) -> str:
    what = (
        f"--level_name={level_name!r} is a DeepMind Lab level, but "
        if level_name
        else ""
    )
    return (
        f"{what}DeepMind Lab is not installed (Python module 'deepmind_lab' not "
        f"found). {INSTALL_DEEPMIND_LAB} Atari levels such as "
        "--level_name=atari/pong (or atari57) work without it."
    )


def deepmind_lab_available() -> bool:
    """Whether `import deepmind_lab` can work. Never raises; imports nothing."""
    try:
        if sys.modules.get("deepmind_lab") is not None:
            return True
        return importlib.util.find_spec("deepmind_lab") is not None
    except Exception:  # a broken package must read as "not available"
        return False


def _import_deepmind_lab(level_name: str | None = None):
    try:
        import deepmind_lab
    except ImportError as e:
        raise DeepMindLabNotInstalledError(
            _deepmind_lab_missing_message(level_name)
        ) from e
    return deepmind_lab


class LocalLevelCache:
    """A DeepMind Lab level cache in a local directory.

    DeepMind Lab compiles each level to a .pk3 file on first use; with a cache
    it asks `fetch` before compiling and calls `write` after. Several actor
    processes may share one directory: writes go to a temporary file that is
    renamed into place, so a reader never sees a half-written level.
    """

    def __init__(self, cache_dir: str = "/tmp/level_cache"):
        self._cache_dir = cache_dir
        os.makedirs(cache_dir, exist_ok=True)

    def fetch(self, key: str, pk3_path: str) -> bool:
        path = os.path.join(self._cache_dir, key)
        if os.path.isfile(path):
            shutil.copyfile(path, pk3_path)
            return True
        return False

    def write(self, key: str, pk3_path: str) -> None:
        path = os.path.join(self._cache_dir, key)
        if os.path.exists(path):
            return
        fd, tmp_path = tempfile.mkstemp(dir=self._cache_dir, prefix=".tmp-")
        os.close(fd)
        try:
            shutil.copyfile(pk3_path, tmp_path)
            os.replace(tmp_path, path)
        finally:
            if os.path.exists(tmp_path):
                os.remove(tmp_path)


class PyProcessDmLab:
    """A DeepMind Lab level for `py_process.PyProcess` (the env-class protocol).

    initial() -> observation; step(action) -> (reward float32, done bool,
    observation); close(). observation = (RGB_INTERLEAVED uint8
    [height, width, 3], INSTR string). `action` is DeepMind Lab's native
    action (7 ints, e.g. a row of DEFAULT_ACTION_SET) as in the reference, or
    an index into DEFAULT_ACTION_SET. Each step repeats the action
    `num_action_repeats` frames. When an episode ends the level is reset with a
    fresh seed from the seeded generator, and the observation returned with
    done=True is the first of the next episode.
    """

    def __init__(
        self,
        level: str,
        config: dict[str, Any],
        num_action_repeats: int,
        seed: int,
        runfiles_path: str | None = None,
        level_cache: Any = None,
        level_cache_dir: str = "",
    ):
        """`level_cache_dir`: a directory for a LocalLevelCache, made here in
        the child (a cache object given as `level_cache` wins)."""
        deepmind_lab = _import_deepmind_lab(level)
        if level_cache is None and level_cache_dir:
            level_cache = LocalLevelCache(level_cache_dir)
        self._num_action_repeats = num_action_repeats
        self._random_state = np.random.RandomState(seed=seed)
        if runfiles_path:
            deepmind_lab.set_runfiles_path(runfiles_path)
        # DeepMind Lab takes every setting as a string.
        config = {k: str(v) for k, v in config.items()}
        self._observation_spec = ["RGB_INTERLEAVED", "INSTR"]
        try:
            self._env = deepmind_lab.Lab(
                level=level,
                observations=self._observation_spec,
                config=config,
                level_cache=level_cache,
            )
        except RuntimeError as e:
            # One line naming the level (DeepMind Lab's own text says why).
            raise ValueError(
                f"DeepMind Lab cannot load level {level!r}: {str(e).strip()}"
            ) from None
        # The first episode starts here, not in initial(): a level whose map
        # is missing makes the engine exit the whole process, and at start-up
        # that is reported as this level's process dying while it starts.
        self._reset()
        self._fresh = True

    def _reset(self) -> None:
        self._env.reset(seed=self._random_state.randint(0, 2**31 - 1))

    def _observation(self):
        d = self._env.observations()
        return tuple(d[k] for k in self._observation_spec)

    def initial(self) -> tuple[np.ndarray, str]:
        """The first observation of a new episode (the constructor's, once)."""
        if not self._fresh:
            self._reset()
        self._fresh = False
        return self._observation()

    def step(self, action) -> tuple[np.float32, np.bool_, tuple[np.ndarray, str]]:
        action = np.asarray(action)
        if action.ndim == 0:
            action = DEFAULT_ACTION_SET[int(action)]
        # DeepMind Lab requires a C int array.
        action = np.asarray(action, dtype=np.intc)
        self._fresh = False
        reward = self._env.step(action, num_steps=self._num_action_repeats)
        done = not self._env.is_running()
        if done:
            self._reset()
        observation = self._observation()
        return np.float32(reward), np.bool_(done), observation

    def close(self) -> None:
        self._env.close()

    @staticmethod
    def _tensor_specs(method_name, unused_kwargs, constructor_kwargs):
        """Output specs of `initial` and `step` for py_process (TF, lazily)."""
        config = constructor_kwargs.get("config") or {}
        # DeepMind Lab's defaults when the config leaves them out.
        width = int(config.get("width", 320))
        height = int(config.get("height", 240))
        return environment_tensor_specs(method_name, [height, width, 3])


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
    environment_vector.EnvironmentVector): every tensor above, state
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


# -- level names --------------------------------------------------------------


def is_atari_level(level_name: str) -> bool:
    """True for 'atari/<game>' names and for the 'atari57' suite."""
    return level_name == "atari57" or level_name.startswith(ATARI_PREFIX)


def _atari_level_names() -> list[str]:
    return [ATARI_PREFIX + game for game in atari.available_games()]


def _unknown_level_error(level_name: str, reason: str) -> ValueError:
    # Candidates: every name we know. Atari games also match by their bare
    # name, so 'pong' suggests 'atari/pong'.
    candidates: dict[str, str] = {"dmlab30": "dmlab30", "atari57": "atari57"}
    for name in KNOWN_DEEPMIND_LAB_LEVELS:
        candidates[name] = name
    for name in _atari_level_names():
        candidates[name] = name
        candidates.setdefault(name[len(ATARI_PREFIX) :], name)
    query = level_name.lower()
    matches = difflib.get_close_matches(query, list(candidates), n=8, cutoff=0.6)
    close = list(dict.fromkeys(candidates[m] for m in matches))[:5]
    suggestion = (
        f"Closest valid names: {', '.join(close)}." if close else "No close valid name."
    )
    return ValueError(
        f"Unknown --level_name={level_name!r}: {reason} {suggestion} Valid: "
        "'atari/<game>' (an ale_py ROM id, e.g. atari/pong), 'atari57', "
        "'dmlab30', or a DeepMind Lab level such as "
        "'explore_goal_locations_small'."
    )


# experiment.py's default level, and what it falls back to without DeepMind Lab.
DEFAULT_LEVEL = "explore_goal_locations_small"
FALLBACK_LEVEL = "atari/pong"


def resolve_level_name(
    level_name: str, is_default: bool, deepmind_lab_available: bool
) -> tuple[str, str | None]:
    """Returns (level name to use, warning or None).

    The default level is a DeepMind Lab level; without DeepMind Lab it falls
    back to atari/pong so that a fresh machine can train right away. A
    DeepMind Lab level named explicitly stays an error later on.
    """
    if is_default and not deepmind_lab_available:
        return FALLBACK_LEVEL, (
            f"DeepMind Lab is not installed, so the default level "
            f"{DEFAULT_LEVEL!r} cannot run: using {FALLBACK_LEVEL!r} "
            f"instead. {INSTALL_DEEPMIND_LAB} Or choose a level with "
            f"--level_name."
        )
    return level_name, None


def expand_level_names(level_name: str, is_test: bool = False) -> list[str]:
    """The level names that `--level_name=level_name` trains (or tests) on.

    'dmlab30' -> the 30 'contributed/dmlab30/<level>' names: training levels,
    or test levels when is_test. 'atari57' -> the 57 'atari/<game>' names.
    Any other valid name -> [level_name].

    Raises:
      ValueError: unknown name; the message lists the closest valid names.
    """
    if not isinstance(level_name, str) or not level_name:
        raise ValueError(
            f"--level_name must be a non-empty string, got {level_name!r}."
        )
    if level_name == "dmlab30":
        names = dmlab30.LEVEL_MAPPING.values() if is_test else dmlab30.LEVEL_MAPPING
        return [DMLAB30_PREFIX + name for name in names]
    if level_name == "atari57":
        return list(atari57.LEVEL_NAMES)
    if level_name.startswith(ATARI_PREFIX):
        if level_name[len(ATARI_PREFIX) :] in atari.available_games():
            return [level_name]
        raise _unknown_level_error(level_name, "ale_py has no ROM of that name.")
    if level_name in KNOWN_DEEPMIND_LAB_LEVELS:
        return [level_name]
    if deepmind_lab_available():
        # A custom DeepMind Lab level: DeepMind Lab itself reports a bad name.
        return [level_name]
    raise _unknown_level_error(
        level_name,
        "not a level known here, and DeepMind Lab, which could run other "
        f"(custom) levels, is not installed. {INSTALL_DEEPMIND_LAB} Atari "
        "levels such as atari/pong work without it.",
    )


def has_instructions(level_names: list[str]) -> bool:
    """Whether any level may give a text instruction: DeepMind Lab levels may;
    Atari games never do (their instruction is always '')."""
    return not all(map(is_atari_level, level_names))


def uses_full_action_space(level_names: list[str]) -> bool:
    """Atari: several games share one policy over all 18 actions."""
    return len(set(level_names)) > 1


def num_actions(level_names: list[str]) -> int:
    """Number of agent actions for these levels (all Atari or all DMLab).

    9 for DeepMind Lab (DEFAULT_ACTION_SET); for Atari the game's minimal
    action set when there is one game, 18 when there are several.
    """
    level_names = list(level_names)
    if not level_names:
        raise ValueError("num_actions needs at least one level name.")
    atari_levels = [is_atari_level(name) for name in level_names]
    if all(atari_levels):
        if "atari57" in level_names or uses_full_action_space(level_names):
            return atari.NUM_FULL_ACTIONS
        return atari.num_actions(level_names[0][len(ATARI_PREFIX) :])
    if any(atari_levels):
        raise ValueError(
            f"Cannot mix Atari and DeepMind Lab levels in one run: {level_names}."
        )
    return len(DEFAULT_ACTION_SET)


def create_environment(
    level_name: str, seed: int, is_test: bool = False, **options: Any
):
    """A `py_process.PyProcess` (not started) running one level.

    Wrap its `.proxy` in a FlowEnvironment. Atari levels ('atari/<game>'):
    full_action_space (pass `uses_full_action_space(level_names)`),
    episode_life (loss of life ends the episode; training only, ignored when
    is_test), repeat_action_probability (0.25 for sticky actions), noop_max
    and max_episode_frames apply; width, height, dataset_path, level_cache and
    level_cache_dir (a LocalLevelCache made in the child) are DeepMind Lab's.
    DeepMind Lab test mode adds allowHoldOutLevels and the evaluation mixer
    seed, as the reference does.

    Raises:
      DeepMindLabNotInstalledError: a DeepMind Lab level without deepmind_lab.
      ValueError: an unknown Atari game.
    """
    import py_process

    env_type, kwargs = environment_class(level_name, seed, is_test, **options)
    return py_process.PyProcess(env_type, **kwargs)


def create_environment_vector(
    level_name: str, seeds: list[int], is_test: bool = False, **options: Any
):
    """A `py_process.PyProcess` (not started) running len(seeds) environments
    of one level in one process (environment_vector.EnvironmentVector), the
    k-th with seed seeds[k]; options as for `create_environment`.

    Wrap its `.proxy` in a FlowEnvironment with num_envs=len(seeds).
    """
    import environment_vector
    import py_process

    env_type, env_kwargs = None, []
    for seed in seeds:
        env_type, kwargs = environment_class(level_name, seed, is_test, **options)
        env_kwargs.append(kwargs)
    return py_process.PyProcess(
        environment_vector.EnvironmentVector, env_type=env_type, env_kwargs=env_kwargs
    )


def environment_class(
    level_name: str,
    seed: int,
    is_test: bool = False,
    *,
    num_action_repeats: int = 4,
    width: int = 96,
    height: int = 72,
    dataset_path: str = "",
    level_cache: Any = None,
    level_cache_dir: str = "",
    full_action_space: bool = False,
    episode_life: bool = False,
    repeat_action_probability: float = 0.0,
    noop_max: int = atari.DEFAULT_NOOP_MAX,
    max_episode_frames: int = atari.DEFAULT_MAX_EPISODE_FRAMES,
) -> tuple[type, dict]:
    """The environment class running `level_name` and its constructor's
    keyword arguments (see `create_environment`)."""
    if level_name.startswith(ATARI_PREFIX):
        game = level_name[len(ATARI_PREFIX) :]
        if game not in atari.available_games():
            raise _unknown_level_error(level_name, "ale_py has no ROM of that name.")
        return atari.PyProcessAtari, dict(
            game=game,
            seed=seed,
            num_action_repeats=num_action_repeats,
            noop_max=noop_max,
            repeat_action_probability=repeat_action_probability,
            max_episode_frames=max_episode_frames,
            episode_life=episode_life and not is_test,
            full_action_space=full_action_space,
        )
    if level_name in ("atari57", "dmlab30"):
        raise ValueError(
            f"{level_name!r} is a suite: create one environment per name of "
            f"expand_level_names({level_name!r})."
        )
    if not deepmind_lab_available():
        raise DeepMindLabNotInstalledError(_deepmind_lab_missing_message(level_name))
    if level_name in dmlab30.ALL_LEVELS:
        level_name = DMLAB30_PREFIX + level_name
    config = {
        "width": width,
        "height": height,
        "datasetPath": dataset_path,
        "logLevel": "WARN",
    }
    if is_test:
        config["allowHoldOutLevels"] = "true"
        # DeepMind Lab's mixer seed for evaluation (its python_api.md).
        config["mixerSeed"] = 0x600D5EED
    # Keyword arguments, so that `_tensor_specs` finds the config (frame size)
    # in constructor_kwargs whatever py_process does with positional ones.
    return PyProcessDmLab, dict(
        level=level_name,
        config=config,
        num_action_repeats=num_action_repeats,
        seed=seed,
        level_cache=level_cache,
        level_cache_dir=level_cache_dir,
    )
