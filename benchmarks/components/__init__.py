"""One component at a time, without training: batcher_bench.py (calls
through the dynamic batcher against unbatched), vtrace_bench.py
(vtrace.from_importance_weights against NumPy), py_process_bench.py (round
trips and child starts), environment_bench.py (Atari's frames through the
environment pipe against in-process) and dmlab_level_cache_bench.py
(DeepMind Lab's level cache). Each is a command line: `python3
benchmarks/components/<name>.py --help`."""
