"""Other projects beside ours, on this machine, each run from outside the
repository (never committed) through one runner shape (peers.py: a peer's
script installs its project into a virtual environment of its own and
prints `<peer>_<figure>=<value>` lines, and each game it finished):
sample_factory_bench.py (ours beside Sample Factory's Atari example at each
side's fastest layout, with the raw-emulator ceiling, one invocation),
peer_defaults.py (each project at its own defaults for the same wall-clock
time) and per_hour.py (learning per hour: ours and CleanRL's PPO, each
alone for the same minutes, curves against minutes and frames):

    python3 benchmarks/peers/sample_factory_bench.py --peer_s 240
    python3 benchmarks/peers/peer_defaults.py --level atari/pong --minutes 10
    python3 benchmarks/peers/per_hour.py --level atari/phoenix --minutes 60 \
        --json benchmarks/results/per_hour_phoenix.json
"""
