"""The cached-generation speed levers of issue 17, each measured on its own at the reference config, batch 4.

    .venv/bin/python -m lab.perf.step_profile [--levers step transpose generation threads] [--rounds 3]

  step        one cached decode pass (4 rows, position 150): the module path vs FusedStep with each product kind
              (linear.PRODUCT_KINDS: F.linear's layout, a contiguous W^T copy, oneDNN-prepacked)
  transpose   the 17 weight products of a step, F.linear (W viewed transposed) vs torch.addmm(b, x, Wt) with a
              contiguous W^T vs oneDNN's prepacked fp32 linear, for 4..128 rows
  generation  whole 4 x 256 generations (top_k 10, float32, 1 thread): the module path with F.linear and with
              oneDNN-prepacked products (packed_linears), fused with each product kind; the tokens of every variant
              are checked equal to the first's
  threads     whole generations with 2 threads under OMP_WAIT_POLICY=PASSIVE: decode_threads on vs off
  attention   one query over 40 / 150 / 288 cached keys (4 rows x 8 heads): SDPA vs baddbmm + softmax + bmm
  profile     torch.profiler over one default generation: self CPU time of the costliest ops, and the total
Variants alternate within each round; the results file (lab/perf/results/) records the command, config,
commit, load average and every raw value (wall and CPU seconds). On a shared machine read neighbouring ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP; run.py's default too

import torch  # noqa: E402  (after the wait policy is set)

from dalle_lab.generate import GenerationConfig, threads  # noqa: E402
from dalle_lab.generate.decoder import Decoder  # noqa: E402
from dalle_lab.model import DALLE, linear  # noqa: E402
from dalle_lab.utils import cpu_has_native_bf16  # noqa: E402
from lab.common import git_commit, loadavg, write_results  # noqa: E402
from lab.perf.backends import REFERENCE  # noqa: E402
from lab.perf.decode_levers import cpu_us  # noqa: E402

BATCH, TOP_K = 4, 10
KINDS = ("linear", "wt", "onednn")
DEFAULT_KINDS = linear.PRODUCT_KINDS  # the committed choice, restored after each lever


def reference_model():
    torch.manual_seed(0)
    return DALLE(**REFERENCE).eval(), torch.randint(1, 100, (BATCH, REFERENCE["text_seq_len"]))


def lever_step(results, rounds):
    model, text = reference_model()
    variants = {"module": (False, "linear"), **{f"fused_{kind}": (True, kind) for kind in KINDS}}
    for name, (fused, kind) in variants.items():
        linear.PRODUCT_KINDS = ((64, kind),)
        dec = Decoder(model, model.text_ids(text), GenerationConfig(top_k=TOP_K, cond_scale=1.0))
        with torch.no_grad(), model.packed_weights(rows=BATCH):
            dec.prefill(text[:, :0])
            tokens = torch.randint(0, 512, (BATCH, 1))
            if fused:
                fused_step = model.fused_step(dec.caches, dec.rows)
                step = lambda: fused_step(dec.embed(tokens, 150).view(dec.rows, -1), dec.T + 1 + 150)  # noqa: E731
            else:
                step = lambda: dec.step_at(tokens, 150)  # noqa: E731
            results[f"step/{name}/cpu_us"] = cpu_us(step, 200, rounds)
    linear.PRODUCT_KINDS = DEFAULT_KINDS


def lever_transpose(results, rounds):
    model, _ = reference_model()
    linears = [m for m in model.transformer.modules() if isinstance(m, torch.nn.Linear)] + [model.to_image_logits]
    ws = [m.weight.detach() for m in linears]
    bs = [torch.zeros(w.shape[0]) if m.bias is None else m.bias.detach() for m, w in zip(linears, ws)]
    wts = [w.t().contiguous() for w in ws]
    for rows in (4, 8, 16, 32, 64, 128):
        xs = [torch.randn(rows, w.shape[1]) for w in ws]
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]
        kernels = {"F.linear": lambda k: torch.nn.functional.linear(xs[k], ws[k], bs[k]),
                   "addmm_Wt": lambda k: torch.addmm(bs[k], xs[k], wts[k]),
                   "onednn_prepacked": lambda k: torch.ops.mkldnn._linear_pointwise(xs[k], onednn[k], bs[k], "none",
                                                                                    [], "")}
        for kname, f in kernels.items():
            results[f"transpose/rows{rows}/{kname}/cpu_us"] = cpu_us(lambda: [f(k) for k in range(len(ws))], 50,
                                                                     rounds)


def generate(model, text, seed=0, strategy="auto", single_thread=True):
    wall, cpu = time.perf_counter(), time.process_time()
    bound = threads.SINGLE_THREAD_MAX_ROWS
    threads.SINGLE_THREAD_MAX_ROWS = bound if single_thread else 0  # decode_threads off: every pass on all threads
    try:
        tokens = model.generate_images(text, top_k=TOP_K, return_tokens=True, strategy=strategy,
                                       generator=torch.Generator().manual_seed(seed))
    finally:
        threads.SINGLE_THREAD_MAX_ROWS = bound
    return tokens, time.perf_counter() - wall, time.process_time() - cpu


def alternate(results, prefix, variants, rounds, num_threads):
    """variants: name -> (product kind, generate kwargs); whole generations, alternated, raw values kept."""
    torch.set_num_threads(num_threads)
    model, text = reference_model()
    reference = None
    for r in range(rounds + 1):  # round 0 warms up and is not recorded
        for name, (kind, kw) in variants.items():
            linear.PRODUCT_KINDS = DEFAULT_KINDS if kind is None else ((64, kind),)
            tokens, wall, cpu = generate(model, text, **kw)
            reference = tokens if reference is None else reference
            results.setdefault(f"{prefix}/{name}/tokens_equal_first", []).append(bool(torch.equal(tokens, reference)))
            if r:
                results.setdefault(f"{prefix}/{name}/wall_s", []).append(wall)
                results.setdefault(f"{prefix}/{name}/cpu_s", []).append(cpu)
    linear.PRODUCT_KINDS = DEFAULT_KINDS
    torch.set_num_threads(1)


def lever_generation(results, rounds):
    alternate(results, "generation", {**{f"module_{kind}": (kind, dict(strategy="plain"))
                                         for kind in ("linear", "onednn")},
                                      **{f"fused_{kind}": (kind, dict(strategy="fused")) for kind in KINDS}},
              rounds, num_threads=1)


def lever_threads(results, rounds):
    alternate(results, "threads2", {"single_thread_off": (None, dict(single_thread=False)),
                                    "single_thread_on": (None, dict(single_thread=True))}, rounds, num_threads=2)


def lever_attention(results, rounds):
    buffer, qkv = torch.randn(2, BATCH, 8, 289, 32), torch.randn(BATCH, 3, 8, 32)
    q = qkv[:, :1].transpose(1, 2)
    for n in (40, 150, 288):
        kv = buffer.narrow(3, 0, n)

        def explicit():
            scores = torch.baddbmm(torch.empty(BATCH * 8, 1, n), qkv[:, 0].reshape(BATCH * 8, 1, 32),
                                   kv[0].reshape(BATCH * 8, n, 32).transpose(1, 2), beta=0, alpha=32 ** -0.5)
            return torch.bmm(scores.softmax(-1), kv[1].reshape(BATCH * 8, n, 32))

        results[f"attention/keys{n}/sdpa/cpu_us"] = cpu_us(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, kv[0], kv[1]), 300, rounds)
        results[f"attention/keys{n}/baddbmm_softmax_bmm/cpu_us"] = cpu_us(explicit, 300, rounds)


def lever_profile(results, rounds):
    from torch.profiler import profile

    model, text = reference_model()
    generate(model, text)
    with profile() as prof:
        generate(model, text)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    results["profile/total_self_cpu_ms"] = [sum(e.self_cpu_time_total for e in events) / 1e3]
    for e in events[:12]:
        results[f"profile/{e.key}/self_cpu_ms"] = [e.self_cpu_time_total / 1e3]
        results[f"profile/{e.key}/calls"] = [float(e.count)]


LEVERS = dict(step=lever_step, transpose=lever_transpose, generation=lever_generation, threads=lever_threads,
              attention=lever_attention, profile=lever_profile)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=time.strftime("lab/perf/results/step-profile-%Y%m%d-%H%M.json",
                                                  time.gmtime()))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    meta = dict(command=" ".join([sys.executable, *sys.argv]), commit=git_commit(), config=REFERENCE,
                batch=BATCH, top_k=TOP_K, product_kinds=DEFAULT_KINDS, dtype="float32", torch=torch.__version__,
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), loadavg_start=loadavg(),
                cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu_has_native_bf16=cpu_has_native_bf16(),
                started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    results = {}
    for name in args.levers:
        LEVERS[name](results, args.rounds)
        print(f"{name} done, load average {loadavg():.2f}", flush=True)
    meta["loadavg_end"] = loadavg()
    for key, values in results.items():
        shown = values if isinstance(values[0], bool) else f"{statistics.median(values):.4g}  ({', '.join(f'{v:.4g}' for v in values)})"
        print(f"{key:<48} {shown}")
    print(f"load average {meta['loadavg_start']:.2f} -> {meta['loadavg_end']:.2f}")
    write_results(dict(meta=meta, results=results), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
