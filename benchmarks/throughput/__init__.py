"""Training throughput: throughput_bench.py (frames per second of
single-machine training against the raw-ALE ceiling in one invocation, its
parts and the profile of where the CPU goes; tables and plots in
throughput_report.py), learner_bench.py (the learner alone),
learner_tasks_bench.py (synchronous learner tasks over gRPC, loopback or
network namespaces; learner_tasks_report.py draws and projects it),
distributed_bench.py (actor tasks against one machine), memory_bench.py
(peak resident memory) and family_bench.py (any family's level). Each is a
command line: `python3 benchmarks/throughput/<name>.py --help`."""
