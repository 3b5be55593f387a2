"""The ViZDoom family: first-person 3D scenarios of Doom through the
`vizdoom` package (PyPI), with its scenarios and a free game WAD inside it.

Level names: 'vizdoom/<scenario>' for the scenarios below, which suit a
single agent (each is a .cfg of the package's scenarios directory), and
'vizdoom' for all of them in one agent. Left out: the multiplayer and bot
games (cig, deathmatch, multi, multi_duel), the full games (doom, doom2,
freedoom1, freedoom2, oblige) and the variants of basic that differ only in
what they report (simpler_basic, basic_audio, basic_notifications, learning).

Observations: the RGB screen, rendered at 160x120 (ViZDoom's smallest
resolution) and resized to 96x72 with area averaging: the DeepMind-Lab-like
input the deep agent is built for. Each agent step repeats its action
`num_action_repeats` tics (ViZDoom sums the reward over them). An episode
ends as the scenario defines (goal, death, or its own timeout); the
observation returned with done=True is the first of the next episode. The
seed goes to ViZDoom's own generator (`DoomGame.set_seed`).

Actions: one discrete action per button the scenario offers (pressed alone),
plus 'no-op', plus, where the scenario can both move forward and turn,
forward with each turn (the movement a navigating agent needs most):

  scenario                  buttons                                     actions
  basic, rocket_basic       MOVE_LEFT MOVE_RIGHT ATTACK                 4
  defend_the_center,        TURN_LEFT TURN_RIGHT ATTACK                 4
    defend_the_line, predict_position
  health_gathering(_supreme) TURN_LEFT TURN_RIGHT MOVE_FORWARD          6
  my_way_home               TURN_LEFT TURN_RIGHT MOVE_FORWARD
                            MOVE_LEFT MOVE_RIGHT                        8
  deadly_corridor           MOVE_LEFT MOVE_RIGHT ATTACK MOVE_FORWARD
                            MOVE_BACKWARD TURN_LEFT TURN_RIGHT          10
  take_cover                MOVE_LEFT MOVE_RIGHT                        3

The 'vizdoom' suite shares one policy over the union of these actions (10,
in `SUITE_ACTIONS`); in a scenario an action whose buttons it does not offer
does nothing.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from families.contract import (
    EnvironmentFamily,
    UnknownLevelError,
    environment_tensor_specs,
    importable,
)

PREFIX = "vizdoom/"
SUITE = "vizdoom"
SCENARIOS = (
    "basic",
    "deadly_corridor",
    "defend_the_center",
    "defend_the_line",
    "health_gathering",
    "health_gathering_supreme",
    "my_way_home",
    "predict_position",
    "rocket_basic",
    "take_cover",
)
FRAME_HEIGHT, FRAME_WIDTH = 72, 96

# Actions as the buttons they press, in the order the suite's policy uses.
SUITE_ACTIONS: tuple[tuple[str, ...], ...] = (
    (),  # no-op
    ("MOVE_FORWARD",),
    ("TURN_LEFT",),
    ("TURN_RIGHT",),
    ("MOVE_FORWARD", "TURN_LEFT"),
    ("MOVE_FORWARD", "TURN_RIGHT"),
    ("MOVE_LEFT",),
    ("MOVE_RIGHT",),
    ("ATTACK",),
    ("MOVE_BACKWARD",),
)


def _vizdoom():
    import vizdoom

    return vizdoom


def scenario_config(scenario: str) -> str:
    """The scenario's .cfg file inside the vizdoom package."""
    return os.path.join(_vizdoom().scenarios_path, scenario + ".cfg")


@functools.cache
def scenario_buttons(scenario: str) -> tuple[str, ...]:
    """The buttons the scenario's config offers, in its order (read from the
    .cfg file itself, without starting the engine)."""
    with open(scenario_config(scenario)) as f:
        text = f.read()
    start = text.index("available_buttons")
    block = text[text.index("{", start) + 1 : text.index("}", start)]
    lines = (line.split("#")[0] for line in block.splitlines())
    return tuple(word for line in lines for word in line.split())


def scenario_actions(scenario: str) -> tuple[tuple[str, ...], ...]:
    """The scenario's own action set (see the module docstring)."""
    buttons = scenario_buttons(scenario)
    actions = [()] + [(b,) for b in buttons]
    if "MOVE_FORWARD" in buttons:
        actions += [
            ("MOVE_FORWARD", t) for t in ("TURN_LEFT", "TURN_RIGHT") if t in buttons
        ]
    return tuple(actions)


