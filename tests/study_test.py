"""The study runner (benchmarks/study.py) on the real experiment.py at a
tiny budget: two Atari arms trained and tested in order, a record each;
a complete record skipped; an arm stopped part-way continued from its
checkpoint with its curve kept; another commit's unfinished record and a
truncated record refused, nothing overwritten. And the Atari-5 suites."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from run_helpers import REPO_ROOT

sys.path.insert(0, REPO_ROOT)

import environments  # noqa: E402
from benchmarks import study  # noqa: E402
from benchmarks.studies import (  # noqa: E402
    atari_study,
    off_policy_study,
    pbt_study,
    runner,
)
from benchmarks.studies import records as study_records  # noqa: E402
from families import atari57  # noqa: E402

STUDY = os.path.join(REPO_ROOT, "benchmarks", "study.py")
TINY = (
    "--num_actors=1 --envs_per_actor=2 --envs_per_process=2 --batch_size=1 "
    "--unroll_length=20 --agent=shallow --progress_secs=1"
)
FRAMES = 4000


def study_command(tmp_path, *args) -> list[str]:
    return [
        sys.executable,
        STUDY,
        f"--results={tmp_path / 'results'}",
        f"--logdir_root={tmp_path / 'runs'}",
        "--test_episodes=2",
        "--point_minutes=0.05",
        *args,
    ]


def run_study(tmp_path, *args, timeout=300):
    return subprocess.run(
        study_command(tmp_path, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Breakout to a budget it reaches; Pong to one it cannot reach before the
# test stops it.
ARMS = (
    f"--arm=breakout: --level_name=atari/breakout {TINY} "
    f"--total_environment_frames={FRAMES}",
    f"--arm=pong: --level_name=atari/pong {TINY} --total_environment_frames=400000",
)


def start_study(tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen(
        study_command(tmp_path, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_record(path, ready, timeout: float = 240.0) -> dict:
    """The record at `path` once `ready(record)`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if record is not None and ready(record):
            return record
        time.sleep(0.5)
    raise AssertionError(f"{path} never got there")


