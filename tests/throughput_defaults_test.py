"""A family's throughput defaults (EnvironmentFamily.throughput_defaults):
an Atari or ViZDoom run that sets no layout flag gets the fastest measured layout for
its agent and says so in its first log line; any layout flag on the command
line, test mode, a cluster task and a family without defaults keep the
flags' own values (the paper's). A run with fewer actors than levels is
warned that some levels are never played."""

from __future__ import annotations

import logging

import pytest

import config
import experiment

LAYOUT = config.LAYOUT_SETTINGS


def config_for(*args: str):
    flags = experiment.parse_flags(["experiment.py", *args])
    experiment.validate_flags(flags)
    return experiment.config_from_flags(flags)


def layout_of(config) -> dict:
    run, learner = config.run, config.learner
    return dict(
        num_actors=run.num_actors,
        envs_per_actor=run.envs_per_actor,
        envs_per_process=run.envs_per_process,
        batch_size=learner.batch_size,
        unroll_length=learner.unroll_length,
    )


FLAG_DEFAULTS = dict(
    num_actors=4, envs_per_actor=1, envs_per_process=1, batch_size=2, unroll_length=100
)


@pytest.mark.parametrize(
    "agent,expected",
    [
        (
            "shallow",
            dict(
                num_actors=4,
                envs_per_actor=32,
                envs_per_process=32,
                batch_size=32,
                unroll_length=20,
            ),
        ),
        (
            "deep",
            dict(
                num_actors=8,
                envs_per_actor=4,
                envs_per_process=4,
                batch_size=32,
                unroll_length=20,
            ),
        ),
    ],
)
def test_an_atari_run_without_layout_flags_gets_the_familys_fastest_layout(
    agent, expected
):
    config = config_for("--level_name=atari/pong", f"--agent={agent}")
    assert layout_of(config) == expected
    summary = config.summary()
    assert f"Atari's throughput defaults for the {agent} agent (" in summary
    assert f"--num_actors={expected['num_actors']}" in summary
    assert "no layout flag given" in summary


@pytest.mark.parametrize("given", LAYOUT)
def test_any_layout_flag_keeps_the_flags_own_defaults(given):
    value = {"envs_per_process": 1}.get(given, 3)
    config = config_for(
        "--level_name=atari/pong", "--agent=shallow", f"--{given}={value}"
    )
    assert layout_of(config) == dict(FLAG_DEFAULTS, **{given: value})
    assert "throughput defaults" not in config.summary()


def test_a_family_without_defaults_keeps_the_flags_defaults(monkeypatch):
    import toy_family

    import environments

    monkeypatch.setattr(environments, "_FAMILIES", list(environments.families()))
    environments.register(toy_family.FAMILY)
    config = config_for("--level_name=toy/corridor_3", "--agent=shallow")
    assert layout_of(config) == FLAG_DEFAULTS
    assert "throughput defaults" not in config.summary()


# One layout for both agents (families/doom.py).
VIZDOOM_DEFAULTS = dict(
    num_actors=4,
    envs_per_actor=16,
    envs_per_process=16,
    batch_size=32,
    unroll_length=20,
)


@pytest.mark.parametrize("agent", ["shallow", "deep", None])
def test_a_vizdoom_run_without_layout_flags_gets_the_familys_fastest_layout(agent):
    """No --agent: the flag's default (deep), as `--level_name=vizdoom/...`
    alone runs."""
    args = ["--level_name=vizdoom/defend_the_center"]
    if agent is not None:
        args.append(f"--agent={agent}")
    config = config_for(*args)
    assert layout_of(config) == VIZDOOM_DEFAULTS
    assert f"ViZDoom's throughput defaults for the {agent or 'deep'} agent (" in (
        config.summary()
    )


@pytest.mark.parametrize("given", ["num_actors", "batch_size"])
def test_a_vizdoom_layout_flag_keeps_the_flags_own_defaults(given):
    config = config_for(
        "--level_name=vizdoom/defend_the_center", "--agent=shallow", f"--{given}=3"
    )
    assert layout_of(config) == dict(FLAG_DEFAULTS, **{given: 3})
    assert "throughput defaults" not in config.summary()


def test_test_mode_and_cluster_tasks_keep_the_flags_defaults(tmp_path, monkeypatch):
    test = config_for("--mode=test", "--level_name=atari/pong", f"--logdir={tmp_path}")
    assert layout_of(test) == FLAG_DEFAULTS
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"learner": ["localhost:1"], "actor": ["localhost:2"]}, '
        '"task": {"type": "learner", "index": 0}}',
    )
    task = config_for("--level_name=atari/pong", "--agent=shallow")
    assert layout_of(task) == FLAG_DEFAULTS


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
    # Atari's shallow defaults have 4 actors; the Atari-57 suite has 57 levels.
    config_for("--level_name=atari57", "--agent=shallow")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        w.startswith("--num_actors=4: 53 of the 57 levels of atari57")
        and "use --num_actors=57 or more" in w
        for w in warnings
    ), warnings
    caplog.clear()
    config_for("--level_name=atari57", "--agent=shallow", "--num_actors=57")
    assert not [r for r in caplog.records if "get no actor" in r.getMessage()]
    assert config.unplayed_levels_warning("atari57", 57, 57) is None
    assert config.unplayed_levels_warning("atari/pong", 1, 4) is None
