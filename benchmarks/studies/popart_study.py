"""PopArt against plain IMPALA on a multi-task flag file, same frames.

Trains a multi-task flag file (default flagfiles/vizdoom3_multitask.cfg:
one agent on three ViZDoom scenarios whose returns differ by two orders of
magnitude) three ways, one after the other:

  popart     --popart --reward_clipping=none
  unclipped  --reward_clipping=none (one value scale for every level)
  clipped    plain IMPALA: rewards clipped to [-1, 1]

then plays whole episodes with each run's final checkpoint (test mode,
--test_episodes per level). `--arm references` first measures what makes
levels of different scales comparable: each level's random policy
(benchmarks/learning/random_policy.py, with the arms' action set) and each level
trained alone with the same flags and its share of the frames (total /
number of levels), then tested.
`--plot` draws each level's training return per arm (with the references),
each level's share of the gradient norm and mean |policy-gradient
advantage| per arm, and PopArt's statistics over training, and writes the
record: test-mode returns with their standard errors, each normalised
between the level's random policy (0 %) and its run alone (100 %: the
best mean of 100 consecutive training episodes), their
median and mean over the levels (human-normalised too where the levels are
Atari games). `--seed N` trains an arm again with experiment.py's --seed
into ARM_seedN; the plot shows every seed's run (dashed after the first)
and the record each arm's normalised scores averaged over its seeds.
`--arm popart_entropy_0.001` (or `clipped_entropy_0.001`) trains an arm with
a tenth of the entropy cost, plotted beside the others.

    python3 benchmarks/studies/popart_study.py --root /tmp/popart --arm references
    python3 benchmarks/studies/popart_study.py --root /tmp/popart     # the three arms
    python3 benchmarks/studies/popart_study.py --root /tmp/popart --arm popart --seed 2
    python3 benchmarks/studies/popart_study.py --root /tmp/popart --plot
    python3 benchmarks/studies/popart_study.py --root /tmp/atari3 \\
        --flagfile flagfiles/atari3_multitask.cfg
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common, figures  # noqa: E402

FLAGFILE = os.path.join(common.REPO, "flagfiles", "vizdoom3_multitask.cfg")
ARMS = {
    "popart": ["--popart", "--reward_clipping=none"],
    "unclipped": ["--reward_clipping=none"],
    "clipped": ["--reward_clipping=abs_one"],
}
# Run only when named (--arm): the arms with a tenth of the flag file's
# entropy cost. PopArt's normalised advantages are ~10x smaller than clipped
# rewards' on the levels that pay every tic, so against the same entropy cost
# its policy is held nearer uniform (docs/popart.md).
VARIANTS = {
    "popart_entropy_0.001": [*ARMS["popart"], "--entropy_cost=0.001"],
    "clipped_entropy_0.001": [*ARMS["clipped"], "--entropy_cost=0.001"],
}
COLOURS = {
    "popart": "C0",
    "unclipped": "C1",
    "clipped": "C2",
    "popart_entropy_0.001": "C3",
    "clipped_entropy_0.001": "C4",
}
RECORD = os.path.join(common.REPO, "benchmarks", "results", "popart_comparison.json")
PLOT = os.path.join(common.REPO, "benchmarks", "plots", "popart_comparison.png")


def run_name(arm: str, seed: int) -> str:
    """An arm's run directory under --root: the arm's name for seed 1, else
    ARM_seedN."""
    return arm if seed == 1 else f"{arm}_seed{seed}"


def runs_of(root: str, arm: str) -> list[tuple[str, int]]:
    """(run name, seed) of the arm's runs under root that have test results,
    seed 1 first."""
    runs = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if name == arm:
            seed = 1
        elif name.startswith(f"{arm}_seed") and name[len(arm) + 5 :].isdigit():
            seed = int(name[len(arm) + 5 :])
        else:
            continue
        if os.path.exists(os.path.join(root, name, "test_results.json")):
            runs.append((name, seed))
    return sorted(runs, key=lambda run: run[1])


def flag_value(flagfile: str, name: str) -> str:
    """The value of --name in a flag file (its last occurrence)."""
    value = None
    with open(flagfile) as f:
        for line in f:
            if line.startswith(f"--{name}="):
                value = line.strip().split("=", 1)[1]
    if value is None:
        raise ValueError(f"{flagfile} has no --{name}")
    return value


def levels(flagfile: str = FLAGFILE) -> list[str]:
    return flag_value(flagfile, "level_name").split(",")


def short(level: str) -> str:
    """The level's name without its family: vizdoom/basic -> basic."""
    return level.rsplit("/", 1)[-1]


