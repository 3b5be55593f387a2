"""Tests of the benchmark scripts' own options (not of the figures they measure).

The benchmarks themselves take minutes and are run by hand (BENCHMARKS.md);
these tests cover only what their command lines promise and cost seconds.
"""

import os
import re
import subprocess
import sys

from run_helpers import REPO_ROOT

sys.path.insert(0, REPO_ROOT)

import config  # noqa: E402
from benchmarks.throughput import throughput_bench  # noqa: E402

SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "throughput", "throughput_bench.py")


def test_throughput_record_goes_where_json_says_else_to_the_committed_one(tmp_path):
    target = tmp_path / "round.json"
    assert throughput_bench.record_path("defaults", str(target)) == str(target)
    assert throughput_bench.record_path("defaults", None) == os.path.join(
        REPO_ROOT, "benchmarks", "results", "throughput_defaults.json"
    )


def test_throughput_json_with_several_parts_is_refused_before_any_run(tmp_path):
    target = tmp_path / "round.json"
    result = subprocess.run(
        [sys.executable, SCRIPT, "--part=all", f"--json={target}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"--json={target}" in result.stderr
    assert f"--part=all runs {len(throughput_bench.PARTS)} parts" in result.stderr
    assert not target.exists()


def test_every_record_names_its_part():
    """Committed throughput records carry the part's current name."""
    import glob
    import json

    for path in glob.glob(
        os.path.join(REPO_ROOT, "benchmarks", "results", "throughput_*.json")
    ):
        with open(path) as f:
            record = json.load(f)
        if "part" in record:
            assert record["part"] in throughput_bench.PARTS, path


def test_defaults_part_passes_no_layout_flag_and_compares_with_the_best_setting():
    family_default, best = throughput_bench.PARTS["defaults"][:2]
    flags = throughput_bench.flags_for(family_default)
    assert not set(flags) & set(config.LAYOUT_SETTINGS)
    # What the run gets (recorded for the table) is the layout it is
    # compared with, the family's flag file's.
    assert {k: family_default[k] for k in config.LAYOUT_SETTINGS} == {
        k: best[k] for k in config.LAYOUT_SETTINGS
    }


def test_feed_forward_part_gives_experiment_flags_and_labels_each_row():
    """The part's four runs: Atari's defaults with and without the LSTM,
    without and with replay; their flags parse as experiment.py's, and the
    table tells the rows apart."""
    from benchmarks.throughput import throughput_report

    part = throughput_bench.PARTS["feed_forward"]
    flags = [throughput_bench.flags_for(c) for c in part]
    assert [(f.get("use_lstm"), f.get("replay_proportion")) for f in flags] == [
        (None, None),
        ("false", None),
        (None, 0.75),
        ("false", 0.75),
    ]
    for f in flags:
        assert not set(f) & set(config.LAYOUT_SETTINGS)
        command = [sys.executable, "experiment.py", "--print_config"]
        command += [f"--{k}={v}" for k, v in f.items() if k != "agent"]
        printed = subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
        )
        assert printed.returncode == 0, printed.stderr[-2000:]
        lstm = "false" if f.get("use_lstm") else "true"
        assert re.search(rf"--use_lstm +{lstm} ", printed.stdout)
    runs = [
        {
            "config": c,
            "code": "current",
            "repeat": 0,
            "frames_per_s": 4000.0 + i,
            "learner_steps_per_s": 1.0,
            "cpu_s": {},
            "cpu_total_s": 20.0,
            "window_s": 10.0,
            "load_start": 0.0,
            "load_end": 0.0,
            "startup_s": 5.0,
        }
        for i, c in enumerate(part)
    ]
    ceiling = {"frames_per_s": 30000.0, "frames_per_cpu_s": 15000.0, "load": 0.0}
    text = throughput_report.table(
        {
            "machine": {"nproc": 2},
            "ceilings": [ceiling],
            "ceiling_frames_per_s": 30000.0,
            "runs": runs,
        }
    )
    rows = [line for line in text.splitlines() if line.startswith("| current")]
    assert len(rows) == 4
    assert "feed-forward" not in rows[0] and "replay" not in rows[0]
    assert "feed-forward" in rows[1] and "replay" not in rows[1]
    assert "replay 0.75 of 10,000" in rows[2] and "feed-forward" not in rows[2]
    assert "feed-forward, replay 0.75 of 10,000" in rows[3]


def test_family_bench_layouts_name_the_layout_flags_or_the_familys_defaults():
    from benchmarks.throughput import family_bench

    assert family_bench.parse_layout("8x4x4/16") == dict(
        num_actors=8,
        envs_per_actor=4,
        envs_per_process=4,
        batch_size=16,
        unroll_length=20,
    )
    assert family_bench.parse_layout("8")["batch_size"] == 8
    assert family_bench.parse_layout("defaults") == {}


def test_popart_comparison_normalises_each_level_between_random_and_best():
    """Levels of rewards 100x apart, made comparable: 0 % at the random
    policy's return, 100 % at the reference run's; the standard error is of
    the mean over the test episodes."""
    import numpy as np
    import pytest

    from benchmarks.studies import popart_study

    references = {
        "vizdoom/defend_the_center": {"random": 0.0, "best": 10.0},
        "vizdoom/basic": {"random": -300.0, "best": 80.0},
        "vizdoom/health_gathering": {"random": 300.0, "best": 2100.0},
    }
    scores = popart_study.normalised_scores(
        {
            "vizdoom/defend_the_center": [4.0, 6.0],
            "vizdoom/basic": [80.0, 80.0, 80.0],
            "vizdoom/health_gathering": [300.0],
        },
        references,
    )
    levels = scores["levels"]
    assert levels["vizdoom/defend_the_center"]["normalised"] == pytest.approx(50.0)
    assert levels["vizdoom/basic"]["normalised"] == pytest.approx(100.0)
    assert levels["vizdoom/health_gathering"]["normalised"] == pytest.approx(0.0)
    assert levels["vizdoom/defend_the_center"]["standard_error"] == pytest.approx(
        np.std([4.0, 6.0], ddof=1) / np.sqrt(2)
    )
    assert levels["vizdoom/basic"]["standard_error"] == 0.0
    assert levels["vizdoom/health_gathering"]["episodes"] == 1
    assert scores["median"] == pytest.approx(50.0)
    assert scores["mean"] == pytest.approx(50.0)
    with pytest.raises(ValueError, match="no test episodes"):
        popart_study.normalised_scores({"vizdoom/basic": []}, references)


def test_popart_comparison_references_are_random_and_the_alone_runs_peak(tmp_path):
    """The references stage's files become {level: {random, best}}: the
    random policy's mean return, and the best mean of 100 consecutive
    training episodes of the level's run alone (its peak, not its end);
    None until every level has both."""
    import json

    import tensorflow as tf

    from benchmarks.studies import popart_study

    level = "vizdoom/take_cover"
    names = [level]
    assert popart_study.references_from(str(tmp_path), names) is None
    (tmp_path / "random_take_cover.json").write_text(json.dumps({"mean": 2.0}))
    returns = [0.0] * 100 + [10.0] * 100 + [5.0] * 100
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path / "alone_take_cover"))
        for step, value in enumerate(returns):
            summary = tf.compat.v1.Summary(
                value=[
                    tf.compat.v1.Summary.Value(
                        tag=f"{level}/episode_return", simple_value=value
                    )
                ]
            )
            writer.add_summary(summary, step)
        writer.close()
    references = popart_study.references_from(str(tmp_path), names)
    assert references == {level: {"random": 2.0, "best": 10.0}}
    # Fewer episodes than the window: no reference yet.
    assert popart_study.references_from(str(tmp_path), names, window=400) is None


