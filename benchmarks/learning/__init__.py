"""One learning run: train_until.py trains experiment.py until a return or
a time limit and records its curve (the study runner's engine),
learning_curve.py draws a run's curve against frames and time,
evaluate_checkpoints.py plays test games with each checkpoint a run kept,
random_policy.py measures the random policy's return (a curve's floor),
scalars_plot.py draws a run's TensorBoard scalars. Each is a command line:
`python3 benchmarks/learning/<name>.py --help`."""
