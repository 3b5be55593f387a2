"""A family's run defaults (EnvironmentFamily.default_flagfiles): single-machine
training of an Atari or ViZDoom level, list or suite takes the values of the
family's tested flag file for every flag it does not set, through the real
config path (experiment.apply_family_defaults, validate_flags,
config_from_flags); a flag on the command line or in a --flagfile wins over
each one; suites and lists get the file's frame target per level; the first
log line names the family, its file and the target. Cluster tasks (flags or
TF_CONFIG) take the same file but for the number of actors (the cluster's).
DeepMind Lab, a family without a file and test mode keep the flags' own
defaults (the reference's). A default that depends on a given flag follows it;
two given flags that contradict each other are one flag error."""

from __future__ import annotations

import logging
import os

import pytest

import config as config_lib
import experiment
from runtime.errors import FlagError

ATARI = "flagfiles/pong_shallow_unroll80.cfg"
ATARI_DEEP = "flagfiles/pong_deep.cfg"
VIZDOOM = "flagfiles/vizdoom_defend_the_center.cfg"
FLAG_DEFAULTS = dict(
    num_actors=4, envs_per_actor=1, envs_per_process=1, batch_size=2, unroll_length=100
)


def flags_for(*args: str):
    f = experiment.parse_flags(["experiment.py", *args])
    defaults = experiment.apply_family_defaults(f)
    experiment.validate_flags(f, defaults)
    return f, defaults


def config_for(*args: str):
    f, defaults = flags_for(*args)
    return experiment.config_from_flags(f, defaults)


@pytest.fixture(autouse=True)
def _fresh_flags():
    yield
    experiment.parse_flags(["experiment.py"])


def file_values(f, path: str, num_levels: int = 1) -> dict:
    """The flag file's values as its flags parse them, but --level_name; the
    per-level frame counts times `num_levels`."""
    values = config_lib.read_flag_file(path)
    values.pop("level_name")
    parsed = {name: f[name].parser.parse(value) for name, value in values.items()}
    for name in config_lib.PER_LEVEL_SETTINGS:
        parsed[name] *= num_levels
    return parsed


def flag_values(f, names) -> dict:
    return {name: f[name].value for name in names}


def layout_of(config) -> dict:
    run, learner = config.run, config.learner
    return dict(
        num_actors=run.num_actors,
        envs_per_actor=run.envs_per_actor,
        envs_per_process=run.envs_per_process,
        batch_size=learner.batch_size,
        unroll_length=learner.unroll_length,
    )


@pytest.mark.parametrize(
    "level,path",
    [("atari/breakout", ATARI), ("vizdoom/defend_the_center", VIZDOOM)],
)
def test_a_level_alone_gets_its_familys_flag_file(level, path):
    f, defaults = flags_for(f"--level_name={level}")
    expected = file_values(f, path)
    assert flag_values(f, expected) == expected
    assert len(expected) >= 10 and defaults.flagfile == path
    config = experiment.config_from_flags(f, defaults)
    assert config.environment.level_name == level
    assert config.agent.torso == expected["agent"] == "shallow"
    assert config.run.num_actors == expected["num_actors"]
    assert config.learner.batch_size == expected["batch_size"]
    assert config.learner.entropy_cost == expected["entropy_cost"]
    assert config.learner.learning_rate == expected["learning_rate"]
    assert config.learner.max_grad_norm == expected["max_grad_norm"]
    frames = expected["total_environment_frames"]
    assert config.learner.total_environment_frames == frames
    family = "Atari" if level.startswith("atari") else "ViZDoom"
    summary = config.summary()
    assert f"{family}'s defaults from {path}, its tested command" in summary
    assert f"{frames:,} frames" in summary
    assert f"--total_environment_frames={frames}" in summary


def test_the_deep_agent_gets_atari_deep_flag_file():
    f, defaults = flags_for("--level_name=atari/space_invaders", "--agent=deep")
    expected = file_values(f, ATARI_DEEP)
    expected.pop("agent")
    assert defaults.flagfile == ATARI_DEEP
    assert flag_values(f, expected) == expected
    assert f.agent == "deep"


