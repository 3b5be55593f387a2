"""Atari-57: the 57 games, their human and random scores, and the score.

Figures: the standard Atari-57 human and random baselines (Mnih et al. 2015;
Wang et al. 2016; 30 no-op starts, 108,000-frame episode cap), copied here
from the project's reference data (never read from files at run time).
Game names are ale_py's ROM ids, which are also this project's level names
after 'atari/' (e.g. 'atari/montezuma_revenge'); all 57 exist in ale_py 0.12.

Human-normalised score of a game: 100 * (mean return - random) / (human -
random). The Atari-57 headline is the median over the 57 games; the mean is
reported too.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

import numpy as np
from absl import logging

from families.scores import human_normalized, strip_prefix

LEVEL_PREFIX = "atari/"

# game -> (random, human) episode returns.
_SCORES: dict[str, tuple[float, float]] = {
    "alien": (227.8, 7127.7),
    "amidar": (5.8, 1719.5),
    "assault": (222.4, 742.0),
    "asterix": (210.0, 8503.3),
    "asteroids": (719.1, 47388.7),
    "atlantis": (12850.0, 29028.1),
    "bank_heist": (14.2, 753.1),
    "battle_zone": (2360.0, 37187.5),
    "beam_rider": (363.9, 16926.5),
    "berzerk": (123.7, 2630.4),
    "bowling": (23.1, 160.7),
    "boxing": (0.1, 12.1),
    "breakout": (1.7, 30.5),
    "centipede": (2090.9, 12017.0),
    "chopper_command": (811.0, 7387.8),
    "crazy_climber": (10780.5, 35829.4),
    "defender": (2874.5, 18688.9),
    "demon_attack": (152.1, 1971.0),
    "double_dunk": (-18.6, -16.4),
    "enduro": (0.0, 860.5),
    "fishing_derby": (-91.7, -38.7),
    "freeway": (0.0, 29.6),
    "frostbite": (65.2, 4334.7),
    "gopher": (257.6, 2412.5),
    "gravitar": (173.0, 3351.4),
    "hero": (1027.0, 30826.4),
    "ice_hockey": (-11.2, 0.9),
    "jamesbond": (29.0, 302.8),
    "kangaroo": (52.0, 3035.0),
    "krull": (1598.0, 2665.5),
    "kung_fu_master": (258.5, 22736.3),
    "montezuma_revenge": (0.0, 4753.3),
    "ms_pacman": (307.3, 6951.6),
    "name_this_game": (2292.3, 8049.0),
    "phoenix": (761.4, 7242.6),
    "pitfall": (-229.4, 6463.7),
    "pong": (-20.7, 14.6),
    "private_eye": (24.9, 69571.3),
    "qbert": (163.9, 13455.0),
    "riverraid": (1338.5, 17118.0),
    "road_runner": (11.5, 7845.0),
    "robotank": (2.2, 11.9),
    "seaquest": (68.4, 42054.7),
    "skiing": (-17098.1, -4336.9),
    "solaris": (1236.3, 12326.7),
    "space_invaders": (148.0, 1668.7),
    "star_gunner": (664.0, 10250.0),
    "surround": (-10.0, 6.5),
    "tennis": (-23.8, -8.3),
    "time_pilot": (3568.0, 5229.2),
    "tutankham": (11.4, 167.6),
    "up_n_down": (533.4, 11693.2),
    "venture": (0.0, 1187.5),
    "video_pinball": (16256.9, 17667.9),
    "wizard_of_wor": (563.5, 4756.5),
    "yars_revenge": (3092.9, 54576.9),
    "zaxxon": (32.5, 9173.3),
}

# The 57 games in alphabetical order.
GAMES: tuple[str, ...] = tuple(_SCORES)
# game -> human episode return.
HUMAN_SCORES: dict[str, float] = {game: s[1] for game, s in _SCORES.items()}
# game -> random-agent episode return.
RANDOM_SCORES: dict[str, float] = {game: s[0] for game, s in _SCORES.items()}
# 'atari/<game>' level names, in the order of GAMES.
LEVEL_NAMES: tuple[str, ...] = tuple(LEVEL_PREFIX + game for game in GAMES)

# Smaller suites of Atari-57 games (Aitchison, Sweetser and Hutter, ICML 2023,
# "Atari-5: Distilling the Arcade Learning Environment down to Five Games"):
# each is a set of games with a weight a game, fitted so that
#   log10(1 + median57) ~= sum_i w_i * log10(1 + max(HNS_i, 0))
# (HNS in percent, no intercept) estimates the median human-normalised score
# over all 57 games. Atari-5 and Atari-3 are test sets; Atari-3-Val and
# Atari-5-Val share no game with them and are the sets the paper gives for
# tuning (tune there, report on Atari-5). The weights and each estimate's
# stated relative error are as the authors fitted them (the repository
# maitchison/PPO, tools/plot_util.py, AtariScoreNormalizer.SUBSETS).
# Name -> ((game, weight), ...) in the paper's order, and the error in %.
SUBSET_WEIGHTS: dict[str, tuple[tuple[str, float], ...]] = {
    "atari5": (
        ("battle_zone", 0.3819751237831753),
        ("double_dunk", 0.0679099488887574),
        ("name_this_game", 0.310804148620847),
        ("phoenix", 0.12412619402774641),
        ("qbert", 0.08048518286466755),
    ),
    "atari3": (
        ("battle_zone", 0.3705645071598444),
        ("name_this_game", 0.513268255229986),
        ("phoenix", 0.10151691314166367),
    ),
    "atari3_val": (
        ("assault", 0.3352529798243203),
        ("ms_pacman", 0.4236379909065204),
        ("yars_revenge", 0.1916184632131803),
    ),
    "atari5_val": (
        ("bank_heist", 0.10718453170488736),
        ("video_pinball", 0.09591728001257466),
        ("assault", 0.2233635194763938),
        ("ms_pacman", 0.294255864978837),
        ("yars_revenge", 0.22392551763974122),
    ),
}
SUBSET_ERROR_PERCENT: dict[str, float] = {
    "atari5": 10.4,
    "atari3": 13.7,
    "atari3_val": 17.1,
    "atari5_val": 14.3,
}
# Name -> games.
SUBSETS: dict[str, tuple[str, ...]] = {
    name: tuple(game for game, _ in weights) for name, weights in SUBSET_WEIGHTS.items()
}

HumanNormalizedScores = collections.namedtuple("HumanNormalizedScores", "median mean")


def human_normalized_score(game: str, returns: Iterable[float]) -> float:
    """100 * (mean(returns) - random) / (human - random) for one game.

    game: 'pong' or 'atari/pong'.
    """
    name = strip_prefix(game, LEVEL_PREFIX)
    if name not in _SCORES:
        raise ValueError(f"{game!r} is not an Atari-57 game.")
    random, human = _SCORES[name]
    return human_normalized(returns, random, human)


def human_normalized_scores_per_game(
    level_returns: Mapping[str, Iterable[float]],
) -> dict[str, float]:
    """game -> human-normalised score, for all 57 games.

    Args:
      level_returns: level name ('atari/pong' or 'pong') -> episode returns.
        Levels outside Atari-57 are ignored; returns given under both
        spellings of one game are pooled.

    Raises:
      ValueError: a game is missing or has no returns (named).
    """
    pooled: dict[str, list[float]] = {}
    for level_name, returns in level_returns.items():
        name = strip_prefix(level_name, LEVEL_PREFIX)
        if name not in _SCORES:
            logging.info("Skipping level %s for the Atari-57 score.", level_name)
            continue
        values = np.asarray(returns, dtype=np.float64).reshape(-1)
        pooled.setdefault(name, []).extend(values.tolist())
    missing = [game for game in GAMES if not pooled.get(game)]
    if missing:
        raise ValueError(
            f"Missing games (or returns) for the Atari-57 score: {missing}"
        )
    return {game: human_normalized_score(game, pooled[game]) for game in GAMES}


def median57_estimate(suite: str, game_scores: Mapping[str, float]) -> float:
    """The suite's estimate of the 57-game median human-normalised score
    (percent): 10 ** sum_i w_i log10(1 + max(HNS_i, 0)) - 1 over the suite's
    games (SUBSET_WEIGHTS), from {game: HNS in percent} ('pong' or
    'atari/pong'). A game of the suite without a score: ValueError."""
    scores = {strip_prefix(g, LEVEL_PREFIX): float(v) for g, v in game_scores.items()}
    missing = [game for game in SUBSETS[suite] if game not in scores]
    if missing:
        raise ValueError(f"Missing {', '.join(missing)} for the {suite} estimate.")
    total = sum(
        weight * np.log10(1.0 + max(scores[game], 0.0))
        for game, weight in SUBSET_WEIGHTS[suite]
    )
    return float(10.0**total - 1.0)


def subset_scores(
    suite: str, level_returns: Mapping[str, Iterable[float]]
) -> dict[str, float]:
    """The median and mean human-normalised score over a subset's games
    (SUBSETS[suite]) and the suite's estimate of the 57-game median
    (`median57_estimate`), from {level: returns}; a game without returns is
    named in the ValueError."""
    scores = []
    for game in SUBSETS[suite]:
        returns = [
            float(r)
            for level, values in level_returns.items()
            if strip_prefix(level, LEVEL_PREFIX) == game
            for r in np.asarray(values, dtype=np.float64).reshape(-1)
        ]
        if not returns:
            raise ValueError(f"Missing returns for {game!r} in the {suite} score.")
        scores.append(human_normalized_score(game, returns))
    return {
        "median": float(np.median(scores)),
        "mean": float(np.mean(scores)),
        "median57_estimate": median57_estimate(
            suite, dict(zip(SUBSETS[suite], scores, strict=True))
        ),
    }


def compute_human_normalized_scores(
    level_returns: Mapping[str, Iterable[float]],
) -> HumanNormalizedScores:
    """Median and mean over the 57 games of the human-normalised score.

    Returns HumanNormalizedScores(median, mean) (a namedtuple, so
    `median, mean = compute_human_normalized_scores(...)` works). No per-game
    cap. See `human_normalized_scores_per_game` for arguments and errors.
    """
    scores = list(human_normalized_scores_per_game(level_returns).values())
    return HumanNormalizedScores(float(np.median(scores)), float(np.mean(scores)))
