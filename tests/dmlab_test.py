"""DeepMind Lab: the wrapper, training, test mode, restarts, bad levels and
the level cache, each test on the real `deepmind_lab` and on the stand-in.

Every test runs twice: `[real]` on the real library where it is installed
(it skips elsewhere, saying how to get it) and `[stand-in]` on the stand-in
package in tests/standin (dmlab_helpers.py), which runs everywhere, CI
included. Both pass the same assertions: that is what keeps the stand-in
faithful to the real API. Small sizes: the shallow agent, one or two actors,
a few thousand frames (an explore_goal_locations_small episode is 5,400
frames). The in-process fake Lab of environments_test.py stays for what
neither shows cheaply (a scripted episode end, the exact settings strings).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal

import pytest
from dmlab_helpers import (
    CONFIG,
    EPISODE_FRAMES,
    FULL_LEVEL,
    LEVEL,
    REAL,
    SMALL,
    STANDIN,
    deepmind_lab,
)
from run_helpers import (
    command,
    one_error_line,
    run_and_kill_one_environment,
    run_at_once,
)

import environments
from families import dmlab


@pytest.fixture(scope="module", params=[REAL, STANDIN])
def lab(request):
    """The real DeepMind Lab (skipped where it is not installed) or the
    stand-in."""
    return deepmind_lab(request.param)


# -- the wrapper ------------------------------------------------------------------


def test_wrapper_outputs_match_its_specs(lab):
    import tensorflow as tf

    out = lab.in_child(
        f"""
env = dmlab.PyProcessDmLab({FULL_LEVEL!r}, CONFIG, 4, seed=1)
frame, instruction = env.initial()
out["initial"] = [list(frame.shape), str(frame.dtype), float(frame.std()),
                  type(instruction).__name__]
steps = []
for action in range(len(dmlab.DEFAULT_ACTION_SET)):
    reward, done, (frame, _) = env.step(action)
    steps.append([str(reward.dtype), str(done.dtype), list(frame.shape)])
# A native 7-int action, as the reference sends, works too.
env.step(np.array(dmlab.DEFAULT_ACTION_SET[0], np.intc))
out["steps"] = steps
env.close()
"""
    )
    initial_spec = dmlab.PyProcessDmLab._tensor_specs("initial", {}, {"config": CONFIG})
    step_spec = dmlab.PyProcessDmLab._tensor_specs("step", {}, {"config": CONFIG})
    shape, dtype, std, instruction_type = out["initial"]
    assert tf.TensorShape(shape) == initial_spec[0].shape == (72, 96, 3)
    assert dtype == "uint8" and std > 0  # a rendered view
    assert instruction_type == "str" and initial_spec[1].dtype == tf.string
    assert len(out["steps"]) == 9 == environments.num_actions([FULL_LEVEL])
    for reward_dtype, done_dtype, frame_shape in out["steps"]:
        assert reward_dtype == "float32" == step_spec[0].dtype.name
        assert done_dtype == "bool" == step_spec[1].dtype.name
        assert tf.TensorShape(frame_shape) == step_spec[2][0].shape


def test_test_mode_settings_open_the_hold_out_levels(lab, monkeypatch):
    """Test mode adds allowHoldOutLevels and DeepMind Lab's evaluation mixer
    seed, as the reference does; a *_test level of DMLab-30 starts only
    with them."""
    lab.in_process(monkeypatch)
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
    out = lab.in_child(
        f"""
for name, config in (("test", {config!r}), ("training", {training_config!r})):
    try:
        dmlab.PyProcessDmLab({test_level!r}, config, 4, seed=1).close()
        out[name] = "started"
    except ValueError as e:
        out[name] = str(e)
