"""DALLE-pytorch 1.6.6 command lines (train_dalle.py, generate.py) on dalle_lab: each flag either does what it did
there (or its intent here) or fails with the one-line message docs/training.md lists. Tiny models, one step."""
import pytest
import torch

from dalle_lab.model import DALLE


def _tiny_dalle(**fields):
    torch.manual_seed(0)
    config = dict(dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=20, text_seq_len=4, num_image_tokens=16,
                  image_fmap_size=2, null_cond_prob=0.0)
    return DALLE(**{**config, **fields})


@pytest.mark.parametrize("dropout,options", [
    (0.0, {}), (0.1, {}),
    # the per-layer masks, rotary angles and token shift go through the recomputation too
    (0.1, dict(attn_types=("axial_row", "conv_like"), rotary_emb=True, shift_tokens=True, image_fmap_size=3)),
])
def test_gradient_checkpointing_gives_the_plain_gradients(dropout, options):
    def grads(checkpointing: bool):
        model = _tiny_dalle(attn_dropout=dropout, ff_dropout=dropout, **options).train()
        model.transformer.gradient_checkpointing = checkpointing
        text = torch.tensor([[3, 4, 5, 0], [6, 0, 0, 0]])
        image = torch.arange(2 * model.config.image_seq_len).reshape(2, -1) % 16
        torch.manual_seed(1)  # the same dropout masks: checkpointing replays the RNG state in the recomputation
        loss = model(text, image, return_loss=True)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    loss_plain, plain = grads(False)
    loss_ckpt, ckpt = grads(True)
    assert torch.equal(loss_plain, loss_ckpt)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=0, atol=1e-6, msg=name)


def test_gradient_checkpointing_recomputes_each_block_only_when_training(monkeypatch):
    import dalle_lab.model.transformer as transformer

    calls = []
    real = transformer.checkpoint
    monkeypatch.setattr(transformer, "checkpoint", lambda *a, **k: calls.append(k) or real(*a, **k))
    model = _tiny_dalle()
    model.transformer.gradient_checkpointing = True
    text, image = torch.tensor([[3, 4, 5, 0]]), torch.tensor([[1, 2, 3, 4]])
    model.train()(text, image, return_loss=True).backward()
    assert len(calls) == 2 and all(k["use_reentrant"] is False for k in calls)  # depth 2: one per block
    calls.clear()
    model.eval()(text, image, return_loss=True)
    with torch.no_grad():
        model.train()(text, image, return_loss=True)
    model.generate_images(text, return_tokens=True)
    assert calls == []


# ------------------------------------------------------------------------------------------------ train_dalle.py

from test_cli import TINY_FLAGS, script_main, vqgan_flags  # noqa: E402

from dalle_lab.model import DALLEConfig  # noqa: E402
from dalle_lab.training.cli import build_train_parser, config_from_args, given_flags  # noqa: E402
from dalle_lab.training.dallepytorch_flags import FlagError, apply_train_flags  # noqa: E402

# the attention and embedding variants are DALLEConfig fields of their own (issue 16 part 2): their flags exist
# once the fields do, so these forms are skipped until then
MODEL_OPTION_FORMS = [
    ("attn_types", ["--attn_types", "full"]),
    ("shift_tokens", ["--shift_tokens"]),
    ("rotary_emb", ["--rotary_emb"]),
    ("shared_attn_ids", ["--shared_attn_ids", "0,1"]),
    ("shared_ff_ids", ["--shared_ff_ids", "0,1"]),
    ("share_input_output_emb", ["--share_input_output_emb"]),
]


def parse(*argv):
    """(cfg, overrides, notes) as train_dalle.py gets them from a command line."""
    args = build_train_parser().parse_args([str(a) for a in argv])
    notes = apply_train_flags(args)
    cfg, overrides = config_from_args(args)
    return cfg, overrides, notes


def train(tmp_path, *argv, name="run", steps=True):
    out = tmp_path / name
    budget = ["--max_steps", "1"] if steps else []
    code = script_main("train_dalle.py", *TINY_FLAGS, *budget, "--batch_size", "2", "--output_dir", out, *argv)
    return code, out / "dalle.pt"


def saved(checkpoint):
    return torch.load(checkpoint, map_location="cpu", weights_only=True)


