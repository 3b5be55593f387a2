"""The process and session infrastructure under everything else.

`child_process.py` runs an object in a child process of its own and tells
its death, errors and hangs apart; `sessions.py` builds the training session
and its device settings; `shutdown.py` turns SIGINT and SIGTERM into a clean
stop; `checkpoints.py` saves, finds, checks and exports checkpoints;
`errors.py` holds the typed errors and their exit codes; `tf_logging.py`
keeps TensorFlow's logging readable; `cpu_features.py` reads what the CPU
computes natively. Nothing here imports another part of the project.
"""
