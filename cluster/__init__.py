"""Training across machines over TensorFlow's gRPC runtime.

Without TensorFlow: `spec.py` describes the cluster (`ClusterConfig`: its
jobs, tasks and devices); `addresses.py` resolves it from the host flags or
TF_CONFIG; `hosts.py` parses and checks each HOST:PORT; `ports.py` probes
the network and picks free ports. `servers.py` starts this task's
tf.distribute.Server and the sessions that wait for the learner;
`learner_task.py` is the learner task (the queue, the variables and the
training step on /job:learner/task:0); `actor_task.py` is an actor task (its
environments and unroll, with a local copy of the weights); `state.py` is
what they share: the end-of-training protocol and how a task's process ends.
"""
