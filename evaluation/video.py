"""Videos of test-mode episodes: what the agent saw, as an animated GIF.

Test mode (`--test_video_dir`) records the first episode of each level from
the observations the agent itself receives: the newest grayscale frame for
Atari ([84, 84, 1] as the environment sends it, the newest of the agent's
stack of 4; an environment-side stack [84, 84, 4] shows its newest too), the
RGB frame for DeepMind Lab ([H, W, 3]). Frames are kept at their own size while the
episode plays and enlarged only when the file is written, so a long episode
costs ~7 KB per agent step of memory (Atari), not the enlarged size.

The GIF is written by imageio (its Pillow plugin) and plays at `fps` agent
steps per second: 15 is real time for Atari with 4 action repeats at 60 Hz.
"""

import os
import re

import imageio.v3 as iio
import numpy as np

DEFAULT_FPS = 15
DEFAULT_SCALE = 3
# An episode longer than this many agent steps is cut here (Atari caps an
# episode at 27,000 agent steps, which would make a GIF of hundreds of MB).
MAX_STEPS = 5000


def display_frame(frame: np.ndarray) -> np.ndarray:
    """One observation as a picture: uint8 [H, W, C] -> uint8 [H, W] or [H, W, 3].

    C == 3 is an RGB frame (DeepMind Lab); any other C is a stack of
    grayscale frames, oldest first (Atari), of which the newest is shown.
    """
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.dtype != np.uint8:
        raise ValueError(
            f"Expected a uint8 [H, W, C] frame, got {frame.dtype} {frame.shape}."
        )
    if frame.shape[-1] == 3:
        return frame
    return frame[..., -1]


def enlarge(pictures: np.ndarray, scale: int) -> np.ndarray:
    """Nearest-neighbour enlargement of [N, H, W, ...] by `scale` in H and W."""
    if scale == 1:
        return pictures
    return np.repeat(np.repeat(pictures, scale, axis=1), scale, axis=2)


def video_path(directory: str, level_name: str, episode_return: float | None) -> str:
    """<directory>/<level>_return<sign><value>.gif, e.g. atari_pong_return+18.gif;
    <level>_cut.gif for an episode cut at MAX_STEPS (its return is unknown)."""
    level = re.sub(r"[^A-Za-z0-9_.-]+", "_", level_name).strip("_")
    if episode_return is None:
        return os.path.join(directory, f"{level}_cut.gif")
    value = f"{episode_return:+g}".replace(".", "_")
    return os.path.join(directory, f"{level}_return{value}.gif")


def write_gif(path: str, pictures: np.ndarray, fps: int = DEFAULT_FPS) -> None:
    """Writes uint8 [N, H, W] or [N, H, W, 3] as a looping GIF at `fps`."""
    if len(pictures) == 0:
        raise ValueError(f"No frames to write to {path}.")
    iio.imwrite(
        path,
        pictures,
        extension=".gif",
        duration=1000.0 / fps,  # milliseconds per frame
        loop=0,
    )


class EpisodeRecorder:
    """Collects the frames of one level's first test episode and writes them.

    Feed it every unroll of that level's actor with `add_unroll`; it writes
    the GIF when the first episode ends and ignores everything after.
    """

    def __init__(
        self,
        directory: str,
        level_name: str,
        fps: int = DEFAULT_FPS,
        scale: int = DEFAULT_SCALE,
        max_steps: int = MAX_STEPS,
    ):
        self._directory = directory
        self._level_name = level_name
        self._fps = fps
        self._scale = scale
        self._max_steps = max_steps
        self._pictures: list[np.ndarray] = []
        self._first_unroll = True
        self.path: str | None = None  # set once the GIF is written

    @property
    def done(self) -> bool:
        return self.path is not None

    def add_unroll(
        self, frames: np.ndarray, done: np.ndarray, episode_return: np.ndarray
    ) -> str | None:
        """Adds one unroll; returns the GIF's path when this unroll wrote it.

        Args:
          frames: uint8 [T + 1, H, W, C], the unroll's observations.
          done: bool [T + 1]; done[t] means frames[t] starts a new episode.
          episode_return: float [T + 1]; at a done step, the return of the
            episode that just ended.
        """
        if self.done:
            return None
        # Step 0 repeats the previous unroll's last step, except in the first.
        start = 0 if self._first_unroll else 1
        self._first_unroll = False
        for t in range(start, len(frames)):
            if done[t] and self._pictures:
                return self._write(float(episode_return[t]))
            self._pictures.append(display_frame(frames[t]))
            if len(self._pictures) >= self._max_steps:
                return self._write(None)
        return None

    def _write(self, episode_return: float | None) -> str:
        os.makedirs(self._directory, exist_ok=True)
        path = video_path(self._directory, self._level_name, episode_return)
        write_gif(path, enlarge(np.stack(self._pictures), self._scale), self._fps)
        self._pictures = []
        self.path = path
        return path
