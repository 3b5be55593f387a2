"""Single-machine training (--task=-1): one graph, one in-process session.

Every actor is a Python thread of this process that runs its own `enqueue`
op in a loop (actor/runner.py); each unroll steps the actor's environments,
each in its own child process (py_process.py) or several to a process
(families/vector.py). The learner dequeues `batch_size` unrolls, stages them
(one step of policy lag) and applies one update (learner/); with
num_learners=N, N towers (a GPU, a queue and a batch each) make that one
update. The session is in-process: no TensorFlow server, so no network port.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

import agent as agent_lib
import py_process
from actor import runner
from actor.supervisor import EnvironmentRestarts
from actor.unroll import actor_output_specs
from config import Config
from learner import loop, pipeline, progress
from runtime import sessions
from runtime.shutdown import ShutdownRequest


def train(
    config: Config, shutdown: ShutdownRequest, evolver: loop.Evolver | None = None
) -> None:
    """Single-machine training until --total_environment_frames (`evolver`:
    a PBT member, learner/loop.py).

    One graph: the agent, the queue, the learner's pipeline (which builds the
    agent's variables) and `num_actors` actors whose inference shares the
    learner's device, batched across actors when the op is built.
    """
    run, environment = config.run, config.environment
    specs = actor_output_specs(environment, config.agent, config.learner.unroll_length)
    logging.info("Training %s.", config.summary())
    if config.learner.batch_size > run.num_actors * run.envs_per_actor:
        logging.info(
            "batch_size %d > %d environments: batches include consecutive "
            "unrolls of the same environments.",
            config.learner.batch_size,
            run.num_actors * run.envs_per_actor,
        )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(run.seed)
        devices = sessions.learner_devices(config.learner.num_learners)
        agent = agent_lib.create_agent(config.agent)
        queues = [pipeline.create_queue(specs, learner=i) for i in range(len(devices))]
        # The learner builds the agent's variables (in the main graph).
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, queues, specs, config.learner, devices
        )
        inference_fn, _ = runner.make_inference_fn(
            agent, devices[0], run.dynamic_batching, run.envs_per_actor
        )
        actor_list = runner.build_actors(
            agent, environment, run, config.learner.unroll_length, queues, inference_fn
        )
        restarts = EnvironmentRestarts(
            run.logdir, learner_pipeline.learner.num_env_frames
        )
        hooks = [
            # Before PyProcessHook: its `end` must release the actors first.
            runner.ActorRunnerHook(
                [runner.ActorRunner(a, restarts, shutdown) for a in actor_list],
                tf.group([q.close(cancel_pending_enqueues=True) for q in queues]),
            ),
            py_process.PyProcessHook(),
        ]
        num_environments = run.num_actors * run.envs_per_actor
        result = loop.train_learner(
            config,
            learner_pipeline,
            hooks,
            shutdown,
            session_config=sessions.session_config(True, num_environments),
            evolver=evolver,
        )
    if shutdown.requested:
        shutdown.log_stop(result.num_env_frames, run.logdir)
        return
    logging.info(progress.done_line(result, run.logdir, environment.level_name))