def test_an_agent_without_a_file_of_its_own_takes_the_familys_first():
    f, defaults = flags_for("--level_name=vizdoom/defend_the_center", "--agent=deep")
    expected = file_values(f, VIZDOOM)
    expected.pop("agent")
    assert defaults.flagfile == VIZDOOM and f.agent == "deep"
    assert flag_values(f, expected) == expected


def test_a_suite_gets_the_target_per_level_and_an_actor_a_level():
    f, defaults = flags_for("--level_name=atari57")
    expected = file_values(f, ATARI, num_levels=57)
    layout = ("num_actors", "envs_per_actor", "envs_per_process")
    rest = {k: v for k, v in expected.items() if k not in layout}
    assert flag_values(f, rest) == rest
    # 4 actors of 32 games in the file: 57 actors (one a game) of 128 // 57.
    assert flag_values(f, layout) == dict(
        num_actors=57, envs_per_actor=2, envs_per_process=2
    )
    config = experiment.config_from_flags(f, defaults)
    per_level = file_values(f, ATARI)["total_environment_frames"]
    assert config.learner.total_environment_frames == 57 * per_level
    assert f"({per_level:,} frames a level x 57 levels)" in config.summary()


def test_a_level_list_gets_the_target_per_level(caplog):
    caplog.set_level(logging.WARNING, logger="absl")
    config = config_for("--level_name=atari/pong,atari/breakout")
    f = experiment.FLAGS
    expected = file_values(f, ATARI, num_levels=2)
    assert flag_values(f, expected) == expected
    assert (
        config.learner.total_environment_frames == expected["total_environment_frames"]
    )
    assert config.learner.decay_frames == expected["learning_rate_decay_frames"]
    assert not [r for r in caplog.records if "get no actor" in r.getMessage()]


def test_a_command_line_flag_wins_over_each_default():
    f, defaults = flags_for(
        "--level_name=atari/breakout", "--entropy_cost=0.02", "--num_actors=2"
    )
    expected = file_values(f, ATARI)
    assert expected["entropy_cost"] != 0.02 and expected["num_actors"] != 2
    assert (f.entropy_cost, f.num_actors) == (0.02, 2)
    assert "entropy_cost" not in defaults.values
    assert f.envs_per_actor == expected["envs_per_actor"]
    assert f.batch_size == expected["batch_size"]


def test_a_flagfile_wins_over_each_default(tmp_path):
    flagfile = tmp_path / "mine.cfg"
    flagfile.write_text("--learning_rate=0.001\n--total_environment_frames=5000\n")
    f, _ = flags_for("--level_name=atari/breakout", f"--flagfile={flagfile}")
    expected = file_values(f, ATARI)
    assert (f.learning_rate, f.total_environment_frames) == (0.001, 5000)
    assert f.entropy_cost == expected["entropy_cost"]


def test_the_default_level_with_deepmind_lab_keeps_the_references_settings(
    monkeypatch,
):
    """The stand-in on the path, as the real library would be."""
    from dmlab_helpers import STANDIN, DeepMindLab

    import environments

    DeepMindLab(STANDIN).in_process(monkeypatch)
    for args in ([], ["--level_name=contributed/dmlab30/rooms_watermaze"]):
        f, defaults = flags_for("--level_cache_dir=", *args)
        assert defaults is None
        config = experiment.config_from_flags(f, defaults)
        if not args:
            assert config.environment.level_name == environments.DEFAULT_LEVEL
        assert layout_of(config) == FLAG_DEFAULTS
        assert config.agent.torso == "deep"
        assert config.learner.total_environment_frames == 10**9
        assert config.learner.entropy_cost == 0.00025
        assert config.learner.learning_rate == 0.00048
        assert "defaults from" not in config.summary()


def test_a_family_without_a_flag_file_keeps_the_flags_defaults(monkeypatch):
    import toy_family

    import environments

    monkeypatch.setattr(environments, "_FAMILIES", list(environments.families()))
    environments.register(toy_family.FAMILY)
    config = config_for("--level_name=toy/corridor_3", "--agent=shallow")
    assert layout_of(config) == FLAG_DEFAULTS
    assert "defaults from" not in config.summary()


