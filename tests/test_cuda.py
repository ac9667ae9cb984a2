"""The CUDA paths on a real GPU: numerics against the CPU, the precision --amp picks, training in float32, bf16 and
fp16 with loss scaling, a GPU checkpoint generating on the CPU, CUDA-graph decoding, generate.py and the demo recipe.

Skipped without CUDA (scripts/gpu_check.sh runs them where a GPU is lent). Tolerances come from the float formats
in the test, never from a fixture written on another machine. The recipe's choices themselves are checked without
a GPU in test_cpu_kinds.py.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dalle_lab.model import DALLE
from dalle_lab.training.checkpoint import load_dalle, read_checkpoint
from dalle_lab.training.loop import train
from dalle_lab.training.precision import resolve_precision
from dalle_lab.utils import cuda_has_native_bf16

from test_training import TINY_MODEL, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")
ROOT = Path(__file__).resolve().parents[1]
CAPTION = "a small red circle at the top left on a white background"
FP32_EPS = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def exact_float32_products():
    """TF32 would round CUDA float32 products to 10 mantissa bits; the comparisons below assume float32's own."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def tiny_dalle(tiny_vqgan, **options):
    from dalle_lab.vae import VQGanVAE

    torch.manual_seed(0)
    return DALLE(vae=VQGanVAE(*tiny_vqgan), dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=64,
                 text_seq_len=8, **options).eval()


def test_amp_means_bf16_where_the_gpu_computes_it_natively_else_fp16():
    native = torch.cuda.get_device_capability()[0] >= 8
    assert cuda_has_native_bf16() == native
    assert resolve_precision(True, "cuda").dtype == ("bf16" if native else "fp16")
    assert resolve_precision(True, "cuda").needs_loss_scaling == (not native)
    assert resolve_precision(True, "cuda", "fp16").grad_scaler() is not None


def test_the_loss_on_the_gpu_is_the_cpus_to_float32_rounding(tiny_vqgan):
    dalle = tiny_dalle(tiny_vqgan)
    text = torch.randint(1, 64, (3, 8))
    image = torch.randint(0, dalle.config.num_image_tokens, (3, dalle.config.image_seq_len))

    def loss(model, *inputs):  # DALLE-pytorch's API returns the loss tensor; DALLEOutput carries it as .loss
        out = model(*inputs, return_loss=True)
        return float(out if isinstance(out, torch.Tensor) else out.loss)

    with torch.no_grad():
        cpu = loss(dalle, text, image)
        gpu = loss(dalle.cuda(), text.cuda(), image.cuda())
    # sums over a few hundred terms of size ~log(vocab) each: a few hundred float32 roundings at most
    assert abs(gpu - cpu) <= 1000 * FP32_EPS * abs(cpu), (cpu, gpu)


def test_cuda_graph_decoding_gives_the_plain_logits_and_tokens(tiny_vqgan):
    dalle = tiny_dalle(tiny_vqgan).cuda()
    text = torch.randint(1, 64, (2, 8), device="cuda")

    def greedy(**options):
        steps = []
        tokens = dalle.generate_images(text, top_k=1, return_tokens=True,
                                       logits_callback=lambda i, cond, uncond: steps.append(cond.float().cpu()),
                                       generator=torch.Generator("cuda").manual_seed(0), **options)
        return tokens, torch.stack(steps)

    plain_tokens, plain_logits = greedy(strategy="plain")
    graph_tokens, graph_logits = greedy(strategy="graph")
    scale = plain_logits.abs().max().item()
    torch.testing.assert_close(graph_logits, plain_logits, rtol=0, atol=64 * FP32_EPS * scale)
    assert torch.equal(graph_tokens, plain_tokens)
    sampled = dalle.generate_images(text, return_tokens=True, strategy="speculative",  # window passes as graphs
                                    generator=torch.Generator("cuda").manual_seed(0))
    assert sampled.shape == plain_tokens.shape and sampled.device.type == "cuda"
    assert 0 <= sampled.min() and sampled.max() < dalle.config.num_image_tokens


@pytest.mark.parametrize("amp_dtype", ["fp32", "bf16", "fp16"])
def test_training_on_the_gpu_and_the_checkpoint_on_the_cpu(amp_dtype, tiny_vqgan, tmp_path, capsys):
    if amp_dtype == "bf16" and not cuda_has_native_bf16():
        pytest.skip("this GPU only emulates bfloat16")
    amp = dict(amp=False) if amp_dtype == "fp32" else dict(amp=True, amp_dtype=amp_dtype)
    result = train(tiny_config(tiny_vqgan, tmp_path, device="cuda", max_steps=6, **amp), TINY_MODEL)
    assert result.step == 6
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
    summary = capsys.readouterr().err
    assert f"on cuda, {'float32' if amp_dtype == 'fp32' else amp_dtype}" in summary, summary
    checkpoint = read_checkpoint(result.checkpoint_path)
    assert (checkpoint["scaler"] is not None) == (amp_dtype == "fp16")  # loss scaling only for fp16
    assert all(t.dtype == torch.float32 for t in checkpoint["model"].values() if t.is_floating_point())

    dalle, tokenizer, _ = load_dalle(result.checkpoint_path, "cpu")
    text = tokenizer.tokenize([CAPTION], dalle.config.text_seq_len)
    images = dalle.generate_images(text, generator=torch.Generator().manual_seed(0))
    assert images.shape[0] == 1 and images.device.type == "cpu" and torch.isfinite(images).all()


def test_deepspeed_trains_one_process_on_the_gpu(tiny_vqgan, tmp_path):
    pytest.importorskip("deepspeed")
    result = train(tiny_config(tiny_vqgan, tmp_path, device="cuda", deepspeed=True, max_steps=3), TINY_MODEL)
    assert result.step == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)


def test_generate_py_on_the_gpu(tiny_dalle_checkpoint, tmp_path):
    from dalle_lab.cli.generate import main

    assert main(["--dalle_path", str(tiny_dalle_checkpoint), "--text", CAPTION, "--num_images", "2",
                 "--device", "cuda", "--outputs_dir", str(tmp_path)]) == 0
    assert len(list(tmp_path.glob("*/*.png"))) == 3  # two images and the grid


def test_the_demo_trains_on_every_gpu_here_one_process_each():
    env = {**os.environ, "DEMO_DRY_RUN": "1", "PYTHON": sys.executable}
    for name in ("DEMO_PROCESSES", "DEMO_GPUS", "DEMO_GPU_BF16"):
        env.pop(name, None)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    gpus = torch.cuda.device_count()
    dtype = "bf16" if cuda_has_native_bf16() else "fp16"
    assert f"[demo] CUDA: training on {gpus if gpus & (gpus - 1) == 0 else 2 ** (gpus.bit_length() - 1)} of " \
           f"{gpus} GPU(s)" in out.stdout, out.stdout
    train_command = next(line for line in out.stdout.splitlines() if "train_dalle.py" in line)
    assert f"--device cuda --amp --amp_dtype {dtype}" in train_command
    assert ("--nproc_per_node" in train_command) == (gpus > 1)