"""
    )
    assert out["test"] == "started"
    assert out["training"].startswith(f"DeepMind Lab cannot load level '{test_level}'")


# -- training and test mode, end to end -------------------------------------------


@pytest.fixture(scope="module")
def trained(lab, tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("dmlab_train"))
    cache = str(tmp_path_factory.mktemp("dmlab_cache"))
    result = lab.run(
        command(
            *SMALL,
            f"--level_name={LEVEL}",
            "--num_actors=1",
            "--batch_size=2",
            f"--logdir={logdir}",
            f"--level_cache_dir={cache}",
            f"--total_environment_frames={EPISODE_FRAMES + 800}",
        ),
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
def test_test_mode_on_explore_goal_locations_small(lab, trained, tmp_path):
    logdir, _, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    test = lab.run(
        command(
            *SMALL,
            f"--level_name={LEVEL}",
            f"--logdir={logdir}",
            "--mode=test",
            "--test_num_episodes=1",
        ),
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
def test_a_killed_deepmind_lab_process_is_restarted(lab, tmp_path):
    run = run_and_kill_one_environment(
        [
            *SMALL,
            f"--level_name={LEVEL}",
            "--num_actors=2",
            "--batch_size=2",
            f"--logdir={tmp_path / 'run'}",
            "--save_checkpoint_secs=2",
            "--total_environment_frames=1000000000",  # stopped by SIGINT
        ],
        tmp_path / "run.log",
        env=lab.environ(),
    )
    assert run.returncode == 128 + signal.SIGINT, run.output[-3000:]
    assert re.search(
        rf"Actor \d \({LEVEL}\): environment failed: PyProcess "
        rf"PyProcessDmLab \(pid {run.killed}\) died: killed by signal SIGKILL",
        run.output,
    ), run.output[-3000:]
    assert "environment restarted" in run.output


# -- bad levels: one line naming the level ----------------------------------------------


BAD_LEVELS = {
    "contributed/dmlab30/no_such_level": "Level not found",
    # A build without this level's map files: the engine exits its process
    # (the stand-in is told its map is missing; on a full DeepMind Lab build
    # the level starts and the test skips).
    "natlab_fixed_large_map": "died: exited with code",
    # Without --dataset_path its first episode cannot load its stimuli.
    "psychlab_continuous_recognition": (
        "DeepMind Lab cannot start level 'contributed/dmlab30/psychlab_"
        "continuous_recognition': Failed to start environment"
    ),
    # A level script that fails as an episode starts (the stand-in is told
    # so; on the real library the level starts and the test skips).
    "explore_object_locations_small": (
        "DeepMind Lab cannot start level 'contributed/dmlab30/explore_object_"
        "locations_small': Failed to start environment"
    ),
}


@pytest.fixture(scope="module")
def bad_level_runs(lab, tmp_path_factory):
    """experiment.py on each of BAD_LEVELS, the processes at once (each
    mostly waits for TensorFlow's import): {level: (exit code, stderr)}."""
    return run_at_once(
        {
            level: command(
                *SMALL,
                f"--level_name={level}",
                "--num_actors=1",
                "--batch_size=1",
                f"--logdir={tmp_path_factory.mktemp('bad_level')}",
                "--total_environment_frames=1000",
            )
            for level in BAD_LEVELS
        },
        env=lab.environ(
            DEEPMIND_LAB_STANDIN_MISSING_MAPS="natlab_fixed_large_map",
            DEEPMIND_LAB_STANDIN_FAILING_STARTS="explore_object_locations_small",
        ),
    )


@pytest.mark.parametrize("level", sorted(BAD_LEVELS))
def test_a_level_that_cannot_start_is_one_line_naming_it(bad_level_runs, level):
    returncode, stderr = bad_level_runs[level]
    if level.startswith("natlab") and returncode == 0:
        pytest.skip("this DeepMind Lab build has the natlab maps")
    if level.startswith("explore") and returncode == 0:
        pytest.skip("a failing start is injected into the stand-in only")
    assert returncode == 1, stderr[-3000:]
    line = one_error_line(stderr)
    assert line.startswith(f"experiment.py: error: --level_name={level}: ")
    assert BAD_LEVELS[level] in line


# -- the level cache ---------------------------------------------------------------------


def start_time(lab, level_cache_dir: str, seed: int) -> float:
    """Seconds a fresh process takes to start the level (construct + initial)."""
    out = lab.in_child(
        f"""
started = time.monotonic()
env = dmlab.PyProcessDmLab({FULL_LEVEL!r}, CONFIG, 4, seed={seed},
                                   level_cache_dir={level_cache_dir!r})
env.initial()
out["seconds"] = time.monotonic() - started
env.close()
"""
    )
    return out["seconds"]


def test_the_level_cache_serves_a_maze_compiled_before(lab, tmp_path):
    """The same seed gives the same maze: the second start reads it from the
    cache (a few files, written whole) instead of compiling it again. The
    figures are in BENCHMARKS.md; here only that the cache was used."""
    cache = str(tmp_path / "cache")
    start_time(lab, cache, seed=3)
    files = sorted(os.listdir(cache))
    assert files and not [f for f in files if f.startswith(".tmp-")]
    sizes = {f: os.path.getsize(os.path.join(cache, f)) for f in files}
    start_time(lab, cache, seed=3)
    assert {f: os.path.getsize(os.path.join(cache, f)) for f in files} == sizes
    assert sorted(os.listdir(cache)) == files  # nothing new to compile


def test_an_unwritable_level_cache_dir_is_a_flag_error(lab, tmp_path):
    result = lab.run(
        command(
            *SMALL,
            f"--level_name={LEVEL}",
            "--level_cache_dir=/etc/passwd/levels",
            f"--logdir={tmp_path}",
        ),
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--level_cache_dir=/etc/passwd/levels: cannot create it" in result.stderr
