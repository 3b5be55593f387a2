"""Tests of dmlab30.py and atari57.py scores on hand-computed cases, and of
test mode's results table and episode loop."""

import collections
import math

import numpy as np
import pytest

import dmlab30
from evaluation import test_mode
from families import atari57


def _dmlab_returns(value_for_level):
    """Returns keyed by *training* level, as a training run produces them."""
    return {
        train: [value_for_level(test)] for train, test in dmlab30.LEVEL_MAPPING.items()
    }


def test_dmlab30_tables():
    assert len(dmlab30.LEVEL_MAPPING) == 30
    assert len(dmlab30.HUMAN_SCORES) == len(dmlab30.RANDOM_SCORES) == 30
    assert set(dmlab30.HUMAN_SCORES) == set(dmlab30.LEVEL_MAPPING.values())
    # 28 levels are their own test level, plus 2 train/test pairs.
    assert len(dmlab30.ALL_LEVELS) == 32
    assert dmlab30.HUMAN_SCORES["explore_goal_locations_small"] == 267.5
    assert dmlab30.RANDOM_SCORES["rooms_collect_good_objects_test"] == 0.073
    assert (
        dmlab30.LEVEL_MAPPING["rooms_exploit_deferred_effects_train"]
        == "rooms_exploit_deferred_effects_test"
    )


def test_dmlab30_human_and_random_returns():
    human = _dmlab_returns(lambda t: dmlab30.HUMAN_SCORES[t])
    random = _dmlab_returns(lambda t: dmlab30.RANDOM_SCORES[t])
    assert dmlab30.compute_human_normalized_score(human, None) == pytest.approx(100)
    assert dmlab30.compute_human_normalized_score(random, 100) == pytest.approx(0)


def test_dmlab30_cap_and_mean_of_returns():
    # Every level at random except rooms_watermaze (human 54, random 4.065),
    # whose two returns average to 4.065 + 3 * (54 - 4.065) = 153.87: a score
    # of 300, so the mean is 300 / 30 = 10 uncapped and 100 / 30 capped at 100.
    returns = _dmlab_returns(lambda t: dmlab30.RANDOM_SCORES[t])
    excess = 3 * (54 - 4.065)
    returns["rooms_watermaze"] = [4.065 + excess - 1.0, 4.065 + excess + 1.0]
    assert dmlab30.compute_human_normalized_score(returns, None) == pytest.approx(10)
    assert dmlab30.compute_human_normalized_score(returns, 100) == pytest.approx(
        100 / 30
    )
    # Negative scores are not raised by the cap.
    returns["rooms_watermaze"] = [4.065 - (54 - 4.065)]
    assert dmlab30.compute_human_normalized_score(returns, 100) == pytest.approx(
        -100 / 30
    )


def test_dmlab30_train_level_counts_for_test_level_and_prefixes():
    # rooms_collect_good_objects: human 10, random 0.073; a return of 5.0365
    # is a score of 50 = (5.0365 - 0.073) / 9.927 * 100, mean 50 / 30.
    returns = _dmlab_returns(lambda t: dmlab30.RANDOM_SCORES[t])
    del returns["rooms_collect_good_objects_train"]
    returns["contributed/dmlab30/rooms_collect_good_objects_train"] = [5.0365]
    assert dmlab30.compute_human_normalized_score(returns, 100) == pytest.approx(
        50 / 30
    )
    # Under the test name the level counts the same.
    del returns["contributed/dmlab30/rooms_collect_good_objects_train"]
    returns["rooms_collect_good_objects_test"] = [5.0365]
    assert dmlab30.compute_human_normalized_score(returns, None) == pytest.approx(
        50 / 30
    )


def test_dmlab30_missing_and_extra_levels():
    returns = _dmlab_returns(lambda t: dmlab30.HUMAN_SCORES[t])
    returns["some_other_level"] = [1e9]  # ignored
    returns["atari/pong"] = [21.0]  # ignored
    assert dmlab30.compute_human_normalized_score(returns, None) == pytest.approx(100)
    del returns["rooms_watermaze"]
    with pytest.raises(ValueError, match="rooms_watermaze"):
        dmlab30.compute_human_normalized_score(returns, 100)
    returns["rooms_watermaze"] = []
    with pytest.raises(ValueError, match="rooms_watermaze"):
        dmlab30.compute_human_normalized_score(returns, 100)


def test_atari57_tables():
    assert len(atari57.GAMES) == 57 == len(set(atari57.GAMES))
    assert atari57.HUMAN_SCORES["pong"] == 14.6
    assert atari57.RANDOM_SCORES["pong"] == -20.7
    assert atari57.LEVEL_NAMES[0] == "atari/alien"
    assert "montezuma_revenge" in atari57.GAMES


def _atari_returns(score_for_game):
    """Returns giving each game the human-normalised score asked for."""
    out = {}
    for game in atari57.GAMES:
        rnd, hum = atari57.RANDOM_SCORES[game], atari57.HUMAN_SCORES[game]
        out["atari/" + game] = [rnd + score_for_game(game) / 100 * (hum - rnd)]
    return out