class PyProcessVizdoom:
    """One ViZDoom scenario for `py_process.PyProcess` (the env-class
    protocol): initial() -> observation; step(action) -> (reward float32,
    done bool, observation); close(). observation = (RGB uint8 [72, 96, 3],
    instruction ''). `action` indexes `actions` (the scenario's own set, or
    SUITE_ACTIONS for a policy shared by several scenarios)."""

    def __init__(
        self,
        scenario: str,
        seed: int,
        num_action_repeats: int = 4,
        shared_actions: bool = False,
    ):
        vizdoom = _vizdoom()
        game = vizdoom.DoomGame()
        game.load_config(scenario_config(scenario))
        game.set_window_visible(False)
        game.set_screen_format(vizdoom.ScreenFormat.RGB24)
        game.set_screen_resolution(vizdoom.ScreenResolution.RES_160X120)
        game.set_mode(vizdoom.Mode.PLAYER)
        game.set_seed(int(seed) % 2**31)
        game.init()
        self._game = game
        self._num_action_repeats = num_action_repeats
        buttons = [str(b).split(".")[-1] for b in game.get_available_buttons()]
        actions = SUITE_ACTIONS if shared_actions else scenario_actions(scenario)
        # Each action as the button vector ViZDoom takes.
        self._actions = [[int(b in action) for b in buttons] for action in actions]
        self._frame = np.zeros([FRAME_HEIGHT, FRAME_WIDTH, 3], np.uint8)

    def _observation(self) -> tuple[np.ndarray, str]:
        import cv2

        state = self._game.get_state()
        if state is not None:
            self._frame = cv2.resize(
                state.screen_buffer,
                (FRAME_WIDTH, FRAME_HEIGHT),
                interpolation=cv2.INTER_AREA,
            )
        return self._frame.copy(), ""

    def initial(self) -> tuple[np.ndarray, str]:
        self._game.new_episode()
        return self._observation()

    def step(self, action) -> tuple[np.float32, np.bool_, tuple[np.ndarray, str]]:
        reward = self._game.make_action(
            self._actions[int(action)], self._num_action_repeats
        )
        done = self._game.is_episode_finished()
        if done:
            self._game.new_episode()
        return np.float32(reward), np.bool_(done), self._observation()

    def close(self) -> None:
        self._game.close()

    @staticmethod
    def _tensor_specs(method_name, unused_kwargs, unused_constructor_kwargs):
        return environment_tensor_specs(method_name, [FRAME_HEIGHT, FRAME_WIDTH, 3])


class VizdoomFamily(EnvironmentFamily):
    """ViZDoom for the registry (see contract.EnvironmentFamily)."""

    name = "ViZDoom"
    suites = (SUITE,)
    level_forms = "'vizdoom/<scenario>' (e.g. vizdoom/my_way_home), 'vizdoom'"
    # The tested defend_the_center command (BENCHMARKS.md, "ViZDoom
    # defend_the_center"), for either agent.
    default_flagfiles = ("flagfiles/vizdoom_defend_the_center.cfg",)

    def owns(self, level_name: str) -> bool:
        return level_name == SUITE or level_name.startswith(PREFIX)

    def expand(self, level_name: str, is_test: bool = False) -> list[str]:
        if level_name == SUITE:
            return [PREFIX + s for s in SCENARIOS]
        if level_name[len(PREFIX) :] in SCENARIOS:
            return [level_name]
        raise UnknownLevelError(
            "not a ViZDoom scenario of this family (single-agent scenarios: "
            + ", ".join(SCENARIOS)
            + ")."
        )

    def suggestions(self) -> dict[str, str]:
        names = {SUITE: SUITE}
        for scenario in SCENARIOS:
            names[PREFIX + scenario] = PREFIX + scenario
            names.setdefault(scenario, PREFIX + scenario)
        return names

    def available(self) -> bool:
        return importable("vizdoom")

    def not_available_message(self, level_name: str) -> str:
        return (
            f"--level_name={level_name}: a ViZDoom scenario, but the vizdoom "
            f"package is not installed; install the requirements "
            f"(python3 -m pip install -r requirements.txt)."
        )

    def num_actions(self, level_names) -> int:
        level_names = list(level_names)
        if SUITE in level_names or len(set(level_names)) > 1:
            return len(SUITE_ACTIONS)
        return len(scenario_actions(level_names[0][len(PREFIX) :]))

    def run_options(self, environment, is_test: bool) -> dict[str, Any]:
        return {
            "num_action_repeats": environment.num_action_repeats,
            "shared_actions": len(set(environment.level_names)) > 1,
        }

    def environment_class(
        self,
        level_name: str,
        seed: int,
        is_test: bool = False,
        *,
        num_action_repeats: int = 4,
        shared_actions: bool = False,
    ) -> tuple[type, dict]:
        """PyProcessVizdoom and its arguments."""
        self.expand(level_name)  # an unknown scenario raises here
        return PyProcessVizdoom, dict(
            scenario=level_name[len(PREFIX) :],
            seed=seed,
            num_action_repeats=num_action_repeats,
            shared_actions=shared_actions,
        )


FAMILY = VizdoomFamily()
