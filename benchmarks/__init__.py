"""The project's benchmarks and studies, by concern. Each package's
docstring says what it measures and how to run it; BENCHMARKS.md gives
every figure with its command, machine, date and load.

- study.py: the study runner's command line (`python3 benchmarks/study.py
  STUDY --results DIR --logdir_root DIR`): arms trained to a frame budget,
  tested, a record each, resumable.
- studies/: the studies it runs and their tables and figures (the Atari
  suites and the tuning of Atari's default, the off-policy corrections,
  PBT) and PopArt's comparison; the runner and the records.
- learning/: one learning run: training until a return, its curve, its
  checkpoints' test scores, the random policy's baseline, its scalars.
- peers/: other projects beside ours on this machine (Sample Factory),
  one runner shape for all.
- throughput/: frames per second of training against the raw emulator's
  ceiling, and where the CPU goes; the learner alone, learner tasks,
  actor tasks, memory, any family's level.
- components/: one part at a time: the batcher, V-trace, py_process, the
  environment pipe, DeepMind Lab's level cache.
- core/: what they share (the machine, runs measured from inside, code
  snapshots, records, figures).
- results/ and plots/: the committed records and figures.
"""
