"""Training on one machine: the actors are threads of the learner's process.

`training.py` builds one graph with the agent, the queues, the learner's
pipeline and the actors (their inference batched across actors by the
dynamic-batching op) and runs it until --total_environment_frames. It joins
the actor's side and the learner's, which never import each other; a
cluster's tasks are in cluster/.
"""
