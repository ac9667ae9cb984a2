"""The documented command `python -m dalle_lab.align` on a tiny checkpoint (tiny taming VQGAN, tiny DALLE), in-process:
both methods run, write their files, resume, and the exported model loads with load_dalle."""
import json

import pytest
import torch

from dalle_lab.align.__main__ import main


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_dalle_checkpoint, tmp_path_factory):
    path = tiny_dalle_checkpoint
    directory = tmp_path_factory.mktemp("prompts")
    prompts = directory / "prompts.txt"
    prompts.write_text("a small red circle at the top left on a white background\n\n"
                       "a red circle above a blue square on a black background\n")
    return path, prompts


TINY = ["--epochs", "1", "--prompts_per_epoch", "2", "--group_size", "2", "--sample_batch_size", "4",
        "--train_batch_size", "4", "--threads", "1", "--eval_num_prompts", "3", "--eval_num_heldout", "2",
        "--eval_loss_images", "4", "--eval_diversity_samples", "2"]


@pytest.mark.parametrize("method,reward", [("policy_gradient", "jpeg_compressibility:1+shapes_faithfulness:0.5"),
                                           ("reward_backprop", "negative_total_variation")])
def test_cli_runs_resumes_and_exports(tiny_checkpoint, tmp_path, method, reward, capsys):
    from dalle_lab.training.checkpoint import load_dalle

    dalle_path, prompts = tiny_checkpoint
    args = ["--dalle_path", str(dalle_path), "--prompts", str(prompts), "--out_dir", str(tmp_path),
            "--method", method, "--reward", reward, *TINY]
    assert main(args) == 0
    assert main(args[:-len(TINY)] + [*TINY[:1], "2", *TINY[2:]]) == 0  # same out_dir, epochs 2: resumes at 1
    assert "resumed" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1] and rows[-1]["images_sampled"] == 8
    dalle, _, _ = load_dalle(tmp_path / "dalle_aligned.pt")
    assert dalle.config.dim == 32
    results = json.loads((tmp_path / "results.json").read_text())  # the in-run evaluation's results file
    assert results["command"][-len(TINY):] == [*TINY[:1], "2", *TINY[2:]] and results["epochs"] == 2
    assert results["stop_reason"] == "epochs: 2 of --epochs 2" and "eval_val_accuracy" in results["final"]
    for name in ("reward_curve.png", "samples_before.png", "samples_after.png", "eval_curve.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_cli_errors_name_the_problem(tiny_checkpoint, tmp_path, capsys):
    dalle_path, _ = tiny_checkpoint
    assert main(["--dalle_path", str(dalle_path), "--prompts", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt" in capsys.readouterr().err
    assert main(["--dalle_path", str(dalle_path), "--method", "reward_backprop", "--out_dir", str(tmp_path),
                 "--reward", "jpeg_compressibility", *TINY]) == 1
    assert "differentiable" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--dalle_path", str(dalle_path), "--method", "nonsense"])


def test_cli_with_deepspeed_resumes_its_engine_state(tiny_checkpoint, tmp_path, capsys):
    pytest.importorskip("deepspeed")
    dalle_path, prompts = tiny_checkpoint
    args = ["--dalle_path", str(dalle_path), "--prompts", str(prompts), "--out_dir", str(tmp_path),
            "--deepspeed_zero_stage", "1", *TINY]
    assert main(args) == 0
    state = torch.load(tmp_path / "align_state.pt", weights_only=True)
    assert state["optimizer"] is None and state["deepspeed"]["zero_stage"] == 1
    assert main(args[:-len(TINY)] + [*TINY[:1], "2", *TINY[2:]]) == 0
    assert "resumed" in capsys.readouterr().out
    # a plain run cannot continue the DeepSpeed state (its optimizer lives in DeepSpeed's files)
    assert main(args[:-len(TINY) - 2] + [*TINY[:1], "3", *TINY[2:]]) == 1
    assert "DeepSpeed" in capsys.readouterr().err


def test_cli_names_prompt_words_the_vocabulary_never_saw(tiny_checkpoint, tmp_path, capsys):
    """Named per prompt, and the run goes on (here to the next check, which stops it cheaply)."""
    dalle_path, _ = tiny_checkpoint
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a violet hexagon under the moon\na red circle above a blue square on a black background\n")
    assert main(["--dalle_path", str(dalle_path), "--prompts", str(prompts), "--out_dir", str(tmp_path / "run"),
                 "--method", "reward_backprop", "--reward", "jpeg_compressibility", *TINY]) == 1
    err = capsys.readouterr().err
    assert ("python -m dalle_lab.align: warning: the text vocabulary does not know these words" in err
            and "'a violet hexagon under the moon': violet, hexagon, under, moon" in err)
    assert "a red circle above" not in err.split("differentiable")[0]  # known words: not named
    assert "differentiable" in err  # the warning did not stop it: the next check did


def test_a_model_of_other_data_is_not_trained_on_shapes_prompts_and_a_bom_is_not_a_word(other_data_checkpoint, tmp_path,
                                                                                        capsys):
    """Default prompts and --prompts heldout are Shapes captions: refused for a model with another vocabulary. A
    prompts file saved with a byte-order mark reads its first caption without it."""
    path = other_data_checkpoint
    for prompts in ([], ["--prompts", "heldout"]):
        assert main(["--dalle_path", str(path), *prompts, "--out_dir", str(tmp_path / "run"), *TINY]) == 1
        assert "not the Shapes vocabulary" in capsys.readouterr().err
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffgrinning face\r\nred heart\r\n".encode("utf-8"))
    held = tmp_path / "held.txt"
    held.write_text("smiling face\n")
    assert main(["--dalle_path", str(path), "--prompts", str(bom), "--reward", "jpeg_compressibility", "--out_dir",
                 str(tmp_path / "run"), *TINY, "--eval_loss_images", "0", "--eval_num_heldout", "0",
                 "--eval_prompts", str(held)]) == 0
    assert "\ufeff" not in capsys.readouterr().err
    assert main(["--dalle_path", str(path), "--prompts", str(bom), "--reward", "jpeg_compressibility", "--out_dir",
                 str(tmp_path / "no_eval"), *TINY, "--eval_loss_images", "0", "--eval_num_heldout", "0",
                 "--eval_num_prompts", "0", "--eval_diversity_samples", "0"]) == 0
    results = json.loads((tmp_path / "no_eval" / "results.json").read_text())  # written without evaluations too
    assert results["stop_reason"].startswith("epochs") and results["final"] is None and results["command"]
