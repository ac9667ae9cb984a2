#!/usr/bin/env python
"""Training on a small CPU: one process with all the threads, or one single-threaded process per core (DDP, gloo)?

    python -m lab.perf.cpu_processes_speed                      # 3 rounds of 200 steps, global batch 32
    python -m lab.perf.cpu_processes_speed --rounds 1 --steps 50

Part of a float32 step (the VQGAN encoder, many small kernels) uses one core, while two single-threaded processes
run side by side; whether that makes two processes faster is what this measures (on 2 idle cores: 1.05x in the
loop, the same whole-process time). It times the two ways to train the same global batch on the same sample
stream, as fresh processes alternating within each round (A B, then B A, ...):

- one process: `train_dalle.py --batch_size B` with OMP_NUM_THREADS = cores;
- one process per core: `torchrun --standalone --nproc_per_node cores train_dalle.py --batch_size B/cores` with
  OMP_NUM_THREADS = 1 (DistributedDataParallel over gloo: the gradients are averaged, so one step is one step of
  the global batch).

It records the whole-process wall time (imports, data, model set-up and the final save included), the median step
time the training loop logged, and the loss at the last step (the two should train alike), with the load average
before and after each run, into lab/perf/results/cpu_processes_speed-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.common import ROOT, git_commit, write_results


def one_run(kind: str, steps: int, batch: int, cores: int, seed: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        flags = ["--output_dir", out_dir, "--max_steps", str(steps), "--seed", str(seed), "--no-progress",
                 "--sample_every_n_steps", "0", "--log_every_n_steps", "10", *extra]
        if kind == "one_process":
            command = [sys.executable, "train_dalle.py", "--batch_size", str(batch), *flags]
            threads = cores
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(cores),
                       "train_dalle.py", "--batch_size", str(batch // cores), *flags]
            threads = 1
        # OpenMP's wait policy stays the environment's, as scripts/demo.sh leaves it
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        load_before = os.getloadavg()
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{kind} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        metrics = [json.loads(line) for line in (Path(out_dir) / "dalle-metrics.jsonl").read_text().splitlines()
                   if line]
    # the loop's first logged steps include warm-up of the allocator and the thread pools
    step_s = [batch / m["samples_per_s"] for m in metrics if m["step"] > min(20, steps // 2)]
    if not step_s:
        raise SystemExit(f"--steps {steps}: too few logged steps to time; use --steps 40 or more")
    record = {"kind": kind, "command": command, "omp_threads": threads, "wall_s": wall,
              "median_step_s": statistics.median(step_s), "logged_step_s": step_s,
              "last_loss": metrics[-1]["loss"], "last_loss_img": metrics[-1]["loss_img"],
              "load_before": load_before, "load_after": os.getloadavg()}
    print(f"  {kind:18s} wall {wall:6.1f} s  median step {record['median_step_s'] * 1000:5.0f} ms  "
          f"loss {record['last_loss']:.4f}  load {load_before[0]:.2f}", flush=True)
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch_size", type=int, default=32, help="the global batch (per process: divided by --cores)")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("train_flags", nargs="*", help="more train_dalle.py flags (after --), for both kinds")
    args = p.parse_args(argv)
    if args.batch_size % args.cores:
        p.error(f"--batch_size {args.batch_size} does not divide into {args.cores} processes")
    rounds = []
    for r in range(args.rounds):
        order = ("one_process", "process_per_core") if r % 2 == 0 else ("process_per_core", "one_process")
        print(f"round {r + 1}/{args.rounds}", flush=True)
        rounds.append({kind: one_run(kind, args.steps, args.batch_size, args.cores, args.seed, args.train_flags)
                       for kind in order})

    def median(kind, key):
        return statistics.median(r[kind][key] for r in rounds)

    summary = {key: {kind: median(kind, key) for kind in ("one_process", "process_per_core")}
               for key in ("wall_s", "median_step_s")}
    for value in summary.values():
        value["ratio_one_over_per_core"] = value["one_process"] / value["process_per_core"]
    print(f"whole process: {summary['wall_s']['ratio_one_over_per_core']:.2f}x, "
          f"in the loop: {summary['median_step_s']['ratio_one_over_per_core']:.2f}x faster with a process per core")
    record = {"script": "lab/perf/cpu_processes_speed.py", "argv": sys.argv[1:] if argv is None else argv,
              "commit": git_commit(), "cores": args.cores, "steps": args.steps, "global_batch": args.batch_size,
              "seed": args.seed, "started_load": rounds[0][next(iter(rounds[0]))]["load_before"],
              "summary_medians": summary, "rounds": rounds}
    write_results(record, args.out or f"lab/perf/results/cpu_processes_speed-{time.strftime('%Y%m%d-%H%M')}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
