"""The environment seam: a family written outside the project (toy_family.py)
and registered by a script of its own trains and tests end to end through
experiment.py, and the registry asks each question of the family that owns
the level."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import toy_family
from run_helpers import REPO_ROOT

import environments
from families import atari, dmlab
from families.contract import FamilyFlag
from runtime.errors import FlagError

SCRIPT = os.path.join(REPO_ROOT, "tests", "train_with_toy_family.py")
SMALL = [
    "--agent=shallow",
    "--num_actors=2",
    "--batch_size=2",
    "--unroll_length=20",
    "--num_action_repeats=1",
]


@pytest.fixture
def with_toy_family(monkeypatch):
    """The toy family registered in this process for one test."""
    monkeypatch.setattr(environments, "_FAMILIES", list(environments.families()))
    environments.register(toy_family.FAMILY)


def test_the_registry_asks_the_family_that_owns_the_level(with_toy_family):
    assert environments.family_of("toy/corridor_5") is toy_family.FAMILY
    assert environments.family_of("atari/pong") is atari.FAMILY
    assert environments.expand_level_names("toy2") == [
        "toy/corridor_3",
        "toy/corridor_5",
    ]
    assert environments.num_actions(["toy/corridor_3", "toy/corridor_5"]) == 2
    assert not environments.has_instructions(["toy/corridor_3"])
    env_type, kwargs = environments.environment_class("toy/corridor_4", seed=3)
    assert env_type is toy_family.ToyCorridor and kwargs["length"] == 4
    assert environments.suite_scores("toy2", {"a": [1.0], "b": [0.0]}) == {
        "mean_return": 0.5
    }
    assert environments.level_score("toy/corridor_3", [1.0]) is None


def test_the_registry_reports_a_familys_unknown_level_with_close_names(
    with_toy_family,
):
    with pytest.raises(ValueError) as info:
        environments.expand_level_names("toy/corridor_12")
    message = str(info.value)
    assert message.startswith("Unknown --level_name='toy/corridor_12': toy corridors")
    assert "toy/corridor_" in message.split("Closest valid names:")[1]
    # The list of valid forms comes from the registered families, the toy
    # family's included.
    assert "'toy/corridor_<3 to 9>', 'toy2'" in message.split("Valid:")[1]
    with pytest.raises(ValueError, match="Cannot mix Toy and Atari levels"):
        environments.num_actions(["toy/corridor_3", "atari/pong"])
    with pytest.raises(ValueError, match="is a suite"):
        environments.environment_class("toy2", seed=1)


def test_a_family_registered_twice_is_asked_once(with_toy_family):
    before = environments.families()
    environments.register(toy_family.FAMILY)
    assert environments.families() == before


def test_a_family_can_take_a_registered_familys_place(monkeypatch):
    """register(..., replace=) puts a wrapping family where the one it
    replaces was: it owns the same names, and the replaced one is gone."""
    import nan_rewards

    monkeypatch.setattr(environments, "_FAMILIES", list(environments.families()))
    position = environments.families().index(atari.FAMILY)
    environments.register(nan_rewards.FAMILY, replace=atari.FAMILY)
    assert environments.families()[position] is nan_rewards.FAMILY
    assert atari.FAMILY not in environments.families()
    monkeypatch.setenv(nan_rewards.AT_STEP_VARIABLE, "7")
    env_type, kwargs = environments.environment_class("atari/pong", seed=1)
    assert env_type is nan_rewards.NanRewardAtari and kwargs["nan_at_step"] == 7
    with pytest.raises(ValueError, match="cannot replace Atari: it is not"):
        environments.register(toy_family.FAMILY, replace=atari.FAMILY)


def test_a_family_owns_its_flags(with_toy_family):
    """The toy family's --toy_goal_reward: defined by experiment.py from the
    family's declaration, checked there, and turned into the family's
    options, which reach the environment's constructor."""
    import experiment

    f = experiment.parse_flags(
        ["experiment.py", "--level_name=toy2", "--toy_goal_reward=2.5"]
    )
    experiment.validate_flags(f)
    config = experiment.config_from_flags(f)
    assert config.environment.options == toy_family.ToyOptions(goal_reward=2.5)
    options = environments.run_options("toy/corridor_3", config.environment)
    _, kwargs = environments.environment_class("toy/corridor_3", 1, **options)
    assert kwargs["goal_reward"] == 2.5

    f = experiment.parse_flags(["experiment.py", "--toy_goal_reward=0"])
    with pytest.raises(FlagError, match=r"^--toy_goal_reward=0.0: must be > 0"):
        experiment.validate_flags(f)
    experiment.parse_flags(["experiment.py"])


