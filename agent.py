"""The IMPALA agent network (Sonnet 2), deep and shallow variants.

The network follows the IMPALA paper (Espeholt et al., 2018, figure 3):

  frame -> torso (deep: 3 residual stages; shallow: 2 convolutions) -> ReLU
        -> FC 256 -> ReLU
  concat [torso, clipped last reward, one-hot last action, instruction code]
        -> LSTM 256 (state reset where an episode ended)
        -> policy logits (num_actions) and baseline (1; with PopArt one
           normalised value per level of the run, popart.py)
  action ~ Categorical(policy logits)

The frame stack (Atari's 4 frames) is built here, in the graph, from one
frame a step: with frame_stack S > 1 the agent's state carries the last
S - 1 frames beside the core state (`StackedState`), and each step's
observation is those frames and the new one, oldest first, along the
channels; where an episode starts (done) the stack restarts as the new frame
repeated S times, as the LSTM state restarts. An actor then sends each frame
once, and the learner rebuilds the stacks from the unroll's frames and the
state before its first step, which the unroll carries (SEED RL keeps its
stack in the agent state the same way). The network sees [H, W, S x C]
either way, so a checkpoint does not depend on where the stack was built.

Two options leave the paper's network: use_lstm=False drops the LSTM (the
heads read the concatenation), torso_dtype='bfloat16' computes the torso's
convolutions in bfloat16 (float32 weights).

Everything is time-major: `unroll` takes inputs shaped [T, B, ...]; the
one-step `__call__` takes inputs shaped [B, ...].

`env_outputs` is the environment's StepOutput namedtuple
(reward, info, done, observation) where observation is
(frame uint8 [H, W, C], instruction tf.string scalar); only its `reward`,
`done` and `observation` fields are read here, so agent.py does not import
environments.py.
"""

import collections
import sys

import numpy as np
import sonnet as snt
import tensorflow as tf

from config import AgentConfig

AgentOutput = collections.namedtuple("AgentOutput", "action policy_logits baseline")
# An agent that stacks frames: its core state (LSTMState, or () without the
# LSTM) and the last S - 1 frames, uint8 [B, S - 1, H, W, C], oldest first.
StackedState = collections.namedtuple("StackedState", "core frames")

# Instruction encoding sizes from the paper.
INSTRUCTION_HASH_BUCKETS = 1000
INSTRUCTION_EMBEDDING_SIZE = 20
INSTRUCTION_LSTM_SIZE = 64
TORSO_OUTPUT_SIZE = 256
CORE_LSTM_SIZE = 256

# (output channels, number of residual blocks) per stage of the deep torso.
DEEP_STAGES = ((16, 2), (32, 2), (32, 2))

TORSOS = ("deep", "shallow")

# The dtypes a torso's convolutions can compute in. Its weights are float32
# either way (RMSProp's updates are far below bfloat16's resolution of a
# weight), so checkpoints do not depend on it.
TORSO_DTYPES = ("float32", "bfloat16")


def _pass_sonnet_tf2_check() -> None:
    """Satisfies Sonnet 2's one-time "requires TensorFlow 2" check now.

    Sonnet asserts `tf.executing_eagerly()` under `tf.init_scope()` the first
    time any module is constructed; inside `with tf.Graph().as_default():`
    that is False, so constructing the first module while eager execution is
    still on (at import time) is what lets every later graph-mode build work.
    """
    if tf.executing_eagerly():
        snt.Module(name="sonnet_tf2_check")


_pass_sonnet_tf2_check()


