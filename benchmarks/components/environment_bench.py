"""Atari environment frames per second: through FlowEnvironment vs in-process.

Usage (from the repository root):

    python3 benchmarks/components/environment_bench.py [--game pong] [--seconds 8]

Figures, all in the same run, on the same game with uniformly random actions
(emulator frames per second; one agent step = 4 frames):

1. Resize of one 210x160 grayscale screen to 84x84, per method (OpenCV
   INTER_AREA / INTER_LINEAR, Pillow BOX / BILINEAR if Pillow is installed,
   numpy area matrices, numpy nearest): the measurement behind atari.py's
   choice of cv2.INTER_AREA.
2. Bare ale_py: `act` 4 times per step, no preprocessing (emulator only).
3. The ceiling: `atari.PyProcessAtari` stepped in this process (ale_py plus
   the full preprocessing: max-pool, grayscale, resize, frame stack).
4. The same environment in a py_process child, stepped through
   FlowEnvironment in a tf.compat.v1 Session as the actor does: a tf.scan
   unroll of 100 steps per session.run, the observations fetched, the
   environment state fed back. With 1 environment, then 2 environments
   driven by 2 threads (aggregate frames/s).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# One thread for numpy's BLAS too, like the other single-thread resize rows.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

import numpy as np  # noqa: E402

from benchmarks.core import common  # noqa: E402
from families import atari  # noqa: E402

UNROLL_LENGTH = 100


def _time_per_call(fn, min_seconds: float) -> float:
    fn()
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(100):
            fn()
        n += 100
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / n


def bench_resize(screen: np.ndarray, min_seconds: float) -> list[tuple[str, float]]:
    import cv2

    cv2.setNumThreads(1)  # as in the environment processes
    out = np.empty((84, 84), np.uint8)
    methods = [
        (
            "cv2.resize INTER_AREA (chosen)",
            lambda: cv2.resize(screen, (84, 84), dst=out, interpolation=cv2.INTER_AREA),
        ),
        (
            "cv2.resize INTER_LINEAR",
            lambda: cv2.resize(
                screen, (84, 84), dst=out, interpolation=cv2.INTER_LINEAR
            ),
        ),
        (
            "cv2 2x2 INTER_AREA to 105x80, then INTER_LINEAR",
            lambda: cv2.resize(
                cv2.resize(screen, (80, 105), interpolation=cv2.INTER_AREA),
                (84, 84),
                dst=out,
                interpolation=cv2.INTER_LINEAR,
            ),
        ),
    ]
    try:
        from PIL import Image

        methods += [
            (
                "Pillow resize BOX",
                lambda: np.asarray(Image.fromarray(screen).resize((84, 84), Image.BOX)),
            ),
            (
                "Pillow resize BILINEAR",
                lambda: np.asarray(
                    Image.fromarray(screen).resize((84, 84), Image.BILINEAR)
                ),
            ),
        ]
    except ImportError:
        print("(Pillow not installed: its rows are skipped)")

    def area_matrix(n_in: int, n_out: int) -> np.ndarray:
        m = np.zeros((n_out, n_in), np.float32)
        scale = n_in / n_out
        for i in range(n_out):
            lo, hi = i * scale, (i + 1) * scale
            for j in range(int(lo), int(np.ceil(hi))):
                m[i, j] = min(hi, j + 1) - max(lo, j)
        return m / scale

    rows, cols = area_matrix(210, 84), area_matrix(160, 84).T
    row_index = np.arange(84) * 210 // 84
    col_index = np.arange(84) * 160 // 84
    methods += [
        (
            "numpy area (matrix products)",
            lambda: np.rint(rows @ screen.astype(np.float32) @ cols).astype(np.uint8),
        ),
        ("numpy nearest (indexing)", lambda: screen[row_index][:, col_index]),
    ]
    reference = cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)
    return [
        (
            name,
            _time_per_call(fn, min_seconds),
            float(np.abs(np.asarray(fn(), np.int16) - reference).mean()),
        )
        for name, fn in methods
    ]


def bench_bare_ale(game: str, seconds: float) -> float:
    ale_py = atari._ale_py()
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", 1)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(ale_py.roms.get_rom_path(game))
    actions = ale.getMinimalActionSet()
    rng = np.random.RandomState(0)
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in rng.randint(len(actions), size=100):
            for _ in range(4):
                ale.act(actions[a])
            if ale.game_over():
                ale.reset_game()
        frames += 400
    return frames / (time.perf_counter() - start)


def bench_in_process(game: str, seconds: float) -> float:
    env = atari.PyProcessAtari(game, seed=1)
    env.initial()
    n = len(env.action_set)
    rng = np.random.RandomState(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in rng.randint(n, size=100):
            env.step(a)
        steps += 100
    return 4 * steps / (time.perf_counter() - start)


class FlowBench:
    """Environments in py_process children, stepped through FlowEnvironment.

    As the actor steps them: a tf.scan unroll of UNROLL_LENGTH steps per
    session.run (random actions drawn in the graph), the stacked observations
    and rewards fetched, the environment state fed back into the next unroll.
    One thread per environment; `measure` returns total frames/s.
    """

    def __init__(self, game: str, num_envs: int):
        import tensorflow as tf

        import environments
        import py_process

        self._tf = tf
        num_actions = environments.num_actions(["atari/" + game])
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._unrolls = []
            for i in range(num_envs):
                process = environments.create_environment("atari/" + game, seed=i + 1)
                flow = environments.FlowEnvironment(process.proxy)
                initial_output, initial_state = flow.initial()
                state_in = tf.nest.map_structure(
                    lambda t: tf.compat.v1.placeholder(t.dtype, t.shape),
                    initial_state,
                )
                first = tf.nest.map_structure(tf.zeros_like, initial_output)

                def body(carry, _, flow=flow):
                    action = tf.random.uniform([], 0, num_actions, tf.int32)
                    return flow.step(action, carry[1])

                outputs, states = tf.scan(
                    body, tf.range(UNROLL_LENGTH), initializer=(first, state_in)
                )
                fetches = (
                    (outputs.observation[0], outputs.reward),
                    tf.nest.map_structure(lambda t: t[-1], states),
                )
                self._unrolls.append((initial_state, state_in, fetches))
            self._session = tf.compat.v1.train.SingularMonitoredSession(
                hooks=[py_process.PyProcessHook()]
            )
        self._raw = self._session.raw_session()
        self._states = self._raw.run([u[0] for u in self._unrolls])
        for i in range(num_envs):  # warm-up unroll, not timed
            self._unroll(i)

    def _unroll(self, i: int) -> None:
        _, state_in, fetches = self._unrolls[i]
        feed = dict(
            zip(
                self._tf.nest.flatten(state_in),
                self._tf.nest.flatten(self._states[i]),
                strict=True,
            )
        )
        _, self._states[i] = self._raw.run(fetches, feed)

    def measure(self, seconds: float) -> float:
        steps = [0] * len(self._unrolls)
        stop = threading.Event()

        def actor(i: int) -> None:
            while not stop.is_set():
                self._unroll(i)
                steps[i] += UNROLL_LENGTH

        threads = [
            threading.Thread(target=actor, args=(i,), daemon=True)
            for i in range(len(self._unrolls))
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        return 4 * sum(steps) / (time.perf_counter() - start)

    def close(self) -> None:
        self._session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", default="pong")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="measuring time per figure per round"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds; the table shows the median and the best round",
    )
    common.add_json_argument(parser)
    args = parser.parse_args()

    print(f"date: {datetime.date.today().isoformat()}")
    print(f"machine: nproc={os.cpu_count()}, CPU: {common.cpu_model()}")
    try:
        print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)")
    except OSError:
        pass
    print(f"python {platform.python_version()}, game {args.game}, random actions\n")

    env = atari.PyProcessAtari(args.game, seed=1)
    env.initial()
    for a in np.random.RandomState(0).randint(len(env.action_set), size=200):
        env.step(a)
    screen = env._screens[0].copy()
    resize_rounds = [bench_resize(screen, min_seconds=0.3) for _ in range(args.rounds)]
    print("Resize 210x160 -> 84x84 uint8 (one thread; best of rounds):")
    print("| method | us per frame | mean abs. difference from INTER_AREA |")
    print("|---|---:|---:|")
    for i, (name, _, diff) in enumerate(resize_rounds[0]):
        best = min(r[i][1] for r in resize_rounds)
        print(f"| {name} | {best * 1e6:.1f} | {diff:.2f} |")

    configs = [
        ("bare ale_py, act x4, no preprocessing", None),
        ("PyProcessAtari in-process, full preprocessing (ceiling)", None),
        ("FlowEnvironment via py_process, 1 env", FlowBench(args.game, 1)),
        (
            "FlowEnvironment via py_process, 2 envs, 2 threads (total)",
            FlowBench(args.game, 2),
        ),
    ]
    results = [[] for _ in configs]
    try:
        for _ in range(args.rounds):
            results[0].append(bench_bare_ale(args.game, args.seconds))
            results[1].append(bench_in_process(args.game, args.seconds))
            results[2].append(configs[2][1].measure(args.seconds))
            results[3].append(configs[3][1].measure(args.seconds))
    finally:
        for _, flow in configs[2:]:
            flow.close()

    ceiling = statistics.median(results[1])
    print(
        f"\nEnvironment throughput, emulator frames/s (4 per agent step), "
        f"{args.rounds} interleaved rounds of {args.seconds:g} s:"
    )
    print(
        "| configuration | frames/s (median) | best round | agent steps/s | vs ceiling |"
    )
    print("|---|---:|---:|---:|---:|")
    for (name, _), fps in zip(configs, results, strict=True):
        median = statistics.median(fps)
        print(
            f"| {name} | {median:,.0f} | {max(fps):,.0f} | {median / 4:,.0f} |"
            f" {median / ceiling:.0%} |"
        )
    try:
        print(f"\nload average after: {os.getloadavg()[0]:.2f} (1 min)")
    except OSError:
        pass
    common.write_json(
        args.json,
        {
            "game": args.game,
            "resize_us_per_frame": {
                name: min(r[i][1] for r in resize_rounds) * 1e6
                for i, (name, _, _) in enumerate(resize_rounds[0])
            },
            "frames_per_s": {
                name: fps for (name, _), fps in zip(configs, results, strict=True)
            },
        },
    )


if __name__ == "__main__":
    main()