def test_a_run_records_the_flags_of_the_families_registered_now(monkeypatch):
    """A family's flag stays defined in this process once its family has left
    the registry (absl keeps it); a run's settings are those of the families
    registered when it starts, so the toy family's flag is recorded while it
    is registered and not after (as when test files share one process)."""
    import experiment

    registered = list(environments.families())
    monkeypatch.setattr(environments, "_FAMILIES", list(registered))
    environments.register(toy_family.FAMILY)
    f = experiment.parse_flags(["experiment.py", "--level_name=toy2"])
    assert "toy_goal_reward" in experiment.experiment_flag_names(f)
    monkeypatch.setattr(environments, "_FAMILIES", list(registered))
    f = experiment.parse_flags(["experiment.py"])
    assert "toy_goal_reward" in f  # still defined
    names = experiment.experiment_flag_names(f)
    assert "toy_goal_reward" not in names
    assert {"width", "level_cache_dir", "agent"} <= set(names)


def test_a_family_flag_may_not_take_another_flags_name(monkeypatch):
    import experiment

    class Clash(toy_family.ToyFamily):
        name = "Clash"
        flags = (FamilyFlag("batch_size", 1, "Taken already."),)

    monkeypatch.setattr(environments, "_FAMILIES", list(environments.families()))
    environments.register(Clash())
    with pytest.raises(ValueError, match="Clash declares --batch_size, a flag already"):
        experiment.define_family_flags()


def test_experiment_py_defines_no_familys_flag():
    """Every family flag comes from its family's declaration: experiment.py
    names none of them in a DEFINE call (the families read from the
    registry, so a family added later is checked too)."""
    source = (Path(REPO_ROOT) / "experiment.py").read_text(encoding="utf-8")
    for family in environments.families():
        for flag in family.flags:
            assert not re.search(rf"DEFINE_\w+\(\s*[\"']{flag.name}[\"']", source)
    assert {flag.name for flag in dmlab.FAMILY.flags} == {
        "width",
        "height",
        "dataset_path",
        "level_cache_dir",
    }


def test_without_registration_the_toy_levels_are_unknown():
    assert toy_family.FAMILY not in environments.families()
    with pytest.raises(ValueError, match="Unknown --level_name='toy2'"):
        environments.expand_level_names("toy2")


def run_script(*args: str, timeout: float = 180):
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_a_family_registered_by_a_script_trains_and_tests_end_to_end(tmp_path):
    logdir = str(tmp_path / "run")
    train = run_script(
        *SMALL,
        "--level_name=toy2",
        f"--logdir={logdir}",
        "--total_environment_frames=2000",
        "--toy_goal_reward=2",
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert re.search(
        r"Training toy2 \(2 levels, 2 actions\), shallow agent", train.stderr
    )
    for level in ("toy/corridor_3", "toy/corridor_5"):
        assert re.search(
            rf"Episode on {level}: return [02]\.0, \d+ frames", train.stderr
        )
    assert "Training done: 2000 environment frames" in train.stderr

    test = run_script(
        *SMALL,
        "--level_name=toy2",
        f"--logdir={logdir}",
        "--mode=test",
        "--test_num_episodes=3",
    )
    assert test.returncode == 0, test.stderr[-3000:]
    with open(os.path.join(logdir, "test_results.json")) as f:
        results = json.load(f)
    assert sorted(results["levels"]) == ["toy/corridor_3", "toy/corridor_5"]
    assert all(len(r["returns"]) == 3 for r in results["levels"].values())
    assert set(results["human_normalized"]) == {"mean_return"}
    assert "toy2 human-normalised mean_return:" in test.stdout


def test_a_family_that_limits_environments_per_process_says_so():
    """`max_envs_per_process` (no family of the project sets one: DeepMind
    Lab allows several Labs to a process) gives one flag error above it."""

    class TwoToAProcess(toy_family.ToyFamily):
        max_envs_per_process = 2

    family = TwoToAProcess()
    assert family.envs_per_process_problem(2, "toy/corridor") is None
    assert family.envs_per_process_problem(4, "toy/corridor") == (
        "--envs_per_process=4: Toy runs 2 levels per process, and "
        "--level_name=toy/corridor has Toy levels; use --envs_per_process=2 "
        "(several environments to a process are for families that allow it, "
        "such as Atari)."
    )
    assert toy_family.FAMILY.envs_per_process_problem(64, "toy/corridor") is None
