"""Both kinds of CPU on every machine: each branch chosen by cpu_has_native_bf16() runs here, whatever this CPU is.

The machines change between sessions (AVX2-only EPYCs without native bfloat16, Zen 4 EPYCs with avx512_bf16), and a
branch that only one kind takes would hide its failures on the other. DALLE_LAB_CPU_BF16=1 / 0 forces the probe
(dalle_lab/utils.py); each test below checks what a branch decides and that it runs. The bf16 branches are slow on
AVX2 CPUs (emulated), so their runs are a step or two of tiny models. The demo's recipe on CUDA GPUs is decided here
too, without a GPU (DEMO_GPUS / DEMO_GPU_BF16 stand in for the probes; tests/test_cuda.py runs it on a real one).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dalle_lab.model.linear import Linear, packed_linears
from dalle_lab.training.loop import train
from dalle_lab.training.precision import resolve_precision
from dalle_lab.utils import CPU_BF16_VARIABLE, cpu_has_native_bf16, cuda_has_native_bf16
from dalle_lab.vae import train as vae_train

from test_training import TINY_MODEL, tiny_config

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"native_bf16": "1", "avx2_only": "0"}


@pytest.fixture(params=sorted(KINDS))
def cpu_kind(request, monkeypatch):
    monkeypatch.setenv(CPU_BF16_VARIABLE, KINDS[request.param])
    return request.param


def test_the_probe_follows_the_variable_and_refuses_other_values(monkeypatch):
    monkeypatch.setenv(CPU_BF16_VARIABLE, "1")
    assert cpu_has_native_bf16()
    monkeypatch.setenv(CPU_BF16_VARIABLE, "0")
    assert not cpu_has_native_bf16()
    monkeypatch.setenv(CPU_BF16_VARIABLE, "yes")
    with pytest.raises(ValueError, match="DALLE_LAB_CPU_BF16='yes': set 1 .* or 0"):
        cpu_has_native_bf16()
    monkeypatch.delenv(CPU_BF16_VARIABLE)
    assert cpu_has_native_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def demo_run(env_overrides: dict) -> subprocess.CompletedProcess:
    """scripts/demo.sh as a dry run (DEMO_DRY_RUN=1: it prints the commands it would run), with these settings."""
    env = {**os.environ, "DEMO_DRY_RUN": "1", "PYTHON": sys.executable}
    for name in ("DEMO_PROCESSES", "DEMO_GPUS", "DEMO_GPU_BF16"):
        env.pop(name, None)
    env.update(env_overrides)
    return subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def commands(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stderr
    return [line.split("would run: ", 1)[1] for line in out.stdout.splitlines() if "would run: " in line]


def demo_commands(kind: str) -> list[str]:
    return commands(demo_run({CPU_BF16_VARIABLE: KINDS[kind], "DEMO_GPUS": "0"}))  # the CPU, even beside a GPU


def test_the_demo_recipe_of_each_cpu_kind(cpu_kind):
    train_command, generate_command = demo_commands(cpu_kind)
    assert "generate.py --dalle_path runs/dalle/dalle.pt --device cpu" in generate_command
    if cpu_kind == "native_bf16":  # train_dalle.py's own defaults: 1800 bf16 steps of batch 64 in one process
        assert train_command == f"{sys.executable} train_dalle.py --output_dir runs/dalle --device cpu"
    else:  # 1000 float32 steps of global batch 32, two DDP processes of 16 where the cores allow
        processes = 2 if len(os.sched_getaffinity(0)) >= 2 else 1  # the cores nproc counts
        assert f"--max_steps 1000 --batch_size {32 // processes} --warmup_steps 50" in train_command
        if processes == 2:
            assert "-m torch.distributed.run --standalone --nproc_per_node 2 train_dalle.py" in train_command


def test_amp_resolves_per_cpu_kind_and_a_step_runs(cpu_kind, tiny_vqgan, tmp_path, capsys):
    expected = "bf16" if cpu_kind == "native_bf16" else None
    assert resolve_precision(True, "cpu").dtype == expected
    assert resolve_precision(True, "cpu", "bf16").dtype == "bf16"  # asked for by name: on either kind
    assert resolve_precision(False, "cpu").dtype is None
    result = train(tiny_config(tiny_vqgan, tmp_path, amp=True, max_steps=2), TINY_MODEL)
    assert result.step == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
    summary = capsys.readouterr().err
    assert ("cpu, bf16," in summary) == (expected == "bf16"), summary
    assert ("no native bfloat16 on this CPU" in summary) == (expected is None), summary


def test_packed_bf16_products_equal_f_linear_on_either_kind(cpu_kind):
    """The native branch prepacks the weight for oneDNN; on a CPU that refuses (an AVX2 machine told it has bf16)
    the product falls back to F.linear. Either way the numbers are F.linear's in bfloat16."""
    torch.manual_seed(0)
    layer = Linear(64, 48)
    x = torch.randn(4, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.linear(x, layer.weight, layer.bias)
        with packed_linears(layer, rows=4):
            assert layer.packed.bf16_packable == (cpu_kind == "native_bf16")
            packed = layer(x)
    assert packed.dtype == torch.bfloat16
    assert torch.equal(packed, expected)


def test_the_vae_trainer_precision_per_cpu_kind_and_a_step_runs(cpu_kind, tmp_path):
    expected = "bf16" if cpu_kind == "native_bf16" else "fp32"
    assert vae_train.resolve_precision("auto", torch.device("cpu")) == (torch.bfloat16 if expected == "bf16"
                                                                         else None)
    tiny = dict(image_size=16, n_embed=16, embed_dim=8, z_channels=32, ch=32, ch_mult=(1, 2), num_res_blocks=1,
                batch_size=2, val_size=2, warmup_steps=1, val_every=0, sample_every=0, save_every=0, threads=1,
                progress=False, precision="auto")
    metrics = vae_train.train_vae(vae_train.VAETrainConfig(steps=1, out_dir=str(tmp_path), **tiny))
    assert metrics["precision"] == expected and metrics["steps_this_run"] == 1


# ---------------------------------------------------------------- the demo on CUDA GPUs, decided without one

@pytest.mark.parametrize("gpus,processes", [(1, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("native_bf16", [True, False])
def test_the_demo_trains_on_the_gpus_one_process_each_whatever_the_cpu(cpu_kind, gpus, processes, native_bf16):
    """DEMO_GPUS / DEMO_GPU_BF16 stand in for the probes. One GPU is one process on either kind of CPU (an AVX2 CPU's
    two-process recipe once started rank 1 on cuda:1 of a one-GPU machine); several split the batch of 64."""
    out = demo_run({CPU_BF16_VARIABLE: KINDS[cpu_kind], "DEMO_GPUS": str(gpus), "DEMO_GPU_BF16": str(int(native_bf16))})
    dtype = "bf16" if native_bf16 else "fp16"
    how = "bf16 autocast" if native_bf16 else "fp16 autocast with dynamic loss scaling"
    assert f"[demo] CUDA: training on {processes} of {gpus} GPU(s), one process each, 1800 steps of global batch " \
           f"64 under {how}" in out.stdout
    train_command, generate_command = commands(out)
    assert f"train_dalle.py --output_dir runs/dalle --device cuda --amp --amp_dtype {dtype}" in train_command
    assert "--device cuda" in generate_command
    if processes == 1:
        assert train_command.startswith(f"{sys.executable} train_dalle.py") and "--batch_size" not in train_command
    else:
        assert f"-m torch.distributed.run --standalone --nproc_per_node {processes} train_dalle.py" in train_command
        assert train_command.endswith(f"--batch_size {64 // processes}")


@pytest.mark.parametrize("settings,message", [
    ({"DEMO_GPUS": "two"}, "[demo] DEMO_GPUS=two: give the number of CUDA GPUs to train on (0: the CPU)"),
    ({"DEMO_GPUS": "1", "DEMO_GPU_BF16": "yes"}, "[demo] DEMO_GPU_BF16=yes: set 1 (the GPU computes bfloat16 "
                                                 "natively) or 0, or unset it"),
    ({"DEMO_GPUS": "1", "DEMO_GPU_BF16": "1", "DEMO_PROCESSES": "2"},
     "[demo] DEMO_PROCESSES=2 must divide the batch of 64 and be at most 1"),
    ({"DEMO_GPUS": "8", "DEMO_GPU_BF16": "1", "DEMO_PROCESSES": "3"},
     "[demo] DEMO_PROCESSES=3 must divide the batch of 64 and be at most 8"),
])
def test_the_demo_refuses_gpu_settings_it_cannot_follow(settings, message):
    out = demo_run(settings)
    assert out.returncode == 2 and out.stderr == message + "\n" and "would run" not in out.stdout


def test_amp_on_cuda_is_bf16_only_where_the_gpu_computes_it(monkeypatch):
    from dalle_lab.training import precision

    for native, dtype in ((True, "bf16"), (False, "fp16")):
        monkeypatch.setattr(precision, "cuda_has_native_bf16", lambda device=None, native=native: native)
        chosen = resolve_precision(True, "cuda")
        assert chosen.dtype == dtype and chosen.needs_loss_scaling == (dtype == "fp16")
    assert resolve_precision(True, "cuda", "bf16").dtype == "bf16"  # asked for by name: on any GPU


@pytest.mark.parametrize("capability,hip,native", [((7, 0), None, False), ((7, 5), None, False),
                                                   ((8, 0), None, True), ((9, 0), None, True),
                                                   ((9, 0), "6.2", True), ((7, 0), "6.2", True)])
def test_native_bf16_on_a_gpu_means_compute_capability_8_or_rocm(monkeypatch, capability, hip, native):
    """torch.cuda.is_bf16_supported() says yes to a V100 or T4 too (emulation); the demo and --amp must not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert cuda_has_native_bf16() is native
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_has_native_bf16() is False
