"""The learning-run tools in benchmarks/: evaluate_checkpoints.py plays test
mode on every checkpoint of a run, learning_curve.py reads its references and
test points.

The checkpoints are the committed Pong agent's (pretrained/atari_pong), copied
under two frame counts; test mode runs for real on them. The plot itself needs
matplotlib (benchmarks/requirements.txt), which the project's install does not
bring, so only what feeds it is checked here.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from run_helpers import REPO_ROOT

sys.path.insert(0, REPO_ROOT)

from benchmarks.learning import evaluate_checkpoints, learning_curve  # noqa: E402

PRETRAINED = os.path.join(REPO_ROOT, "pretrained", "atari_pong")
PREFIX = os.path.basename(
    glob.glob(os.path.join(PRETRAINED, "model.ckpt-*.index"))[0]
).removesuffix(".index")


def _run_dir(tmp_path, steps):
    """A run directory holding the pretrained weights under each of `steps`."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    for step in steps:
        for suffix in (".index", ".data-00000-of-00001"):
            shutil.copy(
                os.path.join(PRETRAINED, PREFIX + suffix),
                logdir / f"model.ckpt-{step}{suffix}",
            )
    return logdir


def test_evaluate_checkpoints_tests_each_checkpoint_oldest_first(tmp_path):
    logdir = _run_dir(tmp_path, [2_000_000, 640])
    before = sorted(os.listdir(logdir))
    out = tmp_path / "records.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(
                REPO_ROOT, "benchmarks", "learning", "evaluate_checkpoints.py"
            ),
            f"--logdir={logdir}",
            "--level_name=atari/pong",
            "--episodes=1",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(out.read_text())["checkpoints"]
    assert [r["frames"] for r in records] == [640, 2_000_000]
    for record in records:
        assert len(record["returns"]) == 1
        assert -21 <= record["mean_return"] <= 21
        assert record["mean_return"] == record["returns"][0]
    # The run's directory is only read: no results file, no new checkpoint.
    assert sorted(os.listdir(logdir)) == before


def test_evaluate_checkpoints_names_a_directory_without_checkpoints(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(
                REPO_ROOT, "benchmarks", "learning", "evaluate_checkpoints.py"
            ),
            f"--logdir={tmp_path}",
            "--level_name=atari/pong",
            f"--out={tmp_path / 'records.json'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert f"--logdir={tmp_path} holds no checkpoint" in result.stderr
    assert not (tmp_path / "records.json").exists()


def test_checkpoint_prefixes_are_ordered_by_frames_not_by_name(tmp_path):
    logdir = _run_dir(tmp_path, [900, 10_000, 25])
    (logdir / "model.ckpt-5.data-00000-of-00001").write_bytes(b"")  # no index
    prefixes = evaluate_checkpoints.checkpoint_prefixes(str(logdir))
    assert [os.path.basename(p) for p in prefixes] == [
        "model.ckpt-25",
        "model.ckpt-900",
        "model.ckpt-10000",
    ]


def test_learning_curve_references_parse_and_refuse_malformed_ones():
    assert learning_curve.parse_references(["human=30.5", "random=-1.7"]) == [
        ("human", 30.5),
        ("random", -1.7),
    ]
    for bad in ("human", "=3", "human=abc"):
        with pytest.raises(SystemExit, match="is not LABEL=NUMBER"):
            learning_curve.parse_references([bad])


def test_learning_curve_places_test_points_in_frames_and_minutes():
    points = [
        {"frames": 2_000_000, "wall_time": 1_000.0 + 600.0, "mean_return": 3.0},
        {"frames": 4_000_000, "wall_time": 1_000.0 + 1_800.0, "mean_return": 9.0},
    ]
    frames, minutes = learning_curve.x_of_test(points, start=1_000.0)
    assert frames == [2.0, 4.0]
    assert minutes == [10.0, 30.0]


def test_learning_curve_takes_pauses_out_of_the_time_axis():
    Episode = learning_curve.Episode
    episodes = [
        Episode(100.0, 1, -21.0),
        Episode(160.0, 2, -20.0),
        Episode(160.0 + 3600.0, 3, -19.0),  # resumed an hour later
        Episode(160.0 + 3660.0, 4, -18.0),
    ]
    points = [{"frames": 4, "wall_time": 160.0 + 3700.0, "mean_return": 0.0}]
    shifted, points, removed = learning_curve.remove_gaps(episodes, points, 300.0)
    assert removed == 3300.0
    assert [e.wall_time for e in shifted] == [100.0, 160.0, 460.0, 520.0]
    assert points[0]["wall_time"] == 560.0
    # Nothing shorter than the limit is touched.
    same, _, none = learning_curve.remove_gaps(episodes[:2], [], 300.0)
    assert same == episodes[:2] and none == 0.0