def test_test_mode_keeps_the_flags_defaults_and_cluster_tasks_take_the_file(
    tmp_path, monkeypatch
):
    test = config_for("--mode=test", "--level_name=atari/pong", f"--logdir={tmp_path}")
    assert layout_of(test) == FLAG_DEFAULTS
    file_layout = dict(
        num_actors=4,
        envs_per_actor=32,
        envs_per_process=32,
        batch_size=8,
        unroll_length=80,
    )
    single = config_for("--level_name=atari/pong")
    assert layout_of(single) == file_layout
    task = config_for("--level_name=atari/pong", "--job_name=actor", "--task=0")
    # The same experiment as on one machine; its actors are the cluster's.
    assert layout_of(task) == file_layout
    assert task.learner == single.learner and task.agent == single.agent
    assert f"Atari's defaults from {ATARI}" in task.summary()
    assert "--num_actors" not in task.summary().split("defaults from", 1)[1]
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"learner": ["localhost:1"], "actor": ["localhost:2"]}, '
        '"task": {"type": "learner", "index": 0}}',
    )
    task = config_for("--level_name=atari/pong")
    assert layout_of(task) == file_layout
    assert task.learner == single.learner and task.agent == single.agent


@pytest.mark.parametrize(
    "given,envs_per_process", [(1, 1), (4, 4), (48, 24), (64, 32), (33, 11)]
)
def test_a_default_that_depends_on_a_given_flag_follows_it(given, envs_per_process):
    """--envs_per_actor alone: the file's 32 environments a process become
    the most that divide it."""
    config = config_for("--level_name=atari/breakout", f"--envs_per_actor={given}")
    assert config.run.envs_per_actor == given
    assert config.run.envs_per_process == envs_per_process


def test_the_record_names_the_given_flag_a_derived_default_followed():
    """The value that followed --envs_per_actor is said to come from it, not
    from the family's file, whose value differs."""
    from run_helpers import resolved_settings

    settings = resolved_settings("--level_name=atari/pong", "--envs_per_actor=1")
    assert settings["envs_per_process"] == {
        "value": 1,
        "source": "--envs_per_actor=1 (the most that divides it; "
        "flagfiles/pong_shallow_unroll80.cfg has 32)",
    }
    # A value taken from the file as it is still names the file.
    settings = resolved_settings("--level_name=atari/pong", "--envs_per_actor=64")
    assert settings["envs_per_process"] == {
        "value": 32,
        "source": "family defaults (flagfiles/pong_shallow_unroll80.cfg)",
    }


def test_two_given_flags_that_contradict_each_other_are_one_error(tmp_path):
    f = experiment.parse_flags(
        [
            "experiment.py",
            "--level_name=atari/breakout",
            "--envs_per_actor=4",
            "--envs_per_process=3",
            f"--logdir={tmp_path / 'run'}",
        ]
    )
    defaults = experiment.apply_family_defaults(f)
    with pytest.raises(FlagError) as e:
        experiment.validate_flags(f, defaults)
    message = str(e.value)
    assert message.startswith("--envs_per_process=3: must divide --envs_per_actor=4")
    assert "\n" not in message
    assert experiment.run_mode(f) == 2
    assert not os.path.exists(tmp_path / "run")


def test_torso_dtype_auto_is_resolved_and_said(monkeypatch):
    from runtime import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2"}))
    config = config_for("--level_name=atari/pong", "--agent=deep", "--torso_dtype=auto")
    assert config.agent.torso_dtype == "float32"
    assert "--torso_dtype=auto: float32, this CPU has no bfloat16" in config.summary()
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    config = config_for("--level_name=atari/pong", "--agent=deep", "--torso_dtype=auto")
    assert config.agent.torso_dtype == "bfloat16"
    assert "(bfloat16 torso)" in config.summary()


def test_a_run_whose_actors_cannot_cover_its_levels_is_warned(caplog):
    caplog.set_level(logging.WARNING, logger="absl")
    config_for("--level_name=atari57", "--num_actors=4")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        w.startswith("--num_actors=4: 53 of the 57 levels of atari57")
        and "use --num_actors=57 or more" in w
        for w in warnings
    ), warnings
    caplog.clear()
    config_for("--level_name=atari57")
    assert not [r for r in caplog.records if "get no actor" in r.getMessage()]
    assert config_lib.unplayed_levels_warning("atari57", 57, 57) is None
    assert config_lib.unplayed_levels_warning("atari/pong", 1, 4) is None