def test_atari57_median_and_mean():
    # Scores 0, 10, ..., 560 in GAMES order: median 280 (the 29th of 57),
    # mean 280; then pong raised from 360 to 10,000 moves only the mean,
    # by 9640 / 57.
    index = {game: i for i, game in enumerate(atari57.GAMES)}
    returns = _atari_returns(lambda g: 10.0 * index[g])
    median, mean = atari57.compute_human_normalized_scores(returns)
    assert median == pytest.approx(280) and mean == pytest.approx(280)
    assert index["pong"] == 36
    returns = _atari_returns(lambda g: 10000.0 if g == "pong" else 10.0 * index[g])
    scores = atari57.compute_human_normalized_scores(returns)
    assert scores.median == pytest.approx(280)
    assert scores.mean == pytest.approx(280 + 9640 / 57)


def test_atari57_single_game_and_pooling():
    # Pong: (R - -20.7) / (14.6 - -20.7) * 100; R = -3.05 is 50.
    assert atari57.human_normalized_score("pong", [-3.05]) == pytest.approx(50)
    assert atari57.human_normalized_score("atari/pong", [-20.7, 14.6]) == pytest.approx(
        50
    )
    per_game = atari57.human_normalized_scores_per_game(
        {**_atari_returns(lambda g: 0.0), "pong": [14.6], "atari/pong": [-20.7]}
    )
    assert per_game["pong"] == pytest.approx(50)
    assert math.isclose(per_game["alien"], 0, abs_tol=1e-9)


def test_atari57_missing_and_extra_games():
    returns = _atari_returns(lambda g: 100.0)
    returns["explore_goal_locations_small"] = [5.0]  # ignored
    returns["atari/adventure"] = [5.0]  # not one of the 57: ignored
    assert atari57.compute_human_normalized_scores(returns).median == pytest.approx(100)
    del returns["atari/zaxxon"]
    with pytest.raises(ValueError, match="zaxxon"):
        atari57.compute_human_normalized_scores(returns)
    with pytest.raises(ValueError, match="not an Atari-57 game"):
        atari57.human_normalized_score("adventure", [1.0])


def test_results_table_rows_and_suite_lines_without_negative_zero():
    pong, breakout = "atari/pong", "atari/breakout"
    results = {
        "level_name": "atari/pong,atari/breakout",
        "levels": {
            pong: {"returns": [-21.0, -20.0], "mean_return": -20.5},
            breakout: {"returns": [3.0], "mean_return": 3.0},
        },
        "human_normalized": {"median": -0.04, "mean": -1.26},
    }
    lines = test_mode.results_table(results).splitlines()
    assert lines[0].split()[0] == "level"
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:4]}
    assert rows[pong][:2] == ["2", "-20.50"]
    assert rows[breakout][:2] == ["1", "3.00"]
    assert lines[4:] == [
        "atari/pong,atari/breakout human-normalised median: 0.0 %",
        "atari/pong,atari/breakout human-normalised mean: -1.3 %",
    ]


def test_play_episodes_says_it_is_at_work_while_no_episode_ends(monkeypatch):
    """Test mode on a policy whose games last to the step cap logs, every
    progress interval, the episodes ended and the agent steps played; it
    returns the first episodes that end, in order, with their lengths."""
    unroll = 4  # [T + 1] steps a run; step 0 repeats the previous last step.
    Info = collections.namedtuple("Info", "episode_return episode_step")
    EnvOutputs = collections.namedtuple("EnvOutputs", "done info")
    ActorOutput = collections.namedtuple("ActorOutput", "env_outputs")
    ended_at = {4: (7.0, 30), 7: (2.0, 12), 8: (5.0, 9)}  # run: (return, steps)

    class Session:
        calls = 0

        def run(self, fetches):
            assert fetches == {"done": "done", "info": "info"}
            self.calls += 1
            done = np.zeros(unroll + 1, bool)
            returns = np.zeros(unroll + 1, np.float32)
            lengths = np.zeros(unroll + 1, np.int32)
            if self.calls in ended_at:
                done[2] = True
                returns[2], lengths[2] = ended_at[self.calls]
            return {"done": done, "info": Info(returns, lengths)}

    ticks = iter(range(0, 1000, 4))  # each read of the clock 4 s later
    session = Session()
    # Read test mode's own log calls: absl's handler and verbosity are the
    # process's, which other tests in the same worker may have set.
    logged = []
    monkeypatch.setattr(
        test_mode.logging, "info", lambda message, *args: logged.append(message % args)
    )
    returns, steps = test_mode.play_episodes(
        session,
        ActorOutput(EnvOutputs("done", "info")),
        "atari/breakout",
        2,
        progress_secs=10,
        clock=lambda: float(next(ticks)),
    )
    assert (returns, steps) == ([7.0, 2.0], [30, 12])
    assert session.calls == 7
    lines = [line for line in logged if "agent steps" in line]
    # The clock reads 0 at the start, then once after each run: 4, 8, 12
    # (run 3: a line, the interval restarting at 12), 16 (run 4: the first
    # end), 20, 24 (run 6: a line); run 7 ends the second episode.
    assert lines == [
        "Level atari/breakout: 0 of 2 episodes ended, 12 agent steps played.",
        "Level atari/breakout: 1 of 2 episodes ended, 24 agent steps played.",
    ]
