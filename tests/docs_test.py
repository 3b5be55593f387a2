"""Keeps README.md, docs/, the Dockerfile and .ci/run honest.

- Every `--flag` on an `experiment.py` or `launch.py` command line in the
  code blocks of README.md and docs/*.md (and in the Dockerfile) is a flag
  those scripts define, and docs/flags.md's tables name every flag of
  experiment.py with its real default.
- README.md stays a five-minute read (at most MAX_README_LINES lines) with
  its map of where to change what, and links every page of docs/.
- The install and test commands are the same in README.md, the Dockerfile and
  .ci/run (CI runs exactly what a newcomer is told to run).
- The Dockerfile pins its base image (tag and digest) and installs DeepMind
  Lab only from a wheel the user puts in wheels/, with the run-time libraries
  and dm-env the README names; nothing in the repository builds DeepMind Lab.

The flags are read by importing each script in a child process (absl flags
register at import; importing must not start training) and listing absl's
FLAGS, so flags defined in modules the script imports count too.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
FLAGS_PAGE = DOCS / "flags.md"
MAX_README_LINES = 300
# BENCHMARKS.md: each figure once, with its command; narratives live in docs/.
MAX_BENCHMARKS_LINES = 900
FLAGFILES = REPO / "flagfiles"
DOCKERFILE = REPO / "Dockerfile"
CI_RUN = REPO / ".ci" / "run"
REQUIREMENTS = REPO / "requirements.txt"
DOCKERIGNORE = REPO / ".dockerignore"

SCRIPTS = ("experiment.py", "launch.py")
# absl's own command-line flags, valid for any absl program.
ABSL_BUILTIN_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok"}
IMPORT_TIMEOUT_S = 180
# The fast loop of README's Development section, as split into words.
FAST_TESTS = "python3 -m pytest -m not slow tests"

_LIST_FLAGS = """
import importlib, json, sys
from absl import flags
importlib.import_module(sys.argv[1])
out = {}
for name in flags.FLAGS:
    default = flags.FLAGS[name].default
    if not isinstance(default, (bool, int, float, str, type(None))):
        default = repr(default)
    out[name] = default