# the DALLE-pytorch flags that are the same setting here, with a value and where it lands (cfg or model override)
SAME_SETTINGS = [
    (["--image_text_folder", "data"], "image_text_folder", "data"),
    (["--wds", "jpg,txt"], "wds", "jpg,txt"),
    (["--truncate_captions"], "truncate_captions", True),
    (["--bpe_path", "my.model"], "bpe_path", "my.model"),
    (["--vqgan_model_path", "v.ckpt"], "vqgan_model_path", "v.ckpt"),
    (["--vqgan_config_path", "v.yaml"], "vqgan_config_path", "v.yaml"),
    (["--dalle_path", "d.pt"], "dalle_path", "d.pt"),
    (["--dalle_output_file_name", "mine"], "dalle_output_file_name", "mine"),
    (["--amp"], "amp", True),
    (["--wandb_name", "coco"], "wandb_name", "coco"),
    (["--wandb_entity", "team"], "wandb_entity", "team"),
    (["--epochs", "3"], "epochs", 3),
    (["--save_every_n_steps", "7"], "save_every_n_steps", 7),
    (["--keep_n_checkpoints", "3"], "keep_n_checkpoints", 3),
    (["--batch_size", "4"], "batch_size", 4),
    (["--ga_steps", "2"], "ga_steps", 2),
    (["--learning_rate", "3e-4"], "learning_rate", 3e-4),
    (["--clip_grad_norm", "0.5"], "clip_grad_norm", 0.5),
    (["--lr_decay"], "lr_decay", "plateau"),
    (["--random_resize_crop_lower_ratio", "0.75"], "random_resize_crop_lower_ratio", 0.75),
    (["--flops_profiler", "--deepspeed"], "flops_profiler", True),
    (["--deepspeed"], "deepspeed", True),
    (["--distributed_backend", "deepspeed"], "deepspeed", True),
    (["--distributed_backend", "DeepSpeed"], "deepspeed", True),
    (["--distr_backend", "deepspeed"], "deepspeed", True),
    (["--deepspeed_config", "ds.json"], "deepspeed_config", "ds.json"),
    (["--local_rank", "0"], "deepspeed", False),
    (["--dim", "512"], "dim", 512),
    (["--text_seq_len", "256"], "text_seq_len", 256),
    (["--depth", "2"], "depth", 2),
    (["--heads", "8"], "heads", 8),
    (["--dim_head", "64"], "dim_head", 64),
    (["--ff_dropout", "0.1"], "ff_dropout", 0.1),
    (["--attn_dropout", "0.1"], "attn_dropout", 0.1),
    (["--loss_img_weight", "7"], "loss_img_weight", 7.0),
    (["--stable_softmax"], "stable", True),
    (["--reversible"], "gradient_checkpointing", True),
    (["--fp16"], "amp", True),
    (["--taming"], "vqgan_model_path", None),
]


