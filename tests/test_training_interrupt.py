"""Interrupting train_dalle.py as a user (or the machine) does: SIGKILL at a step after the first checkpoint (the
steps since that checkpoint are lost), or Ctrl-C, then --resume. The final weights equal the uninterrupted run's
(float32, within 1e-6).

No test waits a guessed time: the interrupted run is started with DALLE_LAB_HOLD_AFTER_STEP=k (a test hook in
dalle_lab/training/interrupt.py), which holds it after step k until the signal arrives, so the run can never finish
first on a fast machine. k is drawn from a generator seeded with the test's name: a failure repeats."""
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dalle_lab.tokenizers import DEFAULT_BPE_PATH
from dalle_lab.training.interrupt import HOLD_VARIABLE
from test_cli import ROOT, script_main, vqgan_flags
from test_training_resume import assert_same_weights, two_caption_folder

slow = pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                          reason="starts a training process (~20 s on 2 busy cores); set DALLE_LAB_SLOW_TESTS=1")

SAVE_EVERY = 3
RANDOM_FLAGS = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16", "--null_cond_prob", "0.5",
                "--attn_dropout", "0.2", "--ff_dropout", "0.2", "--warmup_steps", "2", "--sample_every_n_steps", "0",
                "--log_every_n_steps", "1", "--no-progress", "--no-amp", "--batch_size", "2", "--seed", "7",
                "--save_every_n_steps", str(SAVE_EVERY)]
WAIT_TIMEOUT = 1200  # s: only a bound on a hung run; the tests wait for events, never for a time


# Set in this process by earlier in-process distributed tests (MASTER_PORT especially): a child that inherited them
# would bind the same port as its concurrently running sibling and die before its first step.
DISTRIBUTED_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def child_env(hold_after_step: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES and k != HOLD_VARIABLE}
    if hold_after_step is not None:
        env[HOLD_VARIABLE] = str(hold_after_step)
    return {**env, "OMP_NUM_THREADS": "1"}


def hold_step(test_name: str, max_steps: int) -> int:
    """The step the interrupted run is held after: past the first checkpoint, before the last step."""
    return random.Random(test_name).randrange(SAVE_EVERY, max_steps)


def expected_stop(sig, held_at: int) -> int:
    """The step the interrupted run's checkpoint holds: Ctrl-C saves the step it stopped at; SIGKILL loses the steps
    since the last periodic checkpoint."""
    return held_at if sig == signal.SIGINT else held_at - held_at % SAVE_EVERY


def wait_until_held(process, out: Path, step: int, ranks: int = 1) -> None:
    """Wait for every rank's marker of the hold after `step` (or for the process to end, which is a failure)."""
    markers = [out / f"held-after-step-{step}.rank{rank}" for rank in range(ranks)]
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not all(marker.exists() for marker in markers):
        assert process.poll() is None, f"the run ended (code {process.returncode}) before it reached step {step}"
        assert time.monotonic() < deadline, f"no hold after step {step} within {WAIT_TIMEOUT} s"
        time.sleep(0.01)


def start(*args, hold_after_step=None):
    return subprocess.Popen([sys.executable, str(ROOT / "train_dalle.py"), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=child_env(hold_after_step))


def interrupt_while_held(args, out, sig, held_at):
    """Start a run held after step `held_at`, send `sig` once it is held; (returncode, stderr)."""
    process = start(*args, hold_after_step=held_at)
    try:
        wait_until_held(process, out, held_at)
    except AssertionError:
        process.kill()
        _, stderr = process.communicate(timeout=60)
        raise AssertionError(stderr[-3000:])
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=WAIT_TIMEOUT)
    return process.returncode, stderr


def check_interrupted(out: Path, code: int, output: str, sig, held_at: int) -> int:
    """The interrupted run stopped as the signal says, with the step it should have saved; that step."""
    stopped_at = torch.load(out / "dalle.pt", weights_only=True)["step"]
    assert stopped_at == expected_stop(sig, held_at), (stopped_at, held_at, output[-3000:])
    if sig == signal.SIGINT:  # a clean stop: exit code 130, the step it stopped at is saved
        assert code == 130 and f"step {stopped_at} saved" in output, output[-3000:]
    else:
        assert code == -signal.SIGKILL, output[-3000:]
    return stopped_at


