"""The DeepMind Lab path end to end, on the stand-in `deepmind_lab`.

Every test here runs on the stand-in package in tests/standin (see its
docstring for what it models), because the real library is not installed on
the machines that run CI: they show what the real one cannot show there. The
first tests hold the stand-in to the contract measured on the real library;
the others run experiment.py and its environment processes with it: DMLab-30
training with its levels assigned to actors as the reference assigns them,
DMLab-30 test mode with the hold-out levels, the level cache across runs and
the default level's fallback. tests/dmlab_test.py runs the common tests on
both the real library and the stand-in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from dmlab_helpers import (
    FULL_LEVEL,
    LEVEL,
    SMALL,
    STANDIN,
    DeepMindLab,
    read_trace,
)
from run_helpers import REPO_ROOT, command

import dmlab30
from families import dmlab

STANDIN_LAB = DeepMindLab(STANDIN)
EVALUATION_MIXER_SEED = str(0x600D5EED)  # DeepMind Lab's, for test mode


# -- the stand-in itself ---------------------------------------------------------


def test_the_stand_in_is_importable_only_where_a_test_puts_it():
    """Runs without the stand-in: a user's Python, started in the repository,
    does not find a `deepmind_lab` in it."""
    if dmlab.deepmind_lab_available():
        pytest.skip("the real DeepMind Lab is installed here")
    result = subprocess.run(
        [sys.executable, "-c", "import deepmind_lab"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr
    assert importlib.util.find_spec("deepmind_lab") is None  # pytest's path too


def test_the_stand_in_follows_the_measured_contract():
    """On the stand-in: the facts measured on deepmind_lab 1.0."""
    out = STANDIN_LAB.in_child(
        f"""
import deepmind_lab
try:
    deepmind_lab.Lab({FULL_LEVEL!r}, ['RGB_INTERLEAVED'], config={{'width': 96}})
except TypeError as e:
    out['int_config'] = str(e)
try:
    deepmind_lab.Lab('no_such_level', ['RGB_INTERLEAVED'])
except RuntimeError as e:
    out['unknown'] = str(e)
lab = deepmind_lab.Lab({FULL_LEVEL!r}, ['RGB_INTERLEAVED', 'INSTR'],
                       config={{'width': '96', 'height': '72'}},
                       renderer='software')
spec = lab.observation_spec()
out['num_observations'] = len(spec)
out['rgb'] = [[list(s['shape']), np.dtype(s['dtype']).name] for s in spec
              if s['name'] == 'RGB_INTERLEAVED']
out['instr'] = [[list(s['shape']), s['dtype'] is str] for s in spec
                if s['name'] == 'INSTR']
out['actions'] = lab.action_spec()
lab.reset(seed=1)
obs = lab.observations()
out['frame'] = [list(obs['RGB_INTERLEAVED'].shape), str(obs['RGB_INTERLEAVED'].dtype)]
out['instruction'] = obs['INSTR']
forward = np.array([0, 0, 0, 1, 0, 0, 0], np.intc)
reward = lab.step(forward, num_steps=4)
out['reward_type'] = type(reward).__name__
try:
    lab.step(np.array([0, 0, 0, 1, 0, 0, 0]), num_steps=4)  # int64
except ValueError:
    out['int64_refused'] = True
steps = 1
while lab.is_running():
    lab.step(forward, num_steps=4)
    steps += 1
out['steps'], out['num_steps'] = steps, lab.num_steps()
for call in ('observations', 'step'):
    try:
        lab.observations() if call == 'observations' else lab.step(forward, 4)
    except RuntimeError as e:
        out[call] = str(e)
