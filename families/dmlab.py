"""The DeepMind Lab family: DMLab-30 and DeepMind Lab's other levels.

DeepMind Lab is a library the user installs from its own project (README,
"DeepMind Lab"); `deepmind_lab` is imported lazily, in the child process that
runs a level, so this module imports without it.

- `PyProcessDmLab`: one level for `py_process.PyProcess` (the reference's
  wrapper): the paper's 9 actions (`DEFAULT_ACTION_SET`), RGB frames and the
  level's language instruction.
- `LocalLevelCache`: DeepMind Lab's level cache in a directory shared by every
  actor and run (a maze level compiles a new map at every episode).
- `FAMILY` (a `DeepMindLabFamily`): what the registry in environments.py
  needs: level names ('dmlab30' for the 30 DMLab-30 levels, a DMLab-30
  level by its short name or full path, DeepMind Lab's standard levels, and
  any other name when DeepMind Lab is installed: custom levels, which
  DeepMind Lab itself checks), actions, options (--width, --height,
  --dataset_path, --level_cache_dir) and the DMLab-30 score.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

import dmlab30
from families.contract import (
    EnvironmentFamily,
    FamilyFlag,
    environment_tensor_specs,
    importable,
)
from runtime.errors import FlagError

SUITE = "dmlab30"
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
    return importable("deepmind_lab")


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
        # that is reported as this level's process dying while it starts. A
        # level that cannot start an episode (a psychlab level without its
        # dataset) is one line naming it, as one that cannot load.
        try:
            self._reset()
        except RuntimeError as e:
            raise ValueError(
                f"DeepMind Lab cannot start level {level!r}: {str(e).strip()}"
            ) from None
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


@dataclasses.dataclass(frozen=True)
class DeepMindLabOptions:
    """DeepMind Lab's settings of a run: the frame size, the psychlab
    dataset, and the level cache directory ('' = no cache)."""

    width: int = 96
    height: int = 72
    dataset_path: str = ""
    level_cache_dir: str = ""


def _at_least_one(value: int) -> str | None:
    return None if value > 0 else "must be >= 1."


def _a_directory_or_empty(path: str) -> str | None:
    if not path or os.path.isdir(path):
        return None
    return (
        "no such directory; give the directory of the brady_konkle_oliva2008 "
        "stimuli (needed by DMLab-30's psychlab levels) or leave it empty."
    )


class DeepMindLabFamily(EnvironmentFamily):
    """DeepMind Lab for the registry (see contract.EnvironmentFamily)."""

    name = "DeepMind Lab"
    suites = (SUITE,)
    level_forms = (
        "'dmlab30' or a DeepMind Lab level such as 'explore_goal_locations_small'"
    )
    # Any name no other family claims may be a custom level of the user's.
    catch_all = True
    # No limit: the library's loader gives each Lab after a process's first
    # its own copy of the engine (public/dmlab_so_loader.cc), so several
    # share a process. The default stays one a process, as the reference's.
    flags = (
        FamilyFlag(
            "width",
            DeepMindLabOptions.width,
            "Frame width (DeepMind Lab).",
            _at_least_one,
        ),
        FamilyFlag(
            "height",
            DeepMindLabOptions.height,
            "Frame height (DeepMind Lab).",
            _at_least_one,
        ),
        FamilyFlag(
            "dataset_path",
            DeepMindLabOptions.dataset_path,
            "Path to the dataset needed for psychlab (DeepMind Lab).",
            _a_directory_or_empty,
        ),
        FamilyFlag(
            "level_cache_dir",
            "~/.cache/scalable_agent/dmlab_levels",
            "Where DeepMind Lab keeps the levels it compiles (a maze level "
            "compiles a new map at every reset), shared by every actor and run; "
            "'' for no cache.",
        ),
    )

    def owns(self, level_name: str) -> bool:
        return (
            level_name == SUITE
            or level_name in KNOWN_DEEPMIND_LAB_LEVELS
            or deepmind_lab_available()
        )

    def expand(self, level_name: str, is_test: bool = False) -> list[str]:
        if level_name == SUITE:
            names = dmlab30.LEVEL_MAPPING.values() if is_test else dmlab30.LEVEL_MAPPING
            return [DMLAB30_PREFIX + name for name in names]
        return [level_name]

    def suggestions(self) -> dict[str, str]:
        return {name: name for name in (SUITE, *KNOWN_DEEPMIND_LAB_LEVELS)}

    def available(self) -> bool:
        return deepmind_lab_available()

    def not_available_message(self, level_name: str) -> str:
        return (
            f"--level_name={level_name}: a DeepMind Lab level, but DeepMind Lab "
            f"is not installed. {INSTALL_DEEPMIND_LAB} Or use an Atari level "
            f"such as --level_name=atari/pong."
        )

    def unknown_level_hint(self) -> str:
        return (
            "DeepMind Lab, which could run other (custom) levels, is not "
            f"installed. {INSTALL_DEEPMIND_LAB} Atari levels such as atari/pong "
            "work without it."
        )

    def num_actions(self, level_names) -> int:
        return len(DEFAULT_ACTION_SET)

    def has_instructions(self, level_names) -> bool:
        return True

    def options(self, values: Mapping[str, Any]) -> DeepMindLabOptions:
        """The options from their flags' values; the level cache directory
        is expanded and created.

        Raises:
          FlagError: the level cache directory cannot be created.
        """
        cache_dir = values.get("level_cache_dir", "")
        path = ""
        if cache_dir:
            path = os.path.expanduser(cache_dir)
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as e:
                raise FlagError(
                    f"--level_cache_dir={cache_dir}: cannot create it "
                    f"({e.strerror}); give a writable directory, or '' for no "
                    f"cache."
                ) from None
        given = {
            k: values[k] for k in ("width", "height", "dataset_path") if k in values
        }
        return DeepMindLabOptions(**given, level_cache_dir=path)

    def run_options(self, environment, is_test: bool) -> dict[str, Any]:
        options = environment.options or DeepMindLabOptions()
        return {
            "num_action_repeats": environment.num_action_repeats,
            **dataclasses.asdict(options),
        }

    def environment_class(
        self,
        level_name: str,
        seed: int,
        is_test: bool = False,
        *,
        num_action_repeats: int = 4,
        width: int = DeepMindLabOptions.width,
        height: int = DeepMindLabOptions.height,
        dataset_path: str = DeepMindLabOptions.dataset_path,
        level_cache: Any = None,
        level_cache_dir: str = "",
    ) -> tuple[type, dict]:
        """PyProcessDmLab and its arguments. Test mode adds
        allowHoldOutLevels and the evaluation mixer seed, as the reference
        does. `level_cache` (an object) wins over `level_cache_dir` (a
        LocalLevelCache made in the child).

        Raises:
          DeepMindLabNotInstalledError: deepmind_lab does not import.
        """
        if not deepmind_lab_available():
            raise DeepMindLabNotInstalledError(
                _deepmind_lab_missing_message(level_name)
            )
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
        # Keyword arguments, so that `_tensor_specs` finds the config (frame
        # size) in constructor_kwargs whatever py_process does with positional
        # ones.
        return PyProcessDmLab, dict(
            level=level_name,
            config=config,
            num_action_repeats=num_action_repeats,
            seed=seed,
            level_cache=level_cache,
            level_cache_dir=level_cache_dir,
        )

    def suite_scores(self, suite: str, level_returns) -> dict[str, float]:
        return {
            "no_cap": dmlab30.compute_human_normalized_score(level_returns, None),
            "cap_100": dmlab30.compute_human_normalized_score(level_returns, 100),
        }

    def level_score(self, level: str, returns) -> float | None:
        return dmlab30.human_normalized_score(level, returns)


FAMILY = DeepMindLabFamily()
