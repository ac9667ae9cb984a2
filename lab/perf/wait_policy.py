"""One thread or all for a batch-4 cached generation, under each OpenMP wait policy (what threads.py decides).

    .venv/bin/python -m lab.perf.wait_policy [--rounds 3] [--threads 2]

OpenMP reads OMP_WAIT_POLICY once, when it starts, so every variant runs in a fresh process: PASSIVE (threads sleep
at once between parallel regions) or the default (they spin a while first), each on one thread and on all --threads
threads (set directly, decode_threads off, so the variant is what its name says whatever threads.py picks). A process builds the reference model (seed 0), generates once to
warm up, then times two 4 x 256 generations (top_k 10, float32, the fused step). Variants alternate within each
round; the results file (lab/perf/results/wait-policy-<time>.json) keeps the command, commit, load average
and every raw wall / CPU time. Run it on an idle machine: on a busy one spinning threads fight the other jobs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from lab.common import ROOT, git_commit, loadavg, write_results

VARIANTS = {  # name -> (OMP_WAIT_POLICY or None for OpenMP's default, one thread)
    "passive/one_thread": ("PASSIVE", True), "passive/all_threads": ("PASSIVE", False),
    "default/one_thread": (None, True), "default/all_threads": (None, False),
}


def child(one_thread: bool, num_threads: int) -> None:
    import torch

    from dalle_lab.generate import threads
    from lab.perf.backends import REFERENCE
    from dalle_lab.model import DALLE

    torch.set_num_threads(1 if one_thread else num_threads)
    threads.SINGLE_THREAD_MAX_ROWS = 0  # decode_threads off: the variant is the thread count set here
    torch.manual_seed(0)
    model = DALLE(**REFERENCE).eval()
    text = torch.randint(1, 100, (4, REFERENCE["text_seq_len"]))
    times = []
    for rep in range(3):  # the first warms up
        wall, cpu = time.perf_counter(), time.process_time()
        model.generate_images(text, top_k=10, return_tokens=True, generator=torch.Generator().manual_seed(rep))
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    print("RESULT " + json.dumps(dict(wall_s=[w for w, _ in times[1:]], cpu_s=[c for _, c in times[1:]])))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", choices=["0", "1"], help=argparse.SUPPRESS)
    p.add_argument("--out", default=time.strftime("lab/perf/results/wait-policy-%Y%m%d-%H%M.json",
                                                  time.gmtime()))
    args = p.parse_args(argv)
    if args.child is not None:
        child(args.child == "1", args.threads)
        return 0
    meta = dict(command=" ".join([sys.executable, *sys.argv]), commit=git_commit(), threads=args.threads,
                batch=4, top_k=10, loadavg_start=loadavg(), started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    results = {}
    for r in range(args.rounds):
        for name, (policy, one_thread) in VARIANTS.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            load = loadavg()
            out = subprocess.run([sys.executable, "-m", "lab.perf.wait_policy", "--child", str(int(one_thread)),
                                  "--threads", str(args.threads)], env=env, capture_output=True, text=True, check=True,
                                 cwd=ROOT)
            got = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
            for key, values in got.items():
                results.setdefault(f"{name}/{key}", []).extend(values)
            results.setdefault(f"{name}/loadavg", []).append(load)
            print(f"round {r + 1} {name:<22} wall {', '.join(f'{v:.3f}' for v in got['wall_s'])} s  "
                  f"[load {load:.2f}]", flush=True)
    meta["loadavg_end"] = loadavg()
    for name in VARIANTS:
        print(f"{name:<22} median wall {statistics.median(results[f'{name}/wall_s']):.3f} s, "
              f"CPU {statistics.median(results[f'{name}/cpu_s']):.3f} s")
    print(f"load average {meta['loadavg_start']:.2f} -> {meta['loadavg_end']:.2f}")
    write_results(dict(meta=meta, results=results), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
