"""What a run tells: a progress line, each episode, summaries, test results.

`ProgressLogger` logs a line every --progress_secs (frames against the target,
frames/s, ETA) and writes frames/s to TensorBoard; `EpisodeLogger` logs and
summarises every episode that ends in the learner's batches (and a suite's
human-normalised training scores).
"""

from __future__ import annotations

import collections
import time

import numpy as np
import tensorflow as tf
from absl import logging

import environments

PROGRESS_SECS = 10
RECENT_EPISODES = 100


def format_duration(seconds: float) -> str:
    """A duration at a glance: '45 s', '12 min', '3 h 05 min', '2 d 7 h'."""
    if not np.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def progress_line(
    num_env_frames: int,
    total_frames: int,
    fps: float,
    steps_per_s: float,
    recent_returns,
    queue_size,
    policy_lag: tuple[float, float | None] | None = None,
) -> str:
    """'frames 7,200 / 1,000,000,000 (0.0 %) | 720 frames/s | ETA 16 d 1 h |
    ...': where the run is against its target, and how fast it gets there;
    `policy_lag`: (fresh, replayed or None) mean lags in updates since the
    last line, or None."""
    done = 100.0 * num_env_frames / max(total_frames, 1)
    eta = (total_frames - num_env_frames) / fps if fps > 0 else float("inf")
    mean_return = np.mean(recent_returns) if recent_returns else float("nan")
    return (
        f"frames {num_env_frames:,} / {total_frames:,} ({done:.1f} %) | "
        f"{fps:.0f} frames/s | ETA {format_duration(max(eta, 0.0))} | "
        f"{steps_per_s:.2f} learner steps/s | mean return (last "
        f"{len(recent_returns)} episodes) {mean_return:.2f} | "
        f"{queue_text(queue_size)}"
        + (f" | {lag_text(policy_lag)}" if policy_lag is not None else "")
    )


def lag_text(policy_lag: tuple[float, float | None]) -> str:
    """'policy lag 1.5 updates' (and '(replayed 212.0)' with replay)."""
    fresh, replayed = policy_lag
    text = f"policy lag {fresh:.1f} updates"
    return text if replayed is None else f"{text} (replayed {replayed:.1f})"


class PolicyLagMeter:
    """Running means of the fresh and replayed unrolls' policy lags
    (update.PolicyLag's values, in updates)."""

    def __init__(self):
        self._sums = np.zeros(2)
        self._counts = np.zeros(2)

    def add(self, fresh, replayed) -> None:
        for i, lags in enumerate((fresh, replayed)):
            lags = np.asarray(lags, dtype=np.float64)
            self._sums[i] += lags.sum()
            self._counts[i] += lags.size

    def means(self) -> tuple[float, float | None] | None:
        """(fresh, replayed or None without replayed unrolls); None before any."""
        if not self._counts[0]:
            return None
        replayed = self._sums[1] / self._counts[1] if self._counts[1] else None
        return float(self._sums[0] / self._counts[0]), replayed


def queue_text(queue_size) -> str:
    """'queue 1' for one learner's queue; 'queues 1,0' for several learners'."""
    sizes = np.atleast_1d(queue_size)
    if sizes.size == 1:
        return f"queue {int(sizes[0])}"
    return "queues " + ",".join(str(int(n)) for n in sizes)


def done_line(result, logdir: str, level_name: str) -> str:
    """A finished run in one line (a loop.LearnerResult): frames, episodes,
    time, the mean return of its last episodes, the session's mean policy
    lag, and the command that evaluates it."""
    returns = result.recent_returns
    mean = f"{np.mean(returns):.2f}" if returns else "none yet"
    lag = f"; mean {lag_text(result.policy_lag)}" if result.policy_lag else ""
    return (
        f"Training done: {result.num_env_frames} environment frames, "
        f"{result.num_episodes} episodes in {format_duration(result.seconds)}; "
        f"mean return of the last {len(returns)} episodes: {mean}{lag}. Checkpoint "
        f"and TensorBoard logs in {logdir}. Evaluate it: python3 experiment.py "
        f"--mode=test --level_name={level_name} --logdir={logdir}"
    )


class ProgressLogger:
    """A progress line every `interval_secs`, and a frames/s summary."""

    def __init__(
        self, summary_writer, total_frames: int, interval_secs: float = PROGRESS_SECS
    ):
        self._writer = summary_writer
        self._total_frames = total_frames
        self._interval = interval_secs
        self._last_time = time.time()
        self._last_frames = None
        self._steps = 0
        # The session's policy lag, and since the last line.
        self.policy_lag = PolicyLagMeter()
        self._recent_lag = PolicyLagMeter()

    def step(
        self, num_env_frames: int, recent_returns, queue_size, policy_lag=None
    ) -> None:
        """One learner step; `policy_lag`: its update.PolicyLag values."""
        if policy_lag is not None:
            self.policy_lag.add(*policy_lag)
            self._recent_lag.add(*policy_lag)
        self._steps += 1
        now = time.time()
        if self._last_frames is None:  # Count from the first step (after resume).
            self._last_frames, self._last_time, self._steps = num_env_frames, now, 0
            return
        elapsed = now - self._last_time
        if elapsed < self._interval or elapsed <= 0:
            return
        fps = (num_env_frames - self._last_frames) / elapsed
        logging.info(
            "%s",
            progress_line(
                num_env_frames,
                self._total_frames,
                fps,
                self._steps / elapsed,
                recent_returns,
                queue_size,
                self._recent_lag.means(),
            ),
        )
        self._recent_lag = PolicyLagMeter()
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
        is_suite = list(level_names) != [level_name]
        self._suite = level_name if is_suite else None
        self._suite_returns = {name: [] for name in level_names}
        self.recent_returns = collections.deque(maxlen=RECENT_EPISODES)
        self.num_episodes = 0

    def log(self, level_names, done, info, num_env_frames: int) -> list:
        """level_names [B] bytes, done [T, B], info arrays [T, B]; returns the
        finished episodes' (level, return)."""
        finished = []
        for t, b in zip(*np.nonzero(done), strict=True):
            level = level_names[b].decode()
            episode_return = float(info.episode_return[t, b])
            episode_frames = int(info.episode_step[t, b]) * self._num_action_repeats
            self.num_episodes += 1
            self.recent_returns.append(episode_return)
            finished.append((level, episode_return))
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
            for tag, value in environments.suite_scores(
                self._suite, self._suite_returns
            ).items():
                summary.value.add(
                    tag=f"{self._suite}/training_{tag}", simple_value=value
                )
            self._writer.add_summary(summary, num_env_frames)
            self._suite_returns = {name: [] for name in self._suite_returns}
        return finished
