"""The runner shape every peer shares: a peer is a shell script next to
this file that installs its project into a virtual environment of its own
(outside the repository), trains it for a number of seconds and prints its
figures as `<prefix>_<name>=<value>` lines (frames_per_s, frames, return),
and, where it can, each whole game as `<prefix>_episode=<seconds>,<frames>,
<return>` (seconds since its start, the frames seen by then); `run` starts
it and reads them back into a record.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer: its label in tables, its script here and its lines' prefix."""

    label: str
    script: str
    prefix: str


SAMPLE_FACTORY = Peer(
    "Sample Factory 2.1.1", "sample_factory_peer.sh", "sample_factory"
)
CLEANRL_PPO = Peer(
    "CleanRL's PPO (ppo_atari.py, commit fe8d8a0)", "cleanrl_ppo_peer.sh", "cleanrl_ppo"
)


def run(peer: Peer, seconds: float, env: dict | None = None) -> dict:
    """Runs `peer` for `seconds` with `env` added to the environment;
    returns {command, frames_per_s, frames, mean_return, output_tail}, a
    figure None where the script printed none."""
    script = os.path.join(HERE, peer.script)
    given = {k: v for k, v in (env or {}).items()}
    done = subprocess.run(
        ["bash", script, str(int(seconds))],
        capture_output=True,
        text=True,
        env=dict(os.environ, **given),
    )
    return parse(peer, done.stdout, done.stderr, done.returncode, seconds, given)


def parse(
    peer: Peer, stdout: str, stderr: str, returncode: int, seconds: float, given: dict
) -> dict:
    """The record of a peer's run from what its script printed."""
    found = dict(re.findall(rf"^{peer.prefix}_(\w+)=(\S+)$", stdout, re.M))
    episodes = [
        (float(t), int(frames), float(value))
        for t, frames, value in re.findall(
            rf"^{peer.prefix}_episode=([\d.]+),(\d+),(-?[\d.]+)$", stdout, re.M
        )
    ]
    prefix = " ".join(f"{k}={v}" for k, v in given.items())
    return dict(
        command=f"{prefix} benchmarks/peers/{peer.script} {int(seconds)}".strip(),
        frames_per_s=float(found["frames_per_s"]) if "frames_per_s" in found else None,
        frames=int(found["frames"]) if "frames" in found else None,
        mean_return=float(found["return"]) if "return" in found else None,
        returncode=returncode,
        episodes=episodes,
        output_tail=(stdout + stderr)[-1500:],
    )