def test_popart_comparison_finds_each_arms_seeds_and_averages_over_them(tmp_path):
    """A second seed trains into ARM_seedN beside the first run; the plot
    finds every run with test results, seed 1 first, and the record's
    over_seeds averages each level's normalised score over an arm's runs."""
    import pytest

    from benchmarks.studies import popart_study

    assert popart_study.run_name("popart", 1) == "popart"
    assert popart_study.run_name("popart", 2) == "popart_seed2"
    for name in ("popart_seed2", "popart", "popart_seed3", "clipped", "popart_x"):
        (tmp_path / name).mkdir()
        if name != "popart_seed3":  # not tested yet: left out
            (tmp_path / name / "test_results.json").write_text("{}")
    assert popart_study.runs_of(str(tmp_path), "popart") == [
        ("popart", 1),
        ("popart_seed2", 2),
    ]
    assert popart_study.runs_of(str(tmp_path / "missing"), "popart") == []

    def normalised(a: float, b: float) -> dict:
        return {"levels": {"x": {"normalised": a}, "y": {"normalised": b}}}

    record = {
        "arms": {
            "popart": {"arm": "popart", "normalised": normalised(10.0, 50.0)},
            "popart_seed2": {"arm": "popart", "normalised": normalised(30.0, 70.0)},
            "clipped": {"arm": "clipped", "normalised": normalised(0.0, 0.0)},
        }
    }
    over = popart_study.over_seeds(record)
    assert list(over) == ["popart"]  # one run of clipped: nothing to average
    assert over["popart"]["seeds"] == 2
    assert over["popart"]["levels"] == {"x": 20.0, "y": 60.0}
    assert over["popart"]["median"] == pytest.approx(40.0)


