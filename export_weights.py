"""Copies a run's agent weights, without the optimiser's state, to a new logdir.

    python3 export_weights.py --logdir=/tmp/agent --out=pretrained/atari_pong

A training checkpoint holds each weight three times (the weight and
RMSProp's two slots) plus the frame counter; test mode needs only the
weights. The output is a normal checkpoint directory (`checkpoint`,
`model.ckpt-<frames>.index/.data`) that `--mode=test --logdir=<out>` reads
with the same flags the run was trained with. Training cannot resume from
it: it has no optimiser state, and experiment.py says so.
"""

import sys

from runtime import tf_logging

tf_logging.import_tensorflow_quietly()

from absl import app, flags  # noqa: E402

from runtime import checkpoints  # noqa: E402
from runtime.errors import FlagError  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("logdir", None, "The run whose newest whole checkpoint to read.")
flags.DEFINE_string(
    "out", None, "The directory to write the weights-only checkpoint to."
)


def main(argv):
    del argv
    try:
        path = checkpoints.export_weights(FLAGS.logdir, FLAGS.out)
    except FlagError as e:
        print(f"export_weights.py: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"Weights written to {path}.")


if __name__ == "__main__":
    flags.mark_flags_as_required(["logdir", "out"])
    app.run(main)
