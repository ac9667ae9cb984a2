"""Turn run.py's raw measurements into the side-by-side tables (markdown, so they paste into lab/perf/README.md).

Ratios are "ours / peer" in speed (throughput), so > 1 means ours is faster, and each is the median over rounds of
the ratio between the two runs of the same round (neighbouring runs see the same machine load). They are given by
wall-clock time and by CPU time (all threads): under heavy load from other jobs the CPU-time ratio is the steadier.
Memory ratios are ours / peer peak resident memory, so < 1 means ours uses less.

MFU (model FLOPs utilisation) = 6 * non-embedding parameters * training tokens/s / matmul ceiling (FLOP/s): the
usual 2 FLOPs per parameter per token forward and 4 backward, attention's own score FLOPs left out, as in the issue.
Both ceilings are given for every run; the meaningful pairs are fp32 runs against the fp32 ceiling and bf16 runs
against the bf16 ceiling. The ceiling is the best 2048x2048 matmul of the run, so on a loaded machine it too is
depressed and MFU reads high.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

TARGETS = [
    # (label, key of ours, key of peer, ours impl, peer impl, metric, target): issue 17's targets
    ("1. cached generation, 4 x 256 tokens, fp32, the default path (no strategy given)", "generate/reference/cached",
     "generate/reference/cached", "ours", "peer", "speed", 5.0),
    ("1. same, against the peer's plain variant (rotary and token shift off, like for like; issue 38)",
     "generate/reference/cached", "generate/reference/cached", "ours", "peer-plain", "speed", 4.0),
    ("1. same, through the compiled step (strategy 'compiled'; its compile is timed apart below)",
     "generate/reference/cached/compiled", "generate/reference/cached", "ours", "peer-plain", "speed", 4.0),
    ("1. same path with contiguous W^T products (a candidate default where oneDNN's prepacked ones are slower)",
     "generate/reference/cached/products-wt", "generate/reference/cached", "ours", "peer-plain", "speed", 4.0),
    ("1. same path with F.linear's products (a candidate default)",
     "generate/reference/cached/products-linear", "generate/reference/cached", "ours", "peer-plain", "speed", 4.0),
    ("1. same path with W^T products on one thread (a candidate default for few-row decoding)",
     "generate/reference/cached/products-wt/threads1", "generate/reference/cached", "ours", "peer-plain", "speed",
     4.0),
    ("1. class-default architecture on both sides (rotary and token shift on; issue 33), default path",
     "generate/class-default/cached", "generate/class-default/cached", "ours", "peer", "speed", 3.0),
    ("2. throughput, batch 64", "generate/reference/cached/b64", "generate/reference/cached/b64", "ours", "peer",
     "speed", 4.0),
    ("3. speculative vs our plain cached, batch 4 (random-init model; the target is on a trained one: "
     "lab/perf/speculative.py)", "generate/reference/cached/speculative", "generate/reference/cached", "ours",
     "ours", "speed", 1.7),
    ("5. training fp32, ref config", "train/reference/fp32", "train/reference/fp32", "ours", "peer", "speed", 1.5),
    ("5. training bf16 autocast, both", "train/reference/bf16", "train/reference/bf16", "ours", "peer", "speed",
     2.0),
]


def _ok(results):
    return [r for r in results if "error" not in r]


def _speed(result: dict, clock: str = "wall") -> float:
    """Throughput of one measurement, whatever its kind (higher is better), by wall-clock or by CPU time."""
    if "tokens_per_s" in result:
        return result["tokens_per_step"] / result["s_per_step" if clock == "wall" else "cpu_s_per_step"]
    return 1.0 / result["s_per_batch" if clock == "wall" else "cpu_s_per_batch"]


def index(jobs) -> dict:
    """(key, impl) -> {round: result}"""
    table = defaultdict(dict)
    for job in jobs:
        table[(job.key, job.impl)][job.round] = job.result
    return table


def paired_ratio(table, key_a, impl_a, key_b, impl_b, metric) -> tuple[float, list] | None:
    a, b = table.get((key_a, impl_a), {}), table.get((key_b, impl_b), {})
    ratios = []
    for rnd in sorted(set(a) & set(b)):
        ra, rb = a[rnd], b[rnd]
        if "error" in ra or "error" in rb:
            continue
        if metric == "speed":
            ratios.append(_speed(ra) / _speed(rb))
        elif metric == "cpu_speed":
            ratios.append(_speed(ra, "cpu") / _speed(rb, "cpu"))
        else:  # memory
            ratios.append(ra["peak_rss_mb"] / rb["peak_rss_mb"])
    if not ratios:
        return None
    return statistics.median(ratios), ratios


def _values(table, key, field, impl="ours") -> list:
    return [r[field] for r in _ok(table.get((key, impl), {}).values()) if field in r]


def median_of(table, key, impl, field):
    values = _values(table, key, field, impl)
    return statistics.median(values) if values else None


def ceiling(jobs) -> dict:
    """Best matmul of the run: run.py measures it at the start and at the end (both are round 0, so not via index)."""
    results = _ok([job.result for job in jobs if job.key == "matmul"])
    best = {}
    for name in ("fp32", "bf16"):
        values = [r[f"gflops_{name}"] for r in results if r.get(f"gflops_{name}") is not None]
        best[name] = max(values) if values else None  # None: not measured (no native bf16 on this CPU)
    return best


def _fmt(value, spec=".0f", missing="-"):
    return missing if value is None else format(value, spec)


def print_report(jobs, meta: dict) -> None:
    table = index(jobs)
    ceil = ceiling(jobs)
    keys = sorted({j.key for j in jobs if j.key != "matmul"})
    impls = [i for i in ("ours", "peer", "peer-plain") if any(j.impl == i for j in jobs)]
    print()
    print(f"## Run of {meta['started']} ({'quick' if meta['quick'] else 'full'}; {meta['minutes']:.1f} min; "
          f"torch threads {meta['threads']}, OMP_WAIT_POLICY {meta['omp_wait_policy']}; load average "
          f"{meta['loadavg_start']:.1f} at start, {meta['loadavg_end']:.1f} at end, {meta['cpus']} CPUs)")
    print()
    print(f"Matmul ceiling (2048x2048, best of the run): {_fmt(ceil['fp32'])} GFLOP/s fp32, "
          f"{_fmt(ceil['bf16'])} GFLOP/s bf16")

    print()
    print("### Targets (ratio = median over rounds of ours/peer from neighbouring runs)")
    print()
    print("| target | ratio (wall) | per round | by CPU time | goal | met (wall) |")
    print("|---|---|---|---|---|---|")
    for label, key_a, key_b, impl_a, impl_b, metric, goal in TARGETS:
        got = paired_ratio(table, key_a, impl_a, key_b, impl_b, metric)
        if got is None:
            print(f"| {label} | not measured | | | >= {goal} | |")
            continue
        ratio, per_round = got
        cpu = paired_ratio(table, key_a, impl_a, key_b, impl_b, "cpu_speed")
        print(f"| {label} | {ratio:.2f}x | {', '.join(f'{r:.2f}' for r in per_round)} | "
              f"{_fmt(cpu and cpu[0], '.2f')}x | >= {goal}x | "
              f"{'met' if ratio >= goal else f'not met (short by {goal / ratio:.2f}x)'} |")
    for key in ("train/reference/fp32", "generate/reference/cached"):
        got = paired_ratio(table, key, "ours", key, "peer", "memory")
        if got:
            ratio, per_round = got
            print(f"| peak RSS, {key} | {ratio:.2f} | {', '.join(f'{r:.2f}' for r in per_round)} | | <= 1.00 | "
                  f"{'met' if ratio <= 1.0 else 'not met'} |")
    for key in ("generate/reference/cached", "generate/class-default/cached"):
        same = _values(table, key, "tokens_equal_module_path")
        if same:
            print(f"| {key}: tokens equal to the cached module path's for the same seed | {sum(same)} of "
                  f"{len(same)} rounds | | | all | {'met' if all(same) else 'not met'} |")
    firsts = _values(table, "generate/reference/cached/compiled", "first_generation_s")
    if firsts:
        same = _values(table, "generate/reference/cached/compiled", "tokens_equal_module_path")
        print(f"| compiled step: first generation of each process, compile included (cold where Inductor's disk "
              f"cache was empty, e.g. a new TORCHINDUCTOR_CACHE_DIR) | round 1: {firsts[0]:.1f} s; later rounds: "
              f"{', '.join(f'{r:.1f}' for r in firsts[1:]) or '-'} s | | | | "
              f"tokens equal to the module path's in {sum(same)} of {len(same)} rounds |")
    graph_jobs = [j for j in jobs if j.key.startswith("generate/") and "graph" in j.key]
    if graph_jobs:
        ok = all("error" not in j.result for j in graph_jobs)
        print(f"| 4. CUDA-graph decode step runs on {meta.get('device', 'cpu')} | {'yes' if ok else 'FAILED'} | | | "
              f"runs | {'met' if ok else 'not met'} |")

    print()
    print("### Every measurement (medians over rounds)")
    print()
    print("| measurement | impl | tokens/s or s/batch (wall) | CPU s | ms/token step | images/s | peak RSS MB "
          "| MFU fp32 / bf16 ceil | ours/this speed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in keys:
        for impl in impls:
            results = _ok(table.get((key, impl), {}).values())
            if not results:
                if table.get((key, impl)):
                    print(f"| {key} | {impl} | FAILED | | | | | |")
                continue
            rss = median_of(table, key, impl, "peak_rss_mb")
            vs = paired_ratio(table, key, "ours", key, impl, "speed") if impl != "ours" else None
            vs_txt = f"{vs[0]:.2f}x" if vs else ""
            cpu_s = median_of(table, key, impl, "cpu_s_per_step" if key.startswith("train") else "cpu_s_per_batch")
            if key.startswith("train"):
                tps = median_of(table, key, impl, "tokens_per_s")
                n = results[0]["params"]["non_embedding"]
                mfu = [6 * n * tps / (c * 1e9) if c else None for c in (ceil["fp32"], ceil["bf16"])]
                print(f"| {key} | {impl} | {tps:.0f} tok/s ({median_of(table, key, impl, 's_per_step'):.3f} s/step) "
                      f"| {_fmt(cpu_s, '.3f')} | | | {rss:.0f} | {_fmt(mfu[0] and 100 * mfu[0])}% / "
                      f"{_fmt(mfu[1] and 100 * mfu[1])}% "
                      f"| {vs_txt} |")
            else:
                print(f"| {key} | {impl} | {median_of(table, key, impl, 's_per_batch'):.2f} s / "
                      f"{results[0]['batch']} images | {_fmt(cpu_s, '.2f')} "
                      f"| {median_of(table, key, impl, 'ms_per_token_step'):.1f} "
                      f"| {median_of(table, key, impl, 'images_per_s'):.2f} | {rss:.0f} | | {vs_txt} |")

    _print_linearity(table, impls)
    _print_models(table)


def _print_linearity(table, impls) -> None:
    rows = [("grid64", 64), ("reference", 256), ("grid1024", 1024)]
    if not any((f"generate/{name}/cached", "ours") in table for name, _ in rows if name != "reference"):
        return
    print()
    print("### Cached generation vs image tokens (batch of 4): linear means constant ms per image token")
    print()
    impls = [i for i in impls if (f"generate/{rows[0][0]}/cached", i) in table]
    print("| image tokens | " + " | ".join(f"{i} s/image | {i} ms/image token | {i} CPU ms/image token"
                                          for i in impls) + " |")
    print("|---|" + "---|---|---|" * len(impls))
    for name, n in rows:
        cells = []
        for impl in impls:
            s = median_of(table, f"generate/{name}/cached", impl, "s_per_image")
            cpu = median_of(table, f"generate/{name}/cached", impl, "cpu_s_per_batch")
            batch = median_of(table, f"generate/{name}/cached", impl, "batch")
            cells += [_fmt(s, ".3f"), _fmt(s and 1000 * s / n, ".2f"), _fmt(cpu and 1000 * cpu / batch / n, ".2f")]
        print(f"| {n} | " + " | ".join(cells) + " |")


DIFFERENCES = """\
What differs at equal width, depth and heads (both use GEGLU feed-forwards of 4 x dim and pre-LayerNorm blocks):
- dalle-pytorch 1.6.6 class defaults: rotary position embeddings (text and axial image rotary on a third of each
  head, no parameters), token shift before every attention and feed-forward (no parameters, extra copies/cats),
  LayerScale on every branch (2 x dim parameters per block), one joint output head over text + image vocabularies
  (text_seq_len + num_text_tokens + num_image_tokens outputs at every position, then masked), a cache grown with
  torch.cat. Its "plain" variant here turns rotary and token shift off (learned text positions + axial image
  positions instead), the closest like-with-like to ours.
- dalle_lab: learned absolute positions (text, image rows, image columns), no token shift, no LayerScale, two output
  heads (text, image) each applied only to its own positions, a preallocated KV cache, caption dropout
  (null_cond_prob, a multiply) in training mode.
- Both count the output projections as non-embedding parameters; the frozen image tokenizer is excluded."""


def _print_models(table) -> None:
    print()
    print("### Models compared")
    print()
    print(DIFFERENCES)
    print()
    for key in ("train/reference/fp32", "train/default/fp32"):
        for impl in ("ours", "peer", "peer-plain"):
            results = _ok(table.get((key, impl), {}).values())
            if results:
                r = results[0]
                p = r["params"]
                notes = ("; " + "; ".join(r["notes"])) if r.get("notes") else ""
                print(f"- {key.split('/')[1]} {impl}: {p['total'] / 1e6:.3f}M trainable parameters, "
                      f"{p['non_embedding'] / 1e6:.3f}M non-embedding; filter_thres={r['filter_thres']} keeps "
                      f"k={r['effective_k']} of {r['num_image_tokens']} image tokens{notes}")