print("FLAGS_JSON=" + json.dumps(out))
"""


# --------------------------------------------------------------------------
# Helpers


def _read(path: Path) -> str:
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    return path.read_text(encoding="utf-8")


def _code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced (```) code blocks of a Markdown text."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)


def _logical_lines(text: str) -> list[str]:
    """Shell lines with backslash continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def _commands(line: str) -> list[list[str]]:
    """Splits a shell line into simple commands (token lists) at ;, &&, |, &."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: fall back to plain words
        tokens = line.split()
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token and set(token) <= set("();<>|&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _script_invocations(lines: list[str]) -> list[tuple[str, list[str], str]]:
    """(script, flag names, command text) for each experiment.py/launch.py call."""
    found = []
    for line in lines:
        for command in _commands(line):
            for i, token in enumerate(command):
                script = os.path.basename(token)
                if script in SCRIPTS:
                    names = [
                        arg[2:].split("=", 1)[0]
                        for arg in command[i + 1 :]
                        if arg.startswith("--") and len(arg) > 2
                    ]
                    found.append((script, names, " ".join(command)))
                    break
    return found


@functools.cache
def _defined_flags(script: str) -> dict:
    """{flag name: default} of the absl flags that exist once `script` is imported."""
    path = REPO / script
    if not path.is_file():
        pytest.fail(
            f"{script} does not exist, but README.md shows command lines for it"
        )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _LIST_FLAGS, path.stem],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"importing {script} took over {IMPORT_TIMEOUT_S} s: importing it must only "
            "define flags, not start training (keep main() behind "
            "`if __name__ == '__main__'`)"
        )
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("FLAGS_JSON=")]
    if proc.returncode != 0 or not marker:
        pytest.fail(
            f"importing {script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    flags = json.loads(marker[-1][len("FLAGS_JSON=") :])
    if script == "launch.py":
        # A launcher may parse its own options with argparse.
        source = _read(path)
        for name in re.findall(r"add_argument\(\s*['\"]--([\w-]+)['\"]", source):
            flags.setdefault(name.replace("-", "_"), None)
            flags.setdefault(name, None)
    return flags


def _accepted_flags(script: str) -> set[str]:
    names = set(_defined_flags("experiment.py")) | ABSL_BUILTIN_FLAGS
    if script == "launch.py":
        # The launcher hands experiment.py's flags on to the tasks it starts.
        names |= set(_defined_flags("launch.py"))
    return names


def _is_accepted(name: str, accepted: set[str]) -> bool:
    # absl spells a false boolean flag --noname.
    return name in accepted or (name.startswith("no") and name[2:] in accepted)


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuations joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for raw in _read(DOCKERFILE).splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    return instructions


def _dockerfile_args() -> dict[str, str]:
    args: dict[str, str] = {}
    for keyword, rest in _dockerfile_instructions():
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args.setdefault(name.strip(), value.strip().strip("\"'"))
    return args


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def _shell_of(keyword: str, rest: str) -> str:
    """The shell text a RUN or CMD runs (exec form: the script after -c)."""
    if rest.startswith("["):
        argv = json.loads(rest)
        if len(argv) >= 3 and argv[1] == "-c":
            return argv[2]
        return shlex.join(argv)
    return rest


def _dockerfile_shell_lines(keyword: str) -> list[str]:
    return [
        _shell_of(k, rest) for k, rest in _dockerfile_instructions() if k == keyword
    ]


def _canonical_commands() -> tuple[str, str]:
    """The install and test commands that .ci/run runs."""
    lines = _logical_lines(_read(CI_RUN))
    install = [
        ln for ln in lines if re.search(r"\bpip install\b.*-r\s+requirements\.txt", ln)
    ]
    tests = [ln for ln in lines if re.search(r"\bpytest\b", ln)]
    assert len(install) == 1, (
        f".ci/run should have one install command, found {install}"
    )
    assert len(tests) == 1, f".ci/run should have one test command, found {tests}"
    return install[0], tests[0]


def _doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _all_readme_command_lines() -> list[str]:
    return [ln for block in _code_blocks(_read(README)) for ln in _logical_lines(block)]


def _all_doc_command_lines() -> list[str]:
    """The command lines of README.md and every page of docs/."""
    return [
        ln
        for page in _doc_pages()
        for block in _code_blocks(_read(page))
        for ln in _logical_lines(block)
    ]


def _flag_table_rows() -> list[tuple[str, str]]:
    """(flag, default cell) of the tables in docs/flags.md."""
    text = _read(FLAGS_PAGE)
    rows = re.findall(r"^\|\s*`--(\w+)`\s*\|\s*([^|]*?)\s*\|", text, flags=re.M)
    assert rows, "docs/flags.md has no flag table rows"
    return rows


def _same_default(cell: str, default) -> bool:
    cell = cell.strip().strip("`").strip()
    if cell in ("''", '""'):
        cell = ""
    if isinstance(default, bool):
        return cell.lower() == str(default).lower()
    if isinstance(default, (int, float)):
        try:
            return float(cell) == float(default)
        except ValueError:
            return False
    if default is None:
        return cell in ("", "None")
    return cell == str(default)


# --------------------------------------------------------------------------
# README command lines and flags


def test_readme_shows_experiment_and_launch_command_lines():
    scripts = {
        script for script, _, _ in _script_invocations(_all_readme_command_lines())
    }
    assert scripts == set(SCRIPTS), f"README.md code blocks call {sorted(scripts)}"


def test_benchmarks_md_stays_at_most_max_benchmarks_lines():
    lines = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_BENCHMARKS_LINES, lines


# A path under benchmarks/ as a command or a reader names it.
_BENCHMARK_PATH = re.compile(r"benchmarks/[\w/]+\.(?:py|sh)\b")


def benchmark_paths_named(paths) -> dict[str, set[str]]:
    """{file's name: the benchmarks/...py|sh paths it names that do not
    exist in the repository}."""
    missing = {}
    for path in paths:
        named = set(_BENCHMARK_PATH.findall(path.read_text(encoding="utf-8")))
        if gone := {name for name in named if not (REPO / name).is_file()}:
            missing[path.name] = gone
    return missing


def test_every_benchmarks_path_the_docs_and_the_code_name_exists():
    """BENCHMARKS.md, README.md, docs/, the flag files and the benchmarks'
    own docstrings and scripts: each `python3 benchmarks/...` command (and
    each path named in prose) runs from where it says."""
    texts = [REPO / "BENCHMARKS.md", README, *sorted(DOCS.glob("*.md"))]
    texts += sorted(FLAGFILES.glob("*.cfg"))
    texts += sorted((REPO / "benchmarks").glob("**/*.py"))
    texts += sorted((REPO / "benchmarks").glob("**/*.sh"))
    texts += [p for p in sorted((REPO / "tests").glob("*.py")) if p != Path(__file__)]
    assert len(re.findall(r"python3 benchmarks/", _read(REPO / "BENCHMARKS.md"))) >= 20
    assert benchmark_paths_named(texts) == {}


def test_the_benchmarks_path_check_names_a_moved_script(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "python3 benchmarks/throughput_bench.py --part=profile\n"
        "python3 benchmarks/throughput/throughput_bench.py --part=profile\n"
    )
    assert benchmark_paths_named([page]) == {
        "page.md": {"benchmarks/throughput_bench.py"}
    }


def test_readme_is_short_maps_the_code_and_links_every_docs_page():
    text = _read(README)
    assert text.count("\n") <= MAX_README_LINES, text.count("\n")
    assert "## Where to change what" in text
    for module in (
        "learner/loss.py",
        "actor/unroll.py",
        "environments.py",
        "cluster/",
        "families/",
    ):
        assert module in text, module
    for page in sorted(DOCS.glob("*.md")):
        assert f"](docs/{page.name})" in text, f"README does not link {page.name}"
    assert (REPO / "LICENSE").is_file() and "Apache License" in _read(REPO / "LICENSE")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_in_readme_command_lines_is_defined(script):
    unknown = []
    for called, names, command in _script_invocations(_all_doc_command_lines()):
        if called != script:
            continue
        accepted = _accepted_flags(script)
        unknown += [
            f"--{n} in: {command}" for n in names if not _is_accepted(n, accepted)
        ]
    assert not unknown, (
        "README.md or docs/ use flags that are not defined:\n" + "\n".join(unknown)
    )


def test_every_flag_in_dockerfile_command_lines_is_defined():
    lines = [
        ln
        for keyword in ("RUN", "CMD", "ENTRYPOINT")
        for text in _dockerfile_shell_lines(keyword)
        for ln in _logical_lines(text)
    ]
    invocations = _script_invocations(lines)
    assert invocations, "the Dockerfile runs no experiment.py command"
    unknown = []
    for script, names, command in invocations:
        accepted = _accepted_flags(script)
        unknown += [
            f"--{n} in: {command}" for n in names if not _is_accepted(n, accepted)
        ]
    assert not unknown, "the Dockerfile uses flags that are not defined:\n" + "\n".join(
        unknown
    )


def test_flag_tables_name_real_flags_with_their_defaults():
    defined = _defined_flags("experiment.py")
    problems = []
    for name, cell in _flag_table_rows():
        if name not in defined:
            problems.append(f"--{name}: not defined by experiment.py")
        elif not _same_default(cell, defined[name]):
            problems.append(
                f"--{name}: docs/flags.md says {cell}, experiment.py says "
                f"{defined[name]!r}"
            )
    assert not problems, "docs/flags.md's tables are out of date:\n" + "\n".join(
        problems
    )


def test_every_flag_experiment_py_defines_is_documented():
    import environments
    from runtime import settings

    # experiment.py defines a flag for each declared setting.
    own = {setting.name for setting in settings.SETTINGS}
    assert {"level_name", "learning_rate", "print_config"} <= own
    # The families' own flags, which experiment.py defines from the registry.
    own |= {flag.name for family in environments.families() for flag in family.flags}
    assert {"width", "level_cache_dir"} <= own
    documented = {name for name, _ in _flag_table_rows()}
    missing = sorted(own - documented)
    assert not missing, (
        f"experiment.py flags missing from docs/flags.md's tables: {missing}"
    )


def test_the_tfjob_manifests_run_experiment_py_with_flags_it_defines():
    defined = set(_defined_flags("experiment.py")) | ABSL_BUILTIN_FLAGS
    for name in ("tfjob.yaml", "pbt_tfjob.yaml"):
        text = _read(REPO / "docs" / name)
        commands = re.findall(
            r"- python3\n\s*- experiment\.py\n((?:\s*- --\S+\n)+)", text
        )
        assert commands, name
        for command in commands:
            flags = re.findall(r"- --(\w+)=", command)
            assert flags and set(flags) <= defined, (name, set(flags) - defined)
    # One TFJob per member, each with its own member index and logdir.
    pbt = _read(REPO / "docs" / "pbt_tfjob.yaml")
    assert re.findall(r"- --population_member=(\d+)", pbt) == ["0", "0", "1", "1"]
    assert re.findall(r"- --logdir=(\S+)", pbt) == [
        "/population/runs/0",
        "/population/runs/1",
    ]


def test_launch_flags_are_declared_settings_and_documented():
    import launch
    from runtime import settings

    # launch.py defines no flag of its own writing: each is a declared setting,
    # with the declared default, and experiment.py's three it forwards keep
    # experiment.py's defaults.
    declared = {s.name: s.default for s in settings.LAUNCH_SETTINGS}
    declared |= {name: settings.DEFAULTS[name] for name in settings.LAUNCH_FORWARDED}
    assert {name: launch.FLAGS[name].default for name in launch.FLAGS} == declared
    assert not re.search(r"flags\.DEFINE_", _read(REPO / "launch.py"))
    # docs/distributed.md's table lists exactly launch.py's own flags, with
    # the declared defaults where the default is not this machine's.
    rows = dict(
        re.findall(
            r"^\|\s*`--(\w+)`\s*\|\s*([^|]*?)\s*\|",
            _read(REPO / "docs" / "distributed.md")
            .split("| launch.py flag |")[1]
            .split("\n\n")[0],
            flags=re.M,
        )
    )
    assert set(rows) == {s.name for s in settings.LAUNCH_SETTINGS}
    for setting in settings.LAUNCH_SETTINGS:
        if setting.name not in ("program", "python"):
            assert _same_default(rows[setting.name], setting.default), setting.name


# --------------------------------------------------------------------------
# Flag files: the tested command lines

# Every flag file parsed and validated in one child process (importing
# experiment.py, TensorFlow included, once rather than once a file): a line
# of JSON a file, {"name", "ok", "detail"}. parse_flags starts each parse
# afresh, so one file's flags do not carry into the next.
_VALIDATE_FLAGFILES = """
import json, sys, traceback
import experiment
for path in sys.argv[1:]:
    try:
        f = experiment.parse_flags(["experiment.py", "--flagfile=" + path])
        experiment.validate_flags(f)
        ok, detail = True, f"{f.level_name} {f.agent}"
    except BaseException as e:  # a validation error may be a SystemExit
        ok, detail = False, "".join(traceback.format_exception(e))[-2000:]
    print(json.dumps({"path": path, "ok": ok, "detail": detail}), flush=True)