"""
    )
    assert "int_config" in out  # a TypeError
    assert out["unknown"].startswith(
        "Failed to init environment - \"Level not found: Failed to open file '"
    )
    assert out["unknown"].endswith("/game_scripts/levels/no_such_level.lua'\"")
    assert out["num_observations"] == 43
    assert out["rgb"] == [[[72, 96, 3], "uint8"]]
    assert out["instr"] == [[[], True]] and out["instruction"] == ""
    assert out["actions"] == [
        {"min": -512, "max": 512, "name": "LOOK_LEFT_RIGHT_PIXELS_PER_FRAME"},
        {"min": -512, "max": 512, "name": "LOOK_DOWN_UP_PIXELS_PER_FRAME"},
        {"min": -1, "max": 1, "name": "STRAFE_LEFT_RIGHT"},
        {"min": -1, "max": 1, "name": "MOVE_BACK_FORWARD"},
        {"min": 0, "max": 1, "name": "FIRE"},
        {"min": 0, "max": 1, "name": "JUMP"},
        {"min": 0, "max": 1, "name": "CROUCH"},
    ]
    assert out["frame"] == [[72, 96, 3], "uint8"]
    assert out["reward_type"] == "float" and out["int64_refused"]
    assert out["steps"] == 1350 and out["num_steps"] == 5400
    assert out["observations"] == (
        "Environment in wrong status for call to observations()"
    )
    assert out["step"] == "Environment in wrong status to advance."


def test_the_stand_in_uses_the_level_cache_as_the_engine_does():
    """On the stand-in: fetch before compiling a maze, write after a miss; a
    hit copies the cached file to the engine's path and returns True."""
    out = STANDIN_LAB.in_child(
        f"""
import deepmind_lab, os, shutil, tempfile
class Cache:
    def __init__(self):
        self.dir, self.calls = tempfile.mkdtemp(), []
    def fetch(self, key, pk3_path):
        path = os.path.join(self.dir, key)
        hit = os.path.exists(path)
        if hit:
            shutil.copyfile(path, pk3_path)
        self.calls.append(['fetch', key, os.path.basename(pk3_path), hit])
        return hit
    def write(self, key, pk3_path):
        shutil.copyfile(pk3_path, os.path.join(self.dir, key))
        self.calls.append(['write', key, os.path.basename(pk3_path)])
cache = Cache()
lab = deepmind_lab.Lab({FULL_LEVEL!r}, ['RGB_INTERLEAVED'], level_cache=cache)
lab.reset(seed=7)
lab.reset(seed=8)
lab.reset(seed=7)
out['calls'] = cache.calls
"""
    )
    first, write, second, _, again = out["calls"]
    assert first[0] == "fetch" and not first[3]
    assert re.fullmatch(r"explore_maze_noaas_[0-9a-f]{32}", first[1])
    assert first[2] == "explore_maze.pk3"
    assert write == ["write", first[1], "explore_maze.pk3"]
    assert second[1] != first[1]  # another seed, another maze
    assert again == ["fetch", first[1], "explore_maze.pk3", True]


# -- DMLab-30 through experiment.py ------------------------------------------------

NUM_LEVELS = len(dmlab30.LEVEL_MAPPING)
# Two psychlab levels load their stimuli from here (the stand-in reads no
# file of it; the real library would need brady_konkle_oliva2008's).
DATASET_PATH = os.path.join(REPO_ROOT, "tests")


@pytest.fixture(scope="module")
def dmlab30_run(tmp_path_factory):
    """On the stand-in: DMLab-30 trained by one actor per level (30 actors),
    briefly."""
    logdir = str(tmp_path_factory.mktemp("dmlab30"))
    trace = str(tmp_path_factory.mktemp("trace") / "train.jsonl")
    result = STANDIN_LAB.run(
        command(
            *SMALL,
            "--level_name=dmlab30",
            f"--dataset_path={DATASET_PATH}",
            f"--num_actors={NUM_LEVELS}",
            "--batch_size=2",
            "--seed=5",
            f"--logdir={logdir}",
            "--level_cache_dir=",
            "--total_environment_frames=1600",
        ),
        timeout=300,
        DEEPMIND_LAB_STANDIN_TRACE=trace,
    )
    return logdir, read_trace(trace), result


@pytest.mark.slow
def test_dmlab30_gives_each_actor_its_level_as_the_reference_does(dmlab30_run):
    """On the stand-in: actor i plays level i mod 30 of the DMLab-30 training
    levels with seed --seed + i, one process each; the language levels get
    an instruction and the agent reads it."""
    logdir, trace, result = dmlab30_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training done" in result.stderr
    inits = {e["pid"]: e for e in trace if e["event"] == "init"}
    first_seed = {}
    for e in trace:
        if e["event"] == "reset":
            first_seed.setdefault(e["pid"], (e["level"], e["seed"]))
    assert len(inits) == NUM_LEVELS  # one process per actor
    started = sorted(first_seed.values(), key=lambda level_seed: level_seed[1])
    expected = sorted(
        (
            dmlab30.LEVEL_PREFIX + name,
            np.random.RandomState(5 + i).randint(0, 2**31 - 1),
        )
        for i, name in enumerate(dmlab30.LEVEL_MAPPING)
    )
    assert sorted(started) == [(level, int(seed)) for level, seed in expected]
    for e in inits.values():
        assert e["observations"] == ["RGB_INTERLEAVED", "INSTR"]
        assert e["config"]["width"] == "96" and e["config"]["height"] == "72"
        assert "allowHoldOutLevels" not in e["config"]


