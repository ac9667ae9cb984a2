"""Speed and memory of dalle_lab side by side with dalle-pytorch 1.6.6, measured alternately in one run.

    .venv/bin/python -m lab.perf.run              # full run (about 15-25 minutes on 2 busy cores)
    .venv/bin/python -m lab.perf.run --quick      # before submitting a model/sampler change (< 2 minutes)
    .venv/bin/python -m lab.perf.run --no-peer    # ours only
    .venv/bin/python -m lab.perf.run --device cuda  # ours on a GPU: the default, CUDA-graph and speculative
    ... --json results.json                              # where every raw measurement goes (default: see --json)

Every measurement runs in its own fresh process (worker.py), so its peak resident memory is its own, with torch held
to --threads threads. Measurements that are compared run in rounds, ours then the peer's, round after round
(A B A B ...), and each ratio is the median of the per-round ratios: on a machine shared with other jobs, absolute
numbers drift by far more than the differences between the packages, ratios from neighbouring runs much less.
The peer is installed on first use into lab/perf/.peer-venv (see peer_env.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.common import PERF_RESULTS, ROOT, git_state
from lab.perf.backends import REFERENCE  # plain dict, no torch import
from lab.perf.report import print_report


@dataclass
class Job:
    key: str                     # what it measures, e.g. "train/reference/fp32"; ours and peer share a key
    impl: str                    # "ours" | "peer" | "peer-plain"
    args: list
    result: dict = field(default_factory=dict)
    round: int = 0


def _config_args(config) -> list:
    return ["--config", json.dumps(config)]


def plan_cuda(quick: bool) -> list[list[Job]]:
    """On a GPU: ours only (the peer's environment is CPU-only), each decode path at batch 4 and 64."""
    ref = _config_args(REFERENCE)
    groups = []
    for batch in (4,) if quick else (4, 64):
        groups.append([Job(f"generate/reference/{decode}/b{batch}", "ours",
                           ["--task", "generate", *ref, "--use-cache", "1", "--batch", str(batch), "--reps", "2",
                            "--decode", decode, "--device", "cuda"])
                       for decode in ("default", "graph", "speculative")])
    return groups


def plan(quick: bool, peer: bool, default_config: dict) -> list[list[Job]]:
    """Groups of jobs; the jobs of a group run in rounds, in order, so that ours and the peer's alternate."""
    ref, dflt = _config_args(REFERENCE), _config_args(default_config)
    impls = ["ours", "peer"] if peer else ["ours"]

    def train(cfg_name, cfg, dtype, steps, warmup, who=impls):
        return [Job(f"train/{cfg_name}/{dtype}", i, ["--task", "train", *cfg, "--dtype", dtype,
                                                     "--steps", str(steps), "--warmup", str(warmup)]) for i in who]

    def gen(cfg_name, cfg, cache, reps, who=impls, batch=4, decode="default", kinds=None, threads=None):
        # decode "default": generate_images with no strategy, as users call it (the peer's only way); kinds: a
        # candidate product layout (worker.py --product-kinds); threads: this job's torch threads, not --threads
        name = ("cached" if cache else "uncached") + ("" if batch == 4 else f"/b{batch}")
        name += "" if decode == "default" else f"/{decode}"
        name += "" if kinds is None else f"/products-{kinds}"
        name += "" if threads is None else f"/threads{threads}"
        return [Job(f"generate/{cfg_name}/{name}", i,
                    ["--task", "generate", *cfg, "--use-cache", str(int(cache)), "--batch", str(batch),
                     "--reps", str(reps), "--decode", decode,
                     *([] if kinds is None else ["--product-kinds", kinds]),
                     *([] if threads is None else ["--threads", str(threads)])]) for i in who]

    ceiling = [[Job("matmul", "ours", ["--task", "matmul", "--reps", "3" if quick else "10"])]]
    plain = ["peer-plain"] if peer else []
    if quick:
        return ceiling + [
            # bf16's target is against the peer's fp32, so the peer's own bf16 run is left to the full mode
            train("reference", ref, "fp32", 3, 1) + train("reference", ref, "bf16", 3, 1, who=["ours"]),
            gen("reference", ref, True, 1) + gen("reference", ref, True, 1, who=plain)
            + gen("reference", ref, True, 1, who=["ours"], decode="speculative")
            + gen("reference", ref, True, 1, who=["ours"], decode="compiled"),
        ]

    rot = _config_args(dict(REFERENCE, rotary_emb=True, shift_tokens=True))
    grids = {}
    for fmap in (8, 32):  # 64 and 1024 image tokens; 256 is the reference itself
        cfg = dict(REFERENCE, image_fmap_size=fmap)
        grids[fmap] = gen(f"grid{fmap * fmap}", _config_args(cfg), True, 1)
    return ceiling + [
        train("reference", ref, "fp32", 6, 2) + train("reference", ref, "fp32", 6, 2, who=plain)
        + train("reference", ref, "bf16", 6, 2),
        # the default path against the peer's class defaults and its plain variant (rotary and token shift off,
        # like for like with ours), then our other strategies
        gen("reference", ref, True, 2) + gen("reference", ref, True, 2, who=plain)
        + gen("reference", ref, True, 2, who=["ours"], decode="speculative")
        + gen("reference", ref, True, 2, who=["ours"], decode="compiled")
        + sum((gen("reference", ref, True, 2, who=["ours"], kinds=kinds) for kinds in ("wt", "linear")), [])
        + gen("reference", ref, True, 2, who=["ours"], kinds="wt", threads=1),
        # a DALLE-pytorch class-default architecture (rotary embeddings and token shift on) on both sides
        gen("class-default", rot, True, 2),
        gen("reference", ref, True, 1, batch=64),
        gen("reference", ref, False, 1),
        grids[8] + grids[32],
        train("default", dflt, "fp32", 4, 1) + train("default", dflt, "bf16", 4, 1),
        gen("default", dflt, True, 1),
    ] + ceiling


def rounds_for(group: list[Job], quick: bool) -> int:
    if quick or group[0].key == "matmul":
        return 1
    if group[0].key.startswith(("train/default", "generate/default", "generate/grid", "generate/reference/uncached",
                                "generate/reference/cached/b64")):
        return 2
    return 3


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def git_commit() -> str:
    state = git_state(ROOT)
    return f"{state['commit']}" + (" (with uncommitted changes)" if state["dirty"] else "")


def run_job(job: Job, pythons: dict, threads: int, wait_policy: str) -> dict:
    impl, extra = job.impl, []
    if impl == "peer-plain":
        impl, extra = "peer", ["--variant", "plain"]
    args = list(job.args)
    if impl == "ours" and "/default/" in job.key:
        # ours builds DALLEConfig() itself (so the measurement follows the class); the resolved dict is for the peer
        args[args.index("--config") + 1] = "null"
    cmd = [str(pythons[impl]), "-m", "lab.perf.worker", "--impl", impl, "--threads", str(threads), *extra, *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if wait_policy != "default":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    load = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)  # cwd: `lab` imports
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
        return dict(error=f"exit {proc.returncode}: {tail}", loadavg=load)
    result = json.loads(lines[-1][len("RESULT "):])
    result.update(loadavg=load, wall_s=time.perf_counter() - t0)
    return result


def headline(result: dict) -> str:
    if "error" in result:
        return "FAILED: " + result["error"].splitlines()[-1]
    if "gflops_fp32" in result:
        bf16 = result["gflops_bf16"]
        return f"{result['gflops_fp32']:.0f} GFLOP/s fp32, " + (f"{bf16:.0f} bf16" if bf16 else "no native bf16")
    if "tokens_per_s" in result:
        return f"{result['tokens_per_s']:.0f} tokens/s ({result['s_per_step']:.3f} s/step)"
    if "s_per_batch" in result:
        return f"{result['s_per_batch']:.2f} s per batch of {result['batch']}"
    return "ok"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reference config only, one round (< 2 minutes)")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                   help="measure dalle-pytorch 1.6.6 alongside (default: yes)")
    p.add_argument("--threads", type=int, default=2, help="torch threads in every measurement (default 2)")
    p.add_argument("--omp-wait-policy", choices=["passive", "active", "default"], default="default",
                   help="OpenMP threads spin a while at barriers (default: the environment users run, and what an "
                        "idle machine should be measured in; on an idle AVX2 Zen 3 the peer's batch-4 generation "
                        "was 1.7x faster under it than under passive, ours 1.2x) or sleep at once (passive: on cores shared "
                        "with other jobs spinning threads fight them, a 2-thread generation measured 5-20x slower)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: ours only, plain / CUDA-graph / speculative decoding on the GPU")
    p.add_argument("--bf16", choices=["auto", "yes", "no"], default="auto",
                   help="measure bf16 autocast too: auto = only where the CPU has native bf16 products "
                        "(dalle_lab.utils.cpu_has_native_bf16; elsewhere torch emulates them, ~17x slower than fp32, "
                        "and the package trains in fp32 there)")
    p.add_argument("--json", type=Path,
                   help="where to write the results file (command, commit, load, every raw measurement); default "
                        "lab/perf/results/run-<mode>-<UTC time>.json")
    args = p.parse_args(argv)

    from dalle_lab.model import DALLEConfig  # ours is installed in the environment run.py runs under

    default_config = asdict(DALLEConfig())
    pythons = {"ours": Path(sys.executable)}
    if args.device == "cuda":
        args.peer = False
    if args.peer:
        from lab.perf.peer_env import ensure_peer_venv

        pythons["peer"] = ensure_peer_venv()

    start = time.time()
    load_start = loadavg()
    jobs = []
    groups = plan_cuda(args.quick) if args.device == "cuda" else plan(args.quick, args.peer, default_config)
    if args.bf16 == "auto":
        from dalle_lab.utils import cpu_has_native_bf16

        args.bf16 = "yes" if args.device == "cuda" or cpu_has_native_bf16() else "no"
    if args.bf16 == "no":  # drop the bf16 measurements, and any group they leave empty
        groups = [g for g in ([j for j in group if "/bf16" not in j.key] for group in groups) if g]
    total = sum(len(g) * rounds_for(g, args.quick) for g in groups)
    for group in groups:
        for rnd in range(rounds_for(group, args.quick)):
            for template in group:
                job = Job(template.key, template.impl, template.args, round=rnd)
                jobs.append(job)
                print(f"[{len(jobs):>2}/{total}] {job.key:<28} {job.impl:<10} round {rnd + 1}: ", end="", flush=True)
                job.result = run_job(job, pythons, args.threads, args.omp_wait_policy)
                print(headline(job.result), f"[load {job.result['loadavg']:.1f}]", flush=True)

    meta = dict(command=" ".join([sys.executable, *sys.argv]), commit=git_commit(), device=args.device,
                quick=args.quick, bf16=args.bf16, threads=args.threads, omp_wait_policy=args.omp_wait_policy,
                started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
                minutes=(time.time() - start) / 60, loadavg_start=load_start, loadavg_end=loadavg(),
                cpus=os.cpu_count(), reference=REFERENCE, default_config=default_config)
    out = args.json or PERF_RESULTS / (f"run-{'quick' if args.quick else 'full'}-{args.device}-"
                                           f"{time.strftime('%Y%m%d-%H%M', time.gmtime(start))}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, jobs=[asdict(j) for j in jobs]), indent=1))  # first: keep the raw data
    print_report(jobs, meta)
    print(f"results file: {out}")
    return 1 if any("error" in j.result for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
