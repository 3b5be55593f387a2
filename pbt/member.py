"""A member of a population: an ordinary run of experiment.py (one machine,
or a cluster's chief) given --population_dir and --population_member.

No controller starts or stops members: each decides for itself, from the
population's records (records.py), as the paper's asynchronous rule does.

- **Joining.** The first start writes the member's record with its
  hyperparameters drawn from the priors (seeded by --seed and the member's
  index); a restart with the same command reads them back, so the member
  continues as itself from its last checkpoint. The first member to start
  writes `population.json` (the rule and priors); a member with other
  settings, or whose record names another --logdir, is refused.
- **Training.** The learner's hyperparameters (learner/hyperparameters.py)
  are set to the member's after every new session. Each finished episode
  counts towards its fitness (fitness.py); its record (frames, fitness,
  hyperparameters, its last complete checkpoint) is rewritten every
  --progress_secs.
- **Evolving.** Once ready (rule.py) it draws another member; copying, it
  restores the other's last complete checkpoint (its `checkpoint` in its
  record, never one being written) into the running learner: every
  variable but the frame count. Copied or not, it perturbs and sets its
  hyperparameters. The evolution becomes the member's own once its next
  checkpoint is written: then its record and a lineage entry say so. Killed
  before that, it restarts from its previous checkpoint with its previous
  hyperparameters, whole.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from config import Config
from learner.hyperparameters import MUTABLE
from pbt import records
from pbt.fitness import Fitness
from pbt.rule import (
    PAPER_PRIORS,
    Decision,
    MemberState,
    Prior,
    Rule,
    evolve,
    is_ready,
)
from runtime import run_record
from runtime.errors import FlagError

# The settings (runtime/settings.py, section "population") a member reads.
PRIOR_SETTINGS = {
    "learning_rate": "pbt_learning_rate_prior",
    "entropy_cost": "pbt_entropy_cost_prior",
    "max_grad_norm": "pbt_max_grad_norm_prior",
}


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
    directory: str
    member: int
    size: int
    rule: Rule
    priors: tuple[Prior, ...]
    seed: int

    def describe(self) -> dict:
        """What every member of one population must share (as JSON reads it
        back: lists, not tuples)."""
        return json.loads(
            json.dumps(
                {
                    "size": self.size,
                    "rule": dataclasses.asdict(self.rule),
                    "priors": [dataclasses.asdict(p) for p in self.priors],
                }
            )
        )


def _numbers(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise FlagError(
            f"--{flag}={text}: give comma-separated numbers, e.g. 5e-6,5e-3"
        ) from None


def population_config(values: Mapping[str, Any]) -> PopulationConfig | None:
    """The population settings from the flags' values ({name: value}); None
    without --population_dir.

    Raises:
      FlagError: one line naming the flag, the value and the fix.
    """
    directory = values["population_dir"]
    if not directory:
        return None
    size, member = values["population_size"], values["population_member"]
    if size < 2:
        raise FlagError(
            f"--population_size={size}: a population needs at least 2 members."
        )
    if not 0 <= member < size:
        raise FlagError(
            f"--population_member={member}: give this run's index in the "
            f"population, 0 to {size - 1} (--population_size={size})."
        )
    names = [n.strip() for n in values["pbt_hyperparameters"].split(",") if n.strip()]
    unknown = [n for n in names if n not in MUTABLE]
    if unknown or not names:
        raise FlagError(
            f"--pbt_hyperparameters={values['pbt_hyperparameters']}: "
            f"{', '.join(unknown) or 'none given'}; choose among {', '.join(MUTABLE)}."
        )
    priors = []
    for name in names:
        if name == "epsilon":
            prior = Prior(
                name,
                choices=_numbers("pbt_epsilon_choices", values["pbt_epsilon_choices"]),
            )
            flag = "pbt_epsilon_choices"
        else:
            flag = PRIOR_SETTINGS[name]
            bounds = _numbers(flag, values[flag])
            if len(bounds) != 2:
                raise FlagError(
                    f"--{flag}={values[flag]}: give low,high, e.g. 5e-6,5e-3"
                )
            prior = Prior(name, *bounds)
        if problem := prior.problem():
            raise FlagError(f"--{flag}={values[flag]}: {problem}.")
        priors.append(prior)
    rule = Rule(
        burn_in_frames=values["pbt_burn_in_frames"],
        ready_episodes=values["pbt_ready_episodes"],
        copy_threshold=values["pbt_copy_threshold"],
        perturb_probability=values["pbt_perturb_probability"],
        perturb_factor=values["pbt_perturb_factor"],
    )
    checks = [
        (rule.burn_in_frames >= 0, "pbt_burn_in_frames", "must be >= 0"),
        (rule.ready_episodes >= 1, "pbt_ready_episodes", "must be >= 1"),
        (rule.copy_threshold >= 0, "pbt_copy_threshold", "must be >= 0"),
        (
            0 <= rule.perturb_probability <= 1,
            "pbt_perturb_probability",
            "must be in [0, 1]",
        ),
        (
            rule.perturb_factor > 1,
            "pbt_perturb_factor",
            "must be > 1 (the paper's 1.2)",
        ),
    ]
    for ok, flag, fix in checks:
        if not ok:
            raise FlagError(f"--{flag}={values[flag]}: {fix}.")
    return PopulationConfig(
        directory, member, size, rule, tuple(priors), values["seed"]
    )


def paper_priors() -> list[Prior]:
    return [PAPER_PRIORS[n] for n in ("learning_rate", "entropy_cost", "epsilon")]


class Member:
    """This run as member `population.member`: its record, fitness and
    evolutions (see the module's docstring). Its methods other than `join`
    are the learner loop's evolver interface (learner/loop.py)."""

    def __init__(
        self, population: PopulationConfig, logdir: str, level_names: Sequence[str]
    ):
        self.population = population
        self.logdir = logdir
        self.fitness = Fitness(level_names)
        self.hyperparameters: dict[str, float] = {}
        self._rng = random.Random(population.seed * 1000 + population.member)
        self._record: dict = {}
        self._pending: tuple[Decision, int, dict] | None = None
        self._copy_saver = None
        self._last_write = 0.0
        self.write_secs = 10.0
        self._next_try = 0.0

    # -- before training --------------------------------------------------------

    def join(self, defaults: Mapping[str, float]) -> dict[str, float]:
        """Reads or starts this member's record; returns the hyperparameters
        to train with (`defaults`: the run's values of those that do not
        evolve).

        Raises:
          FlagError: the population's settings differ, the record names
            another logdir, or the directory cannot be written.
        """
        population = self.population
        directory = population.directory
        try:
            shared = records.read_json(os.path.join(directory, records.POPULATION_FILE))
            first = shared is None
            if first:
                shared = population.describe()
            record = records.read_member(directory, population.member)
        except (tf.errors.OpError, OSError) as e:
            raise _unwritable(directory, e) from None
        except ValueError as e:
            raise FlagError(
                f"--population_dir={directory}: {e}; move it away."
            ) from None
        mine = population.describe()
        for key in ("size", "rule", "priors"):
            if shared.get(key) != mine[key]:
                raise FlagError(
                    f"--population_dir={directory}: the population's {key} is "
                    f"{shared.get(key)}, this run's {mine[key]}; start every "
                    "member with the same population settings."
                )
        run = run_record.read(self.logdir)
        if run is not None:
            recorded = {
                name: run["settings"].get(name, {}).get("value")
                for name in ("population_dir", "population_member")
            }
            if recorded["population_dir"] and recorded != {
                "population_dir": directory,
                "population_member": population.member,
            }:
                raise FlagError(
                    f"--logdir={self.logdir}: its run is member "
                    f"{recorded['population_member']} of the population in "
                    f"{recorded['population_dir']}, not member "
                    f"{population.member} of {directory}; give each member a "
                    "--logdir of its own."
                )
        sharing = [
            k
            for k, r in records.read_members(directory).items()
            if r.get("logdir") == self.logdir and k != population.member
        ]
        if sharing:
            raise FlagError(
                f"--logdir={self.logdir}: member {sharing[0]} of {directory} "
                "trains there; give each member a --logdir of its own."
            )
        if record is not None and record.get("logdir") != self.logdir:
            raise FlagError(
                f"--population_member={population.member}: that member of "
                f"{directory} trains in {record.get('logdir')}, not "
                f"--logdir={self.logdir}; give its logdir or another member."
            )
        if record is None:
            drawn = {p.name: p.draw(self._rng) for p in population.priors}
            record = {
                "member": population.member,
                "logdir": self.logdir,
                "frames": 0,
                "fitness": None,
                "fitness_units": self.fitness.units,
                "episodes_since_evolution": 0,
                "evolutions": 0,
                "hyperparameters": {**dict(defaults), **drawn},
                "checkpoint": None,
            }
        self._record = record
        self.hyperparameters = dict(record["hyperparameters"])
        # Written only once every check passed: a refused member writes
        # nothing.
        try:
            if first:
                records.write_json(
                    os.path.join(directory, records.POPULATION_FILE), shared
                )
            self._write(force=True)
        except (tf.errors.OpError, OSError) as e:
            raise _unwritable(directory, e) from None
        return dict(self.hyperparameters)

    def build(self) -> None:
        """In the training graph, before its session: the saver that copies
        another member's weights (every global variable but the frame count)."""
        step = tf.compat.v1.train.get_global_step()
        variables = [v for v in tf.compat.v1.global_variables() if v is not step]
        self._copy_saver = tf.compat.v1.train.Saver(variables, sharded=False)

    # -- the learner loop's evolver interface ------------------------------------

    def after_create_session(self, session, hyperparameters) -> None:
        """A new session (a raw tf.Session): its learner gets the member's
        hyperparameters."""
        hyperparameters.assign(session, self.hyperparameters)

    def after_step(
        self,
        session,
        num_env_frames: int,
        episodes: Sequence[tuple[str, float]],
        hyperparameters,
    ) -> None:
        for level, episode_return in episodes:
            self.fitness.add(level, episode_return)
        self._record.update(
            frames=int(num_env_frames),
            fitness=self.fitness.value(),
            episodes_since_evolution=self.fitness.episodes,
        )
        if self._pending is not None:
            self._settle()
        elif (
            is_ready(self._state(self._record), self.population.rule)
            and time.monotonic() >= self._next_try
        ):
            self._maybe_evolve(session, num_env_frames, hyperparameters)
        self._write()

    def finish(self, num_env_frames: int) -> None:
        """After the final checkpoint: the record says where the member
        ended (and an evolution still waiting settles on that checkpoint)."""
        self._record["frames"] = int(num_env_frames)
        if self._pending is not None:
            self._settle()
        self._write(force=True)

    # -- evolution ------------------------------------------------------------------

    def _state(self, record: Mapping) -> MemberState:
        return MemberState(
            record["member"],
            int(record.get("frames", 0)),
            record.get("fitness"),
            int(record.get("episodes_since_evolution", 0)),
            record.get("hyperparameters", {}),
        )

    def _maybe_evolve(self, session, num_env_frames: int, hyperparameters) -> None:
        # At most one look at the others every write_secs: a ready member
        # that cannot evolve now (nobody else has a record yet, or the donor
        # no whole checkpoint) would otherwise read every record at each
        # learner step, and the records change no faster than that.
        self._next_try = time.monotonic() + self.write_secs
        others = [
            self._state(r)
            for k, r in records.read_members(self.population.directory).items()
            if k != self.population.member
        ]
        decision = evolve(
            self._state(self._record),
            others,
            self.population.priors,
            self.population.rule,
            self._rng,
        )
        if decision is None:
            return
        event = {
            "member": self.population.member,
            "frames": int(num_env_frames),
            "fitness": self._record["fitness"],
            "before": dict(self.hyperparameters),
        }
        if decision.copied_from is not None:
            donor = records.read_member(self.population.directory, decision.copied_from)
            checkpoint = (donor or {}).get("checkpoint")
            try:
                if not checkpoint:
                    raise tf.errors.NotFoundError(None, None, "no checkpoint yet")
                started = time.monotonic()
                self._copy_saver.restore(session, checkpoint)
                copy_seconds = time.monotonic() - started
            except (tf.errors.NotFoundError, ValueError) as e:
                # The donor has no whole checkpoint to give now: no
                # evolution this time; the member stays ready.
                logging.warning(
                    "PBT: member %d could not copy member %d (%s); tries again.",
                    self.population.member,
                    decision.copied_from,
                    getattr(e, "message", e),
                )
                return
            event.update(
                copied_from=decision.copied_from,
                donor_checkpoint=checkpoint,
                donor_fitness=donor.get("fitness"),
                # What the copy cost: the restore into the running learner.
                copy_seconds=round(copy_seconds, 3),
            )
        else:
            event["copied_from"] = None
        self.hyperparameters = dict(decision.hyperparameters)
        hyperparameters.assign(session, self.hyperparameters)
        event.update(
            after=dict(self.hyperparameters), perturbed=list(decision.perturbed)
        )
        logging.info(
            "PBT: member %d at %d frames (fitness %.2f): %s; hyperparameters %s.",
            self.population.member,
            num_env_frames,
            self._record["fitness"],
            f"copied member {decision.copied_from} in {event['copy_seconds']:.2f} s"
            if decision.copied_from is not None
            else "kept its weights",
            self.hyperparameters,
        )
        self.fitness.reset()
        self._pending = (decision, int(num_env_frames), event)

    def _settle(self) -> None:
        """An evolution becomes the member's own once a checkpoint after it
        exists: its record and the lineage say so then."""
        _, frames, event = self._pending
        latest = tf.train.latest_checkpoint(self.logdir)
        if latest is None or _checkpoint_frames(latest) <= frames:
            return
        records.append_lineage(self.population.directory, event)
        self._record["hyperparameters"] = dict(self.hyperparameters)
        self._record["evolutions"] = self._record.get("evolutions", 0) + 1
        self._pending = None
        self._write(force=True)

    def _write(self, force: bool = False) -> None:
        """Rewrites the record (at most every write_secs unless forced); its
        checkpoint is the newest whole one, except while an evolution waits
        to settle (then the one from before it, which matches the record's
        hyperparameters)."""
        now = time.monotonic()
        if not force and now - self._last_write < self.write_secs:
            return
        if self._pending is None:
            latest = tf.train.latest_checkpoint(self.logdir)
            if latest is not None:
                self._record["checkpoint"] = latest
        self._record["updated"] = datetime.datetime.now(datetime.UTC).isoformat()
        records.write_member(
            self.population.directory, self.population.member, self._record
        )
        self._last_write = now


def _unwritable(directory: str, error: Exception) -> FlagError:
    return FlagError(
        f"--population_dir={directory}: cannot be read and written "
        f"({getattr(error, 'message', error)}); give a directory every member "
        "can write."
    )


def _checkpoint_frames(prefix: str) -> int:
    try:
        return int(prefix.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def join_population(
    values: Mapping[str, Any], config: Config, role: str
) -> tuple[Config, Member | None]:
    """This run's place in a population (None without --population_dir, and
    for a cluster's actor and serving learner tasks, which follow the
    chief): the member, joined (its record read or started), and `config`
    with its hyperparameters and record interval.

    Raises:
      FlagError: bad population settings (population_config) or a member
        that cannot join (Member.join).
    """
    population = population_config(values)
    if population is None or role not in ("single", "chief"):
        return config, None
    member = Member(population, config.run.logdir, config.environment.level_names)
    member.write_secs = float(config.run.progress_secs)
    defaults = {name: getattr(config.learner, name) for name in MUTABLE}
    hyperparameters = member.join(defaults)
    learner = dataclasses.replace(config.learner, **hyperparameters)
    return dataclasses.replace(config, learner=learner), member