def run(command: list[str], log_path: str) -> int:
    print(" ".join(command), flush=True)
    with open(log_path, "a") as log:
        return subprocess.run(
            command, cwd=common.REPO, stdout=log, stderr=subprocess.STDOUT
        ).returncode


EXPERIMENT = [sys.executable, os.path.join(common.REPO, "experiment.py")]


def train_and_test(
    name: str,
    root: str,
    flags: list[str],
    test_levels: list[str],
    test_episodes: int,
) -> dict:
    """experiment.py with `flags` into root/name, then test mode on its last
    checkpoint; returns the training time."""
    logdir = os.path.join(root, name)
    os.makedirs(root, exist_ok=True)
    started = time.time()
    rc = run([*EXPERIMENT, *flags, f"--logdir={logdir}"], f"{logdir}.log")
    train_s = time.time() - started
    if rc != 0:
        raise SystemExit(f"{name}: training exited {rc}; see {logdir}.log")
    rc = run(
        [
            *EXPERIMENT,
            "--mode=test",
            f"--level_name={','.join(test_levels)}",
            f"--test_num_episodes={test_episodes}",
            f"--logdir={logdir}",
        ],
        f"{logdir}_test.log",
    )
    if rc != 0:
        raise SystemExit(f"{name}: test mode exited {rc}; see {logdir}_test.log")
    timing = {"train_s": train_s}
    with open(os.path.join(root, f"{name}_timing.json"), "w") as f:
        json.dump(timing, f)
    return timing


def measure_references(flagfile: str, root: str, test_episodes: int, extra) -> None:
    """Each level's random policy and its run alone (the flag file's flags,
    that level only, its share of the frames), tested."""
    names = levels(flagfile)
    frames = int(flag_value(flagfile, "total_environment_frames")) // len(names)
    for level in names:
        rc = run(
            [
                sys.executable,
                os.path.join(common.REPO, "benchmarks", "learning", "random_policy.py"),
                f"--level={level}",
                f"--episodes={test_episodes}",
                f"--run_levels={','.join(names)}",
                f"--json={os.path.join(root, f'random_{short(level)}.json')}",
            ],
            os.path.join(root, f"random_{short(level)}.log"),
        )
        if rc != 0:
            raise SystemExit(f"random policy on {level} exited {rc}")
    for level in names:
        train_and_test(
            f"alone_{short(level)}",
            root,
            [
                f"--flagfile={flagfile}",
                f"--level_name={level}",
                f"--total_environment_frames={frames}",
                *extra,
            ],
            [level],
            test_episodes,
        )


def references_from(root: str, names: list[str], window: int = 100) -> dict | None:
    """{level: {"random": R, "best": B}} from the references stage's files
    under root (None when any is missing): R the random policy's mean
    return, B the best mean of `window` consecutive training episodes of the
    level's run alone (its peak: a run's last checkpoint may sit past it)."""
    from benchmarks.learning import learning_curve

    references = {}
    for level in names:
        random_path = os.path.join(root, f"random_{short(level)}.json")
        alone = os.path.join(root, f"alone_{short(level)}")
        episodes, _ = learning_curve.read_events(alone, f"{level}/episode_return")
        if not (os.path.exists(random_path) and len(episodes) >= window):
            return None
        with open(random_path) as f:
            random = json.load(f)["mean"]
        returns = [e.episode_return for e in episodes]
        best = max(common.rolling_mean(returns, window)[window - 1 :])
        references[level] = {"random": random, "best": float(best)}
    return references


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="where the runs' logdirs go")
    parser.add_argument("--flagfile", default=FLAGFILE, help="a multi-task flag file")
    parser.add_argument(
        "--arm", choices=[*ARMS, *VARIANTS, "all", "references"], default="all"
    )
    parser.add_argument("--test_episodes", type=int, default=30)
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="experiment.py's --seed for the arms; a seed other than 1 trains "
        "into ARM_seedN beside the first runs, and --plot shows every seed",
    )
    parser.add_argument("--plot", action="store_true", help="plot and write the record")
    parser.add_argument(
        "--references",
        default=None,
        help="with --plot: a JSON file {level: {random: R, best: B}} instead "
        "of the references stage's files under --root",
    )
    parser.add_argument(
        "extra", nargs="*", help="more experiment.py flags for training (after --)"
    )
    args = parser.parse_args()
    flagfile = os.path.abspath(args.flagfile)
    names = levels(flagfile)
    if args.plot:
        references = references_from(args.root, names)
        if args.references:
            with open(args.references) as f:
                references = json.load(f)
        plot(args.root, flagfile, references=references)
    elif args.arm == "references":
        measure_references(flagfile, args.root, args.test_episodes, args.extra)
    else:
        for arm in list(ARMS) if args.arm == "all" else [args.arm]:
            train_and_test(
                run_name(arm, args.seed),
                args.root,
                [
                    f"--flagfile={flagfile}",
                    *{**ARMS, **VARIANTS}[arm],
                    f"--seed={args.seed}",
                    *args.extra,
                ],
                names,
                args.test_episodes,
            )


