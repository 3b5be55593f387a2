"""DeepMind Lab for real: the wrapper, training, test mode, restarts, bad
levels and the level cache, on the real `deepmind_lab` module.

Run where DeepMind Lab is installed: CI installs the shared wheel
(../shared/wheels, see .ci/run); elsewhere these tests skip and say how to
get it. Small sizes: the shallow agent, one or two actors, a few thousand
frames (an explore_goal_locations_small episode is 5,400 frames).
The stand-in Lab of environments_test.py stays for what the real one cannot
show cheaply (a scripted episode end, the exact settings strings).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from run_helpers import REPO_ROOT, command, one_error_line

import environments

pytestmark = pytest.mark.skipif(
    not environments.deepmind_lab_available(),
    reason=(
        "DeepMind Lab is not installed: pip install "
        "../shared/wheels/deepmind_lab-1.0-py3-none-any.whl dm-env==1.6 (with the "
        "runtime libraries .ci/run installs), or build it (README, DeepMind Lab)"
    ),
)

LEVEL = "explore_goal_locations_small"
FULL_LEVEL = "contributed/dmlab30/" + LEVEL
EPISODE_FRAMES = 5400  # 90 s at 60 frames/s
SMALL = ["--agent=shallow", "--unroll_length=20", "--width=96", "--height=72"]
CONFIG = {"width": 96, "height": 72, "datasetPath": "", "logLevel": "WARN"}


# -- the wrapper against the real Lab --------------------------------------------
#
# Each Lab runs in a child process of its own, as in training: DeepMind Lab
# supports one Lab per process (a second one in the same process crashes it).


def in_child(code: str) -> dict:
    """Runs `code` (which sets `out`, a dict) in a fresh Python; returns out."""
    program = (
        "import json, sys, time\n"
        "import numpy as np\n"
        "import environments\n"
        f"CONFIG = {CONFIG!r}\n"
        "out = {}\n" + code + "\nprint('OUT=' + json.dumps(out))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("OUT=")]
    return json.loads(line[len("OUT=") :])


def test_wrapper_outputs_match_its_specs_on_the_real_lab():
    import tensorflow as tf

    out = in_child(
        f"""
env = environments.PyProcessDmLab({FULL_LEVEL!r}, CONFIG, 4, seed=1)
frame, instruction = env.initial()
out["initial"] = [list(frame.shape), str(frame.dtype), float(frame.std()),
                  type(instruction).__name__]
steps = []
for action in range(len(environments.DEFAULT_ACTION_SET)):
    reward, done, (frame, _) = env.step(action)
    steps.append([str(reward.dtype), str(done.dtype), list(frame.shape)])
# A native 7-int action, as the reference sends, works too.
env.step(np.array(environments.DEFAULT_ACTION_SET[0], np.intc))
out["steps"] = steps
env.close()
"""
    )
    initial_spec = environments.PyProcessDmLab._tensor_specs(
        "initial", {}, {"config": CONFIG}
    )
    step_spec = environments.PyProcessDmLab._tensor_specs(
        "step", {}, {"config": CONFIG}
    )
    shape, dtype, std, instruction_type = out["initial"]
    assert tf.TensorShape(shape) == initial_spec[0].shape == (72, 96, 3)
    assert dtype == "uint8" and std > 0  # a rendered view
    assert instruction_type == "str" and initial_spec[1].dtype == tf.string
    assert len(out["steps"]) == 9 == environments.num_actions([FULL_LEVEL])
    for reward_dtype, done_dtype, frame_shape in out["steps"]:
        assert reward_dtype == "float32" == step_spec[0].dtype.name
        assert done_dtype == "bool" == step_spec[1].dtype.name
        assert tf.TensorShape(frame_shape) == step_spec[2][0].shape


def test_test_mode_settings_open_the_hold_out_levels():
    """Test mode adds allowHoldOutLevels and DeepMind Lab's evaluation mixer
    seed, as the reference does; a *_test level of DMLab-30 starts only
    with them."""
    test_level = "contributed/dmlab30/rooms_collect_good_objects_test"
    config = environments.create_environment(
        test_level, seed=1, is_test=True
    )._constructor_kwargs["config"]
    assert config["allowHoldOutLevels"] == "true"
    assert config["mixerSeed"] == 0x600D5EED
    training_config = environments.create_environment(
        test_level, seed=1, is_test=False
    )._constructor_kwargs["config"]
    assert "allowHoldOutLevels" not in training_config
    out = in_child(
        f"""
for name, config in (("test", {config!r}), ("training", {training_config!r})):
    try:
        environments.PyProcessDmLab({test_level!r}, config, 4, seed=1).close()
        out[name] = "started"
    except ValueError as e:
        out[name] = str(e)
