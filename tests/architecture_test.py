"""The code base's shape: flags stay in the scripts, modules form no cycle.

- Only experiment.py and launch.py read or define absl flags; every other
  module takes its settings as arguments (config.py's dataclasses).
- The project's modules import each other without a cycle, counting the
  imports inside functions too (a lazy import is still a dependency).
- experiment.py stays the wiring: at most MAX_EXPERIMENT_LINES lines, with
  single-machine training in single_machine/ and test mode's checkpoint
  reading in evaluation/.
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
FLAG_SCRIPTS = {"experiment", "launch", "export_weights"}
MAX_EXPERIMENT_LINES = 450
MIN_FAST_TESTS = 100


PACKAGES = (
    "actor",
    "cluster",
    "evaluation",
    "families",
    "learner",
    "pbt",
    "runtime",
    "single_machine",
)
# The card's names and the other entry scripts; everything else is in PACKAGES.
MAX_ROOT_MODULES = 14
# What each package may import of the project (besides itself): the seams.
# A module at the root is named by its file name; a package by its name.
ALLOWED_IMPORTS = {
    # The bottom layer: processes, sessions, errors, logging, checkpoints.
    "runtime": set(),
    # Environments: the contract and the families, under the registry.
    "families": {"runtime", "dmlab30"},
    # The actor's side: environments, the unroll, its runner and supervisor.
    "actor": {
        "runtime",
        "families",
        "agent",
        "config",
        "dynamic_batching",
        "environments",
        "py_process",
        "trajectory",
    },
    # The learner's side: it knows the trajectory, never the actor.
    "learner": {
        "runtime",
        "families",
        "agent",
        "config",
        "environments",
        "trajectory",
        "vtrace",
    },
    # Single-machine training joins the actor's side and the learner's in one
    # graph; it knows nothing of the cluster, nor of test mode.
    "single_machine": {
        "runtime",
        "families",
        "actor",
        "learner",
        "agent",
        "config",
        "environments",
        "py_process",
        "trajectory",
    },
    # A cluster's tasks: the actor's side and the learner's over TensorFlow's
    # runtime; never single-machine training, test mode or the families.
    "cluster": {
        "runtime",
        "actor",
        "learner",
        "agent",
        "config",
        "py_process",
    },
    # Population Based Training: the rule, the records and a member's
    # fitness; it changes a learner through the learner's own interface.
    "pbt": {"runtime", "families", "environments", "config", "learner"},
    # Test mode: the actor's unroll on a restored checkpoint (and the
    # learner's episode lines); never the cluster or single-machine training.
    "evaluation": {
        "runtime",
        "families",
        "actor",
        "agent",
        "config",
        "environments",
        "py_process",
        "trajectory",
        "learner",
    },
}


def module_name(path: Path, root: Path) -> str:
    """'actor/runner.py' -> 'actor.runner'; 'actor/__init__.py' -> 'actor'."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path) -> dict[str, Path]:
    """Module name -> path for the .py files at the root of `root` and in
    its packages (folders with an __init__.py), the benchmarks' aside (they
    measure the project; the tests below keep their own shape)."""
    paths = sorted(root.glob("*.py"))
    for init in sorted(root.glob("*/__init__.py")):
        if init.parent.name != "benchmarks":
            paths += sorted(init.parent.glob("*.py"))
    return {module_name(path, root): path for path in paths}


def _imported_names(node: ast.AST) -> list[str]:
    """The dotted names an import statement can refer to: `import a.b` ->
    ['a.b']; `from a import b, c` -> ['a.b', 'a.c', 'a'] (b may be a module
    of package a, or a name in a's __init__)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    return []


def imported_modules(path: Path, known: set[str], top_level_only=False) -> set[str]:
    """The modules of `known` that `path` imports (anywhere in its code, or
    at module level only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        names = _imported_names(node)
        if isinstance(node, ast.ImportFrom):
            # `from a import b`: module a.b when it is one, else module a.
            modules = [n for n in names[:-1] if n in known]
            found.update(modules or [n for n in names[-1:] if n in known])
        else:
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
    assert {
        "experiment",
        "actor.runner",
        "learner.pipeline",
        "cluster.actor_task",
    } <= set(graph)
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
        if name not in exempt and (problems := check(path))
    }


