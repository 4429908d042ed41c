#!/usr/bin/python3
"""What a training step costs from Python over the same step from the CLI.

For each model (the zoo GPTs below), one plan is compiled and trained three
ways on one thread, in alternating rounds:
  cli      `strata run PLAN --steps N`: its `steady` line (the median step
           time from the third step on);
  own      strata.Trainer.step() on the trainer's own synthetic batches (the
           CLI's batches), timed around each call from Python;
  numpy    Trainer.step((tokens, labels)) with NumPy arrays the caller holds,
           as a DataLoader loop would pass them.
Each figure is the median over the rounds of each round's median step time;
the overhead is (python - cli) / cli, and the spread (max - min) / median of
the CLI's rounds says how much of it is noise.

Usage: PYTHONPATH=build/python bench/python_step.py [--strata build/tools/strata]
       [--steps 100] [--rounds 9]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import strata  # noqa: E402

MODELS = {
    # name: zoo.gpt keywords. The tiny one shows the fixed cost of a call.
    "gpt tiny (1 layer, hidden 32, seq 16)": dict(layers=1, hidden=32, heads=2, seq=16, batch=2,
                                                  vocab=64),
    "gpt small (2 layers, hidden 128)": dict(layers=2, hidden=128, heads=4, seq=64, batch=4,
                                             vocab=512),
    "gpt 4 layers, hidden 256": dict(layers=4, hidden=256, heads=4, seq=64, batch=4, vocab=512),
}


def cli_step_ms(strata_bin, plan_path, steps):
    out = subprocess.run([strata_bin, "run", plan_path, "--steps", str(steps), "--log-every",
                          str(steps)], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"^steady\s+([\d.]+) ms per step", out, re.M).group(1))


def python_step_ms(plan, steps, batch=None):
    with plan.trainer() as trainer:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.step(batch)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[2:])


def numpy_batch(keywords, seed=0):
    rng = np.random.default_rng(seed)
    shape = (keywords["batch"], keywords["seq"])
    vocab = keywords["vocab"]
    return (rng.integers(0, vocab, shape).astype(np.int64),
            rng.integers(0, vocab, shape).astype(np.int64))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strata", default="build/tools/strata")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(f"strata {strata.__version__}, python {sys.version.split()[0]}, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {args.steps} steps x "
          f"{args.rounds} rounds")
    print("| model | CLI ms/step | Python own batches | overhead | Python NumPy batches "
          "| overhead | round-to-round spread of the CLI |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="strata-python-step-") as folder:
        for name, keywords in MODELS.items():
            model = strata.zoo.gpt(**keywords)
            plan = model.compile(train=True, optimizer="adam")
            path = os.path.join(folder, "plan.splan")
            plan.save(path)
            batch = numpy_batch(keywords)
            rounds = {"cli": [], "own": [], "numpy": []}
            for _ in range(args.rounds):
                rounds["cli"].append(cli_step_ms(args.strata, path, args.steps))
                rounds["own"].append(python_step_ms(plan, args.steps))
                rounds["numpy"].append(python_step_ms(plan, args.steps, batch))
            cli, own, arr = (statistics.median(rounds[k]) for k in ("cli", "own", "numpy"))
            spread = 100 * (max(rounds["cli"]) - min(rounds["cli"])) / cli
            print(f"| {name} | {cli:.3f} | {own:.3f} | {100 * (own - cli) / cli:+.1f}% "
                  f"| {arr:.3f} | {100 * (arr - cli) / cli:+.1f}% | {spread:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