"""
    )
    assert out["test"] == "started"
    assert out["training"].startswith(f"DeepMind Lab cannot load level '{test_level}'")


# -- training and test mode, end to end -------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("dmlab_train"))
    cache = str(tmp_path_factory.mktemp("dmlab_cache"))
    result = subprocess.run(
        command(
            *SMALL,
            f"--level_name={LEVEL}",
            "--num_actors=1",
            "--batch_size=2",
            f"--logdir={logdir}",
            f"--level_cache_dir={cache}",
            f"--total_environment_frames={EPISODE_FRAMES + 800}",
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return logdir, cache, result


@pytest.mark.slow
def test_training_on_explore_goal_locations_small(trained):
    logdir, cache, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    assert glob.glob(os.path.join(logdir, "model.ckpt-*.index"))
    assert glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    episodes = re.findall(
        rf"Episode on {LEVEL}: return (-?[\d.]+), (\d+) frames",
        result.stderr,
    )
    assert episodes, result.stderr[-3000:]
    assert all(int(frames) == EPISODE_FRAMES for _, frames in episodes)
    # The maze the level compiled went to the level cache.
    assert os.listdir(cache)


@pytest.mark.slow
def test_test_mode_on_explore_goal_locations_small(trained, tmp_path):
    logdir, _, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    test = subprocess.run(
        command(
            *SMALL,
            f"--level_name={LEVEL}",
            f"--logdir={logdir}",
            "--mode=test",
            "--test_num_episodes=1",
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert test.returncode == 0, test.stderr[-3000:]
    with open(os.path.join(logdir, "test_results.json")) as f:
        results = json.load(f)
    (level,) = results["levels"]
    assert level == LEVEL
    assert len(results["levels"][level]["returns"]) == 1
    # The table, with the level's human-normalised score (a DMLab-30 level).
    (row,) = [ln for ln in test.stdout.splitlines() if ln.startswith(LEVEL)]
    assert len(row.split()) == 4


# -- a DeepMind Lab process killed mid-run ------------------------------------------


@pytest.mark.slow
def test_a_killed_deepmind_lab_process_is_restarted(tmp_path):
    logdir = str(tmp_path / "run")
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command(
                *SMALL,
                f"--level_name={LEVEL}",
                "--num_actors=2",
                "--batch_size=2",
                f"--logdir={logdir}",
                "--save_checkpoint_secs=2",
                # Far enough past the kill for the restart (1 s pause, then a
                # level start of a few seconds) to finish before the target.
                "--total_environment_frames=16000",
            ),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 180
        while not re.search(r"Saving checkpoints for [1-9]\d* ", log_path.read_text()):
            assert process.poll() is None and time.time() < deadline, (
                log_path.read_text()[-3000:]
            )
            time.sleep(0.2)
        children = [
            int(p)
            for path in glob.glob(f"/proc/{process.pid}/task/*/children")
            for p in open(path).read().split()
        ]
        assert len(children) == 2, children
        os.kill(children[0], signal.SIGKILL)
        returncode = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log_path.read_text()
    assert returncode == 0, output[-3000:]
    assert re.search(
        rf"Actor \d \({LEVEL}\): environment failed: PyProcess "
        rf"PyProcessDmLab \(pid {children[0]}\) died: killed by signal SIGKILL",
        output,
    ), output[-3000:]
    assert "environment restarted" in output


# -- bad levels: one line naming the level ----------------------------------------------


@pytest.mark.parametrize(
    "level, expected",
    [
        ("contributed/dmlab30/no_such_level", "Level not found"),
        # Its map is one of the files the shared build lacks: the engine exits
        # its process (on a full DeepMind Lab build this level starts).
        ("natlab_fixed_large_map", "died: exited with code"),
    ],
)
def test_a_level_that_cannot_start_is_one_line_naming_it(tmp_path, level, expected):
    result = subprocess.run(
        command(
            *SMALL,
            f"--level_name={level}",
            "--num_actors=1",
            "--batch_size=1",
            f"--logdir={tmp_path}",
            "--total_environment_frames=1000",
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if level.startswith("natlab") and result.returncode == 0:
        pytest.skip("this DeepMind Lab build has the natlab maps")
    assert result.returncode == 1, result.stderr[-3000:]
    line = one_error_line(result.stderr)
    assert line.startswith(f"experiment.py: error: --level_name={level}: ")
    assert expected in line


# -- the level cache ---------------------------------------------------------------------


def start_time(level_cache_dir: str, seed: int) -> float:
    """Seconds a fresh process takes to start the level (construct + initial)."""
    out = in_child(
        f"""
started = time.monotonic()
env = environments.PyProcessDmLab({FULL_LEVEL!r}, CONFIG, 4, seed={seed},
                                   level_cache_dir={level_cache_dir!r})
env.initial()
out["seconds"] = time.monotonic() - started
env.close()
"""
    )
    return out["seconds"]


def test_the_level_cache_serves_a_maze_compiled_before(tmp_path):
    """The same seed gives the same maze: the second start reads it from the
    cache (a few files, written whole) instead of compiling it again. The
    figures are in BENCHMARKS.md; here only that the cache was used."""
    cache = str(tmp_path / "cache")
    start_time(cache, seed=3)
    files = sorted(os.listdir(cache))
    assert files and not [f for f in files if f.startswith(".tmp-")]
    sizes = {f: os.path.getsize(os.path.join(cache, f)) for f in files}
    start_time(cache, seed=3)
    assert {f: os.path.getsize(os.path.join(cache, f)) for f in files} == sizes
    assert sorted(os.listdir(cache)) == files  # nothing new to compile


def test_an_unwritable_level_cache_dir_is_a_flag_error(tmp_path):
    result = subprocess.run(
        command(
            *SMALL,
            f"--level_name={LEVEL}",
            "--level_cache_dir=/etc/passwd/levels",
            f"--logdir={tmp_path}",
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--level_cache_dir=/etc/passwd/levels: cannot create it" in result.stderr