"""


def _flagfile_names() -> set[str]:
    return {path.name for path in FLAGFILES.glob("*.cfg")}


@functools.lru_cache(maxsize=1)
def _flagfile_validations() -> dict[str, tuple[bool, str]]:
    """{file name: (parsed and validated, detail)} for every flag file."""
    paths = sorted(str(p) for p in FLAGFILES.glob("*.cfg"))
    result = subprocess.run(
        [sys.executable, "-c", _VALIDATE_FLAGFILES, *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
    )
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[Path(row["path"]).name] = (row["ok"], row["detail"])
    assert len(found) == len(paths), (result.returncode, result.stderr[-2000:])
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in FLAGFILES.glob("*.cfg")))
def test_every_flag_file_parses_and_validates(name):
    path = FLAGFILES / name
    flags = re.findall(r"^--(\w+)", _read(path), flags=re.M)
    assert flags, f"{name} sets no flag"
    accepted = _accepted_flags("experiment.py")
    assert not [f for f in flags if not _is_accepted(f, accepted)], flags
    ok, detail = _flagfile_validations()[name]
    assert ok, detail


def test_docs_use_the_flag_files_that_exist_and_every_one_is_documented():
    text = " ".join(_read(page) for page in _doc_pages())
    used = set(re.findall(r"--flagfile=flagfiles/([\w.-]+)", text))
    assert used, "no command line in README or docs/ uses a flag file"
    assert used <= _flagfile_names(), used - _flagfile_names()
    assert _flagfile_names() <= used, _flagfile_names() - used
    readme = _read(README)
    assert "--flagfile=flagfiles/pong_deep.cfg" in readme
    assert "--flagfile=flagfiles/pong_shallow.cfg" in readme


# --------------------------------------------------------------------------
# One install command and one test command everywhere


def test_install_and_test_commands_are_the_same_in_readme_dockerfile_and_ci():
    install, tests = _canonical_commands()
    assert install == "python3 -m pip install -r requirements.txt", install
    assert tests == "python3 -m pytest tests", tests

    readme_commands = {
        " ".join(c) for ln in _all_readme_command_lines() for c in _commands(ln)
    }
    docker_commands = {
        " ".join(c)
        for text in _dockerfile_shell_lines("RUN")
        for ln in _logical_lines(text)
        for c in _commands(ln)
    }
    for where, commands in (
        ("README.md", readme_commands),
        ("Dockerfile", docker_commands),
    ):
        assert install in commands, (
            f"{where} does not run the install command {install!r}"
        )
        if where == "Dockerfile":
            # The image checks itself in minutes; the full suite is CI's.
            assert "docker/image_check.sh" in commands, "the image checks nothing"
            assert tests not in commands, "the image build runs the whole suite"
            continue
        assert tests in commands, f"{where} does not run the test command {tests!r}"
        # No second spelling of the same steps (a bare `pip`, another pytest
        # target); the README's Development section adds the fast subset.
        allowed = {install, tests} | ({FAST_TESTS} if where == "README.md" else set())
        variants = [
            c
            for c in commands
            if (re.search(r"-r\s+requirements\.txt", c) or re.search(r"\bpytest\b", c))
            and c not in allowed
        ]
        assert not variants, (
            f"{where} spells the install/test commands differently: {variants}"
        )


def test_readme_documents_the_fast_subset_of_the_tests():
    commands = {
        " ".join(c) for ln in _all_readme_command_lines() for c in _commands(ln)
    }
    assert FAST_TESTS in commands
    assert "## Development" in _read(README)


def test_readme_quick_start_trains_on_the_embedded_default():
    commands = {
        " ".join(c) for ln in _all_readme_command_lines() for c in _commands(ln)
    }
    assert "python3 experiment.py" in commands
    assert "python3 dynamic_batching.py" in commands


# --------------------------------------------------------------------------
# Dockerfile pins and steps


def test_dockerfile_pins_base_image_by_tag_and_digest():
    args = _dockerfile_args()
    stages: set[str] = set()
    external = []
    for keyword, rest in _dockerfile_instructions():
        if keyword != "FROM":
            continue
        words = [w for w in rest.split() if not w.startswith("--")]
        image = _expand(words[0], args)
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2])
        if image in stages or image == "scratch":
            continue
        external.append(image)
        match = re.fullmatch(r"([\w./-]+):([\w.-]+)@sha256:([0-9a-f]{64})", image)
        assert match, (
            f"FROM {image}: pin the image with an exact tag and @sha256 digest"
        )
        assert match[2] != "latest" and re.search(r"\d", match[2]), (
            f"FROM {image}: tag is not a version"
        )
    assert external, "the Dockerfile has no base image"


def _docs_page(page: str) -> str:
    """A page of docs/ (the DeepMind Lab and Docker reference)."""
    return _read(DOCS / page)


def test_dockerfile_installs_deepmind_lab_only_from_a_wheel_in_wheels():
    runs = " ".join(_dockerfile_shell_lines("RUN"))
    copies = [
        rest.split()
        for keyword, rest in _dockerfile_instructions()
        if keyword == "COPY"
    ]
    assert ["wheels/", "/tmp/wheels/"] in copies, "the image does not read wheels/"
    assert "-name 'deepmind_lab-*.whl'" in runs
    assert "No DeepMind Lab wheel in wheels/" in runs, "no word when there is none"
    assert (REPO / "wheels" / "README.md").is_file(), "wheels/ must exist to COPY it"
    assert "wheels/*.whl" in _read(REPO / ".gitignore")


def test_docs_name_the_dockerfiles_deepmind_lab_runtime_libraries_and_dm_env():
    runs = " ".join(_dockerfile_shell_lines("RUN"))
    assert "${DMLAB_RUNTIME_LIBRARIES}" in runs and "${libraries}" in runs
    section = _docs_page("deepmind-lab.md")
    words = " ".join(section.replace("`", " ").split())
    for release in ("BOOKWORM", "TRIXIE"):
        libraries = _dockerfile_args()[f"DMLAB_RUNTIME_LIBRARIES_{release}"].split()
        assert libraries and f"${{DMLAB_RUNTIME_LIBRARIES_{release}}}" in runs
        assert " ".join(libraries) in words, (
            f"docs/deepmind-lab.md's {release.lower()} list differs from the "
            "Dockerfile's"
        )
    (dm_env,) = re.findall(r"dm-env==[\d.]+", " ".join(_dockerfile_shell_lines("RUN")))
    assert dm_env in section
    assert "import deepmind_lab" in section and "deepmind_lab.Lab" in section


def test_docker_page_shows_both_builds_and_the_default_command():
    section = _docs_page("docker.md")
    blocks = "\n".join(_code_blocks(section))
    assert "wheels/" in blocks and blocks.count("docker build") >= 2
    assert "docker run --rm scalable_agent" in blocks
    cmd = " ".join(_dockerfile_shell_lines("CMD")[-1].split())
    for command in re.findall(r"python3 experiment\.py[^;\"]*", cmd):
        assert command.strip() in " ".join(section.split()), command


# Words of a DeepMind Lab build from source (its build tool, its packaging
# target, the build tool's root file) and of a wheel taken from outside the
# repository; spelled in pieces so that this file does not match itself.
_BUILD_RECIPE = re.compile(
    "|".join(
        ["ba" + "zel", "build_pip" + "_package", "WORK" + "SPACE", "shared/" + "wheels"]
    ),
    re.IGNORECASE,
)


# What the scan below leaves out: version control, caches and build outputs
# (.gitignore's), none of them the repository's own text.
_NOT_THE_TREE = {
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".venv",
    "venv",
    "build",
    "logs",
    "_vizdoom",
}
_BINARY = (".png", ".gif", ".index", ".data-00000-of-00001", ".so", ".pyc", ".whl")


def repository_files() -> list[Path]:
    """Every file of the working tree, read from the file system (not from
    git, which a Docker image's copy of the tree has neither the metadata
    nor the tool for), but version control and build outputs."""
    found = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_THE_TREE)
        found += [Path(root) / name for name in sorted(names)]
    return found


def test_nothing_in_the_repository_builds_deepmind_lab():
    files = repository_files()
    assert REPO / "Dockerfile" in files and REPO / "tests" / "docs_test.py" in files
    found = []
    for path in files:
        if path.name.endswith(_BINARY):
            continue
        text = path.read_text(errors="replace")
        name = path.relative_to(REPO)
        found += [f"{name}: {m.group(0)}" for m in _BUILD_RECIPE.finditer(text)]
    assert not found, found


def test_dockerfile_fetches_the_psychlab_dataset():
    runs = " ".join(_dockerfile_shell_lines("RUN"))
    assert "bradylab.ucsd.edu/stimuli/ObjectsAll.zip" in runs, (
        "the psychlab dataset is not fetched"
    )


def test_dockerfile_prebuilds_the_op_and_runs_training_then_test_mode():
    runs = [
        " ".join(c)
        for t in _dockerfile_shell_lines("RUN")
        for ln in _logical_lines(t)
        for c in _commands(ln)
    ]
    assert "python3 dynamic_batching.py" in runs, (
        "the Dockerfile does not prebuild batcher.so"
    )
    cmds = _dockerfile_shell_lines("CMD")
    assert cmds, "the Dockerfile has no CMD"
    calls = _script_invocations(_logical_lines(cmds[-1]))
    commands = [command for script, _, command in calls if script == "experiment.py"]
    assert len(commands) == 2, f"CMD should train, then test: {commands}"
    assert "--mode=test" not in commands[0] and "--mode=test" in commands[1], commands


def test_dockerignore_keeps_what_the_image_build_reads():
    patterns = [
        ln.strip()
        for ln in _read(DOCKERIGNORE).splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    needed = [
        "README.md",
        "Dockerfile",
        ".ci/run",
        "requirements.txt",
        "tests/docs_test.py",
        "experiment.py",
        "dynamic_batching.py",
    ]
    for path in needed:
        for pattern in patterns:
            bare = pattern.lstrip("/").removeprefix("**/")
            hit = fnmatch.fnmatch(path, bare) or path.startswith(bare.rstrip("/") + "/")
            assert not hit, (
                f".dockerignore pattern {pattern!r} drops {path}, which the build needs"
            )


def test_docs_say_ci_does_not_build_the_image_and_point_to_benchmarks():
    assert "CI does not build the Docker image" in _read(DOCS / "docker.md")
    assert "BENCHMARKS.md" in _read(README)