@pytest.mark.parametrize("argv, name, value", SAME_SETTINGS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_each_dallepytorch_train_flag_sets_its_setting(argv, name, value):
    cfg, overrides, _ = parse(*argv)
    got = overrides[name] if name in overrides else getattr(cfg, name)
    assert got == value


@pytest.mark.parametrize("field, argv", MODEL_OPTION_FORMS, ids=[f for f, _ in MODEL_OPTION_FORMS])
def test_attention_and_embedding_variants_are_model_options(field, argv):
    import dataclasses

    if field not in {f.name for f in dataclasses.fields(DALLEConfig)}:
        pytest.skip(f"DALLEConfig has no {field} yet: handled by the model options (issue 16 part 2)")
    _, overrides, _ = parse(*argv)
    assert field in overrides


ONE_LINE_ERRORS = [
    (["--distributed_backend", "horovod"], "--distributed_backend horovod is not supported: launch processes with "
                                           "torchrun"),
    (["--distributed_backend", "gloo"], "--distributed_backend 'gloo': choose deepspeed"),
    (["--chinese"], "--chinese: no Chinese vocabulary ships with dalle_lab: train one on your captions with python -m "
                    "dalle_lab.tokenizers.train"),
    (["--vae_path", "vae.pt"], "--vae_path vae.pt: not a VQGAN (.ckpt beside its .yaml, or train_vae.py's folder) nor "
                               "a DALLE-pytorch DiscreteVAE .pt"),
    (["--flops_profiler"], "--flops_profiler is DeepSpeed's flops profiler: add --deepspeed"),
    (["--fp16", "--no-amp"], "--fp16 asks for fp16 mixed precision but --no-amp"),
    (["--fp16", "--amp_dtype", "bf16"], "--fp16 asks for fp16 mixed precision but --no-amp or --amp_dtype bf16"),
]


@pytest.mark.parametrize("argv, message", ONE_LINE_ERRORS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_flags_that_cannot_apply_fail_in_one_line(argv, message, capsys):
    with pytest.raises(FlagError, match="^" + __import__("re").escape(message)) as err:
        parse(*argv)
    assert "\n" not in str(err.value)
    assert script_main("train_dalle.py", *argv) == 2  # the command line says the same, before any work
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines == [f"train_dalle.py: error: {err.value}"]


def test_hug_reads_json_and_refuses_a_youtokentome_model(tmp_path):
    from dalle_lab.tokenizers import DEFAULT_BPE_PATH, train_bpe

    json_vocab = tmp_path / "vocab"  # no suffix: DALLE-pytorch's --hug is what says it is a tokenizers JSON
    train_bpe(["a red circle", "a blue square"], 40, tmp_path / "v.json")
    json_vocab.write_bytes((tmp_path / "v.json").read_bytes())
    cfg, _, notes = parse("--hug", "--bpe_path", json_vocab)
    assert cfg.bpe_path == str(json_vocab) and notes == []
    from dalle_lab.tokenizers import get_tokenizer

    assert get_tokenizer(cfg.bpe_path).kind == "hf"
    with pytest.raises(FlagError, match="--hug: --bpe_path .* is not a HuggingFace tokenizers JSON file"):
        parse("--hug", "--bpe_path", DEFAULT_BPE_PATH)
    _, _, notes = parse("--hug")
    assert "the default vocabulary is used" in notes[0]
    _, _, notes = parse("--chinese", "--bpe_path", json_vocab)
    assert "--bpe_path gives the vocabulary" in notes[0]


def test_resume_knows_which_settings_the_translated_flags_gave():
    given = given_flags(["--fp16", "--stable_softmax", "--reversible", "--distr_backend", "deepspeed"])
    assert {"amp", "amp_dtype", "stable", "gradient_checkpointing", "deepspeed"} <= given


def test_epochs_alone_end_the_run_as_in_dallepytorch():
    from dalle_lab.training.cli import epochs_end_the_run

    argv = ["--epochs", "20", "--image_text_folder", "data"]
    cfg, _, _ = parse(*argv)
    assert epochs_end_the_run(cfg, given_flags(argv)).max_steps is None
    argv += ["--max_steps", "5"]
    cfg, _, _ = parse(*argv)
    assert epochs_end_the_run(cfg, given_flags(argv)).max_steps == 5


def test_fp16_reversible_stable_softmax_taming_train_one_step(tiny_vqgan, tmp_path, capsys, monkeypatch):
    import dalle_lab.model.transformer as transformer

    recomputed = []
    real = transformer.checkpoint
    monkeypatch.setattr(transformer, "checkpoint", lambda *a, **k: recomputed.append(1) or real(*a, **k))
    code, checkpoint = train(tmp_path, *vqgan_flags(tiny_vqgan), "--fp16", "--reversible", "--stable_softmax",
                             "--taming", "--loss_img_weight", "7")
    assert code == 0
    err = capsys.readouterr().err
    assert "--fp16: the CPU has no fast fp16 kernels" in err and "--amp's CPU choice" in err
    assert "--reversible: reversible layers are not implemented; --gradient_checkpointing is used instead" in err
    assert "--taming: the VQGAN is dalle_lab's only image tokenizer" in err
    assert recomputed  # the training step went through the checkpointed blocks
    ckpt = saved(checkpoint)
    assert ckpt["config"]["stable"] is True
    assert ckpt["train_config"]["gradient_checkpointing"] is True
    assert ckpt["train_config"]["amp"] is True and ckpt["train_config"]["amp_dtype"] == "auto"


def test_vae_path_names_a_train_vae_vqgan(tiny_vqgan, tmp_path, capsys):
    model, config = tiny_vqgan
    folder = tmp_path / "vae_out"  # what train_vae.py writes: <out_dir>/vqgan.ckpt + vqgan.yaml
    folder.mkdir()
    (folder / "vqgan.ckpt").write_bytes(model.read_bytes())
    (folder / "vqgan.yaml").write_bytes(config.read_bytes())
    cfg, _, notes = parse("--vae_path", folder)
    assert (cfg.vqgan_model_path, cfg.vqgan_config_path) == (str(folder / "vqgan.ckpt"), str(folder / "vqgan.yaml"))
    cfg, _, _ = parse("--vae_path", folder / "vqgan.ckpt")
    assert cfg.vqgan_config_path == str(folder / "vqgan.yaml")
    code, checkpoint = train(tmp_path, "--vae_path", folder)
    assert code == 0 and saved(checkpoint)["vae"]["model_path"].endswith("vqgan.ckpt")
    with pytest.raises(FlagError, match="give only --vqgan_model_path"):
        parse("--vae_path", folder, *vqgan_flags(tiny_vqgan))


def test_vae_path_names_a_dallepytorch_discrete_vae(tmp_path):
    from dalle_lab.vae import DiscreteVAE

    path = DiscreteVAE(image_size=32, num_layers=2, num_tokens=16, codebook_dim=8, hidden_dim=8).save(tmp_path / "v.pt")
    cfg, _, notes = parse("--vae_path", path)
    assert cfg.discrete_vae_path == str(path) and "DiscreteVAE" in notes[0]
    code, checkpoint = train(tmp_path, "--vae_path", path)
    assert code == 0 and saved(checkpoint)["vae"]["kind"] == "dallepytorch_discrete_vae"


def _image_folder(root, count=4, size=(48, 40)):
    from PIL import Image

    root.mkdir()
    for i in range(count):
        Image.new("RGB", size, (60 * i, 100, 200 - 40 * i)).save(root / f"{i}.png")
        (root / f"{i}.txt").write_text(f"a red circle {i}\n")
    return root


def test_random_resize_crop_lower_ratio_trains_on_folders_and_is_refused_elsewhere(tiny_vqgan, tmp_path, capsys):
    folder = _image_folder(tmp_path / "data")
    from dalle_lab.tokenizers import DEFAULT_BPE_PATH

    code, checkpoint = train(tmp_path, *vqgan_flags(tiny_vqgan), "--image_text_folder", folder, "--epochs", "1",
                             "--bpe_path", DEFAULT_BPE_PATH,
                             "--random_resize_crop_lower_ratio", "0.75", "--truncate_captions", steps=False)
    assert code == 0
    assert saved(checkpoint)["train_config"]["random_resize_crop_lower_ratio"] == 0.75
    assert saved(checkpoint)["train_config"]["max_steps"] is None  # --epochs alone ended it (2 steps of 2)
    assert saved(checkpoint)["step"] == 2
    code, _ = train(tmp_path, *vqgan_flags(tiny_vqgan), "--random_resize_crop_lower_ratio", "0.75", name="shapes")
    assert code == 1
    assert "--random_resize_crop_lower_ratio 0.75 applies to image-text folders" in capsys.readouterr().err


def test_random_square_crop_is_seeded_and_covers_the_lower_ratio():
    import random

    from PIL import Image

    from dalle_lab.data.transforms import pil_to_tensor, random_square_crop

    image = Image.effect_noise((60, 40), 50).convert("RGB")
    crops = [pil_to_tensor(random_square_crop(image, 16, 0.5, random.Random(seed))) for seed in (1, 1, 2)]
    assert crops[0].shape == (3, 16, 16)
    assert torch.equal(crops[0], crops[1]) and not torch.equal(crops[0], crops[2])
    sides = []

    class Spy(random.Random):
        def randint(self, a, b):
            if not hasattr(self, "seen"):  # the first draw is the left edge: its range gives the crop's side
                self.seen = sides.append(image.size[0] - b)
            return super().randint(a, b)

    for seed in range(200):
        random_square_crop(image, 16, 0.5, Spy(seed))
    assert min(sides) >= round(40 * 0.5 ** 0.5) and max(sides) <= 40 and min(sides) < 32 < max(sides)
    with pytest.raises(ValueError, match="must be in \\(0, 1\\]"):
        random_square_crop(image, 16, 1.5, random.Random(0))


def test_folder_crops_follow_the_caption_draw_not_the_worker(tmp_path):
    from dalle_lab.data import TextImageFolder

    folder = _image_folder(tmp_path / "data", count=1, size=(64, 32))
    from PIL import Image

    Image.effect_noise((64, 32), 60).convert("RGB").save(folder / "0.png")
    dataset = TextImageFolder(folder, image_size=16, crop_lower_ratio=0.6)
    a, b, c = (dataset.get(0, caption_draw=d)[0] for d in (7, 7, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    centre = TextImageFolder(folder, image_size=16)
    assert torch.equal(centre.get(0, caption_draw=7)[0], centre.get(0, caption_draw=8)[0])


def test_flops_profiler_fills_the_deepspeed_config():
    from dalle_lab.training.deepspeed_engine import build_deepspeed_config
    from dalle_lab.training.precision import Precision

    config = build_deepspeed_config({}, batch_size=2, ga_steps=1, world_size=1, clip_grad_norm=0.5,
                                    precision=Precision("cpu", None), flops_profile_step=4)
    assert config["flops_profiler"] == {"enabled": True, "profile_step": 4, "module_depth": -1, "top_modules": 1,
                                        "detailed": True}
    user = {"flops_profiler": {"enabled": True, "profile_step": 9}}
    assert build_deepspeed_config(user, batch_size=2, ga_steps=1, world_size=1, clip_grad_norm=0.5,
                                  precision=Precision("cpu", None), flops_profile_step=4)["flops_profiler"] == \
        user["flops_profiler"]  # the user's section wins, as every other key does
    assert "flops_profiler" not in build_deepspeed_config({}, batch_size=2, ga_steps=1, world_size=1,
                                                          clip_grad_norm=0.5, precision=Precision("cpu", None))


def test_flops_profiler_with_deepspeed_prints_the_report(tiny_vqgan, tmp_path, capfd):
    pytest.importorskip("deepspeed")
    code, _ = train(tmp_path, *vqgan_flags(tiny_vqgan), "--distributed_backend", "deepspeed", "--flops_profiler",
                    "--no-amp")
    assert code == 0
    assert "Flops Profiler" in capfd.readouterr().out


# ------------------------------------------------------------------------------------------------ generate.py

from test_cli import generate_main  # noqa: E402

WORDS = ["a red green blue purple yellow circle square triangle above below left right of"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_vqgan):
    """A one-step checkpoint trained with its own vocabulary and its own copy of the VQGAN (so tests can move them)."""
    from dalle_lab.tokenizers import train_bpe

    root = tmp_path_factory.mktemp("trained")
    files = root / "files"
    files.mkdir()
    train_bpe(WORDS, 60, files / "words.json")
    for source, name in zip(tiny_vqgan, ("vq.ckpt", "vq.yaml")):
        (files / name).write_bytes(source.read_bytes())
    code, checkpoint = train(root, "--bpe_path", files / "words.json", "--vqgan_model_path", files / "vq.ckpt",
                             "--vqgan_config_path", files / "vq.yaml", "--truncate_captions")
    assert code == 0
    return checkpoint, files


def manifest(folder):
    import json

    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("top_k, k", [("0.9", 6), ("0.5", 32), ("10", 10), ("1.0", 1), ("0", None)])
def test_top_k_is_a_count_or_dallepytorchs_threshold(trained, tmp_path, top_k, k):
    checkpoint, _ = trained
    out = tmp_path / "out"
    assert generate_main("--dalle_path", checkpoint, "--text", "a red circle", "--num_images", "2", "--batch_size",
                         "1", "--top_k", top_k, "--outputs_dir", out) == 0
    records = manifest(out)
    assert len(records) == 2 and {r["top_k"] for r in records} == {k}  # 64 image tokens: 0.9 keeps int(6.4)
    assert (out / records[0]["file"]).is_file()


@pytest.mark.parametrize("top_k", ["2.5", "-1", "ten"])
def test_a_top_k_that_is_neither_fails_in_one_line(trained, top_k, capsys):
    with pytest.raises(SystemExit) as exit_:
        generate_main("--dalle_path", trained[0], "--text", "a red circle", "--top_k", top_k)
    assert exit_.value.code == 2
    assert f"argument --top_k: {top_k!r}: give a count (an integer >= 1, 0 for none) or DALLE-pytorch's filter " \
           "threshold in (0, 1) (0.9 keeps the likeliest 10% of image tokens)\n" in capsys.readouterr().err


def test_moved_vocabulary_and_vqgan_are_pointed_at(trained, tmp_path, capsys):
    checkpoint, files = trained
    moved = tmp_path / "moved"
    files.rename(moved)
    try:
        args = ["--dalle_path", checkpoint, "--text", "a red circle", "--num_images", "1", "--outputs_dir", tmp_path]
        assert generate_main(*args) == 1
        assert "copy that file here and pass it with --bpe_path" in capsys.readouterr().err
        assert generate_main(*args, "--bpe_path", moved / "words.json") == 1
        err = capsys.readouterr().err
        assert "copy that VQGAN here and pass it with --vqgan_model_path/--vqgan_config_path" in err
        assert generate_main(*args, "--bpe_path", moved / "words.json", "--vqgan_model_path", moved / "vq.ckpt",
                             "--vqgan_config_path", moved / "vq.yaml") == 0
        assert generate_main(*args, "--bpe_path", moved / "nowhere.json") == 1
        assert "--bpe_path " in capsys.readouterr().err
        assert generate_main(*args, "--bpe_path", moved / "words.json", "--vqgan_model_path", moved / "vq.ckpt") == 2
        assert "give both --vqgan_model_path (.ckpt) and --vqgan_config_path" in capsys.readouterr().err
    finally:
        moved.rename(files)


def test_another_vocabulary_is_refused_even_when_pointed_at(trained, tmp_path, capsys):
    from dalle_lab.tokenizers import DEFAULT_BPE_PATH

    assert generate_main("--dalle_path", trained[0], "--text", "a red circle", "--bpe_path", DEFAULT_BPE_PATH,
                         "--outputs_dir", tmp_path) == 1
    assert "has changed since the checkpoint was written" in capsys.readouterr().err


def test_hug_chinese_taming_in_generate(trained, tmp_path, capsys):
    from dalle_lab.tokenizers import DEFAULT_BPE_PATH

    checkpoint, files = trained
    base = ["--dalle_path", checkpoint, "--text", "a red circle", "--num_images", "1", "--outputs_dir", tmp_path]
    assert generate_main(*base, "--hug", "--bpe_path", files / "words.json", "--chinese", "--taming") == 0
    err = capsys.readouterr().err
    assert "--taming: the VQGAN is dalle_lab's only image tokenizer" in err
    assert generate_main(*base, "--chinese", "--overwrite") == 0  # the same caption folder again: replaced
    assert "--chinese: the checkpoint's recorded vocabulary is used" in capsys.readouterr().err
    assert generate_main(*base, "--hug", "--bpe_path", DEFAULT_BPE_PATH) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a HuggingFace tokenizers JSON file: drop --hug" in err[0]


def test_gentxt_completes_the_caption_then_draws_it(trained, tmp_path, capsys):
    checkpoint, _ = trained
    out = tmp_path / "out"
    args = ["--dalle_path", checkpoint, "--text", "a red|a blue|a green", "--num_images", "1", "--top_k", "0.5",
            "--gentxt", "--outputs_dir", out]
    assert generate_main(*args) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("completed caption:")]
    completed = [line.split(" -> ", 1)[1][1:-1] for line in lines]
    assert [c.startswith(given) for c, given in zip(completed, ["a red", "a blue", "a green"])] == [True] * 3
    assert completed != ["a red", "a blue", "a green"]  # an untrained text head rarely ends at once (p ~ 1/30)
    assert [r["caption"] for r in manifest(out)] == completed  # the images are drawn for the completed captions
    assert generate_main(*args[:-1], tmp_path / "again") == 0  # the same seed, the same completions
    assert [l for l in capsys.readouterr().out.splitlines() if l.startswith("completed caption:")] == lines


def test_generate_texts_keeps_the_prefix_and_samples_only_real_tokens_or_the_end():
    from dalle_lab.generate.text import generate_texts

    model = _tiny_dalle(text_seq_len=6).eval()
    V = model.config.num_text_tokens
    text = torch.tensor([[5, 6, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [7, 8, 9, 10, 11, 12]])
    generator = torch.Generator().manual_seed(0)
    filled = generate_texts(model, text, temperature=1.0, generator=generator)
    assert filled[0, :2].tolist() == [5, 6] and torch.equal(filled[2], text[2])
    assert ((filled >= 0) & (filled < V)).all()
    for row in filled.tolist():  # a caption, then only pads: nothing after its end
        end = row.index(0) if 0 in row else len(row)
        assert all(i != 0 for i in row[:end]) and all(i == 0 for i in row[end:])
    with torch.no_grad():  # a text head that always ends: the caption stays as given
        bias = model.to_text_logits.bias
        bias[V:] += 100
        assert torch.equal(generate_texts(model, text), text)
        bias[V:] -= 100
        bias[9] += 100  # ... and one that always says 9: every open position gets it
        assert generate_texts(model, text)[0].tolist() == [5, 6, 9, 9, 9, 9]