def test_learner_tasks_projection_adds_each_remote_towers_measured_cost():
    """N learner tasks: t(N) = t1 + (N - 1) x max(c, b / W), c what the
    second task added to an update here, b its bytes per update, W the
    chief's link; the chief's link also carries every actor's weight copy."""
    import pytest

    from benchmarks.throughput import learner_tasks_report as bench

    def result(configuration, ms, frames_per_s, moved):
        return {
            "agent": "shallow",
            "configuration": configuration,
            "ms_per_update": ms,
            "frames_per_s": frames_per_s,
            "bytes_per_update": moved,
            "batch_size_per_tower": 32,
            "unroll_length": 20,
            "parameter_bytes": 5e6,
        }

    frames_per_update = 32 * 20 * 4
    results = [
        result("1 task, 1 core", 200.0, frames_per_update / 0.2, []),
        result("2 tasks, 1 core each", 250.0, 2 * frames_per_update / 0.25, [1e7]),
    ]
    fast, slow = (
        {r["learner_tasks"]: r for r in bench.project(results, (1, 2, 4), link_gbit=g)}
        for g in (10.0, 0.1)
    )
    assert fast[1]["ms_per_update"] == pytest.approx(200.0)
    assert fast[4]["ms_per_update"] == pytest.approx(200.0 + 3 * 50.0)
    assert fast[4]["speed_up"] == pytest.approx(4 * 200.0 / 350.0)
    # 10 MB over 0.1 Gb/s takes 800 ms: the link, not the measured 50 ms.
    assert slow[2]["ms_per_update"] == pytest.approx(200.0 + 800.0)
    weights = fast[1]["frames_per_s"] * 5e6 / (bench.ENVS_PER_ACTOR * 20 * 4)
    assert fast[1]["chief_link_gbit"] == pytest.approx(8 * weights / 1e9)
    assert "(over the link)" in bench.projection_table(list(slow.values()))


