"""DMLab-30: the 30 levels, their human and random scores, and the score.

Figures: IMPALA paper (Espeholt et al. 2018), appendix, as in DeepMind Lab's
dmlab30 level set; copied here from the project's reference data (the module
never reads data files at run time). Scores are keyed by the *test* level:
training runs use the training levels and the returns of a training level
count for its test level (`LEVEL_MAPPING`). Only two levels differ between
training and test (rooms_collect_good_objects, rooms_exploit_deferred_effects);
all others are the same level for both.

Human-normalised score of a level: 100 * (mean return - random) / (human -
random). The DMLab-30 headline is the mean over the 30 levels of that score,
each capped at 100 (`per_level_cap=100`); uncapped is also reported.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

import numpy as np
from absl import logging

from families.scores import human_normalized, strip_prefix

# DeepMind Lab's level path prefix of the DMLab-30 levels.
LEVEL_PREFIX = "contributed/dmlab30/"

# Training level -> test level (ordered as in the IMPALA paper's table).
LEVEL_MAPPING: collections.OrderedDict[str, str] = collections.OrderedDict(
    [
        ("rooms_collect_good_objects_train", "rooms_collect_good_objects_test"),
        ("rooms_exploit_deferred_effects_train", "rooms_exploit_deferred_effects_test"),
        ("rooms_select_nonmatching_object", "rooms_select_nonmatching_object"),
        ("rooms_watermaze", "rooms_watermaze"),
        ("rooms_keys_doors_puzzle", "rooms_keys_doors_puzzle"),
        ("language_select_described_object", "language_select_described_object"),
        ("language_select_located_object", "language_select_located_object"),
        ("language_execute_random_task", "language_execute_random_task"),
        (
            "language_answer_quantitative_question",
            "language_answer_quantitative_question",
        ),
        ("lasertag_one_opponent_small", "lasertag_one_opponent_small"),
        ("lasertag_three_opponents_small", "lasertag_three_opponents_small"),
        ("lasertag_one_opponent_large", "lasertag_one_opponent_large"),
        ("lasertag_three_opponents_large", "lasertag_three_opponents_large"),
        ("natlab_fixed_large_map", "natlab_fixed_large_map"),
        ("natlab_varying_map_regrowth", "natlab_varying_map_regrowth"),
        ("natlab_varying_map_randomized", "natlab_varying_map_randomized"),
        ("skymaze_irreversible_path_hard", "skymaze_irreversible_path_hard"),
        ("skymaze_irreversible_path_varied", "skymaze_irreversible_path_varied"),
        (
            "psychlab_arbitrary_visuomotor_mapping",
            "psychlab_arbitrary_visuomotor_mapping",
        ),
        ("psychlab_continuous_recognition", "psychlab_continuous_recognition"),
        ("psychlab_sequential_comparison", "psychlab_sequential_comparison"),
        ("psychlab_visual_search", "psychlab_visual_search"),
        ("explore_object_locations_small", "explore_object_locations_small"),
        ("explore_object_locations_large", "explore_object_locations_large"),
        ("explore_obstructed_goals_small", "explore_obstructed_goals_small"),
        ("explore_obstructed_goals_large", "explore_obstructed_goals_large"),
        ("explore_goal_locations_small", "explore_goal_locations_small"),
        ("explore_goal_locations_large", "explore_goal_locations_large"),
        ("explore_object_rewards_few", "explore_object_rewards_few"),
        ("explore_object_rewards_many", "explore_object_rewards_many"),
    ]
)

# Test level -> human episode return.
HUMAN_SCORES: dict[str, float] = {
    "rooms_collect_good_objects_test": 10.0,
    "rooms_exploit_deferred_effects_test": 85.65,
    "rooms_select_nonmatching_object": 65.9,
    "rooms_watermaze": 54.0,
    "rooms_keys_doors_puzzle": 53.8,
    "language_select_described_object": 389.5,
    "language_select_located_object": 280.7,
    "language_execute_random_task": 254.05,
    "language_answer_quantitative_question": 184.5,
    "lasertag_one_opponent_small": 12.65,
    "lasertag_three_opponents_small": 18.55,
    "lasertag_one_opponent_large": 18.6,
    "lasertag_three_opponents_large": 31.5,
    "natlab_fixed_large_map": 36.9,
    "natlab_varying_map_regrowth": 24.45,
    "natlab_varying_map_randomized": 42.35,
    "skymaze_irreversible_path_hard": 100.0,
    "skymaze_irreversible_path_varied": 100.0,
    "psychlab_arbitrary_visuomotor_mapping": 58.75,
    "psychlab_continuous_recognition": 58.3,
    "psychlab_sequential_comparison": 39.5,
    "psychlab_visual_search": 78.5,
    "explore_object_locations_small": 74.45,
    "explore_object_locations_large": 65.65,
    "explore_obstructed_goals_small": 206.0,
    "explore_obstructed_goals_large": 119.5,
    "explore_goal_locations_small": 267.5,
    "explore_goal_locations_large": 194.5,
    "explore_object_rewards_few": 77.7,
    "explore_object_rewards_many": 106.7,
}

# Test level -> random-agent episode return.
RANDOM_SCORES: dict[str, float] = {
    "rooms_collect_good_objects_test": 0.073,
    "rooms_exploit_deferred_effects_test": 8.501,
    "rooms_select_nonmatching_object": 0.312,
    "rooms_watermaze": 4.065,
    "rooms_keys_doors_puzzle": 4.135,
    "language_select_described_object": -0.07,
    "language_select_located_object": 1.929,
    "language_execute_random_task": -5.913,
    "language_answer_quantitative_question": -0.33,
    "lasertag_one_opponent_small": -0.224,
    "lasertag_three_opponents_small": -0.214,
    "lasertag_one_opponent_large": -0.083,
    "lasertag_three_opponents_large": -0.102,
    "natlab_fixed_large_map": 2.173,
    "natlab_varying_map_regrowth": 2.989,
    "natlab_varying_map_randomized": 7.346,
    "skymaze_irreversible_path_hard": 0.1,
    "skymaze_irreversible_path_varied": 14.4,
    "psychlab_arbitrary_visuomotor_mapping": 0.163,
    "psychlab_continuous_recognition": 0.224,
    "psychlab_sequential_comparison": 0.129,
    "psychlab_visual_search": 0.085,
    "explore_object_locations_small": 3.575,
    "explore_object_locations_large": 4.673,
    "explore_obstructed_goals_small": 6.76,
    "explore_obstructed_goals_large": 2.61,
    "explore_goal_locations_small": 7.66,
    "explore_goal_locations_large": 3.14,
    "explore_object_rewards_few": 2.073,
    "explore_object_rewards_many": 2.438,
}

# Every training and test level name (without the path prefix).
ALL_LEVELS: frozenset[str] = frozenset(LEVEL_MAPPING) | frozenset(
    LEVEL_MAPPING.values()
)


def _transform_level_returns(
    level_returns: Mapping[str, Iterable[float]],
) -> dict[str, np.ndarray]:
    """Maps training level names to test level names, keeping only DMLab-30.

    Returns a dict test level -> float64 array of returns. Keys may carry the
    'contributed/dmlab30/' prefix. The returns of a training level and of its
    test level, when both are given, are pooled.
    """
    test_levels = set(LEVEL_MAPPING.values())
    new_level_returns: dict[str, list[float]] = {}
    for level_name, returns in level_returns.items():
        name = strip_prefix(level_name, LEVEL_PREFIX)
        name = LEVEL_MAPPING.get(name, name)
        if name not in test_levels:
            logging.info("Skipping level %s for the DMLab-30 score.", level_name)
            continue
        values = np.asarray(returns, dtype=np.float64).reshape(-1)
        new_level_returns.setdefault(name, []).extend(values.tolist())

    missing = [name for name in LEVEL_MAPPING.values() if name not in new_level_returns]
    if missing:
        raise ValueError(f"Missing levels for the DMLab-30 score: {missing}")
    empty = [name for name, values in new_level_returns.items() if not values]
    if empty:
        raise ValueError(f"Missing returns for the DMLab-30 levels: {empty}")
    return {name: np.asarray(values) for name, values in new_level_returns.items()}


def human_normalized_score(level_name: str, returns: Iterable[float]) -> float:
    """100 * (mean(returns) - random) / (human - random) for one level.

    level_name: a DMLab-30 training or test level (prefix allowed).
    """
    name = strip_prefix(level_name, LEVEL_PREFIX)
    name = LEVEL_MAPPING.get(name, name)
    if name not in HUMAN_SCORES:
        raise ValueError(f"{level_name!r} is not a DMLab-30 level.")
    return human_normalized(returns, RANDOM_SCORES[name], HUMAN_SCORES[name])


def compute_human_normalized_score(
    level_returns: Mapping[str, Iterable[float]], per_level_cap: float | None
) -> float:
    """Mean over the 30 DMLab-30 levels of the human-normalised score.

    Args:
      level_returns: level name -> episode returns on that level. Training
        level names count for their test level; the 'contributed/dmlab30/'
        prefix is allowed; levels outside DMLab-30 are ignored.
      per_level_cap: cap on each level's score before the mean (the paper's
        headline uses 100), or None for no cap.

    Raises:
      ValueError: a DMLab-30 level is missing or has no returns (named).
    """
    new_level_returns = _transform_level_returns(level_returns)
    scores = []
    for name in LEVEL_MAPPING.values():
        score = human_normalized_score(name, new_level_returns[name])
        if per_level_cap is not None:
            score = min(score, per_level_cap)
        scores.append(score)
    return float(np.mean(scores))
