"""The agent a checkpoint holds, so that test mode evaluates it as trained.

Test mode restores the newest checkpoint in --logdir into an agent built
from the flags; a checkpoint's weights evaluate without repeating their
training flags because --agent, --use_lstm and --popart, when not given,
are read from the checkpoint's variable names and shapes here
(pretrained/atari_pong is shallow; --agent's default is deep).
"""

from __future__ import annotations

from absl import logging

import agent as agent_lib
from runtime import checkpoints


def agent_settings(
    logdir: str, torso: str, use_lstm: bool, *, torso_given: bool, lstm_given: bool
) -> tuple[str, bool]:
    """(torso, use_lstm) to evaluate `logdir`'s checkpoint with: each one not
    given on the command line is what the checkpoint holds (the flag's value
    when it cannot tell, or there is no checkpoint yet)."""
    saved_torso, saved_lstm = checkpoints.saved_agent(logdir, agent_lib.TORSOS)
    chosen_torso, chosen_lstm = torso, use_lstm
    if not torso_given and saved_torso is not None:
        chosen_torso = saved_torso
    if not lstm_given and saved_lstm is not None:
        chosen_lstm = saved_lstm
    if (chosen_torso, chosen_lstm) != (torso, use_lstm):
        logging.info(
            "--mode=test: evaluating the checkpoint in %s with the agent it "
            "holds: --agent=%s --use_lstm=%s.",
            logdir,
            chosen_torso,
            str(chosen_lstm).lower(),
        )
    return chosen_torso, chosen_lstm


def num_values(
    logdir: str, popart: bool, *, popart_given: bool, num_levels: int
) -> int:
    """The value head's width to evaluate with: without --popart on the
    command line, the checkpoint's (0 for a head of one value); with
    --popart, the checkpoint's or one per level (the values are unused in
    test mode, but the head must match the weights)."""
    saved = checkpoints.saved_num_values(logdir)
    if not popart_given:
        return saved if saved and saved > 1 else 0
    if popart:
        return saved or num_levels
    return 0