@pytest.mark.slow
def test_arms_train_in_order_continue_after_a_stop_and_are_skipped_once_complete(
    tmp_path,
):
    results = tmp_path / "results"
    # First: Breakout trains to its budget and is tested; Pong starts, and a
    # SIGINT to the study once Pong has frames stops it with a checkpoint.
    first = start_study(tmp_path, *ARMS)
    try:
        wait_for_record(results / "pong.json", lambda r: r.get("frames", 0) > 0)
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 1, err[-3000:]
    breakout = json.loads((results / "breakout.json").read_text())
    assert breakout["complete"] is True
    assert breakout["frames"] >= FRAMES == breakout["frames_target"]
    assert breakout["command"].startswith(
        "python3 experiment.py --level_name=atari/breakout"
    )
    assert f"--logdir={tmp_path / 'runs' / 'breakout'}" in breakout["command"]
    assert breakout["commit"] == runner.code_commit()["commit"]
    assert breakout["machine"]["nproc"] == os.cpu_count()
    assert breakout["segments"][0]["exit_status"] == 0
    test = breakout["test"]["levels"]["atari/breakout"]
    assert test["episodes"] == 2 == len(test["returns"])
    assert test["mean_return"] == sum(test["returns"]) / 2
    assert test["human_normalized"] == pytest.approx(
        atari57.human_normalized_score("atari/breakout", test["returns"]), abs=0.01
    )
    assert breakout["curve"][-1]["frames"] >= FRAMES
    # The run's own record's settings, and its policy lag.
    assert breakout["settings"]["level_name"] == "atari/breakout"
    assert breakout["settings"]["off_policy_correction"] == "vtrace"
    assert breakout["policy_lag"]["fresh"] > 0
    assert breakout["policy_lag"]["replayed"] is None
    # Whole games: Breakout's training logs games of 5 lives.
    assert breakout["unit"] == "game"
    assert breakout["episodes"] > breakout["games"] > 0
    pong = json.loads((results / "pong.json").read_text())
    assert pong["complete"] is False and "test" not in pong
    assert pong["segments"][0]["how"] == "SIGINT to study.py"
    # Trained in order: Breakout's test ended before Pong started.
    assert breakout["test"]["date"] <= pong["segments"][0]["started"]
    stopped_at = pong["frames"]
    assert 0 < stopped_at < 400000
    points = len(pong["curve"])

    # The same command again: Breakout is skipped, its record untouched;
    # Pong continues from its checkpoint until the time limit.
    kept = (results / "breakout.json").read_text()
    breakout_log = os.path.getmtime(tmp_path / "runs" / "breakout.log")
    # The limit leaves the restart's start-up (10 s idle, up to 30 s on a
    # loaded machine) time to train some frames.
    second = run_study(tmp_path, *ARMS, "--minutes=0.6")
    assert second.returncode == 1, second.stderr[-3000:]
    assert "breakout: complete" in second.stdout
    assert (results / "breakout.json").read_text() == kept
    assert os.path.getmtime(tmp_path / "runs" / "breakout.log") == breakout_log
    pong = json.loads((results / "pong.json").read_text())
    assert [s["how"] for s in pong["segments"]] == [
        "SIGINT to study.py",
        "time limit (0.6 min)",
    ]
    assert len(pong["curve"]) > points
    assert pong["frames"] > stopped_at
    log = (tmp_path / "runs" / "pong.log").read_text()
    assert "Restored" in log or "resum" in log.lower(), log[-2000:]
    minutes = [p["minutes"] for p in pong["curve"]]
    assert minutes == sorted(minutes)

    # Another commit's unfinished record: refused, nothing overwritten.
    pong["commit"] = "0" * 40
    path = results / "pong.json"
    path.write_text(json.dumps(pong))
    text = path.read_text()
    refused = run_study(tmp_path, *ARMS, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert f"{path}: an incomplete record of commit {'0' * 40}" in refused.stderr
    assert path.read_text() == text
    assert "pong.log" in os.listdir(tmp_path / "runs")


def test_a_truncated_record_is_named_and_kept(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "pong.json").write_text('{"arm": "pong", "comm')
    refused = run_study(tmp_path, f"--arm=pong: --level_name=atari/pong {TINY}")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert f"{results / 'pong.json'}: not a study record" in refused.stderr
    assert (results / "pong.json").read_text() == '{"arm": "pong", "comm'
    assert not (tmp_path / "runs").exists()


def test_the_figure_keeps_the_studys_order_whichever_arm_ran_last():
    arms = study.STUDIES["atari5"].arms(None)
    records = [{"arm": name} for name in ("phoenix", "mine", "battle_zone", "qbert")]
    assert [r["arm"] for r in study_records.in_study_order(records, arms)] == [
        "battle_zone",
        "phoenix",
        "qbert",
        "mine",
    ]


def test_the_atari5_study_is_the_five_games_at_40m_frames_with_the_default():
    arms = study.STUDIES["atari5"].arms(None)
    assert [a.name for a in arms] == [
        "battle_zone",
        "double_dunk",
        "name_this_game",
        "phoenix",
        "qbert",
    ]
    for arm in arms:
        # Atari's default command: the level and the budget, nothing tuned.
        assert arm.flags == (
            f"--level_name=atari/{arm.name}",
            "--total_environment_frames=40000000",
        )
    assert [a.name for a in study.STUDIES["atari3_val"].arms(1000)] == [
        "assault",
        "ms_pacman",
        "yars_revenge",
    ]


def test_the_atari_suites_are_the_papers_games_and_validation_shares_none_with_test():
    assert environments.expand_level_names("atari5") == [
        "atari/battle_zone",
        "atari/double_dunk",
        "atari/name_this_game",
        "atari/phoenix",
        "atari/qbert",
    ]
    assert environments.expand_level_names("atari3") == [
        "atari/battle_zone",
        "atari/name_this_game",
        "atari/phoenix",
    ]
    assert environments.expand_level_names("atari3_val") == [
        "atari/assault",
        "atari/ms_pacman",
        "atari/yars_revenge",
    ]
    assert environments.expand_level_names("atari5_val") == [
        "atari/bank_heist",
        "atari/video_pinball",
        "atari/assault",
        "atari/ms_pacman",
        "atari/yars_revenge",
    ]
    test_games = set(atari57.SUBSETS["atari5"]) | set(atari57.SUBSETS["atari3"])
    for suite in ("atari3_val", "atari5_val"):
        assert not test_games & set(atari57.SUBSETS[suite])
    # Several games, one policy: all 18 actions, as for atari57.
    assert environments.num_actions(environments.expand_level_names("atari5")) == 18


def test_a_suites_scores_are_its_median_mean_and_estimate_of_the_57_game_median():
    # Human returns score 100 on each game; the estimate is then
    # 101 ** (sum of the weights) - 1: Atari-5's weights sum to 0.9653006,
    # and 101 ** 0.9653006 - 1 = 85.05 (by hand: exp(0.9653006 * ln 101) - 1).
    human = {f"atari/{g}": [atari57.HUMAN_SCORES[g]] for g in atari57.SUBSETS["atari5"]}
    assert environments.suite_scores("atari5", human) == {
        "median": pytest.approx(100.0),
        "mean": pytest.approx(100.0),
        "median57_estimate": pytest.approx(85.05, abs=0.01),
    }
    # Assault random (0), Ms. Pac-Man human (100), Yars' Revenge at twice
    # the human margin (200): median 100, mean 100, estimate
    # 10 ** (0.33525 * log10(1) + 0.42364 * log10(101) + 0.19162 * log10(201))
    # - 1 = 10 ** (0.84911 + 0.44133) - 1 = 18.52.
    mixed = {
        "atari/assault": [atari57.RANDOM_SCORES["assault"]],
        "atari/ms_pacman": [atari57.HUMAN_SCORES["ms_pacman"]],
        "atari/yars_revenge": [
            2 * atari57.HUMAN_SCORES["yars_revenge"]
            - atari57.RANDOM_SCORES["yars_revenge"]
        ],
    }
    assert environments.suite_scores("atari3_val", mixed) == {
        "median": pytest.approx(100.0),
        "mean": pytest.approx(100.0),
        "median57_estimate": pytest.approx(18.52, abs=0.01),
    }
    with pytest.raises(ValueError, match="Missing returns for 'ms_pacman'"):
        environments.suite_scores("atari3_val", {"atari/assault": [1.0]})


def test_the_estimate_clips_negative_scores_at_zero_and_names_a_missing_game():
    # Five scores, the estimate written out by hand; a negative score
    # counts as 0.
    atari5 = {"battle_zone": 63.1, "double_dunk": 535.0, "name_this_game": 248.2}
    atari5.update(phoenix=211.0, qbert=128.5)
    by_hand = (
        10
        ** (
            0.3819751237831753 * np.log10(64.1)
            + 0.0679099488887574 * np.log10(536.0)
            + 0.310804148620847 * np.log10(249.2)
            + 0.12412619402774641 * np.log10(212.0)
            + 0.08048518286466755 * np.log10(129.5)
        )
        - 1
    )
    assert atari57.median57_estimate("atari5", atari5) == pytest.approx(by_hand)
    assert atari57.median57_estimate(
        "atari3_val", {"assault": -50.0, "ms_pacman": 0.0, "yars_revenge": -1.0}
    ) == pytest.approx(0.0)
    with pytest.raises(
        ValueError,
        match="Missing double_dunk, name_this_game, phoenix, qbert for the atari5",
    ):
        atari57.median57_estimate("atari5", {"battle_zone": 1.0})


def test_a_suite_game_the_installed_ale_py_lacks_is_one_error_naming_it(monkeypatch):
    from families import atari

    games = set(atari.available_games()) - {"double_dunk"}
    monkeypatch.setattr(atari, "available_games", lambda: games)
    with pytest.raises(ValueError) as error:
        environments.expand_level_names("atari5")
    message = str(error.value)
    assert "no ROM for double_dunk" in message
    assert "pip install -r requirements.txt" in message


def test_the_table_gives_each_record_its_row():
    trained = {
        "arm": "pong",
        "frames": 40_000_000,
        "unit": "game",
        "last_mean": 18.5,
        "curve": [{"minutes": 3.0}, {"minutes": 81.4}],
        "test": {
            "levels": {
                "atari/pong": {
                    "mean_return": 19.0,
                    "returns": [18.0, 20.0],
                    "human_normalized": 112.5,
                }
            }
        },
    }
    running = {"arm": "qbert", "frames": 1_200_000, "last_mean": 150.0, "curve": []}
    header, rule, pong, qbert = study_records.markdown_table(
        [trained, running]
    ).splitlines()
    assert header.startswith("| arm | frames | minutes | training, last 100 |")
    assert rule.count("|") == header.count("|")
    assert (
        pong == "| pong | 40.0 M | 81 | 18.5 (games) | 19.0 (2, 18 to 20) | 112.5 % |"
    )
    assert qbert == "| qbert | 1.2 M | 0 | 150.0 (episodes) | not tested | - |"


def test_the_off_policy_study_is_each_task_by_correction_and_replay():
    arms = study.STUDIES["off_policy"].arms(None)
    assert len(arms) == 16
    names = [a.name for a in arms]
    assert names[:8] == [
        f"defend_the_center_{c}{r}"
        for r in ("", "_replay")
        for c in ("vtrace", "no_correction", "epsilon_correction", "one_step_is")
    ]
    by_name = {a.name: a for a in arms}
    vizdoom = by_name["defend_the_center_one_step_is_replay"]
    assert vizdoom.flags == (
        "--flagfile=flagfiles/vizdoom_defend_the_center.cfg",
        "--off_policy_correction=one_step_is",
        "--replay_proportion=0.5",
        "--replay_capacity=10000",
        "--total_environment_frames=4000000",
    )
    breakout = by_name["breakout_vtrace"]
    assert breakout.flags == (
        "--level_name=atari/breakout",
        "--off_policy_correction=vtrace",
        "--total_environment_frames=8000000",
    )
    assert by_name["breakout_no_correction_replay"].flag("replay_capacity") == "4000"
    # --frames replaces every budget.
    assert {
        a.flag("total_environment_frames") for a in off_policy_study.off_policy_arms(99)
    } == {"99"}


def test_the_off_policy_table_is_laid_out_as_the_papers_table_2():
    def record(arm, last, test, fresh, replayed=None):
        return {
            "arm": arm,
            "complete": True,
            "last_mean": last,
            "policy_lag": {"fresh": fresh, "replayed": replayed},
            "test": {"levels": {"x": {"mean_return": test, "returns": [test]}}},
        }

    rows = off_policy_study.off_policy_table(
        [
            record("breakout_vtrace", 2.5, 10.0, 2.04),
            record("defend_the_center_one_step_is_replay", 7.25, 9.5, 2.5, 612.3),
            {"arm": "breakout_one_step_is", "complete": False},
        ]
    ).splitlines()
    assert rows[0] == (
        "| correction | replay | defend_the_center: last 100 / test / lag "
        "| breakout: last 100 / test / lag "
        "| the paper's Table 2, 5 DeepMind Lab tasks |"
    )
    assert rows[1] == "| --- | --- | --- | --- | --- |"
    assert rows[2] == (
        "| vtrace | none | - | 2.50 / 10.00 / 2.0 | 46.8 / 32.9 / 31.3 / 229.2 / 43.8 |"
    )
    # not complete yet
    assert (
        rows[5] == "| one_step_is | none | - | - | 51.8 / 35.9 / 25.4 / 215.8 / 43.7 |"
    )
    assert rows[9] == (
        "| one_step_is | 0.5 | 7.25 / 9.50 / 2.5 (612) | - "
        "| 54.7 / 34.4 / 26.4 / 204.8 / 41.6 |"
    )
    assert rows[4].endswith("| 44.2 / 27.3 / 4.3 / 107.7 / 41.5 |")
    assert rows[7].endswith("| 35.0 / 21.1 / 2.8 / 85.0 / 11.2 |")


def test_a_records_policy_lag_and_settings_come_from_its_run(tmp_path):
    log = tmp_path / "arm.log"
    log.write_text(
        "I1206 progress.py] frames 10 / 20 | policy lag 2.0 updates\n"
        "Training done: 100 environment frames, 3 episodes in 9 s; mean return "
        "of the last 3 episodes: -1.00; mean policy lag 2.4 updates (replayed "
        "40.5). Checkpoint ...\n"
    )
    assert runner._policy_lag(str(log)) == {"fresh": 2.4, "replayed": 40.5}
    log.write_text("Training done: ...; mean policy lag 1.5 updates. Checkpoint\n")
    assert runner._policy_lag(str(log)) == {"fresh": 1.5, "replayed": None}
    log.write_text("stopped by SIGINT\n")
    assert runner._policy_lag(str(log)) is None
    (tmp_path / "run_record.json").write_text(
        '{"settings": {"replay_proportion": {"value": 0.5, "source": "command '
        'line"}, "agent": {"value": "shallow", "source": "default"}}}'
    )
    assert runner._run_settings(str(tmp_path)) == {
        "agent": "shallow",
        "replay_proportion": 0.5,
    }
    assert runner._run_settings(str(tmp_path / "none")) is None


def test_the_pbt_study_is_two_populations_of_the_same_draws():
    arms = study.STUDIES["pbt"].arms(None)
    assert [a.name for a in arms] == [
        f"{k}_{i}" for k in ("pbt", "fixed") for i in range(4)
    ]
    assert [len(b) for b in runner.batches(arms)] == [4, 4]
    by_name = {a.name: a for a in arms}
    pbt, fixed = by_name["pbt_2"], by_name["fixed_2"]
    # The same member, seed and budget; evolution off for the fixed one.
    for flag in ("population_member", "seed", "total_environment_frames"):
        assert pbt.flag(flag) == fixed.flag(flag)
    assert pbt.flag("seed") == "3" and pbt.flag("population_size") == "4"
    assert int(fixed.flag("pbt_burn_in_frames")) > int(
        pbt.flag("total_environment_frames")
    )
    assert pbt.flag("pbt_burn_in_frames") == "1000000"
    # Each population's directory under the study's logdir root.
    command = runner.train_command(pbt, "/runs/pbt_2")
    assert "--population_dir=/runs/pbt_population" in command
    assert "--logdir=/runs/pbt_2" in command
    assert "--population_dir=/runs/fixed_population" in runner.test_command(
        fixed, "/runs/fixed_2", 3
    )


def test_the_pbt_table_gives_each_arm_its_members_best_and_median():
    def record(arm, test, last, copied_from=()):
        lineage = [{"member": 0, "copied_from": c} for c in copied_from]
        return {
            "arm": arm,
            "complete": True,
            "last_mean": last,
            "test": {"levels": {"x": {"mean_return": test}}},
            "population": {"member": {}, "lineage": lineage},
        }

    header, _, pbt, fixed = pbt_study.pbt_table(
        [
            record("pbt_0", 10.0, 9.0, copied_from=(None, 2, None)),
            record("pbt_1", 14.0, 12.5, copied_from=(None,)),
            record("pbt_2", 12.0, 11.0),
            {"arm": "fixed_0", "complete": False},
        ]
    ).splitlines()
    assert header.startswith("| arm | members' test means | best | median |")
    assert pbt == (
        "| pbt | 10.00, 14.00, 12.00 | 14.00 | 12.00 | 9.00, 12.50, 11.00 "
        "| 3 / 1, 1 / 0, 0 / 0 |"
    )
    assert fixed == "| fixed | - | - | - | - | - |"


@pytest.mark.slow
def test_the_members_of_a_group_train_together_each_with_its_record(tmp_path):
    result = run_study(
        tmp_path, "pbt", "--only=pbt_0,pbt_1", "--frames=3000", "--test_episodes=1"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [
        json.loads((tmp_path / "results" / f"pbt_{k}.json").read_text()) for k in (0, 1)
    ]
    # Trained at the same time: each started before the other ended.
    first, second = (r["segments"][0] for r in records)
    assert first["started"] <= second["ended"] and second["started"] <= first["ended"]
    for k, record in enumerate(records):
        assert record["complete"] is True and record["frames"] >= 3000
        assert record["settings"]["population_member"] == k
        population = record["population"]
        assert population["member"]["logdir"] == str(tmp_path / "runs" / f"pbt_{k}")
        assert population["member"]["hyperparameters"]
        assert population["lineage"] == []  # burn-in beyond the budget
    assert (tmp_path / "runs" / "pbt_population" / "population.json").exists()


def test_the_tuning_study_trains_replay_first_on_atari3_val_and_never_on_atari5():
    arms = study.STUDIES["atari3_val_tuning"].arms(None)
    assert [a.name for a in arms[:3]] == [
        "replay0.assault",
        "replay0.ms_pacman",
        "replay0.yars_revenge",
    ]
    assert arms[0].flags == (
        "--level_name=atari/assault",
        "--total_environment_frames=10000000",
    )
    by_name = {a.name: a for a in arms}
    assert by_name["replay075.yars_revenge"].flags == (
        "--level_name=atari/yars_revenge",
        "--total_environment_frames=10000000",
        "--replay_proportion=0.75",
        "--replay_capacity=10000",
    )
    # Stage 2 changes one thing at a time around stage 1's winner.
    winner = atari_study.TUNING_STAGE1_WINNER
    for change, flags in atari_study.TUNING_STAGE2_CHANGES.items():
        arm = by_name[f"{winner}_{change}.ms_pacman"]
        assert arm.flags == (*by_name[f"{winner}.ms_pacman"].flags, *flags)
    assert [a.name for a in arms[6:9]] == [
        "replay075.assault",
        "replay075.ms_pacman",
        "replay075.yars_revenge",
    ]
    games = {a.flag("level_name").split("/")[1] for a in arms}
    assert games == set(atari57.SUBSETS["atari3_val"])
    assert not games & set(atari57.SUBSETS["atari5"])


def test_the_tuning_table_gives_each_configuration_its_atari3_val_estimate():
    def record(arm, level, score):
        # The return that scores `score` % (the estimate is computed from
        # the returns, not from the record's rounded score).
        game = level.split("/")[1]
        random_score = atari57.RANDOM_SCORES[game]
        value = random_score + score / 100 * (atari57.HUMAN_SCORES[game] - random_score)
        return {
            "arm": arm,
            "test": {
                "levels": {
                    level: {
                        "mean_return": 1000.0,
                        "returns": [value],
                        "human_normalized": score,
                    }
                }
            },
        }

    records = [
        record("replay0.assault", "atari/assault", 0.0),
        record("replay0.ms_pacman", "atari/ms_pacman", 100.0),
        record("replay0.yars_revenge", "atari/yars_revenge", 200.0),
        record("replay050.assault", "atari/assault", 50.0),
    ]
    rows = atari_study.tuning_table(records).splitlines()
    # The estimate by hand as in the suite's test above: 18.52 %.
    assert rows[2] == (
        "| replay0 | 1,000 (0.0 %) | 1,000 (100.0 %) | 1,000 (200.0 %) | 18.5 % |"
    )
    assert rows[3] == "| replay050 | 1,000 (50.0 %) | - | - | - |"
    line = atari_study.suite_estimate_line("atari3_val", records[:3])
    assert line == (
        "atari3_val estimate of the 57-game median: 18.5 % (stated error 17.1 %)"
    )
    assert atari_study.suite_estimate_line("atari3_val", records[3:]) is None


def test_the_off_policy_figure_overlays_the_four_corrections_per_task_and_replay(
    tmp_path,
):
    """From the committed records: an axes per task and replay setting (2 x 2),
    the four corrections' curves on each, one y-scale per task, each
    legend entry with its policy lag."""

    results = os.path.join(REPO_ROOT, "benchmarks", "results", "off_policy")
    records = [
        study_records.load_record(os.path.join(results, name))
        for name in sorted(os.listdir(results))
        if name.endswith(".json")
    ]
    figure = off_policy_study.draw(records, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 0
    axes = figure.get_axes()
    assert [ax.get_title() for ax in axes] == [
        "defend_the_center, no replay",
        "defend_the_center, replay 0.5",
        "breakout, no replay",
        "breakout, replay 0.5",
    ]
    for ax in axes:
        labels = [line.get_label() for line in ax.get_lines()]
        assert len(labels) == 4, labels
        assert [label.split(" (")[0] for label in labels] == [
            "V-trace",
            "no correction",
            "epsilon-correction",
            "1-step IS",
        ]
        assert all("lag" in label for label in labels)
        assert ax.get_xlabel() == "environment frames (M)"
    # One y-scale per task: both replay settings share it.
    assert axes[0].get_ylim() == axes[1].get_ylim()
    assert axes[2].get_ylim() == axes[3].get_ylim()
    assert axes[0].get_ylim() != axes[2].get_ylim()


def test_atari5s_figure_overlays_a_baseline_folder_and_a_new_one(tmp_path, capsys):
    """The committed Atari-5 records as the baseline and a copy with other
    test scores as the new default: a panel a game, each with both curves
    labelled with their folder and estimate, frames on x, what y averages."""
    baseline = os.path.join(REPO_ROOT, "benchmarks", "results", "atari5")
    new = tmp_path / "atari5_new"
    new.mkdir()
    scores = {}
    for record in study_records.folder_records(baseline):
        ((level, result),) = record["test"]["levels"].items()
        result["returns"] = [r * 1.5 for r in result["returns"]]
        scores[record["arm"]] = atari57.human_normalized_score(level, result["returns"])
        (new / f"{record['arm']}.json").write_text(json.dumps(record))
    expected = atari57.median57_estimate("atari5", scores)
    out = tmp_path / "atari5.png"
    assert atari_study.main([baseline, str(new), "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    printed = capsys.readouterr().out
    assert "atari5: atari5 estimate of the 57-game median: 41.3 %" in printed
    assert (
        f"atari5_new: atari5 estimate of the 57-game median: {expected:.1f} %"
        in printed
    )
    assert f"{expected:.1f}" != "41.3"
    from benchmarks.core import figures

    records = study_records.folder_records(baseline)
    figure = figures.overlay_figure(
        {"old": records, "new": study_records.folder_records(str(new))},
        str(out),
        "atari5",
    )
    axes = figure.get_axes()
    assert sorted(ax.get_title() for ax in axes if ax.get_title()) == sorted(
        atari57.SUBSETS["atari5"]
    )
    for ax in (ax for ax in axes if ax.get_title()):
        assert ax.get_legend_handles_labels()[1] == ["old", "new"]
        assert ax.get_xlabel() == "environment frames (M)"
        assert ax.get_ylabel() == "mean return, last 100 training games"


def test_test_modes_table_gives_a_suites_estimate_of_the_57_game_median():
    from evaluation import test_mode

    human = {f"atari/{g}": [atari57.HUMAN_SCORES[g]] for g in atari57.SUBSETS["atari5"]}
    results = {
        "level_name": "atari5",
        "levels": {
            level: {"mean_return": r[0], "returns": r} for level, r in human.items()
        },
        "human_normalized": environments.suite_scores("atari5", human),
    }
    lines = test_mode.results_table(results).splitlines()
    assert lines[-3:] == [
        "atari5 human-normalised median: 100.0 %",
        "atari5 human-normalised mean: 100.0 %",
        "atari5 estimate of the 57-game median: 85.1 %",
    ]
