"""The Atari family: Atari 2600 games through ale_py, with the IMPALA paper's
preprocessing.

Level names: 'atari/<game>' for any ROM ale_py ships ('atari/pong'), and
'atari57' for the 57 games of atari57.py. `FAMILY` (an `AtariFamily`) is what
the registry in environments.py needs: those names, the action count (the
game's minimal action set, or all 18 when several games share one policy),
the environment class and the Atari-57 scores.

`PyProcessAtari` is an environment class for `py_process.PyProcess`: it runs in
a child process, so this module must not import TensorFlow at module level
(`_tensor_specs` imports it lazily; the child never calls it).

Preprocessing (IMPALA paper, appendix; the DQN setup of Mnih et al. 2015):
- each agent step repeats the action `num_action_repeats` (4) emulator frames
  and sums the rewards;
- the observed frame is the pixel-wise max over the last 2 emulator frames
  (Atari sprites flicker: some are drawn only every other frame);
- grayscale (ALE's own luminance palette), resized from 210x160 to 84x84 with
  OpenCV's INTER_AREA (chosen by measurement, see `resize_frame`);
- the environment returns the newest such frame, uint8 [84, 84, 1]; the
  agent stacks the last 4 (agent.py, `frame_stack`): uint8 [84, 84, 4],
  channels last, oldest first (`frame[..., -1]` is the newest), restarting
  the stack from the current frame, repeated 4 times, wherever an episode
  starts. The stack is built in the graph so that each frame crosses the
  pipe, the queue and the replay buffer once, not 4 times (as SEED RL keeps
  it in the agent's state). `frame_stack=4` builds the same stack here, in
  the environment (how it was done before; the tests compare the two);
- each game starts with a random number of no-op frames, uniform in
  [0, noop_max] (30), drawn from the seeded generator;
- sticky actions (repeat_action_probability) are off by default; 0.25 is the
  Machado et al. (2018) setting;
- an episode is capped at `max_episode_frames` (108,000 emulator frames, 30
  minutes of play) counted from the reset, no-op frames included;
- rewards are the game's raw score changes as float32 (the learner clips them).

Loss of life (`episode_life=True`, for training only): the step where a life
is lost returns done=True, but the game is not reset; play continues from that
point and the frame stack restarts from the current frame, as at the start of
an episode (the done flag the agent's stack restarts at). An "episode" is then one life: `FlowEnvironment`'s episode_return
and episode_step (which restart at every done) are per life, and the 108,000
frame cap and no-op starts apply to the whole game. Test mode
(`episode_life=False`) gives whole games, the figures that are comparable with
published scores. In training, each whole game's return is also written to
standard error by the environment's process: `Game on atari/<game>: return R,
N frames` (N emulator frames, no-ops included).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from families import atari57
from families.contract import (
    EnvironmentFamily,
    UnknownLevelError,
    environment_tensor_specs,
)

# Only the frame geometry is fixed: the agent's network is built for it.
FRAME_HEIGHT = 84
FRAME_WIDTH = 84
# The frames the agent stacks (FAMILY.frame_stack): the paper's 4.
FRAME_STACK = 4
SCREEN_SHAPE = (210, 160)  # every ALE game renders 210x160
NUM_FULL_ACTIONS = 18

DEFAULT_NUM_ACTION_REPEATS = 4
DEFAULT_NOOP_MAX = 30
DEFAULT_MAX_EPISODE_FRAMES = 108_000


def _ale_py():
    """Imports ale_py with its logger quietened (no banner per process)."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    return ale_py


@functools.lru_cache(maxsize=1)
def available_games() -> tuple[str, ...]:
    """The ROM ids that ale_py ships, e.g. 'pong', 'space_invaders' (sorted)."""
    from ale_py import roms

    return tuple(sorted(roms.get_all_rom_ids()))


def _check_game(game: str) -> None:
    if game not in available_games():
        import difflib

        close = difflib.get_close_matches(game, available_games(), n=5, cutoff=0.5)
        raise ValueError(
            f"Unknown Atari game {game!r}: ale_py has no ROM of that name. "
            f"Closest: {close or 'none'}; all games: atari.available_games()."
        )


@functools.cache
def num_actions(game: str, full_action_space: bool = False) -> int:
    """Size of the game's action set: minimal set, or all 18 actions."""
    if full_action_space:
        return NUM_FULL_ACTIONS
    _check_game(game)
    ale_py = _ale_py()
    ale = ale_py.ALEInterface()
    ale.loadROM(ale_py.roms.get_rom_path(game))
    return len(ale.getMinimalActionSet())


