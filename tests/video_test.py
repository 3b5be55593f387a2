"""video.py: the first test episode of a level as a GIF, decoded back.

The unrolls here are made-up arrays (the recorder only sees NumPy arrays);
experiment_test's test-mode run writes a GIF from a real Atari episode.
"""

import imageio.v3 as iio
import numpy as np
import pytest

from evaluation import video


def atari_unroll(start: int, length: int) -> np.ndarray:
    """uint8 [length, 84, 84, 4] whose newest frame (channel 3) is filled
    with its step number, so each decoded picture names its step."""
    frames = np.zeros((length, 84, 84, 4), np.uint8)
    frames[..., 3] = (np.arange(start, start + length) % 256)[:, None, None]
    return frames


def decode(path) -> np.ndarray:
    return iio.imread(path, index=None)


def steps_of(pictures: np.ndarray) -> list[int]:
    """The step number each decoded picture shows (its top-left pixel)."""
    gray = pictures if pictures.ndim == 3 else pictures[..., 0]
    return [int(p[0, 0]) for p in gray]


def test_first_episode_is_written_once_it_ends(tmp_path):
    recorder = video.EpisodeRecorder(str(tmp_path), "atari/pong", scale=2)
    # Unroll 1: steps 0..20; unroll 2 repeats step 20 at its index 0, then
    # 21..40. The episode ends at step 30: done there, with its return.
    done = np.zeros(21, bool)
    returns = np.zeros(21, np.float32)
    assert recorder.add_unroll(atari_unroll(0, 21), done, returns) is None
    assert not recorder.done
    done[10], returns[10] = True, -20.0  # index 10 of unroll 2 is step 30
    path = recorder.add_unroll(atari_unroll(20, 21), done, returns)
    assert path == str(tmp_path / "atari_pong_return-20.gif")
    assert recorder.done
    pictures = decode(path)
    # Steps 0..29: step 20 once (not repeated), not step 30 (the next
    # episode's first frame).
    assert pictures.shape[:3] == (30, 168, 168)
    assert steps_of(pictures) == list(range(30))
    # Later unrolls are ignored; nothing else is written.
    assert recorder.add_unroll(atari_unroll(40, 21), done, returns) is None
    assert [p.name for p in tmp_path.iterdir()] == ["atari_pong_return-20.gif"]


def test_a_done_at_the_first_step_does_not_end_an_empty_episode(tmp_path):
    # The very first observation comes with done=True from some environments'
    # initial(); it starts the recorded episode rather than ending one.
    recorder = video.EpisodeRecorder(str(tmp_path), "atari/pong", scale=1)
    done = np.zeros(5, bool)
    done[0] = True
    done[3] = True
    returns = np.array([0, 0, 0, 21.0, 0], np.float32)
    path = recorder.add_unroll(atari_unroll(0, 5), done, returns)
    assert path.endswith("atari_pong_return+21.gif")
    assert steps_of(decode(path)) == [0, 1, 2]


def test_rgb_frames_keep_their_colours(tmp_path):
    frames = np.zeros((4, 72, 96, 3), np.uint8)
    # Red, a different shade each step: the GIF writer (Pillow) merges a
    # frame identical to the previous one into it.
    frames[..., 0] = np.array([200, 210, 220, 230], np.uint8)[:, None, None]
    done = np.array([False, False, False, True])
    returns = np.array([0, 0, 0, 10.5], np.float32)
    recorder = video.EpisodeRecorder(str(tmp_path), "explore_goal_locations_small")
    path = recorder.add_unroll(frames, done, returns)
    assert path.endswith("explore_goal_locations_small_return+10_5.gif")
    pictures = decode(path)
    assert pictures.shape == (3, 216, 288, 3)
    assert [int(p[0, 0, 0]) for p in pictures] == [200, 210, 220]
    assert np.all(pictures[..., 1:] == 0)


def test_a_long_episode_is_cut(tmp_path):
    recorder = video.EpisodeRecorder(str(tmp_path), "atari/pong", scale=1, max_steps=7)
    done = np.zeros(5, bool)
    returns = np.zeros(5, np.float32)
    assert recorder.add_unroll(atari_unroll(0, 5), done, returns) is None
    path = recorder.add_unroll(atari_unroll(4, 5), done, returns)
    assert path.endswith("atari_pong_cut.gif")
    assert steps_of(decode(path)) == list(range(7))


@pytest.mark.parametrize(
    "frame",
    [np.zeros((84, 84), np.uint8), np.zeros((84, 84, 4), np.float32)],
    ids=["no channel axis", "float"],
)
def test_a_frame_that_is_not_a_picture_is_refused(frame):
    with pytest.raises(ValueError, match="uint8 \\[H, W, C\\]"):
        video.display_frame(frame)
