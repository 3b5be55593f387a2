"""Other projects beside ours, on this machine, each run from outside the
repository (never committed) through one runner shape (peers.py: a peer's
script installs its project into a virtual environment of its own and
prints `<peer>_<figure>=<value>` lines): sample_factory_bench.py (ours
beside Sample Factory's Atari example at each side's fastest layout, with
the raw-emulator ceiling, one invocation) and peer_defaults.py (each
project at its own defaults for the same wall-clock time):

    python3 benchmarks/peers/sample_factory_bench.py --peer_s 240
    python3 benchmarks/peers/peer_defaults.py --level atari/pong --minutes 10
"""