def level_scalars(logdir: str, names: list[str]) -> dict:
    """{tag: [(frames, value)]} of the per-level summaries: gradient share,
    mean |pg advantage| and, with PopArt, each level's mean and scale."""
    from benchmarks.learning import scalars_plot

    tags = []
    for level in names:
        tags += [
            f"levels/{level}/gradient_share",
            f"levels/{level}/mean_abs_pg_advantage",
            f"popart/{level}/mean",
            f"popart/{level}/scale",
        ]
    return scalars_plot.read_scalars(logdir, tags + list(UPDATE_TAGS))


# The update as a whole: its gradient's global norm before clipping (to
# --max_grad_norm) and the loss terms it comes from.
UPDATE_TAGS = (
    "gradient_global_norm",
    "loss/policy_gradient",
    "loss/baseline",
    "loss/entropy",
)


def late_mean(points: list[tuple[int, float]], fraction: float = 0.2) -> float | None:
    """The mean value over the last `fraction` of a run's summary points."""
    if not points:
        return None
    values = [v for _, v in points]
    return float(np.mean(values[-max(1, int(len(values) * fraction)) :]))


def plot(
    root: str, flagfile: str, window: int = 100, references: dict | None = None
) -> None:
    """Four rows of panels, one column a level: training return of each arm
    (and of the level alone) against frames, the level's share of the
    gradient norm and its mean |policy-gradient advantage| per arm, PopArt's
    mean and scale for the level; and the record."""
    from benchmarks.learning import learning_curve

    plt = figures.require_pyplot()

    names = levels(flagfile)
    record = {
        "machine": common.machine_info(),
        "flagfile": os.path.relpath(flagfile, common.REPO),
        "references": references,
        "arms": {},
    }
    fig, axes = plt.subplots(
        4, len(names), figsize=(4.6 * len(names), 12), squeeze=False
    )
    for column, level in enumerate(names):
        alone = os.path.join(root, f"alone_{short(level)}")
        episodes, _ = learning_curve.read_events(alone, f"{level}/episode_return")
        if episodes:
            axes[0][column].plot(
                [e.frames / 1e6 for e in episodes],
                common.rolling_mean([e.episode_return for e in episodes], window),
                color="grey",
                label="alone (its frames only)",
            )
        if references:
            axes[0][column].axhline(
                references[level]["random"], color="grey", ls=":", label="random"
            )
    for arm, flags in {**ARMS, **VARIANTS}.items():
        runs = runs_of(root, arm)
        if not runs:
            print(f"{arm}: no test results under {root}; skipped")
            continue
        for run, seed in runs:
            logdir = os.path.join(root, run)
            results_path = os.path.join(logdir, "test_results.json")
            seed_style = "-" if seed == 1 else "--"
            with open(results_path) as f:
                test = json.load(f)
            timing = {}
            if os.path.exists(os.path.join(root, f"{run}_timing.json")):
                with open(os.path.join(root, f"{run}_timing.json")) as f:
                    timing = json.load(f)
            returns = {level: test["levels"][level]["returns"] for level in names}
            scalars = level_scalars(logdir, names)
            entry = {
                "arm": arm,
                "seed": seed,
                "flags": flags if seed == 1 else [*flags, f"--seed={seed}"],
                "train_s": timing.get("train_s"),
                "test": {
                    level: {
                        "mean_return": float(np.mean(r)),
                        "standard_error": standard_error(r),
                        "returns": r,
                    }
                    for level, r in returns.items()
                },
                "training_final_rolling_mean": {},
                "late_gradient_share": {},
                "late_mean_abs_pg_advantage": {},
                # How hard the update is clipped, and by which loss term.
                "late_update": {
                    tag: late_mean(scalars.get(tag, [])) for tag in UPDATE_TAGS
                },
            }
            if test.get("human_normalized"):
                entry["human_normalized"] = test["human_normalized"]
            if references is not None:
                entry["normalised"] = normalised_scores(returns, references)
            colour = COLOURS[arm]
            for column, level in enumerate(names):
                episodes, _ = learning_curve.read_events(
                    logdir, f"{level}/episode_return"
                )
                if episodes:
                    rolling = common.rolling_mean(
                        [e.episode_return for e in episodes], window
                    )
                    entry["training_final_rolling_mean"][level] = float(rolling[-1])
                    entry["frames"] = max(entry.get("frames", 0), episodes[-1].frames)
                    axes[0][column].plot(
                        [e.frames / 1e6 for e in episodes],
                        rolling,
                        color=colour,
                        ls=seed_style,
                        label=run,
                    )
                for row, name, key in (
                    (1, "gradient_share", "late_gradient_share"),
                    (2, "mean_abs_pg_advantage", "late_mean_abs_pg_advantage"),
                ):
                    # The first summary is of the first step, before any update
                    # of PopArt's statistics: left out of the plot.
                    points = scalars[f"levels/{level}/{name}"][1:]
                    entry[key][level] = late_mean(points)
                    if points:
                        steps, values = zip(*points, strict=True)
                        axes[row][column].plot(
                            [s / 1e6 for s in steps],
                            common.rolling_mean(list(values), 5),
                            color=colour,
                            ls=seed_style,
                            label=run,
                        )
                for stat, style in (("mean", "-"), ("scale", "--")):
                    points = scalars[f"popart/{level}/{stat}"]
                    if points:
                        steps, values = zip(*points, strict=True)
                        axes[3][column].plot(
                            [s / 1e6 for s in steps],
                            values,
                            style,
                            color=colour,
                            alpha=1.0 if seed == 1 else 0.5,
                            label=f"{run}: {stat}",
                        )
            if "--popart" in flags:
                entry["popart_statistics"] = popart_statistics(logdir, names)
            record["arms"][run] = entry
    titles = (
        f"training return (mean of last {window} episodes)",
        "share of the gradient norm",
        "mean |policy-gradient advantage|",
        "PopArt's statistics",
    )
    for column, level in enumerate(names):
        for row, title in enumerate(titles):
            axis = axes[row][column]
            axis.set_title(f"{level}: {title}", fontsize=9)
            axis.set_xlabel("environment frames (millions, all levels)", fontsize=8)
            axis.tick_params(labelsize=7)
            axis.grid(alpha=0.3)
        axes[2][column].set_yscale("log")
        axes[0][column].legend(fontsize=7)
    axes[3][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle(
        f"One shallow agent on {', '.join(names)} (2-core CPU):\nPopArt with "
        "unclipped rewards, unclipped without PopArt, clipped",
        fontsize=9,
    )
    record["over_seeds"] = over_seeds(record)
    fig.tight_layout()
    os.makedirs(os.path.dirname(PLOT), exist_ok=True)
    fig.savefig(PLOT, dpi=100)
    common.write_json(RECORD, record)
    print(f"Wrote {PLOT}")
    print(table(record, names))


def popart_statistics(logdir: str, names: list[str]) -> dict:
    """Each level's mean and scale in the run's newest checkpoint."""
    import tensorflow as tf

    from learner import popart

    reader = tf.train.load_checkpoint(logdir)
    mean = reader.get_tensor("popart/mean")
    scale = popart.scale_from_moments(mean, reader.get_tensor("popart/second_moment"))
    return {
        level: {"mean": float(m), "scale": float(s)}
        for level, m, s in zip(names, mean, scale, strict=True)
    }


def standard_error(returns) -> float:
    """The standard error of the mean of `returns` (0 for one)."""
    returns = np.asarray(returns, dtype=np.float64)
    if returns.size < 2:
        return 0.0
    return float(returns.std(ddof=1) / np.sqrt(returns.size))


def normalised_scores(level_returns: dict, references: dict) -> dict:
    """Test-mode returns made comparable across levels of different reward
    scales: each level's mean return placed between its random policy's
    (0 %) and a reference run's (100 %, e.g. the best single-task run).

    level_returns: {level: [episode returns]}; references: {level:
    {"random": R, "best": B}} with B != R. Returns {"levels": {level:
    {"mean_return", "standard_error" (of the mean; 0 for one episode),
    "episodes", "normalised" (%)}}, "median", "mean"} (over the levels, %).
    """
    levels = {}
    for level, returns in level_returns.items():
        returns = np.asarray(returns, dtype=np.float64)
        if returns.size == 0:
            raise ValueError(f"{level}: no test episodes")
        random, best = references[level]["random"], references[level]["best"]
        if best == random:
            raise ValueError(f"{level}: its random and best references are equal")
        levels[level] = {
            "mean_return": float(returns.mean()),
            "standard_error": standard_error(returns),
            "episodes": int(returns.size),
            "normalised": float(100.0 * (returns.mean() - random) / (best - random)),
        }
    scores = [entry["normalised"] for entry in levels.values()]
    return {
        "levels": levels,
        "median": float(np.median(scores)),
        "mean": float(np.mean(scores)),
    }


def over_seeds(record: dict) -> dict:
    """For each arm with runs of several seeds in the record: {arm: {"seeds":
    n, "levels": {level: the mean over its runs of the level's normalised
    score}, "median", "mean" (over the levels of those means)}}."""
    by_arm: dict[str, list[dict]] = {}
    for entry in record["arms"].values():
        if "normalised" in entry:
            by_arm.setdefault(entry.get("arm"), []).append(entry["normalised"])
    result = {}
    for arm, runs in by_arm.items():
        if arm is None or len(runs) < 2:
            continue
        levels = {
            level: float(np.mean([run["levels"][level]["normalised"] for run in runs]))
            for level in runs[0]["levels"]
        }
        scores = list(levels.values())
        result[arm] = {
            "seeds": len(runs),
            "levels": levels,
            "median": float(np.median(scores)),
            "mean": float(np.mean(scores)),
        }
    return result


def table(record: dict, names: list[str]) -> str:
    """The record as a Markdown table: each level's test return +- its
    standard error (normalised % where there are references), the median
    and mean over levels, the training time; then the late gradient shares
    and PopArt's final statistics."""
    lines = [
        "| arm | "
        + " | ".join(f"{short(n)}: test return (normalised %)" for n in names)
        + " | median | mean | training time |",
        "|---" * (len(names) + 4) + "|",
    ]
    for arm, entry in record["arms"].items():
        normalised = entry.get("normalised") or entry.get("human_normalized") or {}
        cells = []
        for n in names:
            test = entry["test"][n]
            cell = f"{test['mean_return']:.1f} +- {test['standard_error']:.1f}"
            if "levels" in normalised:
                cell += f" ({normalised['levels'][n]['normalised']:.0f})"
            cells.append(cell)
        minutes = f"{entry['train_s'] / 60:.0f} min" if entry.get("train_s") else ""
        lines.append(
            f"| {arm} | "
            + " | ".join(cells)
            + f" | {normalised.get('median', float('nan')):.0f} "
            f"| {normalised.get('mean', float('nan')):.0f} | {minutes} |"
        )
    for arm, over in over_seeds(record).items():
        cells = [f"({over['levels'][n]:.0f})" for n in names]
        lines.append(
            f"| {arm}, mean of {over['seeds']} seeds | "
            + " | ".join(cells)
            + f" | {over['median']:.0f} | {over['mean']:.0f} | |"
        )
    lines += [
        "",
        "| arm | "
        + " | ".join(f"{short(n)}: gradient share, mean abs advantage" for n in names)
        + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for arm, entry in record["arms"].items():
        cells = []
        for n in names:
            share = entry["late_gradient_share"].get(n)
            advantage = entry["late_mean_abs_pg_advantage"].get(n)
            cells.append(
                "-" if share is None else f"{100 * share:.0f} %, {advantage:.3g}"
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| arm | gradient norm before clipping | policy-gradient loss | baseline loss "
        "| entropy loss |",
        "|---|---:|---:|---:|---:|",
    ]
    for arm, entry in record["arms"].items():
        update = entry.get("late_update", {})
        cells = [
            "-" if update.get(tag) is None else f"{update[tag]:.3g}"
            for tag in UPDATE_TAGS
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    for arm, entry in record["arms"].items():
        if "popart_statistics" in entry:
            lines.append("")
            lines.append(
                f"{arm}: statistics at the end: "
                + ", ".join(
                    f"{short(n)} mean {s['mean']:.2f}, scale {s['scale']:.2f}"
                    for n, s in entry["popart_statistics"].items()
                )
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