class _Conv2D(snt.Module):
    """A 2-D convolution with bias whose float32 weights are cast to the
    input's dtype on every call: [B, H, W, C_in] -> [B, H', W', C_out].

    Its variables are snt.Conv2D's (w [k, k, C_in, C_out] initialised from a
    truncated normal of stddev 1 / sqrt(k * k * C_in), b [C_out] zeros, the
    same names), so a checkpoint restores whichever dtype computes. With
    float32 inputs it computes what snt.Conv2D computes; snt.Conv2D itself
    would create bfloat16 variables for bfloat16 inputs.
    """

    def __init__(
        self, channels: int, kernel: int, stride: int, padding: str, name: str
    ):
        super().__init__(name=name)
        self._channels = channels
        self._kernel = kernel
        self._stride = stride
        self._padding = padding

    @snt.once
    def _initialize(self, in_channels: int) -> None:
        shape = (self._kernel, self._kernel, in_channels, self._channels)
        stddev = 1.0 / np.sqrt(np.prod(shape[:-1]))
        w_init = snt.initializers.TruncatedNormal(stddev=stddev)
        self.w = tf.Variable(w_init(shape, tf.float32), name="w")
        self.b = tf.Variable(tf.zeros([self._channels]), name="b")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        self._initialize(int(x.shape[-1]))
        y = tf.nn.convolution(
            x, tf.cast(self.w, x.dtype), strides=self._stride, padding=self._padding
        )
        if x.dtype == tf.float32:
            return tf.nn.bias_add(y, self.b)
        return _bias_add_summed_in_float32(y, self.b)


@tf.custom_gradient
def _bias_add_summed_in_float32(y: tf.Tensor, b: tf.Tensor):
    """y + b for a low-precision y [B, H, W, C] and a float32 bias b [C].

    The forward pass is tf.nn.bias_add in y's dtype. The bias gradient is
    why this exists: TensorFlow's CPU BiasAddGrad sums a bfloat16 gradient
    in bfloat16, and a sum over B x H x W terms (1.2 M in the deep torso's
    first stage at T x B = 168) then stops growing once the partial sum
    dwarfs each term, leaving the bias gradients tens of percent short.
    tf.reduce_sum accumulates bfloat16 in float32, and is faster too.
    """

    def grad(dy: tf.Tensor):
        axes = list(range(dy.shape.rank - 1))
        return dy, tf.cast(tf.reduce_sum(dy, axes), tf.float32)

    return tf.nn.bias_add(y, tf.cast(b, y.dtype)), grad


class _ResidualStage(snt.Module):
    """conv 3x3 stride 1 -> max-pool 3x3 stride 2 -> residual blocks."""

    def __init__(self, channels: int, num_blocks: int, name: str | None = None):
        super().__init__(name=name)
        self._conv = _Conv2D(channels, 3, stride=1, padding="SAME", name="conv")
        self._blocks = [
            (
                _Conv2D(channels, 3, stride=1, padding="SAME", name=f"res{i}_a"),
                _Conv2D(channels, 3, stride=1, padding="SAME", name=f"res{i}_b"),
            )
            for i in range(num_blocks)
        ]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x = self._conv(x)
        x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME")
        for conv_a, conv_b in self._blocks:
            block_input = x
            x = conv_b(tf.nn.relu(conv_a(tf.nn.relu(x))))
            # The residual sum, written as a subtraction on purpose: TF 2.21's
            # grappler remapper fails on conv + bias + add whose sum feeds
            # the next block (it logs "remapper failed" and then skips every
            # fusion of the graph, ~1.5x slower training on CPU).
            x = block_input - tf.negative(x)
        return x


class _DeepTorso(snt.Module):
    """The paper's deep (15-layer residual) torso: [B, H, W, C] -> [B, 256].

    The convolutions compute in `dtype` (float32 [B, H, W, C] in, float32
    out either way); the fully connected layer in float32.
    """

    def __init__(self, dtype: tf.DType = tf.float32, name: str = "deep_torso"):
        super().__init__(name=name)
        self._dtype = dtype
        self._stages = [
            _ResidualStage(c, n, name=f"stage{i}")
            for i, (c, n) in enumerate(DEEP_STAGES)
        ]
        self._flatten = snt.Flatten()
        self._linear = snt.Linear(TORSO_OUTPUT_SIZE, name="fc")

    def __call__(self, frame: tf.Tensor) -> tf.Tensor:
        x = tf.cast(frame, self._dtype)
        for stage in self._stages:
            x = stage(x)
        x = tf.cast(tf.nn.relu(x), tf.float32)
        return tf.nn.relu(self._linear(self._flatten(x)))


