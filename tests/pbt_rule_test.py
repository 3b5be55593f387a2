"""The PBT rule (pbt/rule.py) with fixed seeds, counted over many draws; a
member's fitness (pbt/fitness.py); the population's records (pbt/records.py)
written whole and read back."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from pbt import fitness as fitness_lib
from pbt import records
from pbt.rule import PAPER_PRIORS, MemberState, Prior, Rule, draw_initial, evolve

PRIORS = [PAPER_PRIORS[n] for n in ("learning_rate", "entropy_cost", "epsilon")]
HYPER = {"learning_rate": 1e-4, "entropy_cost": 1e-3, "epsilon": 1e-3}
RULE = Rule(burn_in_frames=1000, ready_episodes=10)


def member(k, fitness, frames=5000, episodes=10, hyper=HYPER):
    return MemberState(k, frames, fitness, episodes, dict(hyper))


def test_a_copy_happens_exactly_when_the_other_is_better_by_more_than_the_threshold():
    rng = random.Random(0)
    no_perturbation = Rule(burn_in_frames=0, ready_episodes=1, perturb_probability=0)
    other_hyper = {"learning_rate": 2e-4, "entropy_cost": 5e-3, "epsilon": 1e-5}
    for other_fitness, copies in [
        (50.0, False),
        (55.0, False),  # better by exactly the threshold: not more
        (55.001, True),
        (90.0, True),
        (None, False),  # the other has no fitness yet
    ]:
        decision = evolve(
            member(0, 50.0),
            [member(1, other_fitness, hyper=other_hyper)],
            PRIORS,
            no_perturbation,
            rng,
        )
        assert (decision.copied_from == 1) is copies, other_fitness
        assert decision.hyperparameters == (other_hyper if copies else HYPER)
        assert decision.perturbed == ()


def test_burn_in_and_readiness_are_respected():
    others = [member(1, 99.0)]
    rng = random.Random(1)
    assert evolve(member(0, 0.0, frames=999), others, PRIORS, RULE, rng) is None
    assert evolve(member(0, 0.0, episodes=9), others, PRIORS, RULE, rng) is None
    assert evolve(member(0, None), others, PRIORS, RULE, rng) is None
    assert evolve(member(0, 0.0), [member(0, 99.0)], PRIORS, RULE, rng) is None
    ready = evolve(member(0, 0.0, frames=1000, episodes=10), others, PRIORS, RULE, rng)
    assert ready is not None and ready.copied_from == 1


def test_the_other_member_is_drawn_uniformly():
    rng = random.Random(2)
    others = [member(k, 100.0) for k in range(1, 5)]
    counts = dict.fromkeys(range(1, 5), 0)
    for _ in range(4000):
        counts[evolve(member(0, 0.0), others, PRIORS, RULE, rng).copied_from] += 1
    # 1,000 each expected, binomial sd 27.
    assert all(880 < n < 1120 for n in counts.values()), counts


def test_each_hyperparameter_is_perturbed_with_its_probability_by_exactly_the_factor():
    rng = random.Random(3)
    continuous = [PAPER_PRIORS["learning_rate"], PAPER_PRIORS["entropy_cost"]]
    draws = 6000
    perturbed = dict.fromkeys(("learning_rate", "entropy_cost"), 0)
    ups = 0
    for _ in range(draws):
        decision = evolve(member(0, 50.0), [member(1, 50.0)], continuous, RULE, rng)
        assert decision.copied_from is None
        for name in ("learning_rate", "entropy_cost"):
            ratio = decision.hyperparameters[name] / HYPER[name]
            if name in decision.perturbed:
                perturbed[name] += 1
                assert ratio == pytest.approx(1.2) or ratio == pytest.approx(1 / 1.2)
                ups += ratio > 1
            else:
                assert ratio == 1.0
    # Probability 0.33 each: 1,980 of 6,000 expected, binomial sd 36.
    for name, count in perturbed.items():
        assert 1850 < count < 2110, (name, count)
    # Up and down equally often.
    total = sum(perturbed.values())
    assert abs(ups - total / 2) < 4 * math.sqrt(total / 4)


def test_a_choice_moves_one_step_and_stays_legal():
    epsilon = PAPER_PRIORS["epsilon"]
    rng = random.Random(4)
    seen = set()
    value = 1e-3
    for _ in range(2000):
        new = epsilon.perturb(value, rng, 1.2)
        ordered = sorted(epsilon.choices)
        assert new in epsilon.choices
        assert abs(ordered.index(new) - ordered.index(value)) <= 1
        if value in (ordered[0], ordered[-1]) and new == value:
            seen.add("clamped")
        seen.add(new)
        value = new
    assert set(epsilon.choices) <= seen and "clamped" in seen


def test_initial_draws_follow_the_priors():
    rng = random.Random(5)
    draws = [draw_initial(PRIORS, rng) for _ in range(3000)]
    lr = [d["learning_rate"] for d in draws]
    assert 5e-6 <= min(lr) and max(lr) <= 5e-3
    # Log-uniform: half the draws below the geometric mean of the bounds.
    below = sum(x < math.sqrt(5e-6 * 5e-3) for x in lr)
    assert 1400 < below < 1600
    assert {d["epsilon"] for d in draws} == {1e-1, 1e-3, 1e-5, 1e-7}
    # The same seed draws the same population.
    assert draw_initial(PRIORS, random.Random(5)) == draws[0]


def test_a_prior_that_is_not_one_says_why():
    assert Prior("learning_rate", 1e-3, 1e-5).problem() == (
        "learning_rate: a log-uniform prior needs 0 < low <= high, not [0.001, 1e-05]"
    )
    assert "0 < low" in Prior("entropy_cost", 0.0, 1.0).problem()
    assert "positive" in Prior("epsilon", choices=(0.1, -1.0)).problem()
    assert all(p.problem() is None for p in PAPER_PRIORS.values())


def test_fitness_is_the_capped_human_normalised_score_where_levels_have_one():
    atari = fitness_lib.Fitness(["atari/pong"])
    assert atari.normalised and atari.value() is None
    # Pong: random -20.7, human 14.6: +21 is above human, capped at 100.
    atari.add("atari/pong", 21.0)
    atari.add("atari/pong", -20.7)
    assert atari.value() == pytest.approx(50.0)
    assert atari.episodes == 2
    atari.reset()
    assert atari.value() is None
    vizdoom = fitness_lib.Fitness(["vizdoom/defend_the_center"])
    assert not vizdoom.normalised and vizdoom.units == "return"
    vizdoom.add("vizdoom/defend_the_center", 7.0)
    vizdoom.add("vizdoom/defend_the_center", 3.0)
    assert vizdoom.value() == 5.0


def test_records_are_written_whole_and_read_back(tmp_path):
    root = str(tmp_path / "population")
    records.write_member(root, 0, {"frames": 1})
    records.write_member(root, 3, {"frames": 2})
    records.write_member(root, 0, {"frames": 5})
    # A temporary file left by a writer killed mid-write, and a damaged
    # record: neither is a member's record.
    (tmp_path / "population" / "members" / "1.json.tmp-dead").write_text("{")
    (tmp_path / "population" / "members" / "2.json").write_text("{not json")
    assert records.read_members(root) == {0: {"frames": 5}, 3: {"frames": 2}}
    with pytest.raises(ValueError, match="2.json is not valid JSON"):
        records.read_json(str(tmp_path / "population" / "members" / "2.json"))
    first = records.append_lineage(root, {"member": 1, "frames": 10, "copied_from": 0})
    second = records.append_lineage(
        root, {"member": 0, "frames": 12, "copied_from": None}
    )
    assert first < second
    lineage = records.read_lineage(root)
    assert [(e["member"], e["frames"]) for e in lineage] == [(1, 10), (0, 12)]
    assert all("time" in e for e in lineage)
    leftovers = [p.name for p in (tmp_path / "population").rglob("*.tmp-*")]
    assert leftovers == ["1.json.tmp-dead"]


def _pbt_figure():
    """benchmarks/studies/pbt_study.py, imported from the benchmarks package."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.studies import pbt_study as pbt_figure

    return pbt_figure


