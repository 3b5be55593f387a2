"""A population's member (pbt/member.py): its settings, joining, a copy of
another member's weights into a running learner, the lineage, and two
members of a population on Breakout through experiment.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import tensorflow as tf
from run_helpers import REPO_ROOT, SMALL, command, run_command_line, run_experiment

from config import LearnerConfig
from learner.hyperparameters import MutableHyperparameters
from pbt import member as member_lib
from pbt import records
from runtime import settings
from runtime.errors import FlagError


def values(**changes):
    """The declared defaults of the population settings (and --seed)."""
    names = [s.name for s in settings.SETTINGS if s.section == "population"]
    base = {name: settings.DEFAULTS[name] for name in [*names, "seed"]}
    return {**base, "population_dir": "/tmp/p", "population_member": 0, **changes}


@pytest.mark.parametrize(
    "changes,expected",
    [
        ({"population_size": 1}, "--population_size=1: a population needs at least 2"),
        ({"population_member": 24}, "--population_member=24: give this run's index"),
        (
            {"pbt_hyperparameters": "learning_rate,discounting"},
            "--pbt_hyperparameters=learning_rate,discounting: discounting; choose",
        ),
        (
            {"pbt_learning_rate_prior": "1e-3,1e-5"},
            "--pbt_learning_rate_prior=1e-3,1e-5: learning_rate: a log-uniform "
            "prior needs 0 < low <= high",
        ),
        ({"pbt_entropy_cost_prior": "a,b"}, "--pbt_entropy_cost_prior=a,b: give"),
        ({"pbt_perturb_factor": 1.0}, "--pbt_perturb_factor=1.0: must be > 1"),
        ({"pbt_ready_episodes": 0}, "--pbt_ready_episodes=0: must be >= 1"),
    ],
)
def test_bad_population_settings_are_one_line_naming_the_flag(changes, expected):
    with pytest.raises(FlagError) as error:
        member_lib.population_config(values(**changes))
    assert str(error.value).startswith(expected), str(error.value)
    assert "\n" not in str(error.value)


def test_the_paper_is_the_default():
    population = member_lib.population_config(values())
    assert population.size == 24
    assert population.rule == member_lib.Rule()
    assert list(population.priors) == member_lib.paper_priors()
    assert member_lib.population_config(values(population_dir="")) is None


def test_a_member_joins_once_and_a_restart_continues_as_it(tmp_path):
    population = member_lib.population_config(
        values(population_dir=str(tmp_path), population_size=2, seed=3)
    )
    defaults = {"learning_rate": 1.0, "entropy_cost": 1.0, "epsilon": 1.0}
    defaults["max_grad_norm"] = 40.0
    first = member_lib.Member(population, "/runs/m0", ["atari/pong"]).join(defaults)
    # Drawn from the priors; the one that does not evolve keeps the run's.
    assert 5e-6 <= first["learning_rate"] <= 5e-3
    assert first["epsilon"] in (0.1, 1e-3, 1e-5, 1e-7)
    assert first["max_grad_norm"] == 40.0
    again = member_lib.Member(population, "/runs/m0", ["atari/pong"]).join(defaults)
    assert again == first
    with pytest.raises(FlagError, match="trains in /runs/m0, not --logdir=/runs/x"):
        member_lib.Member(population, "/runs/x", ["atari/pong"]).join(defaults)
    # Another member in the same logdir: refused.
    second = member_lib.population_config(
        values(population_dir=str(tmp_path), population_size=2, population_member=1)
    )
    with pytest.raises(FlagError, match="member 0 of .* trains there"):
        member_lib.Member(second, "/runs/m0", ["atari/pong"]).join(defaults)
    # Another population's settings in the same directory: refused.
    other = member_lib.population_config(
        values(population_dir=str(tmp_path), population_size=3, population_member=2)
    )
    with pytest.raises(FlagError, match="the population's size is 2, this run's 3"):
        member_lib.Member(other, "/runs/m2", ["atari/pong"]).join(defaults)


def member_1_of_2(shared: str, **changes):
    """Member 1 of a population of 2 in `shared`, ready after its first
    episode."""
    return member_lib.population_config(
        values(
            population_dir=shared,
            population_member=1,
            population_size=2,
            pbt_burn_in_frames=0,
            pbt_ready_episodes=1,
            **changes,
        )
    )


def test_a_copy_restores_the_donors_weights_and_settles_with_the_next_checkpoint(
    tmp_path,
):
    shared, donor_dir, own_dir = (str(tmp_path / n) for n in ("p", "m0", "m1"))
    population = member_1_of_2(shared, pbt_perturb_probability=1.0)
    learner = LearnerConfig(
        batch_size=1, unroll_length=1, num_action_repeats=1, total_environment_frames=9
    )
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.Variable([1.0, 2.0], name="weights")
        hyper = MutableHyperparameters(learner)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            # The donor: member 0, better, with a whole checkpoint.
            weights.load([7.0, 8.0], session)
            step.load(500, session)
            donor_checkpoint = saver.save(session, f"{donor_dir}/model.ckpt", 500)
            records.write_member(
                shared,
                0,
                {
                    "member": 0,
                    "logdir": donor_dir,
                    "frames": 500,
                    "fitness": 90.0,
                    "episodes_since_evolution": 3,
                    "hyperparameters": {
                        "learning_rate": 1e-3,
                        "entropy_cost": 1e-2,
                        "epsilon": 1e-3,
                        "max_grad_norm": 40.0,
                    },
                    "checkpoint": donor_checkpoint,
                },
            )
            # This member: its own weights and frames.
            weights.load([1.0, 2.0], session)
            step.load(100, session)
            member = member_lib.Member(population, own_dir, ["atari/pong"])
            member.join({n: getattr(learner, n) for n in hyper.variables})
            own_checkpoint = saver.save(session, f"{own_dir}/model.ckpt", 100)
            member.build()
            member.write_secs = 0.0  # a record write at every step
            # No episode yet: not ready; the record names its checkpoint.
            member.after_step(session, 100, [], hyper)
            assert records.read_member(shared, 1)["checkpoint"] == own_checkpoint
            before = records.read_member(shared, 1)["hyperparameters"]
            member.after_step(session, 100, [("atari/pong", -21.0)], hyper)
            # Copied: the donor's weights, its own frame count, the donor's
            # hyperparameters each perturbed by exactly 1.2 either way.
            assert session.run(weights).tolist() == [7.0, 8.0]
            assert session.run(step) == 100
            now = hyper.read(session)
            for name, donor in (("learning_rate", 1e-3), ("entropy_cost", 1e-2)):
                assert now[name] / donor == pytest.approx(1.2) or now[
                    name
                ] / donor == pytest.approx(1 / 1.2)
            # One step from 1e-3 (read back in float32).
            assert any(now["epsilon"] == pytest.approx(c) for c in (1e-5, 0.1))
            # Not its own until a checkpoint after the copy: the record keeps
            # the checkpoint and hyperparameters from before.
            record = records.read_member(shared, 1)
            assert record["checkpoint"] == own_checkpoint
            assert record["hyperparameters"] == before
            assert records.read_lineage(shared) == []
            step.load(120, session)
            saver.save(session, f"{own_dir}/model.ckpt", 120)
            member.after_step(session, 120, [], hyper)
    record = records.read_member(shared, 1)
    assert record["hyperparameters"] == pytest.approx(now)
    assert record["evolutions"] == 1
    (event,) = records.read_lineage(shared)
    assert event["copied_from"] == 0 and event["donor_checkpoint"] == donor_checkpoint
    assert event["frames"] == 100 and event["after"] == pytest.approx(now)
    assert 0 <= event["copy_seconds"] < 60
    assert sorted(event["perturbed"]) == ["entropy_cost", "epsilon", "learning_rate"]


def test_a_ready_member_that_cannot_evolve_reads_the_others_once_a_write_period(
    tmp_path, monkeypatch
):
    shared = str(tmp_path / "p")
    population = member_1_of_2(shared)
    member = member_lib.Member(population, str(tmp_path / "m1"), ["atari/pong"])
    member.join({"learning_rate": 1e-3, "entropy_cost": 1e-2, "epsilon": 0.1})
    reads = []
    real_read = records.read_members
    monkeypatch.setattr(
        records, "read_members", lambda d: reads.append(d) or real_read(d)
    )
    # Ready from its first episode on, alone in the population: nobody to
    # compare with, at every one of 50 learner steps.
    member.write_secs = 60.0
    for frames in range(100, 5100, 100):
        member.after_step(None, frames, [("atari/pong", -21.0)], None)
    assert reads == [shared]
    assert records.read_lineage(shared) == []
    # Once the period is over it looks again.
    member.write_secs = 0.0
    member._next_try = 0.0  # noqa: SLF001
    member.after_step(None, 5100, [("atari/pong", -20.0)], None)
    assert reads == [shared, shared]


def test_a_logdir_of_another_populations_member_is_refused(tmp_path):
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "run_record.json").write_text(
        json.dumps(
            {
                "settings": {
                    "population_dir": {"value": "/elsewhere", "source": "x"},
                    "population_member": {"value": 0, "source": "x"},
                }
            }
        )
    )
    population = member_lib.population_config(
        values(population_dir=str(tmp_path / "p"), population_size=2)
    )
    with pytest.raises(FlagError) as error:
        member_lib.Member(population, str(logdir), ["atari/pong"]).join({})
    assert not (tmp_path / "p").exists()  # nothing written
    assert str(error.value) == (
        f"--logdir={logdir}: its run is member 0 of the population in /elsewhere, "
        f"not member 0 of {tmp_path / 'p'}; give each member a --logdir of its own."
    )


def test_a_population_directory_that_cannot_be_written_is_refused(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    logdir = tmp_path / "run"
    code = run_command_line(
        *SMALL,
        f"--logdir={logdir}",
        f"--population_dir={blocked}/population",
        "--population_member=0",
        "--population_size=2",
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(
        f"experiment.py: error: --population_dir={blocked}/population:"
    )
    assert "\n" not in err
    assert not logdir.exists()


@pytest.mark.slow
def test_two_members_on_breakout_one_copies_the_other_through_a_kill(tmp_path):
    shared = tmp_path / "population"
    common = [
        *SMALL,
        # Breakout's episodes (a life each) end within a few hundred frames
        # of a random policy, Pong's after thousands: members become ready
        # on small budgets.
        "--level_name=atari/breakout",
        f"--population_dir={shared}",
        "--population_size=2",
        # Member 1 evolves once it has a checkpoint past its start (one a
        # second), so that the kill below leaves one to resume from.
        "--pbt_burn_in_frames=2000",
        "--pbt_ready_episodes=1",
        "--pbt_perturb_probability=1",
        "--save_checkpoint_secs=1",
        "--progress_secs=2",
        "--total_environment_frames=3000",
    ]
    first = run_experiment(
        *common, "--population_member=0", f"--logdir={tmp_path / 'm0'}"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    record = records.read_member(str(shared), 0)
    assert record["frames"] >= 3000 and record["fitness"] is not None
    assert record["checkpoint"] == tf.train.latest_checkpoint(str(tmp_path / "m0"))
    # A stand-in for a better member: a population this small and short
    # cannot be relied on to have one, and the rule's test is unit-tested.
    record["fitness"] = 1000.0
    records.write_member(str(shared), 0, record)

    # Member 1, killed (SIGKILL) as soon as it has copied member 0.
    # Its budget leaves it time for games (and evolutions) after a restart.
    member_1 = [
        *common,
        "--population_member=1",
        f"--logdir={tmp_path / 'm1'}",
        "--total_environment_frames=6000",
    ]
    log = tmp_path / "m1.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command(*member_1), cwd=REPO_ROOT, stderr=out)
    try:
        deadline = time.monotonic() + 150
        # (And once it has a checkpoint past its start to resume from: the
        # burn-in and a checkpoint a second make that so before the copy
        # unless the machine is fast enough for 2,000 frames in a second.)
        while True:
            text = log.read_text()
            if "copied member 0" in text and re.search(
                r"Saving checkpoints for [1-9]", text
            ):
                break
            assert process.poll() is None, text[-3000:]
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.2)
        process.kill()
    finally:
        process.kill()
        process.wait()
    # Whatever the kill interrupted, the records are whole and agree: an
    # evolution is in the lineage only with a checkpoint after it.
    drawn = records.read_member(str(shared), 1)
    lineage = records.read_lineage(str(shared))
    if lineage:
        assert drawn["hyperparameters"] == pytest.approx(lineage[-1]["after"])
    else:
        assert drawn["evolutions"] == 0
    assert set(records.read_members(str(shared))) == {0, 1}

    # The same command continues member 1 from its last whole checkpoint.
    second = run_experiment(*member_1)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming from a checkpoint at" in second.stderr
    lineage = records.read_lineage(str(shared))
    assert lineage and all(e["member"] == 1 for e in lineage)
    assert all(e["copied_from"] == 0 for e in lineage)
    assert lineage[0]["donor_checkpoint"] == record["checkpoint"]
    assert all(e["perturbed"] for e in lineage)
    final = records.read_member(str(shared), 1)
    assert final["hyperparameters"] == pytest.approx(lineage[-1]["after"])
    assert final["evolutions"] == len(lineage)
    # Each member's run record names its population.
    with open(os.path.join(tmp_path, "m1", "run_record.json")) as f:
        recorded = json.load(f)["settings"]
    assert recorded["population_dir"]["value"] == str(shared)
    assert recorded["population_member"]["value"] == 1
