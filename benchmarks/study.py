r"""The study runner: arms (experiment.py command lines) trained one after
another, each to its frame budget, then tested; a record per arm written as
it goes; resumable; one figure of the curves.

    python3 benchmarks/study.py atari5 \
        --results benchmarks/results/atari5 --logdir_root /tmp/atari5

Every study here goes through this tool (Atari-5, the off-policy study, the
PBT comparison): a study is a name in STUDIES that gives its arms (`atari5`,
`atari3`, `atari3_val`, `atari5_val` and the tuning study `atari3_val_tuning`,
benchmarks/studies/atari_study.py; `off_policy`: each task x each
correction x {no replay, replay 0.5}, off_policy_study.py; `pbt`,
pbt_study.py), or arms given with --arm 'NAME: FLAGS' (repeatable). The
runner itself is benchmarks/studies/runner.py; the records and their table,
benchmarks/studies/records.py.
For each arm, in order:

* `<results>/<arm>.json` complete (trained to its budget and tested): the
  arm is skipped, whichever commit made it (a result is never overwritten).
* absent, or incomplete from this commit with the same command: the arm
  trains (`train_until.train`: experiment.py as a child, its log read as
  it is written) with --logdir=<logdir_root>/<arm>, so an arm stopped
  part-way (SIGINT or SIGTERM to this script, or --minutes) continues from
  its last checkpoint when the same command is run again, its curve kept.
  Then test mode plays --test_episodes games with the final checkpoint.
* incomplete from another commit, or with another command: one line naming
  the file, both commits (or commands) and the fix; exit 2, nothing written.

The record: the arm's training and test commands, the code's commit, the
machine, the date, the curve (frames, minutes, mean of the last 100
training episodes and the episode count every --point_minutes minutes,
with the machine's load beside the run at that point: the load average and
the cores that processes other than the run's used), how each training
segment ended, the test results (each episode's return and length, their
mean, the human-normalised score where the level has published scores),
the settings of the run's own record, its mean policy lag and --beside (a
free note of what else ran). The figure (--figure, default
<results>/curves.png) draws each record's curve (environment frames against
the mean return of the last 100 training episodes) in a panel of its own,
or the study's own layout (the off-policy corrections overlaid).
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from benchmarks.core import common, figures  # noqa: E402
from benchmarks.studies import (  # noqa: E402
    atari_study,
    off_policy_study,
    pbt_study,
    runner,
)
from benchmarks.studies.records import (  # noqa: E402
    Arm,
    Study,
    StudyError,
    check_resumable,
    folder_records,
    in_study_order,
    load_record,
)

STUDIES = {
    **{
        suite: Study(
            functools.partial(atari_study.suite_arms, suite),
            functools.partial(atari_study.suite_table, suite),
        )
        for suite in ("atari5", "atari3", "atari3_val", "atari5_val")
    },
    "atari3_val_tuning": Study(atari_study.tuning_arms, atari_study.tuning_table),
    "off_policy": Study(
        off_policy_study.off_policy_arms,
        off_policy_study.off_policy_table,
        off_policy_study.draw,
    ),
    "pbt": Study(pbt_study.pbt_arms, pbt_study.pbt_table),
}


def parse_arm(text: str) -> Arm:
    name, _, flags = text.partition(":")
    name = name.strip()
    if not name or not flags.strip() or "/" in name:
        raise StudyError(
            f"--arm={text!r}: give 'NAME: FLAGS', e.g. 'pong_lr2: "
            "--level_name=atari/pong --learning_rate=0.0016'."
        )
    parsed = tuple(shlex.split(flags))
    if any(f.startswith("--logdir=") for f in parsed):
        raise StudyError(
            f"--arm={text!r}: leave --logdir out; each arm trains in "
            "<--logdir_root>/<NAME>."
        )
    return Arm(name, parsed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", nargs="?", help=f"one of {', '.join(STUDIES)}")
    parser.add_argument("--arm", action="append", default=[], help="'NAME: FLAGS'")
    parser.add_argument("--only", default="", help="these arms (comma-separated)")
    parser.add_argument("--results", required=True, help="the records' folder")
    parser.add_argument("--logdir_root", required=True, help="arms' logdirs")
    parser.add_argument("--frames", type=int, default=None, help="frames an arm")
    parser.add_argument("--test_episodes", type=int, default=30)
    parser.add_argument("--point_minutes", type=float, default=3.0)
    parser.add_argument("--minutes", type=float, default=None, help="per arm")
    parser.add_argument("--beside", default="", help="what else runs (a note)")
    parser.add_argument("--figure", default=None)
    parser.add_argument(
        "--no_figure",
        action="store_true",
        help="draw no figure (a study process of arms that train together)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="print the records' Markdown table and exit (nothing trains)",
    )
    parser.add_argument("--program", default=os.path.join(common.REPO, "experiment.py"))
    args = parser.parse_args(argv)
    try:
        arms = [parse_arm(text) for text in args.arm]
        if args.study is not None:
            if args.study not in STUDIES:
                raise StudyError(
                    f"Unknown study {args.study!r}: one of {', '.join(STUDIES)}, "
                    "or give the arms with --arm 'NAME: FLAGS'."
                )
            arms = STUDIES[args.study].arms(args.frames) + arms
        elif args.frames:
            arms = [
                Arm(a.name, (*a.flags, f"--total_environment_frames={args.frames}"))
                for a in arms
            ]
        if not arms:
            raise StudyError("No arms: name a study or give --arm 'NAME: FLAGS'.")
        if args.table:
            found = [
                load_record(os.path.join(args.results, f"{arm.name}.json"))
                for arm in arms
            ]
            found = [r for r in found if r is not None]
            study = STUDIES.get(args.study) or Study(lambda _: [])
            print(study.table(found))
            return 0
        study_arms = list(arms)  # the figure's order, whichever arms run now
        if args.only:
            wanted = args.only.split(",")
            unknown = [w for w in wanted if w not in {a.name for a in arms}]
            if unknown:
                raise StudyError(
                    f"--only={args.only}: no arm {', '.join(unknown)}; the arms "
                    f"are {', '.join(a.name for a in arms)}."
                )
            arms = [a for a in arms if a.name in wanted]
        options = runner.Options(
            results=args.results,
            logdir_root=args.logdir_root,
            test_episodes=args.test_episodes,
            point_minutes=args.point_minutes,
            minutes=args.minutes,
            beside=args.beside,
            program=args.program,
        )
        commit = runner.code_commit(os.path.dirname(os.path.abspath(args.program)))
        # Every record is checked before any arm trains, so that a refusal
        # comes first, not after hours of another arm.
        for arm in arms:
            path = os.path.join(args.results, f"{arm.name}.json")
            record = load_record(path)
            if record is not None and not record.get("complete"):
                check_resumable(
                    path,
                    record,
                    commit["commit"],
                    runner.command_text(
                        runner.train_command(
                            arm, os.path.join(args.logdir_root, arm.name)
                        )
                    ),
                )
        records = []
        for batch in runner.batches(arms):
            if len(batch) == 1:
                done = [runner.run_arm(batch[0], options, commit)]
            else:
                done = runner.run_together(batch, args)
            records += done
            stopped = [r["arm"] for r in done if not r.get("complete")]
            if stopped:
                print(
                    f"{', '.join(stopped)}: stopped before the end; the same "
                    "command continues."
                )
                break
    except StudyError as e:
        print(f"study.py: {e}", file=sys.stderr)
        return 2
    every = in_study_order(folder_records(args.results), study_arms)
    if not args.no_figure:
        figure = args.figure or os.path.join(args.results, "curves.png")
        study = STUDIES.get(args.study)
        if study is not None and study.figure is not None:
            study.figure(every, figure)
        else:
            figures.curves_figure(every, figure, args.study or "study")
    print(f"Records in {args.results}.")
    return 0 if all(r.get("complete") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