def test_the_figure_follows_each_member_through_its_evolutions(tmp_path):
    pbt_figure = _pbt_figure()
    root = str(tmp_path)
    records.write_json(
        f"{root}/population.json",
        {"priors": [{"name": "learning_rate"}, {"name": "epsilon"}]},
    )
    start = {"learning_rate": 1e-3, "epsilon": 0.1, "entropy_cost": 0.01}
    after = {"learning_rate": 1.2e-3, "epsilon": 1e-3, "entropy_cost": 0.01}
    records.write_member(root, 0, {"frames": 900, "hyperparameters": start})
    records.write_member(root, 1, {"frames": 800, "hyperparameters": after})
    records.append_lineage(
        root,
        {
            "member": 1,
            "frames": 500,
            "before": start,
            "after": after,
            "copied_from": 0,
            "fitness": 2.5,
        },
    )
    series = pbt_figure.trajectories(root)
    assert series[0] == {
        "frames": [0, 900],
        "copies": [],
        "fitness": [],
        "learning_rate": [1e-3, 1e-3],
        "epsilon": [0.1, 0.1],
    }
    assert series[1]["frames"] == [0, 500, 800]
    assert series[1]["learning_rate"] == [1e-3, 1.2e-3, 1.2e-3]
    assert series[1]["copies"] == [(500, 0)]
    assert series[1]["fitness"] == [(500, 2.5)]


def test_the_figure_pairs_each_members_curve_with_its_fixed_twin(tmp_path):
    pbt_figure = _pbt_figure()

    def record(name, points):
        curve = [{"frames": f, "mean": m} for f, m in points]
        (tmp_path / f"{name}.json").write_text(json.dumps({"curve": curve}))

    record("pbt_0", [(100, 1.0), (200, 2.0)])
    record("fixed_0", [(100, 1.5), (200, None)])
    record("pbt_1", [(100, 0.5)])
    record("breakout_vtrace", [(100, 9.0)])  # not a member: left out
    assert pbt_figure.study_curves(str(tmp_path)) == {
        0: {"pbt": [(100, 1.0), (200, 2.0)], "fixed": [(100, 1.5)]},
        1: {"pbt": [(100, 0.5)]},
    }