@pytest.mark.slow
def test_dmlab30_test_mode_opens_the_hold_out_levels_and_scores_them(
    dmlab30_run, tmp_path
):
    """On the stand-in (episodes shortened to 60 frames, within one unroll:
    30 levels are played): the JSON and the human-normalised table of the 30
    test levels, each started with allowHoldOutLevels and the evaluation
    mixer seed."""
    logdir, _, result = dmlab30_run
    assert result.returncode == 0, result.stderr[-3000:]
    trace = str(tmp_path / "test.jsonl")
    test = STANDIN_LAB.run(
        command(
            *SMALL,
            "--level_name=dmlab30",
            f"--dataset_path={DATASET_PATH}",
            f"--logdir={logdir}",
            "--mode=test",
            "--test_num_episodes=1",
        ),
        timeout=300,
        DEEPMIND_LAB_STANDIN_TRACE=trace,
        DEEPMIND_LAB_STANDIN_EPISODE_FRAMES="60",
    )
    assert test.returncode == 0, test.stderr[-3000:]
    test_levels = [dmlab30.LEVEL_PREFIX + n for n in dmlab30.LEVEL_MAPPING.values()]
    with open(os.path.join(logdir, "test_results.json")) as f:
        results = json.load(f)
    assert sorted(results["levels"]) == sorted(test_levels)
    assert all(len(r["returns"]) == 1 for r in results["levels"].values())
    assert set(results["human_normalized"]) == {"no_cap", "cap_100"}
    rows = [ln.split()[0] for ln in test.stdout.splitlines() if ln.startswith("contr")]
    assert sorted(rows) == sorted(test_levels)
    assert re.search(r"dmlab30 human-normalised cap_100: -?[\d.]+ %", test.stdout)
    inits = [e for e in read_trace(trace) if e["event"] == "init"]
    assert sorted(e["level"] for e in inits) == sorted(test_levels)
    for e in inits:
        assert e["config"]["allowHoldOutLevels"] == "true"
        assert e["config"]["mixerSeed"] == EVALUATION_MIXER_SEED


# -- the level cache across runs, and the default level ------------------------------


@pytest.mark.slow
def test_the_level_cache_is_filled_by_one_run_and_hit_by_the_default_run(tmp_path):
    """On the stand-in: two short runs with the same seed, layout and
    --level_cache_dir. The first, on the level named, compiles its mazes and
    fills the cache; the second is the default run (no --level_name): with
    deepmind_lab it trains on explore_goal_locations_small without a
    warning (without it: the default run's test in newcomer_test, on
    atari/pong after one warning) and finds its mazes in the cache. Its
    actor's two environments share one process: the library's loader lets
    several Labs share a process (each gets its own copy of the engine;
    tests/dmlab_contract_test.py), and both train there."""
    cache = str(tmp_path / "cache")
    layout = (
        "--agent=shallow",
        "--num_actors=1",
        "--envs_per_actor=2",
        "--envs_per_process=2",
        "--batch_size=2",
        "--unroll_length=20",
        f"--level_cache_dir={cache}",
    )
    runs = {
        "first": [f"--level_name={LEVEL}", "--total_environment_frames=160"],
        "default": ["--total_environment_frames=320"],
    }
    hits, traces, results = [], {}, {}
    for run, args in runs.items():
        traces[run] = trace = str(tmp_path / f"{run}.jsonl")
        results[run] = result = STANDIN_LAB.run(
            command(*layout, *args, f"--logdir={tmp_path / run}"),
            timeout=240,
            DEEPMIND_LAB_STANDIN_TRACE=trace,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        hits.append(
            [e["hit"] for e in read_trace(traces[run]) if e["event"] == "cache"]
        )
        if run == "first":
            cached = sorted(os.listdir(cache))
    assert hits[0] and not any(hits[0])
    assert cached and all(name.startswith("explore_maze_noaas_") for name in cached)
    assert hits[1] and all(hits[1])
    assert sorted(os.listdir(cache)) == cached  # nothing new was compiled

    stderr = results["default"].stderr
    warnings = [ln for ln in stderr.splitlines() if "is not installed" in ln]
    (training,) = re.findall(r"\] Training (?!done).*", stderr)
    assert warnings == [] and f"Training {LEVEL}" in training
    assert "Training done" in stderr
    inits = [e["pid"] for e in read_trace(traces["default"]) if e["event"] == "init"]
    assert len(inits) == 2 and len(set(inits)) == 1, inits