def resize_frame(screen: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Resizes a uint8 [210, 160] grayscale screen to uint8 [84, 84].

    OpenCV's INTER_AREA averages every source pixel into the output, so thin
    objects (bullets, one-pixel lines) never vanish, as they can with bilinear
    sampling at a 2.5x row reduction; it is also what the common DQN-family
    pipelines use, and the fastest area-averaging resize measured here
    (BENCHMARKS.md, "Figures from the code").
    """
    import cv2

    return cv2.resize(
        screen, (FRAME_WIDTH, FRAME_HEIGHT), dst=out, interpolation=cv2.INTER_AREA
    )


class PyProcessAtari:
    """One Atari game for `py_process.PyProcess` (the env-class protocol).

    Methods (called in the child process):
      initial() -> observation
      step(action) -> (reward float32, done bool, observation)
      close()
    where observation = (frame uint8 [84, 84, frame_stack], instruction '')
    matches the DeepMind Lab observation's structure so that one agent
    serves both (frame_stack 1, the default, is the newest frame alone: the
    agent stacks; 4 stacks here, oldest first), and
    `action` is an int index into the action set (`action_set`): the game's
    minimal set, or all 18 ALE actions with full_action_space=True (one policy
    shared across games, as for atari57). When done is True the observation
    is already the first of the next episode.
    """

    def __init__(
        self,
        game: str,
        seed: int,
        num_action_repeats: int = DEFAULT_NUM_ACTION_REPEATS,
        noop_max: int = DEFAULT_NOOP_MAX,
        repeat_action_probability: float = 0.0,
        max_episode_frames: int = DEFAULT_MAX_EPISODE_FRAMES,
        episode_life: bool = False,
        full_action_space: bool = False,
        frame_stack: int = 1,
    ):
        if frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {frame_stack}.")
        if num_action_repeats < 1:
            raise ValueError(
                f"num_action_repeats must be >= 1, got {num_action_repeats}."
            )
        if noop_max < 0:
            raise ValueError(f"noop_max must be >= 0, got {noop_max}.")
        if not 0.0 <= repeat_action_probability <= 1.0:
            raise ValueError(
                "repeat_action_probability must be in [0, 1], got "
                f"{repeat_action_probability}."
            )
        if max_episode_frames < 1:
            raise ValueError(
                f"max_episode_frames must be >= 1, got {max_episode_frames}."
            )
        _check_game(game)
        import cv2

        # Many actor processes share few cores; an 84x84 resize gains nothing
        # from OpenCV's thread pool.
        cv2.setNumThreads(1)
        ale_py = _ale_py()

        self._game = game
        self._num_action_repeats = num_action_repeats
        self._noop_max = noop_max
        self._max_episode_frames = max_episode_frames
        self._episode_life = episode_life
        # No-op counts come from their own generator, seeded like the emulator,
        # so a fixed seed replays exactly.
        self._rng = np.random.RandomState(seed % 2**32)

        self._ale = ale_py.ALEInterface()
        self._ale.setInt("random_seed", seed % 2**31)
        # ALE's own default is 0.25 (sticky); the paper's setup has none.
        self._ale.setFloat("repeat_action_probability", repeat_action_probability)
        self._ale.setInt("frame_skip", 1)  # we repeat and max-pool ourselves
        self._ale.loadROM(ale_py.roms.get_rom_path(game))
        if full_action_space:
            actions = self._ale.getLegalActionSet()
        else:
            actions = self._ale.getMinimalActionSet()
        self._actions = list(actions)
        self._noop = ale_py.Action.NOOP

        # Preallocated buffers: the two last raw screens (written alternately
        # by getScreenGrayscale), their max, the resized frame and the stack.
        self._screens = np.zeros((2, *SCREEN_SHAPE), np.uint8)
        self._screen_index = 0
        self._max_screen = np.zeros(SCREEN_SHAPE, np.uint8)
        # The frame stack is a ring of frame_stack planes: a new frame
        # overwrites the oldest plane, and the observation interleaves them
        # oldest first (cv2.merge), which costs far less than shifting an
        # [84, 84, 4] array along its last axis every step.
        self._stack = frame_stack
        self._planes = np.zeros((frame_stack, FRAME_HEIGHT, FRAME_WIDTH), np.uint8)
        self._oldest = 0  # index of the oldest plane

        self._episode_frames = 0
        self._lives = 0
        self._game_return = 0.0
        self.last_noop_count = 0  # for tests and debugging

    # -- introspection (used by tests and the benchmark) ---------------------

    @property
    def action_set(self) -> list[int]:
        """ALE action ids of the agent's actions, indexed by agent action."""
        return [int(a.value) for a in self._actions]

    @property
    def episode_frames(self) -> int:
        """Emulator frames since the current game's reset (no-ops included)."""
        return self._episode_frames

    @property
    def lives(self) -> int:
        return self._ale.lives()

    # -- the env-class protocol ----------------------------------------------

    def initial(self) -> tuple[np.ndarray, str]:
        self._new_game()
        return self._observation()

    def step(self, action) -> tuple[np.float32, np.bool_, tuple[np.ndarray, str]]:
        index = int(action)
        if not 0 <= index < len(self._actions):
            raise ValueError(
                f"Atari action {index} out of range: {self._game} has "
                f"{len(self._actions)} actions (0..{len(self._actions) - 1})."
            )
        ale_action = self._actions[index]
        reward = 0
        repeats = self._num_action_repeats
        for i in range(repeats):
            reward += self._ale.act(ale_action)
            self._episode_frames += 1
            if i >= repeats - 2:
                self._grab_screen()
            if self._ale.game_over(with_truncation=False):
                break
        self._game_return += reward

        game_over = self._ale.game_over(with_truncation=False)
        truncated = self._episode_frames >= self._max_episode_frames
        lives = self._ale.lives()
        # At game over the life count may drop too; that is a game end.
        life_lost = lives < self._lives
        self._lives = lives

        if game_over or truncated:
            done = True
            if self._episode_life:
                self._log_game()
            self._new_game()
        elif self._episode_life and life_lost:
            # The game goes on: only the agent's episode ends. The frame stack
            # restarts, as it would at the start of a new episode.
            done = True
            self._push_frame(fill=True)
        else:
            done = False
            self._push_frame(fill=False)
        return np.float32(reward), np.bool_(done), self._observation()

    def close(self) -> None:
        self._ale = None

    # -- internals -----------------------------------------------------------

    def _log_game(self) -> None:
        """With life loss the learner's episodes are lives, not games: the
        game's own return (what published scores and test mode give) is
        logged here, a line a game on the run's standard error, for the
        study runner and the user (train_until.GAME)."""
        print(
            f"Game on {LEVEL_PREFIX}{self._game}: return {self._game_return:.1f}, "
            f"{self._episode_frames} frames",
            file=sys.stderr,
            flush=True,
        )

    def _grab_screen(self) -> None:
        self._ale.getScreenGrayscale(self._screens[self._screen_index])
        self._screen_index ^= 1

    def _push_frame(self, fill: bool) -> None:
        np.maximum(self._screens[0], self._screens[1], out=self._max_screen)
        resize_frame(self._max_screen, out=self._planes[self._oldest])
        if fill:
            self._planes[:] = self._planes[self._oldest]
        self._oldest = (self._oldest + 1) % self._stack

    def _new_game(self) -> None:
        self._ale.reset_game()
        self._episode_frames = 0
        noops = self._rng.randint(0, self._noop_max + 1) if self._noop_max else 0
        self.last_noop_count = noops
        # Both buffers hold the reset screen, so that with fewer than two
        # no-ops the max is over the frames that exist.
        self._grab_screen()
        self._grab_screen()
        for _ in range(noops):
            self._ale.act(self._noop)
            self._episode_frames += 1
            self._grab_screen()
            if self._ale.game_over(with_truncation=False):
                # No game ends within 30 no-op frames; stay safe regardless.
                self._ale.reset_game()
                self._episode_frames = 0
                self._grab_screen()
                self._grab_screen()
        self._lives = self._ale.lives()
        self._game_return = 0.0
        self._push_frame(fill=True)

    def _observation(self):
        import cv2

        # A fresh array either way: the caller may keep it while the next
        # step overwrites the planes.
        if self._stack == 1:
            return self._planes[0][:, :, None].copy(), ""
        order = [(self._oldest + k) % self._stack for k in range(self._stack)]
        return cv2.merge([self._planes[i] for i in order]), ""

    @staticmethod
    def _tensor_specs(method_name, unused_kwargs, constructor_kwargs):
        """Output specs of `initial` and `step` for py_process (TF, lazily)."""
        return environment_tensor_specs(
            method_name,
            [FRAME_HEIGHT, FRAME_WIDTH, constructor_kwargs.get("frame_stack", 1)],
        )


# -- the family ----------------------------------------------------------------

LEVEL_PREFIX = atari57.LEVEL_PREFIX  # 'atari/'
SUITE = "atari57"
# Every suite: Atari-57 and its subsets (atari57.SUBSETS), each shared by
# several games and so played with all 18 actions.
SUITES = (SUITE, *atari57.SUBSETS)


class AtariFamily(EnvironmentFamily):
    """Atari for the registry (see contract.EnvironmentFamily)."""

    name = "Atari"
    suites = SUITES
    # The agent stacks the last 4 frames of [84, 84, 1] (agent.py).
    frame_stack = FRAME_STACK
    frame_shape = (FRAME_HEIGHT, FRAME_WIDTH, 1)
    level_forms = "'atari/<game>' (an ale_py ROM id, e.g. atari/pong), " + ", ".join(
        repr(s) for s in SUITES
    )
    # The tested Pong commands (BENCHMARKS.md, "Pong within an hour" and
    # "Learning"): the shallow agent's with 80-step unrolls, fastest to +18
    # on 2 cores, is the default; --agent=deep takes the deep agent's.
    default_flagfiles = (
        "flagfiles/pong_shallow_unroll80.cfg",
        "flagfiles/pong_deep.cfg",
    )

    def owns(self, level_name: str) -> bool:
        return level_name in SUITES or level_name.startswith(LEVEL_PREFIX)

    def expand(self, level_name: str, is_test: bool = False) -> list[str]:
        if level_name == SUITE:
            return list(atari57.LEVEL_NAMES)
        if level_name in atari57.SUBSETS:
            games = atari57.SUBSETS[level_name]
            missing = [g for g in games if g not in available_games()]
            if missing:
                raise UnknownLevelError(
                    f"the installed ale_py has no ROM for {', '.join(missing)}; "
                    "install the pinned ale-py (python3 -m pip install -r "
                    "requirements.txt), whose wheel carries every Atari-57 ROM."
                )
            return [LEVEL_PREFIX + g for g in games]
        if level_name[len(LEVEL_PREFIX) :] in available_games():
            return [level_name]
        raise UnknownLevelError("ale_py has no ROM of that name.")

    def suggestions(self) -> dict[str, str]:
        # A game also matches by its bare name: 'pong' suggests 'atari/pong'.
        names = {suite: suite for suite in SUITES}
        for game in available_games():
            names[LEVEL_PREFIX + game] = LEVEL_PREFIX + game
        for game in available_games():
            names.setdefault(game, LEVEL_PREFIX + game)
        return names

    def num_actions(self, level_names) -> int:
        """The game's minimal action set for one game; all 18 actions when
        several games share one policy."""
        level_names = list(level_names)
        if set(SUITES) & set(level_names) or shares_one_policy(level_names):
            return NUM_FULL_ACTIONS
        return num_actions(level_names[0][len(LEVEL_PREFIX) :])

    def run_options(self, environment, is_test: bool) -> dict[str, Any]:
        return {
            "num_action_repeats": environment.num_action_repeats,
            "full_action_space": shares_one_policy(environment.level_names),
            # Training ends an "episode" at each lost life (the usual
            # DQN/IMPALA setup); test mode always plays whole games.
            "episode_life": not is_test,
        }

    def environment_class(
        self,
        level_name: str,
        seed: int,
        is_test: bool = False,
        *,
        num_action_repeats: int = DEFAULT_NUM_ACTION_REPEATS,
        full_action_space: bool = False,
        episode_life: bool = False,
        repeat_action_probability: float = 0.0,
        noop_max: int = DEFAULT_NOOP_MAX,
        max_episode_frames: int = DEFAULT_MAX_EPISODE_FRAMES,
    ) -> tuple[type, dict]:
        """PyProcessAtari and its arguments; episode_life applies to
        training only (test mode plays whole games)."""
        game = level_name[len(LEVEL_PREFIX) :]
        if game not in available_games():
            raise UnknownLevelError("ale_py has no ROM of that name.")
        return PyProcessAtari, dict(
            game=game,
            seed=seed,
            num_action_repeats=num_action_repeats,
            noop_max=noop_max,
            repeat_action_probability=repeat_action_probability,
            max_episode_frames=max_episode_frames,
            episode_life=episode_life and not is_test,
            full_action_space=full_action_space,
        )

    def suite_scores(self, suite: str, level_returns) -> dict[str, float]:
        if suite in atari57.SUBSETS:
            return atari57.subset_scores(suite, level_returns)
        median, mean = atari57.compute_human_normalized_scores(level_returns)
        return {"median": median, "mean": mean}

    def level_score(self, level: str, returns) -> float | None:
        return atari57.human_normalized_score(level, returns)


def shares_one_policy(level_names) -> bool:
    """Several games share one policy over all 18 actions."""
    return len(set(level_names)) > 1


FAMILY = AtariFamily()
