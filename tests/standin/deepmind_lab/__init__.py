"""A stand-in for DeepMind Lab's Python module `deepmind_lab`: for tests only.

DeepMind Lab has no binary on PyPI or in Debian, so the machines that run
this project's CI do not have it. This package takes its place there, so that
the whole DeepMind Lab path of the project (the wrapper, its processes,
training, test mode, the level cache, restarts, bad levels) runs in CI. It is
importable only where a test puts `tests/standin` on the Python path (the
tests that use it set PYTHONPATH for the processes they start); nothing a user
installs or runs can import it.

It follows the real library as measured (deepmind_lab 1.0,
explore_goal_locations_small, software renderer, 96x72) and as its source
says (google-deepmind/lab: python/dmlab_module.c, public/dmlab_so_loader.cc,
engine/code/deepmind/dmlab_connect.c, game_scripts/); tests/dmlab_contract_test.py
holds it, and the real library where installed, to a table of that
behaviour, each row with its source:

- `Lab(level, observations, config={}, renderer='', level_cache=None,
  temp_folder=None)`: `observations` a list and `config` a dict (else
  TypeError, as the argument parser says), config keys and values strings
  (else TypeError). `renderer` '' or 'software' (software), 'hardware', else
  RuntimeError. `width` and `height` positive multiples of 4, else
  RuntimeError "Failed to apply setting ...". A key neither the engine nor
  the levels' setting decorator knows is RuntimeError "Failed to init
  environment - ... Invalid setting" (a level's own parameters, which real
  levels also accept, are not modelled). An unknown observation is
  ValueError.
- `observation_spec()`: 43 dicts `{name, shape, dtype}`; `RGB_INTERLEAVED`
  is (height, width, 3) uint8, `INSTR` has shape () and dtype str (the empty
  string on explore levels). The other 41 names are those DeepMind Lab's
  documentation lists; only the count was checked against the real module.
- `action_spec()`: the 7 actions in DeepMind Lab's order with their bounds;
  `step(action, num_steps)` takes a numpy array (else TypeError) of 7
  (else ValueError "action must have shape (7)") of dtype np.intc (else
  ValueError "action must have dtype np.intc") and returns the reward summed
  over the frames, a Python float; before `reset` or after the episode's
  end it raises RuntimeError "Environment in wrong status to advance.".
- `reset(episode=-1, seed=None)`: `seed` an int or None, else ValueError; a
  level that cannot start raises RuntimeError "Failed to start environment
  - ...": DMLab-30's psychlab_arbitrary_visuomotor_mapping and
  psychlab_continuous_recognition without a `datasetPath` (their
  brady_konkle_oliva2008 stimuli load as an episode starts; 'dummy' gives
  the library's own stand-in images). An episode lasts 5,400 frames (90 s at
  60 frames/s, as explore_goal_locations_small; the real levels' lengths
  differ); then `is_running()` is False, `num_steps()` is 5400, and
  `observations()` and `step()` raise RuntimeError with the real engine's
  words.
- An unknown level fails at `Lab(...)` with the engine's "Level not found"
  RuntimeError; a DMLab-30 `*_test` level needs `allowHoldOutLevels`.
- Level cache: before a maze level's episode the engine asks
  `level_cache.fetch(key, pk3_path)` (key `explore_maze_noaas_<32 hex>`, file
  `explore_maze.pk3`); on a miss it compiles the map and calls
  `level_cache.write(key, pk3_path)`. Here the explore levels compile a new
  maze at every reset, its key a function of the level and the seed.
- Several `Lab`s in one process: the library's loader opens a fresh copy of
  the engine for each one after the first, so each has its own state.

What it does not model: a 3D world. Frames are a cheap picture of the
player's position and orientation, and rewards a seeded random process that
pays more for moving forward; the levels' own rules, their datasets and their
real episode lengths are not here.

Four environment variables exist for tests (the real module has none):
- DEEPMIND_LAB_STANDIN_TRACE: a file to which every Lab appends one JSON line
  per event (`init`, `reset`, `cache`), so that a test sees what happened in
  the environment processes of a run.
- DEEPMIND_LAB_STANDIN_EPISODE_FRAMES: the episode length in frames (5,400
  by default), for tests that play many episodes; the real levels read their
  length from their own settings.
- DEEPMIND_LAB_STANDIN_MISSING_MAPS: comma-separated level names whose map
  files this "build" lacks: their first reset ends the process with exit code
  1, as the real engine does when a map is missing.
- DEEPMIND_LAB_STANDIN_FAILING_STARTS: comma-separated level names whose
  `reset` raises the library's RuntimeError "Failed to start environment",
  as a level script that errors when an episode starts does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

_VERSION = "1.0 (test stand-in)"
_runfiles_path = os.path.dirname(os.path.abspath(__file__))

_DMLAB30 = """
rooms_collect_good_objects_train rooms_collect_good_objects_test
rooms_exploit_deferred_effects_train rooms_exploit_deferred_effects_test
rooms_select_nonmatching_object rooms_watermaze rooms_keys_doors_puzzle
language_select_described_object language_select_located_object
language_execute_random_task language_answer_quantitative_question
lasertag_one_opponent_small lasertag_three_opponents_small
lasertag_one_opponent_large lasertag_three_opponents_large
natlab_fixed_large_map natlab_varying_map_regrowth natlab_varying_map_randomized
skymaze_irreversible_path_hard skymaze_irreversible_path_varied
psychlab_arbitrary_visuomotor_mapping psychlab_continuous_recognition
psychlab_sequential_comparison psychlab_visual_search
explore_object_locations_small explore_object_locations_large
explore_obstructed_goals_small explore_obstructed_goals_large
explore_goal_locations_small explore_goal_locations_large
explore_object_rewards_few explore_object_rewards_many
""".split()
_STANDARD = """
lt_chasm lt_hallway_slope lt_horseshoe_color lt_space_bounce_hard
nav_maze_random_goal_01 nav_maze_random_goal_02 nav_maze_random_goal_03
nav_maze_static_01 nav_maze_static_02 nav_maze_static_03
seekavoid_arena_01 stairway_to_melon tests/empty_room_test
""".split()
# The level scripts this "build" has (game_scripts/levels/<name>.lua).
LEVELS = frozenset(_STANDARD) | frozenset("contributed/dmlab30/" + n for n in _DMLAB30)
_LEVEL_DIRECTORY = "/deepmind_lab/game_scripts/levels"

_ACTIONS = (
    ("LOOK_LEFT_RIGHT_PIXELS_PER_FRAME", -512, 512),
    ("LOOK_DOWN_UP_PIXELS_PER_FRAME", -512, 512),
    ("STRAFE_LEFT_RIGHT", -1, 1),
    ("MOVE_BACK_FORWARD", -1, 1),
    ("FIRE", 0, 1),
    ("JUMP", 0, 1),
    ("CROUCH", 0, 1),
)
# Settings the engine itself reads (dmlab_connect.c, dmlab_setting); any
# other key goes to the level script.
_ENGINE_SETTINGS = frozenset(
    """levelName levelDirectory width height server client hasAltCameras
    maxAltCameraWidth maxAltCameraHeight localLevelCache globalLevelCache
    serverPort port vmMode fps logToStdErr minimalUI reducedUI nativeApp
    appendCommand record demo video demofiles use_pbos gpuDeviceIndex
    playerName mixerSeed""".split()
)
# What the levels' setting decorator accepts besides a level's own
# parameters (game_scripts/decorators/setting_overrides.lua).
_SCRIPT_SETTINGS = frozenset(
    """episodeLengthSeconds invocationMode allowHoldOutLevels levelGenerator
    playerId players randomSeed datasetPath enableCameraMovement logLevel
    __platform__ textureRandomization""".split()
)
# DMLab-30 levels whose episodes load the brady_konkle_oliva2008 stimuli
# (game_scripts/factories/psychlab/*_factory.lua).
_DATASET_LEVELS = frozenset(
    ["psychlab_arbitrary_visuomotor_mapping", "psychlab_continuous_recognition"]
)
_FRAMES_PER_SECOND = 60
_EPISODE_FRAMES = 90 * _FRAMES_PER_SECOND
_GOAL_REWARD = 10.0


def _observation_spec(height: int, width: int) -> list[dict]:
    f64, u8 = np.float64, np.uint8
    image = [
        ("RGB_INTERLEAVED", (height, width, 3)),
        ("RGBD_INTERLEAVED", (height, width, 4)),
        ("RGB", (3, height, width)),
        ("RGBD", (4, height, width)),
        ("BGR_INTERLEAVED", (height, width, 3)),
        ("BGRD_INTERLEAVED", (height, width, 4)),
        ("RGB_INTERLACED", (height, width, 3)),
        ("RGBD_INTERLACED", (height, width, 4)),
    ]
    cameras = [
        ("DEBUG.CAMERA.TOP_DOWN", (3, height, width)),
        ("DEBUG.CAMERA.PLAYER_VIEW", (3, height, width)),
        ("DEBUG.CAMERA.PLAYER_VIEW_NO_RETICLE", (3, height, width)),
        ("DEBUG.CAMERA_INTERLEAVED.TOP_DOWN", (height, width, 3)),
        ("DEBUG.CAMERA_INTERLEAVED.PLAYER_VIEW", (height, width, 3)),
        ("DEBUG.CAMERA_INTERLEAVED.PLAYER_VIEW_NO_RETICLE", (height, width, 3)),
    ]
    doubles = [
        ("FRAMES_REMAINING_AT_60", (1,)),
        ("MAP_FRAME_NUMBER", (1,)),
        ("VEL.TRANS", (3,)),
        ("VEL.ROT", (3,)),
        ("TEAM.SCORE", (2,)),
        ("DEBUG.POS.TRANS", (3,)),
        ("DEBUG.POS.ROT", (3,)),
        ("DEBUG.PLAYER_ID", (1,)),
        ("DEBUG.GADGET_AMOUNT", (1,)),
        ("DEBUG.GADGET", (1,)),
        ("DEBUG.HAS_RED_FLAG", (1,)),
        ("DEBUG.HAS_BLUE_FLAG", (1,)),
        ("DEBUG.PLAYERS.ARMOR", (0,)),
        ("DEBUG.PLAYERS.GADGET", (0,)),
        ("DEBUG.PLAYERS.GADGET_AMOUNT", (0,)),
        ("DEBUG.PLAYERS.HEALTH", (0,)),
        ("DEBUG.PLAYERS.HOLDING_FLAG", (0,)),
        ("DEBUG.PLAYERS.ID", (0,)),
        ("DEBUG.PLAYERS.EYE.POS", (0, 3)),
        ("DEBUG.PLAYERS.EYE.ROT", (0, 3)),
        ("DEBUG.PLAYERS.TEAM", (0,)),
        ("DEBUG.FLAGS.RED", (5,)),
        ("DEBUG.FLAGS.BLUE", (5,)),
        ("DEBUG.FLAGS.RED_HOME", (4,)),
        ("DEBUG.FLAGS.BLUE_HOME", (4,)),
    ]
    strings = [
        "INSTR",
        "DEBUG.PLAYERS.NAME",
        "DEBUG.MAZE.LAYOUT",
        "DEBUG.MAZE.VARIATION",
    ]
    return (
        [{"name": n, "shape": s, "dtype": u8} for n, s in image + cameras]
        + [{"name": n, "shape": s, "dtype": f64} for n, s in doubles]
        + [{"name": n, "shape": (), "dtype": str} for n in strings]
    )


def version() -> str:
    return _VERSION


def runfiles_path() -> str:
    return _runfiles_path


def set_runfiles_path(path: str) -> None:
    global _runfiles_path
    _runfiles_path = str(path)


def _trace(event: str, **fields) -> None:
    path = os.environ.get("DEEPMIND_LAB_STANDIN_TRACE")
    if path:
        line = json.dumps({"event": event, "pid": os.getpid(), **fields})
        with open(path, "a") as f:
            f.write(line + "\n")


def _listed(variable: str) -> set[str]:
    names = os.environ.get(variable, "")
    return {n.strip() for n in names.split(",") if n.strip()}


def _check_size(key: str, value: str) -> None:
    """The engine's check of `width` and `height` (dmlab_connect.c)."""
    try:
        number = int(value)
    except ValueError:
        raise RuntimeError(
            f"Failed to apply setting '{key} = {value}' - \"Failed to parse "
            f"'{value}' as an integer\""
        ) from None
    if number < 4 or number % 4:
        raise RuntimeError(
            f"Failed to apply setting '{key} = {value}' - \"'{key}' must be a "
            f'positive multiple of 4. Actual {number}"'
        )