class _ShallowTorso(snt.Module):
    """The paper's shallow torso (Nature DQN-like): [B, H, W, C] -> [B, 256].

    The convolutions compute in `dtype`, the fully connected layer in float32.
    """

    def __init__(self, dtype: tf.DType = tf.float32, name: str = "shallow_torso"):
        super().__init__(name=name)
        self._dtype = dtype
        self._conv1 = _Conv2D(16, 8, stride=4, padding="VALID", name="conv1")
        self._conv2 = _Conv2D(32, 4, stride=2, padding="VALID", name="conv2")
        self._flatten = snt.Flatten()
        self._linear = snt.Linear(TORSO_OUTPUT_SIZE, name="fc")

    def __call__(self, frame: tf.Tensor) -> tf.Tensor:
        x = tf.nn.relu(self._conv1(tf.cast(frame, self._dtype)))
        x = tf.cast(tf.nn.relu(self._conv2(x)), tf.float32)
        return tf.nn.relu(self._linear(self._flatten(x)))


class _InstructionEncoder(snt.Module):
    """Words -> hash buckets -> Embed 20 -> LSTM 64 -> output at the last word.

    Input: tf.string [B]. Output: float32 [B, 64]; an empty instruction (the
    Atari case) encodes to zeros, because the LSTM never steps for it and its
    initial state is zero.
    """

    def __init__(self, name: str = "instruction"):
        super().__init__(name=name)
        self._embed = snt.Embed(
            INSTRUCTION_HASH_BUCKETS, INSTRUCTION_EMBEDDING_SIZE, name="embed"
        )
        self._lstm = snt.LSTM(INSTRUCTION_LSTM_SIZE, name="lstm")

    def __call__(self, instruction: tf.Tensor) -> tf.Tensor:
        words = tf.strings.split(instruction)  # Ragged [B, (words)], on whitespace.
        lengths = tf.cast(words.row_lengths(), tf.int32)  # [B]
        ids = tf.strings.to_hash_bucket_fast(words, INSTRUCTION_HASH_BUCKETS)
        embedded = self._embed(ids.to_tensor(default_value=0))  # [B, L, 20]
        # One zero step at the end so the unroll always has at least one step
        # (snt.dynamic_unroll needs T >= 1, and every Atari instruction is '').
        # Padding and transposing the float embeddings rather than the integer
        # ids keeps integer tensors away from oneDNN's CPU kernels, which log
        # an error for them.
        embedded = tf.pad(embedded, [[0, 0], [0, 1], [0, 0]])
        embedded = tf.transpose(embedded, [1, 0, 2])  # [L + 1, B, 20], time-major.
        batch_size = tf.shape(instruction)[0]
        # With sequence_length the state is carried through unchanged past
        # each row's end, so the final hidden state is the output at its last
        # real word (and the zero initial state for an empty instruction).
        _, final_state = snt.dynamic_unroll(
            self._lstm,
            embedded,
            self._lstm.initial_state(batch_size),
            sequence_length=lengths,
        )
        return final_state.hidden


