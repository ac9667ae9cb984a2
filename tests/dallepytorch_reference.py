"""Runs INSIDE the peer environment (dalle-pytorch 1.6.6, see lab/perf/peer_env.py): builds tiny DALLE-pytorch
models, saves them as its train_dalle.py does, and records what they compute, for tests/test_convert_reference.py.

    python tests/dallepytorch_reference.py JOB.json OUT_DIR

JOB.json: {"shims": folder holding peer_shims.py, "cases": {name: DALLE keywords}, "vae": DiscreteVAE keywords,
"captions": [...], "vocab": CLIP merges file or null}. For each case OUT_DIR/<name>.pt is the checkpoint and
OUT_DIR/<name>.out.pt holds text, image tokens and the logits of a forward pass. OUT_DIR/vae.out.pt holds images,
DiscreteVAE codes and decodings; OUT_DIR/tokens.pt the SimpleTokenizer's ids of the captions.
"""
import json
import sys
import types
from pathlib import Path

import torch


def perturbed(model, seed):
    """Every parameter drawn anew (LayerScale scales and norms included), so no weight stays at its initial value
    and a mapping that swapped two of them could not pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("vae."):
                continue
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm" in name else 0.0))
    return model


def main(job_path, out_dir):
    job = json.loads(Path(job_path).read_text())
    root = Path(__file__).resolve().parents[1]
    shims = [Path(job["shims"]), root / "lab" / "perf", root / "benchmarks" / "perf"]  # wherever peer_shims.py is now
    sys.path.insert(0, str(next(d for d in shims if (d / "peer_shims.py").is_file())))
    import peer_shims

    dp = peer_shims.import_peer()
    out = Path(out_dir)
    torch.manual_seed(0)
    vae = dp.DiscreteVAE(**job["vae"]).eval()
    vae_params = dict(job["vae"])
    images = torch.rand(2, vae.channels, vae.image_size, vae.image_size)
    with torch.no_grad():
        codes = vae.get_codebook_indices(images)
        torch.save({"images": images, "codes": codes, "decoded": vae.decode(codes), "logits": vae(images, return_logits=True)},
                   out / "vae.out.pt")
    for name, kwargs in job["cases"].items():
        kwargs = dict(kwargs)
        for key in ("attn_types", "shared_attn_ids", "shared_ff_ids"):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        fp16 = kwargs.pop("fp16", False)  # as train_dalle.py --fp16 saves it: every weight and buffer in float16
        model = perturbed(dp.DALLE(vae=vae, **kwargs), seed=len(name)).eval()
        if fp16:  # DALLE-pytorch's generate.py loads such a file into a float32 model: rounded weights, rotary table
            model.load_state_dict({k: v.half() for k, v in model.state_dict().items()})
        g = torch.Generator().manual_seed(1)
        text = torch.randint(1, kwargs["num_text_tokens"], (2, kwargs["text_seq_len"]), generator=g)
        text[0, -2:] = 0  # padding gets the unique pad ids
        image = torch.randint(0, vae.num_tokens, (2, vae.image_size ** 2 // 4 ** vae.num_layers), generator=g)
        with torch.no_grad():
            logits = model(text.clone(), image)
            loss = model(text.clone(), image, return_loss=True)
        hparams = {k: v for k, v in kwargs.items()}
        torch.save({"hparams": hparams, "vae_params": vae_params, "epoch": 3, "version": dp.__version__,
                    "vae_class_name": type(vae).__name__,
                    "weights": {k: v.half() if fp16 else v for k, v in model.state_dict().items()},
                    "opt_state": torch.optim.Adam(model.parameters()).state_dict(), "scheduler_state": None},
                   out / f"{name}.pt")
        torch.save({"text": text, "image": image, "logits": logits, "loss": loss}, out / f"{name}.out.pt")
    if job.get("vocab"):
        sys.modules.setdefault("youtokentome", types.ModuleType("youtokentome"))  # unused by SimpleTokenizer
        fake = types.ModuleType("transformers")
        fake.BertTokenizer = None
        sys.modules.setdefault("transformers", fake)
        try:
            from dalle_pytorch.tokenizer import SimpleTokenizer
        except ImportError as err:  # its tokenizer module needs ftfy, regex, tokenizers: the test says so and skips
            print(f"no SimpleTokenizer reference: {err}", file=sys.stderr)
            return
        tok = SimpleTokenizer(job["vocab"])
        torch.save({"ids": [tok.encode(c) for c in job["captions"]],
                    "tokenized": tok.tokenize(job["captions"], 24, truncate_text=True)}, out / "tokens.pt")


if __name__ == "__main__":
    main(*sys.argv[1:3])
