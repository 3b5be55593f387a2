"""The learner: from dequeued trajectories to one update of the agent.

`pipeline.py` holds the queue the actors fill and stages batches of
`batch_size` unrolls, time-major; `loss.py` is the V-trace actor-critic loss,
a pure function with each term apart; `update.py` applies it with one
optimiser step (learning-rate schedule, gradient clipping, frame count) and
writes the learner's summaries, guarded by `nan_guard.py`, with
`level_summaries.py`'s per-level ones; `popart.py` is PopArt's per-level
value normalisation; `loop.py` runs the training loop in a monitored
session; `progress.py` writes the progress line and episode returns. The
learner reads the trajectory (the root's `trajectory.py`), never the actor.
"""
