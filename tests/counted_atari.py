"""An Atari environment class whose emulator counts for itself: how test
mode's returns and episode lengths are checked against the environment's own
count (tests/experiment_test.py, through run_with_counted_atari.py).

Each game that ends appends a JSON line to $COUNTED_ATARI_LOG (one file per
process: the name gets the pid):
  ale_frames  ALE's getEpisodeFrameNumber() as the game ends (the emulator's
              frames since its reset, no-op starts included);
  ale_return  the sum of the rewards ALE's act() returned in that game;
  noops       the no-op frames the game started with;
  steps       the agent steps PyProcessAtari.step took in it.
The agent's actions, the frames and the rewards are those of the real
environment class: only the emulator's calls are counted on their way.
"""

import json
import os

from families import atari

LOG_VARIABLE = "COUNTED_ATARI_LOG"


class _CountingALE:
    """An ALEInterface whose act() rewards are summed between resets; what
    ALE says at each reset_game is kept in `ended` (oldest first)."""

    def __init__(self, ale):
        self._ale = ale
        self._reward = 0
        self.ended: list[tuple[int, int]] = []

    def act(self, action):
        reward = self._ale.act(action)
        self._reward += reward
        return reward

    def reset_game(self):
        frames = self._ale.getEpisodeFrameNumber()
        if frames:
            self.ended.append((int(frames), int(self._reward)))
        self._reward = 0
        self._ale.reset_game()

    def __getattr__(self, name):
        return getattr(self._ale, name)


class CountedAtari(atari.PyProcessAtari):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ale = _CountingALE(self._ale)
        self._steps = 0
        self._noops = 0
        self._log = f"{os.environ[LOG_VARIABLE]}.{os.getpid()}"

    def initial(self):
        observation = super().initial()
        # Whatever ALE counted before this first game (loading the ROM) is no
        # game of the agent's.
        self._ale.ended.clear()
        self._steps, self._noops = 0, self.last_noop_count
        return observation

    def step(self, action):
        reward, done, observation = super().step(action)
        self._steps += 1
        if done and self._ale.ended:
            ale_frames, ale_return = self._ale.ended.pop(0)
            with open(self._log, "a") as f:
                row = {
                    "ale_frames": ale_frames,
                    "ale_return": ale_return,
                    "noops": self._noops,
                    "steps": self._steps,
                }
                f.write(json.dumps(row) + "\n")
            self._steps, self._noops = 0, self.last_noop_count
        return reward, done, observation