def check_interrupted_run_resumes_exactly(tiny_vqgan, tmp_path, capsys, data_flags, sig, max_steps=16):
    # a folder's or shards' run names its vocabulary: the shipped one (these captions are Shapes captions)
    args = [*vqgan_flags(tiny_vqgan), "--bpe_path", DEFAULT_BPE_PATH, *RANDOM_FLAGS, *data_flags, "--max_steps",
            max_steps]
    assert script_main("train_dalle.py", *args, "--output_dir", tmp_path / "straight") == 0
    out = tmp_path / "interrupted"
    held_at = hold_step(os.environ.get("PYTEST_CURRENT_TEST", ""), max_steps)
    code, stderr = interrupt_while_held([*args, "--output_dir", out], out, sig, held_at)
    stopped_at = check_interrupted(out, code, stderr, sig, held_at)
    capsys.readouterr()
    # the resume runs in this process (a fresh interpreter costs seconds of imports; argv is parsed the same way)
    assert script_main("train_dalle.py", *args, "--output_dir", out, "--resume") == 0
    assert f"at step {stopped_at}" in capsys.readouterr().err  # "resumed ... at step k"
    final = {name: torch.load(path / "dalle.pt", weights_only=True) for name, path in
             (("straight", tmp_path / "straight"), ("resumed", out))}
    assert final["straight"]["step"] == final["resumed"]["step"] == max_steps
    assert_same_weights(final["straight"]["model"], final["resumed"]["model"], atol=1e-6)
    # the metrics file was cut back to the resumed step: each step once, in order
    steps = [json.loads(line)["step"] for line in (out / "dalle-metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, max_steps + 1)), (held_at, stopped_at)


@slow
def test_sigkill_then_resume_on_shapes(tiny_vqgan, tmp_path, capsys):
    check_interrupted_run_resumes_exactly(tiny_vqgan, tmp_path, capsys, [], signal.SIGKILL)


@slow
def test_sigkill_then_resume_on_a_folder_with_caption_dropout_two_captions_and_workers(tiny_vqgan, tmp_path,
                                                                                    capsys):
    folder = two_caption_folder(tmp_path / "data", n=8)
    check_interrupted_run_resumes_exactly(tiny_vqgan, tmp_path, capsys,
                                          ["--image_text_folder", folder, "--num_workers", 2], signal.SIGKILL)


@slow
def test_ctrl_c_stops_at_a_step_boundary_saves_and_resumes(tiny_vqgan, tmp_path, capsys):
    folder = two_caption_folder(tmp_path / "data", n=8)
    check_interrupted_run_resumes_exactly(tiny_vqgan, tmp_path, capsys,
                                          ["--image_text_folder", folder, "--num_workers", 2, "--ga_steps", 2],
                                          signal.SIGINT)


def test_a_stop_request_mid_step_finishes_the_step_and_saves_it(tiny_vqgan, tmp_path, monkeypatch):
    """In-process: the signal arrives during the second micro-batch of step 2; steps 1-2 run, step 2 is saved."""
    from dalle_lab.model import DALLE
    from dalle_lab.training.loop import train

    from test_training import tiny_config

    original, calls = DALLE.forward, {"n": 0}

    def forward(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # micro-batch 2 of step 2
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DALLE, "forward", forward)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs as a background job of a shell
    result = train(tiny_config(tiny_vqgan, tmp_path, max_steps=6, ga_steps=2, batch_size=2),
                   dict(dim=32, depth=1, heads=2, dim_head=16))
    assert result.stopped_because == "interrupted" and result.step == 2
    ckpt = torch.load(tmp_path / "dalle.pt", weights_only=True)
    assert ckpt["step"] == 2 and ckpt["data_position"]["samples"] == 2 * 2 * 2  # both micro-batches counted
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


@slow
def test_sigkill_then_resume_on_webdataset_shards(tiny_vqgan, tmp_path, capsys):
    from test_training_resume import two_caption_shards

    pattern = two_caption_shards(tmp_path / "shards", n=8, per_shard=2)
    check_interrupted_run_resumes_exactly(tiny_vqgan, tmp_path, capsys,
                                          ["--image_text_folder", pattern, "--wds", "png,txt", "--num_workers", 2],
                                          signal.SIGKILL)



def torchrun(*args, log, hold_after_step=None):
    """Two training processes under torchrun; output goes to the file `log` (a pipe nobody reads could fill and stall
    the run)."""
    from dalle_lab.training.distributed import free_port

    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(free_port()), str(ROOT / "train_dalle.py"), *map(str, args)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env=child_env(hold_after_step))


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants, as when the machine goes down. torchrun starts its workers in
    sessions of their own, so killing its process group would leave them running (and finishing the run)."""
    import psutil

    parent = psutil.Process(pid)
    parent.suspend()  # no new worker starts while the tree is collected
    for process in [*parent.children(recursive=True), parent]:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


@slow
def test_two_processes_killed_then_resumed_end_like_the_straight_two_process_run(tiny_vqgan, tmp_path):
    max_steps = 30
    args = [*vqgan_flags(tiny_vqgan), *RANDOM_FLAGS, "--max_steps", max_steps]
    straight = torchrun(*args, "--output_dir", tmp_path / "straight", log=tmp_path / "straight.log")
    assert straight.wait(timeout=300) == 0, (tmp_path / "straight.log").read_text()[-3000:]
    out = tmp_path / "interrupted"
    held_at = hold_step("two processes killed", max_steps)
    process = torchrun(*args, "--output_dir", out, log=tmp_path / "killed.log", hold_after_step=held_at)
    wait_until_held(process, out, held_at, ranks=2)
    kill_tree(process.pid)  # torchrun and both workers
    process.wait(timeout=60)
    stopped_at = torch.load(out / "dalle.pt", weights_only=True)["step"]
    assert stopped_at == expected_stop(signal.SIGKILL, held_at)
    resumed = torchrun(*args, "--output_dir", out, "--resume", log=tmp_path / "resumed.log")
    code = resumed.wait(timeout=300)
    output = (tmp_path / "resumed.log").read_text()
    assert code == 0, output[-3000:]
    assert f"at step {stopped_at}" in output
    final = {name: torch.load(tmp_path / name / "dalle.pt", weights_only=True) for name in ("straight", "interrupted")}
    assert final["straight"]["step"] == final["interrupted"]["step"] == max_steps
    assert_same_weights(final["straight"]["model"], final["interrupted"]["model"], atol=1e-6)
    steps = [json.loads(line)["step"] for line in (out / "dalle-metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, max_steps + 1)), stopped_at


# ------------------------------------------------------------------ DeepSpeed through the command line

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
DEEPSPEED_STEPS = 40
# ZeRO-2 in float32 (--no-amp in RANDOM_FLAGS); two micro-batches a step, so DeepSpeed's own accumulation counter
# must be at a boundary in every checkpoint
DEEPSPEED_FLAGS = ["--deepspeed", "--zero_stage", "2", "--ga_steps", "2", "--max_steps", DEEPSPEED_STEPS]
DEEPSPEED_TIMEOUT = 1200  # s per run: each takes ~10 s of CPU, but a slow test may share busy cores


def deepspeed_args(tiny_vqgan):
    return [*vqgan_flags(tiny_vqgan), *RANDOM_FLAGS, *DEEPSPEED_FLAGS]


def start_logged(*args, log, hold_after_step=None):
    """`python train_dalle.py ...` with its output in the file `log` (no pipe to fill and stall the run)."""
    with open(log, "w") as file:
        return subprocess.Popen([sys.executable, str(ROOT / "train_dalle.py"), *map(str, args)], stdout=file,
                                stderr=subprocess.STDOUT, cwd=ROOT, env=child_env(hold_after_step))


def finished(process, out: Path, log: Path) -> dict:
    """Wait for a run that must succeed; its final checkpoint."""
    code = process.wait(timeout=DEEPSPEED_TIMEOUT)
    assert code == 0, log.read_text()[-3000:]
    return torch.load(out / "dalle.pt", weights_only=True)


@pytest.fixture(scope="module")
def deepspeed_straight_run(tiny_vqgan, tmp_path_factory):
    """The uninterrupted one-process DeepSpeed run both one-process tests compare with: started when first asked
    for, so it runs alongside the first test's interrupted run (two processes, two cores). Call it for its final
    checkpoint."""
    out = tmp_path_factory.mktemp("deepspeed-straight")
    log = out.parent / f"{out.name}.log"
    process = start_logged(*deepspeed_args(tiny_vqgan), "--output_dir", out, log=log)
    yield lambda: finished(process, out, log)
    if process.poll() is None:
        kill_tree(process.pid)
        process.wait()


def check_deepspeed_cli_interrupt_resumes_exactly(args, tmp_path, launch, straight_run, sig, zero_stage=2):
    """`launch(*args, log=..., hold_after_step=...)` starts the command line (one process, or torchrun); interrupt
    it with `sig` while it is held after a step past its first checkpoint (drawn from a generator seeded with the
    launcher and the signal: a failure repeats), run the same command with --resume, and compare the final weights
    with `straight_run()`'s."""
    out = tmp_path / "interrupted"
    ranks = 2 if launch is torchrun else 1
    held_at = hold_step(f"deepspeed {launch.__name__} {sig.name}", DEEPSPEED_STEPS)
    process = launch(*args, "--output_dir", out, log=tmp_path / "interrupted.log", hold_after_step=held_at)
    wait_until_held(process, out, held_at, ranks)
    if sig == signal.SIGKILL:
        kill_tree(process.pid)  # the process and everything it started (torchrun: both workers), at once
    else:
        process.send_signal(sig)
    code = process.wait(timeout=DEEPSPEED_TIMEOUT)
    output = (tmp_path / "interrupted.log").read_text()
    stopped_at = check_interrupted(out, code, output, sig, held_at)

    log = tmp_path / "resumed.log"
    resumed = finished(launch(*args, "--output_dir", out, "--resume", log=log), out, log)
    assert f"at step {stopped_at}" in log.read_text()  # "resumed ... at step k"
    straight = straight_run()
    for ckpt in (straight, resumed):
        assert ckpt["step"] == DEEPSPEED_STEPS
        assert ckpt["engine"] == "deepspeed" and ckpt["deepspeed"]["zero_stage"] == zero_stage
        assert all(tensor.dtype == torch.float32 for tensor in ckpt["model"].values())
    assert straight["deepspeed"]["world_size"] == resumed["deepspeed"]["world_size"]
    assert_same_weights(straight["model"], resumed["model"], atol=1e-6)
    steps = [json.loads(line)["step"] for line in (out / "dalle-metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, DEEPSPEED_STEPS + 1)), (held_at, stopped_at)


@slow
@needs_deepspeed
def test_deepspeed_zero2_sigkill_then_resume_through_the_command_line(tiny_vqgan, tmp_path, deepspeed_straight_run):
    check_deepspeed_cli_interrupt_resumes_exactly(deepspeed_args(tiny_vqgan), tmp_path, start_logged,
                                                  deepspeed_straight_run, signal.SIGKILL)


@slow
@needs_deepspeed
def test_deepspeed_zero2_ctrl_c_stops_at_a_step_boundary_saves_and_resumes(tiny_vqgan, tmp_path,
                                                                            deepspeed_straight_run):
    check_deepspeed_cli_interrupt_resumes_exactly(deepspeed_args(tiny_vqgan), tmp_path, start_logged,
                                                  deepspeed_straight_run, signal.SIGINT)


@slow
@needs_deepspeed
def test_deepspeed_zero2_two_processes_killed_then_resumed_end_like_the_straight_run(tiny_vqgan, tmp_path):
    """ZeRO-2 across two processes: each rank holds half of the optimizer state, both halves go into the checkpoint
    and come back to their ranks."""
    args = deepspeed_args(tiny_vqgan)
    log = tmp_path / "straight.log"
    straight = finished(torchrun(*args, "--output_dir", tmp_path / "straight", log=log), tmp_path / "straight", log)
    assert straight["deepspeed"]["world_size"] == 2
    # written per rank: rank 1 wrote its own optimizer partition and nothing else, rank 0 the module and its own
    rank0, rank1 = ([name for name, _ in files] for files in straight["deepspeed"]["files"])
    assert [Path(name).name for name in rank1] == ["zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert sorted(Path(name).name for name in rank0) == ["mp_rank_00_model_states.pt",
                                                         "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    check_deepspeed_cli_interrupt_resumes_exactly(args, tmp_path, torchrun, lambda: straight, signal.SIGKILL)
