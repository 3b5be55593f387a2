"""The code base's shape: flags stay in the scripts, modules form no cycle.

- Only experiment.py and launch.py read or define absl flags; every other
  module takes its settings as arguments (config.py's dataclasses).
- The project's modules import each other without a cycle, counting the
  imports inside functions too (a lazy import is still a dependency).
- experiment.py stays the wiring: at most MAX_EXPERIMENT_LINES lines.
- The fast subset of the tests (README, Development) is most of them.

Read from the source with `ast`; nothing is imported or run (but pytest's
collection, in a child process).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLAG_SCRIPTS = {"experiment.py", "launch.py", "export_weights.py"}
MAX_EXPERIMENT_LINES = 620
MIN_FAST_TESTS = 100


def project_modules(root: Path) -> dict[str, Path]:
    """Module name -> path for the top-level .py files of `root`."""
    return {path.stem: path for path in sorted(root.glob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = project_modules(root)
    known = set(modules)
    return {
        name: imported_modules(path, known) - {name} for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, str] = {}  # 'open' while on the stack, then 'done'
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = "open"
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return None


def test_project_modules_import_each_other_without_a_cycle():
    graph = import_graph(REPO)
    assert {"experiment", "actors", "pipeline", "distributed"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import(tmp_path):
    # The check itself can fail: a leaf module that imports back inside a
    # function (as atari.py once did with environments.py) closes a cycle.
    (tmp_path / "envs.py").write_text("import games\n")
    (tmp_path / "games.py").write_text("def specs():\n    import envs\n")
    (tmp_path / "leaf.py").write_text("import numpy\n")
    assert find_cycle(import_graph(tmp_path)) in (
        ["envs", "games", "envs"],
        ["games", "envs", "games"],
    )


def _reads_flags(path: Path) -> list[str]:
    """What in `path` refers to absl flags: `FLAGS` names or a flags import."""
    problems = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "FLAGS":
            problems.append(f"line {node.lineno}: FLAGS")
        elif isinstance(node, ast.Attribute) and node.attr == "FLAGS":
            problems.append(f"line {node.lineno}: .FLAGS")
        elif isinstance(node, ast.ImportFrom) and node.module == "absl":
            if any(alias.name == "flags" for alias in node.names):
                problems.append(f"line {node.lineno}: from absl import flags")
        elif isinstance(node, ast.Import):
            if any(alias.name == "absl.flags" for alias in node.names):
                problems.append(f"line {node.lineno}: import absl.flags")
    return problems


def offending_modules(check, exempt: set[str]) -> dict[str, list[str]]:
    """{module: problems} of the project's modules outside `exempt` (file
    names) for which `check(path)` finds problems."""
    return {
        name: problems
        for name, path in project_modules(REPO).items()
        if path.name not in exempt and (problems := check(path))
    }


def test_only_the_scripts_read_flags():
    assert offending_modules(_reads_flags, FLAG_SCRIPTS) == {}
    # The same as the shell check `grep -l "FLAGS\b" *.py`.
    mentions = {
        path.name
        for path in REPO.glob("*.py")
        if re.search(r"FLAGS\b", path.read_text(encoding="utf-8"))
    }
    assert mentions <= FLAG_SCRIPTS, mentions - FLAG_SCRIPTS


@pytest.mark.parametrize(
    "source",
    ["from absl import flags\n", "import absl.flags\n", "x = FLAGS.seed\n"],
)
def test_the_flags_check_catches_each_way_in(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert _reads_flags(path)


def test_experiment_py_stays_the_wiring():
    lines = (REPO / "experiment.py").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_EXPERIMENT_LINES, lines


def test_the_fast_subset_keeps_most_tests_and_leaves_out_the_slow_ones():
    """README's fast loop (`-m "not slow"`) runs at least MIN_FAST_TESTS
    tests, and `slow` is a registered marker (pyproject's --strict-markers
    makes a misspelt one an error)."""

    def collected(*args: str) -> int:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", *args, "tests"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        match = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
        assert match, result.stdout[-2000:]
        return int(match.group(1))

    fast, slow = collected("-m", "not slow"), collected("-m", "slow")
    assert fast >= MIN_FAST_TESTS, fast
    assert slow >= 1
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"slow:' in pyproject and "--strict-markers" in pyproject


# -- the environment seam ----------------------------------------------------------

# The family modules and the registry: the only places that know which family
# a level name belongs to.
FAMILY_MODULES = {"atari", "atari57", "dmlab", "dmlab30", "doom", "environments"}
# What a test of a level's family looks like: a family's prefix or suite name
# in a comparison or a startswith call.
FAMILY_MARKERS = ("atari/", "atari57", "dmlab30", "contributed/", "vizdoom")
# Modules that must not import TensorFlow at module level: what environment
# processes import (a child would pay seconds and hundreds of MiB for it), and
# the pure layers (cluster addresses, CPU features) that tools use without it.
TF_FREE_MODULES = {
    "atari",
    "atari57",
    "child_process",
    "cluster",
    "cpu_features",
    "dmlab",
    "dmlab30",
    "doom",
    "environment_specs",
}


# The helper that tested a level's family before the families existed; its
# name is spelt in two pieces so that a plain grep for it finds no use here.
OLD_FAMILY_HELPER = "is_atari" + "_level"


def _family_tests(path: Path) -> list[str]:
    """Comparisons and startswith calls in `path` that test a family's name."""
    problems = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = getattr(node, "id", getattr(node, "attr", None))
        if isinstance(node, ast.Name | ast.Attribute) and name == OLD_FAMILY_HELPER:
            problems.append(f"line {node.lineno}: {OLD_FAMILY_HELPER}")
        is_startswith = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "removeprefix")
        )
        if not (isinstance(node, ast.Compare) or is_startswith):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                if any(marker in inner.value for marker in FAMILY_MARKERS):
                    problems.append(f"line {node.lineno}: {inner.value!r}")
    return problems


def test_no_module_outside_the_families_tests_a_levels_family():
    exempt = {f"{name}.py" for name in FAMILY_MODULES}
    assert offending_modules(_family_tests, exempt) == {}


@pytest.mark.parametrize(
    "source",
    [
        "ok = name.startswith('atari" + "/')\n",
        "ok = name in ('dmlab30', 'atari57')\n",
        "ok = name == 'atari57'\n",
        f"if not environments.{OLD_FAMILY_HELPER}(name):\n    pass\n",
    ],
)
def test_the_family_check_catches_each_way_in(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert _family_tests(path)


def _module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_modules_of_environment_processes_stay_free_of_tensorflow():
    """Also through the project modules they import at module level."""
    modules = project_modules(REPO)
    seen, todo = set(), list(TF_FREE_MODULES)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        imports = _module_level_imports(modules[name])
        assert "tensorflow" not in imports, f"{name}.py imports TensorFlow"
        todo += [m for m in imports if m in modules]
