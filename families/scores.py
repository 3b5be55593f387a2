"""The human-normalised score, one definition for every suite (DMLab-30 in
the root's dmlab30.py, Atari-57 in atari57.py): a level's mean return placed
between the random policy's (0) and the human reference's (100).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def strip_prefix(level_name: str, prefix: str) -> str:
    """'atari/pong' -> 'pong' for prefix 'atari/'; a name without it as is."""
    return level_name.removeprefix(prefix)


def human_normalized(returns: Iterable[float], random: float, human: float) -> float:
    """100 * (mean(returns) - random) / (human - random)."""
    score = float(np.mean(np.asarray(returns, dtype=np.float64)))
    return (score - random) / (human - random) * 100.0