def test_only_the_scripts_read_flags():
    assert offending_modules(_reads_flags, FLAG_SCRIPTS) == {}
    # The same as the shell check `grep -rl "FLAGS\b" --include=*.py`.
    mentions = {
        name
        for name, path in project_modules(REPO).items()
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


MAX_MODULE_LINES = 700


def test_no_module_of_the_project_or_of_its_benchmarks_passes_700_lines():
    """Every module but the tests' (one concern a module)."""
    long = {
        str(path.relative_to(REPO)): lines
        for path in sorted(REPO.glob("**/*.py"))
        if path.relative_to(REPO).parts[0] not in ("tests", ".git")
        and (lines := path.read_text(encoding="utf-8").count("\n")) > MAX_MODULE_LINES
    }
    assert long == {}
    assert any(REPO.glob("benchmarks/*/*.py"))  # the glob reaches the benchmarks


# benchmarks/ by concern: each package says what it measures and how to run
# it, and its top level keeps the study runner's command line alone.
BENCHMARK_PACKAGES = (
    "benchmarks",
    "benchmarks/components",
    "benchmarks/core",
    "benchmarks/learning",
    "benchmarks/peers",
    "benchmarks/studies",
    "benchmarks/throughput",
)
BENCHMARK_ENTRY_POINTS = {"__init__.py", "study.py"}


@pytest.mark.parametrize("package", BENCHMARK_PACKAGES)
def test_each_benchmarks_package_says_what_it_measures_and_how_to_run_it(package):
    init = REPO / package / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    assert docstring and len(docstring.split()) >= 40, package
    assert "python3 benchmarks/" in " ".join(docstring.split()), package


def test_benchmarks_are_in_their_packages_and_its_top_level_keeps_one_entry():
    packages = {
        str(init.parent.relative_to(REPO))
        for init in REPO.glob("benchmarks/**/__init__.py")
    }
    assert packages == set(BENCHMARK_PACKAGES)
    top = {p.name for p in (REPO / "benchmarks").iterdir() if p.is_file()}
    assert {name for name in top if name.endswith((".py", ".sh"))} == (
        BENCHMARK_ENTRY_POINTS
    )
    stray = [
        str(p.relative_to(REPO))
        for p in REPO.glob("benchmarks/*/**/*.py")
        if not (p.parent / "__init__.py").is_file()
    ]
    assert stray == []


# A block of this many statement lines (imports, comments, docstring quotes
# and closing brackets aside) found twice in benchmarks/ is code to share
# (benchmarks/core/).
REPEATED_BLOCK_LINES = 8
_NOT_STATEMENTS = ("import ", "from ", "#", '"""', ")", "]", "}")


def repeated_blocks(paths: list[Path]) -> list[tuple[str, str]]:
    """[(first place, second place)] of each block of REPEATED_BLOCK_LINES
    statement lines (stripped) that occurs twice, not overlapping."""
    seen: dict[tuple[str, ...], tuple[Path, int]] = {}
    found = []
    for path in paths:
        lines = [
            (number, line.strip())
            for number, line in enumerate(
                path.read_text(encoding="utf-8").splitlines(), 1
            )
            if line.strip() and not line.strip().startswith(_NOT_STATEMENTS)
        ]
        for k in range(len(lines) - REPEATED_BLOCK_LINES + 1):
            block = tuple(line for _, line in lines[k : k + REPEATED_BLOCK_LINES])
            where = (path, lines[k][0])
            first = seen.setdefault(block, where)
            if first[0] != path or where[1] - first[1] >= REPEATED_BLOCK_LINES:
                found.append((f"{first[0].name}:{first[1]}", f"{path.name}:{where[1]}"))
    return found


def test_no_block_of_code_is_repeated_across_the_benchmarks():
    assert repeated_blocks(sorted(REPO.glob("benchmarks/**/*.py"))) == []


def test_the_repeat_check_finds_a_block_copied_into_another_file(tmp_path):
    block = "".join(f"value_{k} = compute({k}, scale={k * 3})\n" for k in range(8))
    (tmp_path / "a.py").write_text("import os\n" + block)
    (tmp_path / "b.py").write_text("x = 1\n" + block + "y = 2\n")
    (tmp_path / "c.py").write_text(block[: len(block) // 2])
    assert repeated_blocks(sorted(tmp_path.glob("*.py"))) == [("a.py:2", "b.py:2")]


def test_experiment_py_stays_the_wiring():
    lines = (REPO / "experiment.py").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_EXPERIMENT_LINES, lines


def test_the_fast_subset_keeps_most_tests_and_leaves_out_the_slow_ones():
    """README's fast loop (`-m "not slow"`) runs at least MIN_FAST_TESTS
    tests, and `slow` is a registered marker (pyproject's --strict-markers
    makes a misspelt one an error)."""

    # One collection: "FAST/ALL tests collected (SLOW deselected)".
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow"]
        + ["tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,  # a guard against a hang only: collection imports every test module
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    match = re.search(
        r"(\d+)/(\d+) tests collected \((\d+) deselected\)", result.stdout
    )
    assert match, result.stdout[-2000:]
    fast, total, slow = map(int, match.groups())
    assert fast + slow == total
    assert fast >= MIN_FAST_TESTS, fast
    assert slow >= 1
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"slow:' in pyproject and "--strict-markers" in pyproject


# -- the environment seam ----------------------------------------------------------


def family_modules() -> set[str]:
    """The modules that may know which family a level belongs to: the
    registry, each registered family's module (read from the registry, so a
    family added later is covered too) and the contract they share."""
    import environments

    registered = {type(family).__module__ for family in environments.families()}
    assert {"families.atari", "families.dmlab", "families.doom"} <= registered
    suites = {"families.atari57", "dmlab30"}  # the suites' own data
    return registered | suites | {"environments", "families.contract"}


# What a test of a level's family looks like: a family's prefix or suite name
# in a comparison or a startswith call.
FAMILY_MARKERS = ("atari/", "atari57", "dmlab30", "contributed/", "vizdoom")
# Modules that must not import TensorFlow at module level: what environment
# processes import (a child would pay seconds and hundreds of MiB for it), and
# the pure layers (cluster addresses, CPU features) that tools use without it.
# Every module of the families package is one of them.
TF_FREE_MODULES = {
    "runtime.child_process",
    "runtime.child_main",
    "runtime.child_wire",
    "cluster.addresses",
    "cluster.hosts",
    "cluster.ports",
    "cluster.spec",
    "runtime.cpu_features",
    "dmlab30",
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
    assert offending_modules(_family_tests, family_modules()) == {}


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
    """Top-level names of what `path` imports at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {name.split(".")[0] for node in tree.body for name in _imported_names(node)}


def test_modules_of_environment_processes_stay_free_of_tensorflow():
    """Also through the project modules they import at module level."""
    modules = project_modules(REPO)
    families = {name for name in modules if name.startswith("families.")}
    assert {"families.atari", "families.contract"} <= families
    seen, todo = set(), [*TF_FREE_MODULES, *families]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        imports = _module_level_imports(modules[name])
        assert "tensorflow" not in imports, f"{modules[name]} imports TensorFlow"
        todo += imported_modules(modules[name], set(modules), top_level_only=True)


# -- the packages ------------------------------------------------------------------


def package_of(module: str) -> str:
    """'actor.runner' -> 'actor'; a root module is its own name."""
    return module.split(".")[0]


def seam_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports across the packages that ALLOWED_IMPORTS does not allow."""
    problems = []
    for name, targets in sorted(graph.items()):
        package = package_of(name)
        if package not in ALLOWED_IMPORTS:
            continue
        allowed = ALLOWED_IMPORTS[package] | {package}
        problems += [
            f"{name} imports {target}"
            for target in sorted(targets)
            if package_of(target) not in allowed
        ]
    return problems


def test_the_packages_keep_their_seams():
    """The runtime imports no other part of the project; the families no
    actor, learner or cluster code; the learner does not import the actor,
    nor the actor the learner (they share trajectory.py)."""
    assert seam_violations(import_graph(REPO)) == []


def test_the_seam_check_finds_a_learner_that_imports_the_actor(tmp_path):
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "__init__.py").write_text('"""The learner."""\n')
    (tmp_path / "learner" / "loss.py").write_text("from actor import unroll\n")
    (tmp_path / "actor").mkdir()
    (tmp_path / "actor" / "__init__.py").write_text('"""The actor."""\n')
    (tmp_path / "actor" / "unroll.py").write_text("import trajectory\n")
    (tmp_path / "trajectory.py").write_text("import collections\n")
    assert seam_violations(import_graph(tmp_path)) == [
        "learner.loss imports actor.unroll"
    ]


def test_the_seam_check_finds_single_machine_training_that_imports_the_cluster(
    tmp_path,
):
    (tmp_path / "single_machine").mkdir()
    (tmp_path / "single_machine" / "__init__.py").write_text('"""One machine."""\n')
    (tmp_path / "single_machine" / "training.py").write_text(
        "from actor import runner\nfrom cluster import servers\n"
    )
    for package, module in (("actor", "runner"), ("cluster", "servers")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text('"""A package."""\n')
        (tmp_path / package / f"{module}.py").write_text("import os\n")
    assert seam_violations(import_graph(tmp_path)) == [
        "single_machine.training imports cluster.servers"
    ]


def test_the_root_holds_the_entry_points_and_the_cards_names_only():
    root = sorted(path.name for path in REPO.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
    card = {
        "experiment.py",
        "vtrace.py",
        "dynamic_batching.py",
        "environments.py",
        "py_process.py",
        "dmlab30.py",
    }
    assert card <= set(root)
    assert (REPO / "batcher.cc").is_file() and (REPO / "Dockerfile").is_file()


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_says_what_it_holds(package):
    """A docstring of one paragraph or more in its __init__.py."""
    init = REPO / package / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    assert docstring and len(docstring.split()) >= 20, package
    on_disk = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    assert on_disk == set(PACKAGES) | {"benchmarks"}