class Lab:
    """One DeepMind Lab environment (see the module docstring)."""

    def __init__(
        self,
        level,
        observations,
        config=None,
        renderer="",
        level_cache=None,
        temp_folder=None,
    ):
        # The argument parser's checks ("sO!|O!sOs": a list, a dict, strings).
        if not isinstance(level, str):
            raise TypeError(f"argument 1 must be str, not {type(level).__name__}")
        if not isinstance(observations, list):
            raise TypeError(
                f"argument 2 must be list, not {type(observations).__name__}"
            )
        config = {} if config is None else config
        if not isinstance(config, dict):
            raise TypeError(f"argument 3 must be dict, not {type(config).__name__}")
        if not isinstance(renderer, str):
            raise TypeError(f"argument 4 must be str, not {type(renderer).__name__}")
        if renderer not in ("", "software", "hardware"):
            raise RuntimeError(
                'Failed to set renderer must be "hardware" or "software" '
                f'actual "{renderer}"!'
            )
        for key, value in config.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("bad argument type for built-in operation")
        for key in ("width", "height"):
            if key in config:
                _check_size(key, config[key])
        name = level.removeprefix("contributed/dmlab30/")
        if level not in LEVELS:
            raise RuntimeError(
                'Failed to init environment - "Level not found: Failed to open '
                f"file '{_LEVEL_DIRECTORY}/{level}.lua'\""
            )
        if name.endswith("_test") and config.get("allowHoldOutLevels") != "true":
            raise RuntimeError(
                f'Failed to init environment - "[string "{level}"]: hold-out '
                'level: set allowHoldOutLevels to "true" to load it"'
            )
        script_settings = {k: v for k, v in config.items() if k not in _ENGINE_SETTINGS}
        for key, value in script_settings.items():
            if key not in _SCRIPT_SETTINGS:
                raise RuntimeError(
                    f'Failed to init environment - "[string "{level}"]: '
                    f'Invalid setting: "{key}" = "{value}""'
                )
        self._dataset_path = config.get("datasetPath", "")
        self._level = level
        self._name = name or level
        self._width = int(config.get("width", "320"))
        self._height = int(config.get("height", "240"))
        self._spec = _observation_spec(self._height, self._width)
        known = {spec["name"]: spec for spec in self._spec}
        for observation in observations:
            if observation not in known:
                raise ValueError(f"Unknown observation '{observation}'.")
        self._observations = list(observations)
        self._known = known
        self._level_cache = level_cache
        self._maze = name.startswith("explore_")
        self._instruction = (
            "Pick up the red object." if name.startswith("language_") else ""
        )
        self._work_dir = tempfile.mkdtemp(prefix="dmlab_standin_")
        self._status = "ready"  # ready | running | finished | closed
        self._frames = 0
        self._rng = np.random.RandomState(0)
        self._position = np.zeros(3)
        self._yaw = 0.0
        _trace(
            "init",
            level=level,
            config=dict(config),
            renderer=renderer,
            observations=self._observations,
        )

    # -- episodes --

    def reset(self, episode=-1, seed=None):
        if self._status == "closed":
            raise RuntimeError("Environment in wrong status to reset.")
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little") >> 1
        elif not isinstance(seed, int):
            raise ValueError(
                f"'seed' must be int or None, was '{type(seed).__name__}'."
            )
        if self._level in _listed("DEEPMIND_LAB_STANDIN_FAILING_STARTS") or (
            self._name in _listed("DEEPMIND_LAB_STANDIN_FAILING_STARTS")
        ):
            raise RuntimeError(
                f'Failed to start environment - "[string "{self._level}"]: '
                'the level script failed to start an episode"'
            )
        if self._name in _DATASET_LEVELS and not self._dataset_path:
            raise RuntimeError(
                'Failed to start environment - "[string '
                '"datasets/brady_konkle_oliva2008.lua"]: assertion failed!\n '
                "Follow instructions to download datasets here: \n "
                '"data/brady_konkle_oliva2008/README.md"\n and update '
                'DATASET_PATH to point the data folder."'
            )
        if {self._level, self._name} & _listed("DEEPMIND_LAB_STANDIN_MISSING_MAPS"):
            sys.stderr.write(
                f"ERROR: Couldn't load maps/{self._level.split('/')[-1]}.bsp\n"
            )
            sys.stderr.flush()
            os._exit(1)
        hit = self._load_map(int(seed))
        self._rng = np.random.RandomState(int(seed) % 2**32)
        self._position = self._rng.uniform(-100.0, 100.0, size=3)
        self._yaw = float(self._rng.uniform(0.0, 360.0))
        self._frames = 0
        self._episode_frames = int(
            os.environ.get("DEEPMIND_LAB_STANDIN_EPISODE_FRAMES", _EPISODE_FRAMES)
        )
        self._status = "running"
        _trace("reset", level=self._level, seed=int(seed), cache_hit=hit)
        return True

    def _load_map(self, seed: int) -> bool | None:
        """A maze level's map: from the level cache, or compiled (and written
        to it). Returns whether the cache had it (None: no maze)."""
        if not self._maze:
            return None
        digest = hashlib.md5(f"{self._level}:{seed}".encode()).hexdigest()
        key = f"explore_maze_noaas_{digest}"
        pk3_path = os.path.join(self._work_dir, "explore_maze.pk3")
        if self._level_cache is not None and self._level_cache.fetch(key, pk3_path):
            hit = True
        else:
            with open(pk3_path, "wb") as f:
                f.write(b"PK\x03\x04" + key.encode() + bytes(256))
            if self._level_cache is not None:
                self._level_cache.write(key, pk3_path)
            hit = False
        _trace("cache", level=self._level, key=key, hit=hit)
        return hit

    def is_running(self) -> bool:
        return self._status == "running"

    def num_steps(self) -> int:
        return self._frames

    def step(self, action, num_steps=1) -> float:
        if not isinstance(action, np.ndarray):
            raise TypeError(
                f"argument 1 must be numpy.ndarray, not {type(action).__name__}"
            )
        if self._status != "running":
            raise RuntimeError("Environment in wrong status to advance.")
        if action.shape != (len(_ACTIONS),):
            raise ValueError(f"action must have shape ({len(_ACTIONS)})")
        if action.dtype != np.intc:
            raise ValueError("action must have dtype np.intc")
        reward = 0.0
        for _ in range(int(num_steps)):
            self._yaw = (self._yaw + 0.1 * float(action[0])) % 360.0
            forward = float(action[3])
            angle = np.deg2rad(self._yaw)
            self._position[:2] += forward * np.array([np.cos(angle), np.sin(angle)])
            chance = 1 / 200 if forward > 0 else 1 / 2000
            if self._rng.random_sample() < chance:
                reward += _GOAL_REWARD
            self._frames += 1
            if self._frames >= self._episode_frames:
                self._status = "finished"
                break
        return float(reward)

    # -- observations --

    def observation_spec(self) -> list[dict]:
        return [dict(spec) for spec in self._spec]

    def action_spec(self) -> list[dict]:
        return [{"min": lo, "max": hi, "name": name} for name, lo, hi in _ACTIONS]

    def observations(self) -> dict:
        if self._status != "running":
            raise RuntimeError("Environment in wrong status for call to observations()")
        return {name: self._observation(name) for name in self._observations}

    def _observation(self, name: str):
        spec = self._known[name]
        if name == "INSTR":
            return self._instruction
        if spec["dtype"] is str:
            return ""
        if name in ("RGB_INTERLEAVED", "RGB_INTERLACED"):
            return self._view()
        if name == "FRAMES_REMAINING_AT_60":
            return np.array([self._episode_frames - self._frames], np.float64)
        if name == "DEBUG.POS.TRANS":
            return self._position.copy()
        if name == "DEBUG.POS.ROT":
            return np.array([0.0, self._yaw, 0.0])
        return np.zeros(spec["shape"], spec["dtype"])

    def _view(self) -> np.ndarray:
        """A picture that changes as the player turns and moves."""
        columns = np.arange(self._width) * (360.0 / self._width) + self._yaw
        rows = np.arange(self._height)[:, None]
        red = (columns % 256)[None, :] + 0 * rows
        green = (rows * 3 + self._position[0]) % 256 + 0 * columns[None, :]
        blue = (red + green + self._position[1]) % 256
        return np.stack([red, green, blue], axis=-1).astype(np.uint8)

    # -- the rest of the API --

    def events(self) -> list:
        return []

    def fps(self) -> float:
        return float(_FRAMES_PER_SECOND)

    def close(self) -> None:
        self._status = "closed"
        shutil.rmtree(self._work_dir, ignore_errors=True)