class Agent(snt.Module):
    """IMPALA agent: `unroll` over [T, B, ...] and a one-step `__call__`."""

    def __init__(
        self,
        num_actions: int,
        torso: str = "deep",
        use_instruction: bool = True,
        torso_dtype: str = "float32",
        use_lstm: bool = True,
        num_values: int = 0,
        frame_stack: int = 1,
        frame_shape: tuple[int, ...] = (),
        name: str = "agent",
    ):
        """num_actions: policy size; torso: 'deep' or 'shallow'.

        frame_stack S: the frames stacked into each observation (module
        docstring); 1 feeds each frame alone. frame_shape [H, W, C]: one
        frame's shape, which the state's frames need (S > 1 only).

        num_values: 0 for the paper's value head, one value per step
        (`baseline` [N]); L >= 1 for PopArt's, one normalised value per level
        of the run (`baseline` [N, L], popart.py). The head's variables are
        agent/baseline/w [256 or the core's input size, max(L, 1)] and b.

        use_lstm=False leaves out the LSTM core (the paper's agent has it):
        the policy and baseline heads read the core's inputs directly (torso
        output, clipped reward, one-hot last action, instruction code), as
        TorchBeast's agent does without --use_lstm. There is then no core
        state: `initial_state` is the empty tuple and every state argument
        and result is ().

        torso_dtype: 'float32' or 'bfloat16', what the torso's convolutions
        compute in (its weights are float32 either way). bfloat16 is faster
        on CPUs with AVX512_BF16 (BENCHMARKS.md) and rounds each convolution's
        output to 8 bits of mantissa, so its outputs are float32's only
        approximately; an actor's batch and the learner's [T x B] batch
        still compute the same values (tests/experiment_test.py's log-rho
        test), so V-trace sees no policy lag that the rounding made.

        use_instruction=False drops the instruction encoder and feeds the core
        zeros in its place: for levels whose instructions are all empty
        (Atari), where the encoder outputs exactly zeros anyway, so the
        network computes the same function, with the same variable shapes
        elsewhere, and skips the encoder's ops on every call (BENCHMARKS.md,
        "Profile").
        """
        super().__init__(name=name)
        if torso not in TORSOS:
            raise ValueError(f"torso={torso!r} is not one of {TORSOS}")
        if torso_dtype not in TORSO_DTYPES:
            raise ValueError(
                f"torso_dtype={torso_dtype!r} is not one of {TORSO_DTYPES}"
            )
        if frame_stack < 1 or (frame_stack > 1 and len(frame_shape) != 3):
            raise ValueError(
                f"frame_stack={frame_stack} needs frame_shape [H, W, C], got "
                f"{frame_shape!r}"
            )
        dtype = tf.as_dtype(torso_dtype)
        self._frame_stack = frame_stack
        self._frame_shape = tuple(frame_shape)
        self._num_actions = num_actions
        self._num_values = num_values
        self._torso_kind = torso
        with self.name_scope:
            torso_class = _DeepTorso if torso == "deep" else _ShallowTorso
            self._torso = torso_class(dtype)
            self._instruction = _InstructionEncoder() if use_instruction else None
            self._core = (
                snt.LSTM(CORE_LSTM_SIZE, name="core_lstm") if use_lstm else None
            )
            self._policy = snt.Linear(num_actions, name="policy_logits")
            self._baseline = snt.Linear(max(num_values, 1), name="baseline")

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def num_values(self) -> int:
        """0: one value per step; L: PopArt's normalised values per level."""
        return self._num_values

    @property
    def value_head(self) -> snt.Linear:
        """The baseline head (PopArt rescales its w and b)."""
        return self._baseline

    @property
    def built(self) -> bool:
        """Whether every variable exists (the agent has been called once).

        Variables are created on the first call, which must happen in the
        main graph: a tf.scan or tf.while_loop body cannot create them.
        """
        return hasattr(self._baseline, "w")  # snt.Linear makes w on its first call.

    @property
    def use_lstm(self) -> bool:
        return self._core is not None

    def initial_state(self, batch_size) -> snt.LSTMState | tuple:
        """Zero core state: LSTMState(hidden [B, 256], cell [B, 256]); () for
        an agent without the LSTM. With a frame stack, StackedState(that,
        zero frames uint8 [B, S - 1, H, W, C]): never seen, because every
        first step of an environment is done."""
        core = () if self._core is None else self._core.initial_state(batch_size)
        if self._frame_stack == 1:
            return core
        shape = [self._frame_stack - 1, *self._frame_shape]
        return StackedState(core, tf.zeros([batch_size, *shape], tf.uint8))

    def stack_frames(self, env_outputs, frames: tf.Tensor):
        """Builds each step's stacked observation from one frame a step.

        Args:
          env_outputs: StepOutput [T, B, ...] whose frame is uint8 [T, B, H,
            W, C] (the newest frame) and done bool [T, B].
          frames: uint8 [B, S - 1, H, W, C], the S - 1 frames before step 0,
            oldest first.

        Returns:
          (env_outputs with frames [T, B, H, W, S x C], oldest first along
           the channels; the S - 1 frames after the last step, as `frames`).
           Where done, the stack is the step's frame repeated S times (an
           episode's first observation).

        A fixed number of ops whatever T (no loop over time): slot k of the
        stack at step t holds the frame of step t - (S - 1 - k), or, where
        an episode started after that step (a done in between), the frame
        of the latest such start; steps before 0 are the state's frames.
        Each slot is one gather of whole frames from the S - 1 + T frames
        in a row; the slots are then interleaved along the channels, for 4
        one-channel frames by packing them into the bytes of a uint32 and
        reinterpreting it as 4 uint8 (TensorFlow's concat along a last axis
        of 1 copies byte by byte: 4x slower here, a quarter of a learner
        step).
        """
        frame, instruction = env_outputs.observation
        depth = self._frame_stack
        time, batch = tf.shape(frame)[0], tf.shape(frame)[1]
        # [S - 1 + T, B, H, W, C]: row r is step r - (S - 1).
        rows = tf.concat([tf.stack(tf.unstack(frames, axis=1)), frame], axis=0)
        flat = tf.reshape(rows, [-1, *self._frame_shape])
        steps = tf.range(time)[:, None] + tf.zeros([1, batch], tf.int32)  # [T, B]
        done = tf.cast(env_outputs.done, tf.bool)
        slots = []
        for lag in range(depth - 1, -1, -1):  # oldest slot first
            source = steps - lag
            # A done at step u in (t - lag, t] restarts the stack at u: the
            # latest one wins, so the newer steps are applied last.
            for back in range(lag - 1, -1, -1):
                shifted = tf.pad(done, [[back, 0], [0, 0]])[:time]
                source = tf.where(shifted, steps - back, source)
            row = (source + depth - 1) * batch + tf.range(batch)[None, :]
            slots.append(tf.gather(flat, row))  # [T, B, H, W, C]
        after = tf.stack([slot[-1] for slot in slots[1:]], axis=1)
        if depth == 4 and self._frame_shape[-1] == 1 and sys.byteorder == "little":
            packed = tf.zeros(tf.shape(slots[0])[:-1], tf.uint32)
            for k, slot in enumerate(slots):
                byte = tf.bitwise.left_shift(
                    tf.cast(slot[..., 0], tf.uint32), tf.constant(8 * k, tf.uint32)
                )
                packed = tf.bitwise.bitwise_or(packed, byte)
            stacks = tf.bitcast(packed, tf.uint8)  # byte k is slot k
        else:
            stacks = tf.concat(slots, axis=-1)
        observation = (stacks, instruction)
        return env_outputs._replace(observation=observation), after

    def _encode(self, last_actions: tf.Tensor, env_outputs) -> tf.Tensor:
        """Per-step features before the core: inputs [N, ...] -> [N, D]."""
        frame, instruction = env_outputs.observation
        frame = tf.cast(frame, tf.float32) / 255.0
        torso = self._torso(frame)
        reward = tf.clip_by_value(tf.cast(env_outputs.reward, tf.float32), -1.0, 1.0)
        one_hot = tf.one_hot(last_actions, self._num_actions)
        if self._instruction is None:
            code = tf.zeros([tf.shape(torso)[0], INSTRUCTION_LSTM_SIZE])
        else:
            code = self._instruction(instruction)
        return tf.concat([torso, reward[:, None], one_hot, code], axis=1)

    def _head(self, core_output: tf.Tensor) -> AgentOutput:
        """[N, 256] -> AgentOutput(action [N], logits [N, A], baseline [N]
        or, with num_values L >= 1, [N, L])."""
        logits = self._policy(core_output)
        baseline = self._baseline(core_output)
        if not self._num_values:
            baseline = tf.squeeze(baseline, axis=-1)
        action = tf.random.categorical(logits, num_samples=1, dtype=tf.int32)
        return AgentOutput(tf.squeeze(action, axis=1), logits, baseline)

    def unroll(self, actions: tf.Tensor, env_outputs, core_state):
        """Runs the agent over a time-major sequence.

        Args:
          actions: int32 [T, B], the action taken *before* each env output
            (the "last action" input).
          env_outputs: StepOutput with reward [T, B], done bool [T, B],
            observation (frame uint8 [T, B, H, W, C], instruction string [T, B]).
          core_state: LSTMState of [B, 256] tensors, the state before step 0
            (`initial_state`'s structure: StackedState with a frame stack,
            whose frames are uint8 [T, B, H, W, C] here, one a step).

        Returns:
          (AgentOutput with action [T, B], policy_logits [T, B, A],
           baseline [T, B]; the state after the last step).
        """
        if self._frame_stack > 1:
            core_state, frames = core_state
            env_outputs, frames = self.stack_frames(env_outputs, frames)
            output, core_state = self._unroll(actions, env_outputs, core_state)
            return output, StackedState(core_state, frames)
        return self._unroll(actions, env_outputs, core_state)

    def _unroll(self, actions: tf.Tensor, env_outputs, core_state):
        """`unroll` over stacked observations and the core state alone."""
        # The torso and instruction encoder have no recurrence: run them on
        # all T * B steps at once.
        features = snt.BatchApply(self._encode, num_dims=2)(actions, env_outputs)
        if self._core is None:
            return snt.BatchApply(self._head, num_dims=2)(features), ()
        initial = self._core.initial_state(tf.shape(actions)[1])

        def reset(state, done_t):
            # done at step t means this observation starts a new episode: the
            # core must not carry memory across the episode boundary.
            return tf.nest.map_structure(
                lambda init, s: tf.where(done_t[:, None], init, s), initial, state
            )

        # T is static (unroll_length + 1), so a Python loop is fine and lets
        # the state be reset between steps. The first step is Sonnet's LSTM
        # (it creates the variables); the input's share of the later steps'
        # gates is one matmul over all of them (the learner's 80 steps at
        # batch 8 would otherwise be 80 small ones), so that the loop keeps
        # the recurrent share alone: Sonnet's step otherwise, same variables.
        features_t = tf.unstack(features)
        done = tf.unstack(env_outputs.done)
        output, core_state = self._core(features_t[0], reset(core_state, done[0]))
        core_outputs = [output]
        if len(features_t) > 1:
            core = self._core
            gates_x = tf.unstack(
                snt.BatchApply(lambda x: tf.matmul(x, core.input_to_hidden) + core.b)(
                    features[1:]
                )
            )
            for gates_x_t, done_t in zip(gates_x, done[1:], strict=True):
                core_state = reset(core_state, done_t)
                gates = gates_x_t + tf.matmul(core_state.hidden, core.hidden_to_hidden)
                i, f, g, o = tf.split(gates, num_or_size_splits=4, axis=1)
                cell = tf.sigmoid(f) * core_state.cell + tf.sigmoid(i) * tf.tanh(g)
                hidden = tf.sigmoid(o) * tf.tanh(cell)
                core_state = snt.LSTMState(hidden=hidden, cell=cell)
                core_outputs.append(hidden)
        agent_output = snt.BatchApply(self._head, num_dims=2)(tf.stack(core_outputs))
        return agent_output, core_state

    def __call__(self, last_actions: tf.Tensor, env_outputs, core_state):
        """One step: inputs [B, ...] -> (AgentOutput [B, ...], core_state)."""
        expanded_actions, expanded_env = tf.nest.map_structure(
            lambda t: tf.expand_dims(t, 0), (last_actions, env_outputs)
        )
        output, core_state = self.unroll(expanded_actions, expanded_env, core_state)
        return tf.nest.map_structure(lambda t: tf.squeeze(t, 0), output), core_state


def create_agent(config: AgentConfig, name: str = "agent") -> Agent:
    """The configured network (with an instruction encoder only where some
    level has instructions)."""
    return Agent(
        config.num_actions,
        torso=config.torso,
        use_instruction=config.use_instruction,
        torso_dtype=config.torso_dtype,
        use_lstm=config.use_lstm,
        num_values=config.num_values,
        frame_stack=config.frame_stack,
        frame_shape=config.frame_shape,
        name=name,
    )
