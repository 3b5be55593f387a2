"""The actor: environments stepped by the agent, one unroll at a time.

`envs.py` makes an actor's environment processes and says which level and
seeds each actor plays; `unroll.py` builds the unroll of `unroll_length`
agent steps over them as graph ops, whose output is the `ActorOutput` of the
root's `trajectory.py`; `runner.py` runs each single-machine actor as a
thread with batched inference; `supervisor.py` is the one policy for
environment failures (restart, back off, give up), used by the runner and by
a cluster's actor tasks alike. The actor imports nothing of the learner.
"""