def test_random_policy_takes_the_action_set_of_the_run_it_stands_for(tmp_path):
    """A ViZDoom scenario alone has its own actions (basic: 4); in a run of
    several scenarios it has the suite's 10, and so does its random
    policy with --run_levels: the baseline the multi-task arms start from."""
    import json

    script = os.path.join(REPO_ROOT, "benchmarks", "learning", "random_policy.py")
    counts = {}
    for name, extra in (
        ("alone", []),
        ("run", ["--run_levels=vizdoom/basic,vizdoom/take_cover"]),
    ):
        path = tmp_path / f"{name}.json"
        subprocess.run(
            [
                sys.executable,
                script,
                "--level=vizdoom/basic",
                "--episodes=2",
                f"--json={path}",
                *extra,
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        record = json.loads(path.read_text())
        assert len(record["returns"]) == 2
        counts[name] = record["num_actions"]
    assert counts == {"alone": 4, "run": 10}


def test_train_until_notes_the_first_frames_and_minutes_of_each_mean():
    from benchmarks.learning import train_until

    curve = train_until.Curve(window=2, thresholds=[0, -20])
    lines = [
        "I1204 19:48:36.6 1 progress.py:109] frames 87,040 / 60,000,000 (0.1 %)",
        "I1204 19:48:37.0 1 progress.py:152] Episode on atari/pong: return -21.0, 4 frames",
        "I1204 19:48:38.0 1 progress.py:152] Episode on atari/pong: return -19.0, 4 frames",
        "I1204 19:48:46.6 1 progress.py:109] frames 176,640 / 60,000,000 (0.3 %)",
        "I1204 19:48:47.0 1 progress.py:152] Episode on atari/pong: return 1.0, 4 frames",
        "I1204 19:48:48.0 1 progress.py:152] Episode on atari/pong: return 3.0, 4 frames",
    ]
    crossed = [curve.line(text, 60.0 * i) for i, text in enumerate(lines)]
    # -20 at the second episode (mean -20 of a full window), 0 at the fourth.
    assert crossed == [False, False, True, False, False, True]
    record = curve.record()
    assert record["reached"] == {
        "-20": dict(frames=87040, minutes=2.0),
        "0": dict(frames=176640, minutes=5.0),
    }
    assert (record["episodes"], record["last_mean"], record["best_mean"]) == (
        4,
        2.0,
        2.0,
    )


def test_peer_defaults_reads_our_progress_lines_after_the_warm_up():
    """The median rate is of the progress lines a minute or more after the
    first one, as Sample Factory's figure is of its 10-second rates after
    its warm-up; a run past midnight keeps counting."""
    from benchmarks.peers import peer_defaults

    def line(clock: str, frames: int, fps: int) -> str:
        return (
            f"I1205 {clock}.123456 140 progress.py:109] frames {frames:,} / "
            f"60,000,000 (0.1 %) | {fps:,} frames/s | ETA 2 h | 1.00 learner "
            "steps/s | mean return (last 100 episodes) -20.00 | queue 1"
        )

    log = "\n".join(
        [
            "I1205 23:58:50.000000 140 x.py:1] Training atari/pong ...",
            line("23:59:00", 10_000, 1_000),
            line("23:59:50", 90_000, 8_000),
            line("00:00:00", 170_000, 8_200),
            line("00:00:10", 250_000, 8_100),
        ]
    )
    assert peer_defaults.progress_figures(log, warmup_s=60) == [8_200.0, 8_100.0]


def test_a_code_snapshot_holds_what_a_run_reads():
    """--baseline_code and each invocation's snapshot run experiment.py from
    a copy: the flag files a family's defaults read at start go with it."""
    from benchmarks.core import common

    assert common._is_code("experiment.py")
    assert common._is_code("learner/update.py")
    assert common._is_code("batcher.cc")
    assert common._is_code("flagfiles/pong_shallow_unroll80.cfg")
    assert not common._is_code("tests/run_helpers.py")
    assert not common._is_code("benchmarks/core/common.py")
    assert not common._is_code("README.md")


def test_a_peers_lines_become_its_record_and_its_games_a_curve_by_minute(tmp_path):
    """The one runner shape: `<prefix>_<figure>=` lines and each game as
    `<prefix>_episode=<seconds>,<frames>,<return>`; the per-hour curve's
    point at minute k holds the frames of the last game by then and the
    mean of the last 100 games; the figure has both sides on both axes."""
    from benchmarks.peers import peers, per_hour

    stdout = "\n".join(
        [
            "t=12.0 global_step=1000, episodic_return=[180.]",
            "cleanrl_ppo_episode=12.0,4000,180.0",
            "cleanrl_ppo_episode=70.5,52000,-20.0",
            "cleanrl_ppo_episode=130.0,104000,300.0",
            "sample_factory_frames_per_s=9999",
            "cleanrl_ppo_frames_per_s=1444",
            "cleanrl_ppo_frames=104000",
            "cleanrl_ppo_return=153.3",
        ]
    )
    record = peers.parse(
        peers.CLEANRL_PPO, stdout, "", 0, 180, {"CLEANRL_ENV": "PhoenixNoFrameskip-v4"}
    )
    assert record["frames_per_s"] == 1444.0 and record["frames"] == 104000
    assert record["mean_return"] == 153.3
    assert record["episodes"] == [
        (12.0, 4000, 180.0),
        (70.5, 52000, -20.0),
        (130.0, 104000, 300.0),
    ]
    assert record["command"] == (
        "CLEANRL_ENV=PhoenixNoFrameskip-v4 benchmarks/peers/cleanrl_ppo_peer.sh 180"
    )
    curve = per_hour.episode_curve(record["episodes"], minutes=3, every=1.0)
    assert curve == [
        dict(minutes=1.0, frames=4000, mean=180.0),
        dict(minutes=2.0, frames=52000, mean=80.0),
        dict(minutes=3.0, frames=104000, mean=153.33),
    ]
    assert per_hour.episode_curve([], minutes=1, every=1.0)[0]["mean"] is None
    assert per_hour.gym_id("atari/ms_pacman") == "MsPacmanNoFrameskip-v4"
    ours = [
        dict(minutes=1.0, frames=400000, mean=120.0),
        dict(minutes=2.0, frames=800000, mean=200.0),
    ]
    figure = per_hour.draw(
        {
            "level": "atari/phoenix",
            "minutes": 3,
            "sides": {
                "ours": {"curve": ours},
                peers.CLEANRL_PPO.label: {"curve": curve},
            },
        },
        str(tmp_path / "per_hour.png"),
    )
    by_minutes, by_frames = figure.get_axes()
    assert len(by_minutes.get_lines()) == len(by_frames.get_lines()) == 2
    assert by_frames.get_xlabel() == "environment frames (M)"
    assert by_frames.get_lines()[0].get_xdata()[-1] == 0.8


def test_learner_bench_builds_and_steps_the_learner_on_its_random_unrolls():
    """Each mode of the learner benchmark builds the learner from its
    random unrolls (their dtypes the actor's specs': int64 policy_frames
    included) and runs timed steps."""
    from benchmarks.throughput import learner_bench

    for mode in ("fixed", "queue"):
        result = learner_bench.bench_config("shallow", 2, 5, mode, seconds=0.0)
        assert result["mode"] == mode
        assert result["steps"] >= 3
        assert result["frames_per_s"] > 0
