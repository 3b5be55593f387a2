"""DeepMind Lab's Python API as its source says it behaves, row by row.

Each row is one call and what the library answers: the exception's type and
its words, or the value returned. The source of each row is in
google-deepmind/lab at commit b1db91a (python/dmlab_module.c, the module;
public/dmlab_so_loader.cc, the loader; engine/code/deepmind/dmlab_connect.c,
the engine's settings; game_scripts/, the levels' Lua). The table runs on
the stand-in in tests/standin (always) and on the real library (where it is
installed; skipped, saying why, elsewhere): the stand-in is held to the
library's source, not to itself. What only the stand-in adds (its
environment variables for tests) is in its own docstring.
"""

from __future__ import annotations

import dataclasses

import pytest
from dmlab_helpers import FULL_LEVEL, REAL, STANDIN, deepmind_lab

PSYCHLAB = "contributed/dmlab30/psychlab_continuous_recognition"
SIZE = {"width": "96", "height": "72"}


@dataclasses.dataclass(frozen=True)
class Row:
    """`call` (Python evaluated in a child that imported deepmind_lab) gives
    `raises` with a message that starts with `starts` and contains `has`,
    or, with raises=None, a value whose repr is `returns`."""

    name: str
    call: str
    source: str
    raises: str | None = None
    starts: str = ""
    has: str = ""
    returns: str | None = None


MODULE = "python/dmlab_module.c"
ROWS = [
    Row(
        "observations_must_be_a_list",
        "deepmind_lab.Lab(LEVEL, ('RGB_INTERLEAVED',))",
        f"{MODULE}:160 Lab_init parses 'sO!|O!sOs' with &PyList_Type",
        raises="TypeError",
    ),
    Row(
        "config_values_must_be_strings",
        "deepmind_lab.Lab(LEVEL, [], config={'width': 96})",
        f"{MODULE}:259-265 Lab_init: PyUnicode_AsUTF8 of each value, NULL ends it",
        raises="TypeError",
    ),
    Row(
        "renderer_is_software_or_hardware",
        "deepmind_lab.Lab(LEVEL, [], renderer='vulkan')",
        f"{MODULE}:190-197 Lab_init",
        raises="RuntimeError",
        starts='Failed to set renderer must be "hardware" or "software" '
        'actual "vulkan"!',
    ),
    Row(
        "width_is_a_positive_multiple_of_4",
        "deepmind_lab.Lab(LEVEL, [], config={'width': '97', 'height': '72'})",
        f"{MODULE}:266-271 Lab_init; engine/code/deepmind/dmlab_connect.c:534-542 "
        "dmlab_setting",
        raises="RuntimeError",
        starts="Failed to apply setting 'width = 97' - ",
        has="'width' must be a positive multiple of 4. Actual 97",
    ),
    Row(
        "a_setting_nobody_knows_fails_the_init",
        "deepmind_lab.Lab(LEVEL, [], config={'noSuchSetting': '1'})",
        "engine/code/deepmind/dmlab_connect.c:707-708 dmlab_setting hands other "
        "keys to the level; game_scripts/decorators/setting_overrides.lua:139-140 "
        "api:init errors on one it does not know",
        raises="RuntimeError",
        starts='Failed to init environment - "',
        has='Invalid setting: "noSuchSetting" = "1"',
    ),
    Row(
        "an_unknown_level_fails_the_init",
        "deepmind_lab.Lab('no_such_level', [])",
        f"{MODULE}:276-279 Lab_init: init fails",
        raises="RuntimeError",
        starts='Failed to init environment - "',
    ),
    Row(
        "an_unknown_observation",
        "deepmind_lab.Lab(LEVEL, ['NO_SUCH_OBSERVATION'], config=SIZE)",
        f"{MODULE}:301-304 Lab_init",
        raises="ValueError",
        starts="Unknown observation 'NO_SUCH_OBSERVATION'.",
    ),
    Row(
        "observations_before_reset",
        "deepmind_lab.Lab(LEVEL, ['RGB_INTERLEAVED'], config=SIZE).observations()",
        f"{MODULE}:579-582 Lab_observations",
        raises="RuntimeError",
        starts="Environment in wrong status for call to observations()",
    ),
    Row(
        "step_before_reset",
        "deepmind_lab.Lab(LEVEL, [], config=SIZE).step(FORWARD)",
        f"{MODULE}:392-396 Lab_step: not running",
        raises="RuntimeError",
        starts="Environment in wrong status to advance.",
    ),
    Row(
        "seed_is_an_int_or_none",
        "started().reset(seed=1.5)",
        f"{MODULE}:329-334 Lab_reset",
        raises="ValueError",
        starts="'seed' must be int or None, was 'float'.",
    ),
    Row(
        "reset_returns_true",
        "started().reset(seed=2)",
        f"{MODULE}:349-353 Lab_reset",
        returns="True",
    ),
    Row(
        "the_action_is_a_numpy_array",
        "started().step([0, 0, 0, 1, 0, 0, 0])",
        f"{MODULE}:387-390 Lab_step parses 'O!|i' with &PyArray_Type",
        raises="TypeError",
    ),
    Row(
        "the_action_has_7_elements",
        "started().step(np.zeros(6, np.intc))",
        f"{MODULE}:401-406 Lab_step",
        raises="ValueError",
        starts="action must have shape (7)",
    ),
    Row(
        "the_action_is_intc",
        "started().step(np.zeros(7, np.int64))",
        f"{MODULE}:408-411 Lab_step",
        raises="ValueError",
        starts="action must have dtype np.intc",
    ),
    Row(
        "step_returns_the_reward_as_a_float",
        "type(started().step(FORWARD, num_steps=4)).__name__",
        f"{MODULE}:430 Lab_step: PyFloat_FromDouble",
        returns="'float'",
    ),
    Row(
        "psychlab_without_its_dataset_cannot_start",
        "deepmind_lab.Lab(PSYCHLAB, [], config={**SIZE, 'datasetPath': ''})"
        ".reset(seed=1)",
        f"{MODULE}:338-341 Lab_reset; game_scripts/factories/psychlab/factory.lua:"
        "110-113 api:start makes the task, whose _init loads "
        "game_scripts/datasets/brady_konkle_oliva2008.lua:37-40 (asserts a path)",
        raises="RuntimeError",
        starts='Failed to start environment - "',
        has="Follow instructions to download datasets here",
    ),
    Row(
        "psychlab_with_the_librarys_dummy_dataset",
        "deepmind_lab.Lab(PSYCHLAB, [], config={**SIZE, 'datasetPath': 'dummy'})"
        ".reset(seed=1)",
        "game_scripts/datasets/brady_konkle_oliva2008.lua:31-32 ('dummy': "
        "generated images)",
        returns="True",
    ),
    Row(
        "two_labs_in_one_process_each_with_its_own_state",
        "two_labs()",
        "public/dmlab_so_loader.cc:136-191 open_unique_dso: each Lab after a "
        "process's first opens a fresh copy of the engine",
        returns="[True, True, 4, 8]",
    ),
]

