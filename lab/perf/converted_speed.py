"""Generation speed of a model converted from DALLE-pytorch: dalle-pytorch 1.6.6 (its KV cache repaired) against
dalle_lab on the same weights, batch 4, each timing in a fresh process, the two alternating.

    python -m lab.perf.converted_speed                         # the reference shape; needs an idle machine
    python -m lab.perf.converted_speed --tiny --rounds 1       # a check that it runs (numbers mean nothing)

The model is DALLE-pytorch's class default (rotary embeddings, token shift, LayerScale) at the reference shape of
docs/performance.md (dim 256, depth 4, 8 heads of 32, 16 x 16 = 256 image tokens, 32 text tokens), with a small
DiscreteVAE, written by dalle-pytorch itself in its train_dalle.py format and converted with
`python -m dalle_lab.convert`. Both sample with filter_thres 0.9; only the transformer's image tokens are timed
(return_tokens / the VAE decode excluded on both sides by decoding nothing). Writes lab/perf/results/<name>.json with
the command, config, commit, seeds, CPU kind and load average, and the raw seconds. The peer environment is
lab/perf/.peer-venv (`python -m lab.perf.peer_env` builds it).
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

from lab.common import PERF_RESULTS, ROOT, git_commit, write_results

REFERENCE = dict(dim=256, depth=4, heads=8, dim_head=32, text_seq_len=32)
TINY = dict(dim=32, depth=2, heads=2, dim_head=16, text_seq_len=8)
VAE = dict(image_size=64, num_tokens=512, codebook_dim=64, num_layers=2, hidden_dim=16)  # 16 x 16 tokens
TINY_VAE = dict(image_size=16, num_tokens=64, codebook_dim=16, num_layers=2, hidden_dim=8)
VOCAB = ROOT / "tests" / "data" / "dallepytorch" / "text.model"


def peer_worker(args) -> None:
    """Runs in the peer environment: `make` writes the checkpoint, `time` generates and prints seconds."""
    import torch

    from lab.perf import peer_shims

    dp = peer_shims.import_peer()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    job = json.loads(args.job)
    vae = dp.DiscreteVAE(**job["vae"])
    dalle = dp.DALLE(vae=vae, num_text_tokens=job["num_text_tokens"], **job["model"]).eval()
    if args.peer == "make":
        torch.save({"hparams": {"num_text_tokens": job["num_text_tokens"], **job["model"]}, "vae_params": job["vae"],
                    "weights": dalle.state_dict(), "vae_class_name": "DiscreteVAE", "version": dp.__version__,
                    "epoch": 0}, args.checkpoint)
        return
    dalle.load_state_dict(torch.load(args.checkpoint, weights_only=True)["weights"])
    peer_shims.repair_cache(dalle)
    dalle.vae.decode = lambda tokens: tokens  # time the transformer only, as on our side
    text = torch.randint(1, job["num_text_tokens"], (job["batch"], job["model"]["text_seq_len"]),
                         generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    start = time.perf_counter()
    dalle.generate_images(text, filter_thres=0.9, use_cache=True)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def ours_worker(args) -> None:
    import torch

    from dalle_lab.training.checkpoint import load_dalle

    torch.set_num_threads(args.threads)
    job = json.loads(args.job)
    dalle, _, _ = load_dalle(args.checkpoint)
    text = torch.randint(1, job["num_text_tokens"], (job["batch"], job["model"]["text_seq_len"]),
                         generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    dalle.generate_images(text, filter_thres=0.9, return_tokens=True, generator=torch.Generator().manual_seed(2))
    print(json.dumps({"seconds": time.perf_counter() - start}))


def _run(cmd) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)  # cwd: `lab` imports
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks the script, measures nothing")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in every timed process (default 2)")
    parser.add_argument("--out", default=None, help="results file (default lab/perf/results/converted_speed-<time>.json)")
    parser.add_argument("--peer", choices=["make", "time"], help=argparse.SUPPRESS)
    parser.add_argument("--ours", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        return peer_worker(args) or 0
    if args.ours:
        return ours_worker(args) or 0

    from dalle_lab.tokenizers.dallepytorch import DallePytorchYttm

    from lab.perf.peer_env import ensure_peer_venv

    peer = str(ensure_peer_venv())
    job = {"model": TINY if args.tiny else REFERENCE, "vae": TINY_VAE if args.tiny else VAE, "batch": args.batch,
           "num_text_tokens": DallePytorchYttm(VOCAB).vocab_size}
    me = ["-m", "lab.perf.converted_speed"]
    with tempfile.TemporaryDirectory() as tmp:
        original, converted = Path(tmp) / "dallepytorch.pt", Path(tmp) / "converted.pt"
        common = ["--job", json.dumps(job), "--threads", str(args.threads)]
        subprocess.run([peer, *me, "--peer", "make", "--checkpoint", str(original), *common], check=True, cwd=ROOT)
        subprocess.run([sys.executable, "-m", "dalle_lab.convert", "dallepytorch", str(original), str(converted),
                        "--bpe_path", str(VOCAB)], check=True, cwd=ROOT)
        load_before = os.getloadavg()
        times = {"dallepytorch": [], "dalle_lab": []}
        for _ in range(args.rounds):
            times["dallepytorch"].append(_run([peer, *me, "--peer", "time", "--checkpoint", str(original), *common]))
            times["dalle_lab"].append(_run([sys.executable, *me, "--ours", "--checkpoint", str(converted), *common]))
    medians = {k: statistics.median(v) for k, v in times.items()}
    cpu = open("/proc/cpuinfo").read()
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": job, "git_commit": git_commit(),
              "seeds": {"weights": 0, "text": 1, "sampling": 2}, "cpu_avx512_bf16": "avx512_bf16" in cpu,
              "threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "seconds": times, "medians": medians,
              "speedup_median": medians["dallepytorch"] / medians["dalle_lab"], "tiny_check_only": args.tiny}
    out = args.out or PERF_RESULTS / f"converted_speed-{time.strftime('%Y%m%d-%H%M%S')}-t{args.threads}.json"
    write_results(record, out)
    print(f"median seconds: dalle-pytorch {medians['dallepytorch']:.3f}, dalle_lab {medians['dalle_lab']:.3f} "
          f"({record['speedup_median']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
