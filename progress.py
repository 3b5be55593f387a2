"""What a training run tells: a progress line, each episode, summaries.

`ProgressLogger` logs a line every PROGRESS_SECS and writes frames/s to
TensorBoard; `EpisodeLogger` logs and summarises every episode that ends in
the learner's batches (and a suite's human-normalised training scores).
"""

from __future__ import annotations

import collections
import time

import numpy as np
import tensorflow as tf
from absl import logging

import atari57
import dmlab30

PROGRESS_SECS = 10
RECENT_EPISODES = 100


class ProgressLogger:
    """A progress line every PROGRESS_SECS, and a frames/s summary."""

    def __init__(self, summary_writer, interval_secs: float = PROGRESS_SECS):
        self._writer = summary_writer
        self._interval = interval_secs
        self._last_time = time.time()
        self._last_frames = None
        self._steps = 0

    def step(self, num_env_frames: int, recent_returns, queue_size: int) -> None:
        self._steps += 1
        now = time.time()
        if self._last_frames is None:  # Count from the first step (after resume).
            self._last_frames, self._last_time, self._steps = num_env_frames, now, 0
            return
        elapsed = now - self._last_time
        if elapsed < self._interval:
            return
        fps = (num_env_frames - self._last_frames) / elapsed
        mean_return = np.mean(recent_returns) if recent_returns else float("nan")
        logging.info(
            "frames %d | %.0f frames/s | %.2f learner steps/s | mean return "
            "(last %d episodes) %.2f | queue %d",
            num_env_frames,
            fps,
            self._steps / elapsed,
            len(recent_returns),
            mean_return,
            queue_size,
        )
        summary = tf.compat.v1.Summary()
        summary.value.add(tag="frames_per_second", simple_value=fps)
        self._writer.add_summary(summary, num_env_frames)
        self._last_frames, self._last_time, self._steps = num_env_frames, now, 0


class EpisodeLogger:
    """Logs and summarises every finished episode of the learner's batches."""

    def __init__(
        self,
        summary_writer,
        level_name: str,
        level_names: list[str],
        num_action_repeats: int,
    ):
        self._writer = summary_writer
        self._num_action_repeats = num_action_repeats
        self._suite = level_name if level_name in ("dmlab30", "atari57") else None
        self._suite_returns = {name: [] for name in level_names}
        self.recent_returns = collections.deque(maxlen=RECENT_EPISODES)
        self.num_episodes = 0

    def log(self, level_names, done, info, num_env_frames: int) -> None:
        """level_names [B] bytes, done [T, B], info arrays [T, B]."""
        for t, b in zip(*np.nonzero(done), strict=True):
            level = level_names[b].decode()
            episode_return = float(info.episode_return[t, b])
            episode_frames = int(info.episode_step[t, b]) * self._num_action_repeats
            self.num_episodes += 1
            self.recent_returns.append(episode_return)
            logging.info(
                "Episode on %s: return %.1f, %d frames",
                level,
                episode_return,
                episode_frames,
            )
            summary = tf.compat.v1.Summary()
            summary.value.add(
                tag=f"{level}/episode_return", simple_value=episode_return
            )
            summary.value.add(
                tag=f"{level}/episode_frames", simple_value=episode_frames
            )
            self._writer.add_summary(summary, num_env_frames)
            if self._suite:
                self._suite_returns[level].append(episode_return)
        if self._suite and min(map(len, self._suite_returns.values())) >= 1:
            summary = tf.compat.v1.Summary()
            for tag, value in human_normalized_scores(
                self._suite, self._suite_returns
            ).items():
                summary.value.add(
                    tag=f"{self._suite}/training_{tag}", simple_value=value
                )
            self._writer.add_summary(summary, num_env_frames)
            self._suite_returns = {name: [] for name in self._suite_returns}


def human_normalized_scores(suite: str, level_returns) -> dict[str, float]:
    """dmlab30: {'no_cap', 'cap_100'}; atari57: {'median', 'mean'}."""
    if suite == "dmlab30":
        return {
            "no_cap": dmlab30.compute_human_normalized_score(level_returns, None),
            "cap_100": dmlab30.compute_human_normalized_score(level_returns, 100),
        }
    median, mean = atari57.compute_human_normalized_scores(level_returns)
    return {"median": median, "mean": mean}