CHILD = """
import deepmind_lab
LEVEL, PSYCHLAB, SIZE = {level!r}, {psychlab!r}, {size!r}
FORWARD = np.array([0, 0, 0, 1, 0, 0, 0], np.intc)

def started():
    lab = deepmind_lab.Lab(LEVEL, ['RGB_INTERLEAVED'], config=SIZE)
    lab.reset(seed=1)
    return lab

def two_labs():
    a, b = started(), started()
    a.step(FORWARD, num_steps=4)
    b.step(FORWARD, num_steps=8)
    return [a.is_running(), b.is_running(), a.num_steps(), b.num_steps()]

for name, call in {calls!r}:
    try:
        out[name] = [None, repr(eval(call))]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
"""


@pytest.fixture(scope="module", params=[STANDIN, REAL])
def answers(request) -> dict:
    """Every row's answer from one child with this deepmind_lab."""
    lab = deepmind_lab(request.param)
    calls = [(row.name, row.call) for row in ROWS]
    return lab.in_child(
        CHILD.format(level=FULL_LEVEL, psychlab=PSYCHLAB, size=SIZE, calls=calls)
    )


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_deepmind_lab_answers_as_its_source_says(answers, row):
    raised, text = answers[row.name]
    assert raised == row.raises, (row.source, raised, text)
    if row.raises is None:
        assert text == row.returns, row.source
    else:
        assert text.startswith(row.starts), (row.source, text)
        assert row.has in text, (row.source, text)
