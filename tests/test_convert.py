"""Converting DALLE-pytorch checkpoints (dalle_lab.convert), without dalle-pytorch installed.

tests/data/dallepytorch/ holds tiny checkpoints that dalle-pytorch 1.6.6 itself wrote in its train_dalle.py format
(every weight drawn at random), with the logits and loss it computed for a batch, and its DiscreteVAE's codes and
decodings. Regenerate in the peer environment (lab/perf/peer_env.py):
    .peer-venv/bin/python tests/dallepytorch_reference.py tests/data/dallepytorch/job.json tests/data/dallepytorch
Numbers are compared within float32 tolerances (1e-5), never bit for bit. tests/test_convert_reference.py runs more
option sets against the live peer.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch

from dalle_lab.convert import ConversionError, Sources, convert_file, load_dallepytorch
from dalle_lab.convert.__main__ import main as convert_main

DATA = Path(__file__).parent / "data" / "dallepytorch"
CASES = sorted(json.loads((DATA / "job.json").read_text())["cases"])
VOCAB = DATA / "text.model"


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _check_same_function(model, name):
    ref = torch.load(DATA / f"{name}.out.pt", weights_only=True)
    T, V = model.config.text_seq_len, model.config.total_text_tokens
    with torch.no_grad():
        logits = model(ref["text"], ref["image"])
        _close(logits[:, :T, :V], ref["logits"][:, :T, :V])
        _close(logits[:, T:, V:], ref["logits"][:, T:, V:])
        _close(logits, ref["logits"])  # the joint tensor as DALLE-pytorch returns it, masked entries included
        _close(model(ref["text"], ref["image"], return_loss=True), ref["loss"])


@pytest.mark.parametrize("name", CASES)
def test_the_command_line_converts_to_a_checkpoint_with_the_same_logits_and_loss(name, tmp_path, capsys):
    from dalle_lab.training.checkpoint import load_dalle

    out = tmp_path / "converted.pt"
    assert convert_main(["dallepytorch", str(DATA / f"{name}.pt"), str(out), "--bpe_path", str(VOCAB)]) == 0
    assert "wrote" in capsys.readouterr().out
    model, tokenizer, vae = load_dalle(out)  # the reader generate.py and train_dalle.py --dalle_path use
    assert tokenizer.kind == "dallepytorch_yttm" and vae.path == tmp_path / "converted.vae.pt"
    _check_same_function(model, name)


def test_discrete_vae_keeps_dallepytorchs_encoding_and_decoding_and_trains():
    vae = load_dallepytorch(DATA / "plain.pt", Sources(bpe_path=str(VOCAB))).vae
    ref = torch.load(DATA / "vae.out.pt", weights_only=True)
    with torch.no_grad():
        _close(vae(ref["images"], return_logits=True), ref["logits"])
        top2 = ref["logits"].topk(2, dim=1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # no near-ties: float rounding on another CPU cannot flip a code
        assert torch.equal(vae.get_codebook_indices(ref["images"]), ref["codes"])
        _close(vae.decode(ref["codes"]), ref["decoded"])
        images = vae.decode_images(ref["codes"])
        assert images.min() >= 0 and images.max() <= 1
        one_hot = torch.nn.functional.one_hot(ref["codes"], vae.num_tokens).float()
        _close(vae.decode_soft(one_hot), images)  # what reward backpropagation decodes
    vae.train()
    loss = vae(ref["images"], return_loss=True)
    loss.backward()
    assert loss.dim() == 0 and vae.codebook.weight.grad.abs().sum() > 0


def test_the_written_vae_file_keeps_every_setting_of_the_discrete_vae(tmp_path):
    """OUT.vae.pt must rebuild the VAE the in-memory conversion uses: the same codes, decodings and training loss,
    with non-default normalization, temperature, straight-through/ReinMax, KL weight and smooth L1."""
    import inspect

    from dalle_lab.training.checkpoint import load_dalle
    from dalle_lab.vae.discrete import DiscreteVAE

    settings = dict(normalization=((0.4, 0.45, 0.5), (0.2, 0.25, 0.3)), temperature=0.7, straight_through=True,
                    reinmax=True, kl_div_loss_weight=0.3, smooth_l1_loss=True)
    vae_params = {**torch.load(DATA / "plain.pt", weights_only=True)["vae_params"], **settings}
    edited = _edited(tmp_path, vae_params=vae_params)
    in_memory = load_dallepytorch(edited, Sources(bpe_path=str(VOCAB))).vae
    out = convert_file(edited, tmp_path / "out.pt", Sources(bpe_path=str(VOCAB)))
    written = load_dalle(out)[2]
    saved = torch.load(tmp_path / "out.vae.pt", weights_only=True)["hparams"]
    assert set(saved) == set(inspect.signature(DiscreteVAE).parameters)  # a new constructor argument must be saved
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _close(written(images, return_logits=True), in_memory(images, return_logits=True))
        codes = in_memory.get_codebook_indices(images)
        assert torch.equal(written.get_codebook_indices(images), codes)
        _close(written.decode_images(codes), in_memory.decode_images(codes))
    losses = []
    for vae in (in_memory, written):
        torch.manual_seed(0)  # the same Gumbel noise for both
        losses.append(vae.train()(images, return_loss=True))
    _close(losses[1], losses[0])


def test_load_dalle_takes_the_dallepytorch_file_directly_with_a_one_line_note():
    import dalle_lab

    note = io.StringIO()
    model, tokenizer, vae = dalle_lab.load_dalle(DATA / "class_defaults.pt", bpe_path=VOCAB, note=note)
    assert note.getvalue().count("\n") == 1 and "converted in memory" in note.getvalue()
    _check_same_function(model, "class_defaults")
    text = tokenizer.tokenize(["a red circle"], model.config.text_seq_len)
    images = model.generate_images(text, filter_thres=0.9, generator=torch.Generator().manual_seed(0))
    assert images.shape == (1, 3, vae.image_size, vae.image_size) and 0 <= images.min() and images.max() <= 1


def test_vqgan_models_take_the_users_vqgan_and_check_its_codebook(tmp_path):
    from dalle_lab.vae import VQGanVAE, make_tiny_vqgan

    ckpt = torch.load(DATA / "plain.pt", weights_only=True)
    ckpt_path, yaml_path = make_tiny_vqgan(tmp_path, image_size=16, n_embed=20)  # 4 x 4 tokens of 20 codes
    codebook = VQGanVAE(ckpt_path, yaml_path).codebook
    ckpt["weights"] = {k: v for k, v in ckpt["weights"].items() if not k.startswith("vae.")}
    ckpt["weights"]["vae.model.quantize.embedding.weight"] = codebook.clone()
    ckpt.update(vae_class_name="VQGanVAE", vae_params=None)
    torch.save(ckpt, tmp_path / "vqgan_dalle.pt")
    with pytest.raises(ConversionError, match=r"vqgan_dalle.pt: vae_class_name VQGanVAE: pass .*--vqgan_model_path"):
        load_dallepytorch(tmp_path / "vqgan_dalle.pt", Sources(bpe_path=str(VOCAB)))
    sources = Sources(bpe_path=str(VOCAB), vqgan_model_path=str(ckpt_path), vqgan_config_path=str(yaml_path))
    _check_same_function(load_dallepytorch(tmp_path / "vqgan_dalle.pt", sources).model, "plain")
    out = convert_file(tmp_path / "vqgan_dalle.pt", tmp_path / "out.pt", sources)
    assert torch.load(out, weights_only=True)["vae"]["kind"] == "taming_vqgan"
    ckpt["weights"]["vae.model.quantize.embedding.weight"] = codebook + 1
    torch.save(ckpt, tmp_path / "vqgan_dalle.pt")
    with pytest.raises(ConversionError, match="is not the VQGAN this model was trained with"):
        load_dallepytorch(tmp_path / "vqgan_dalle.pt", sources)


def _edited(tmp_path, name="plain", **changes):
    ckpt = torch.load(DATA / f"{name}.pt", weights_only=True)
    for key, value in changes.items():
        if key == "hparams":
            ckpt["hparams"] = {**ckpt["hparams"], **value}
        elif key == "weights":
            ckpt["weights"] = value(ckpt["weights"])
        else:
            ckpt[key] = value
    path = tmp_path / "edited.pt"
    torch.save(ckpt, path)
    return path


BAD = {
    "version": (dict(version="0.14.3"), r"edited.pt: version '0.14.3': only DALLE-pytorch 1.x"),
    "reversible": (dict(hparams=dict(reversible=True)), r"edited.pt: hparams.reversible=True: .*two residual streams"),
    "sparse": (dict(hparams=dict(attn_types=("full", "sparse"), sparse_attn=True)),
               r"edited.pt: hparams.attn_types use 'sparse'"),
    "unknown_option": (dict(hparams=dict(cross_attend=True)), r"edited.pt: hparams \['cross_attend'\] are not"),
    "vae_weights_missing": (dict(weights=lambda w: {k: v for k, v in w.items() if not k.startswith("vae.")}),
                            r"edited.pt: a DiscreteVAE model whose weights have no 'vae.\*' entries"),
    "vae_params_missing": (dict(vae_params="oops"), r"edited.pt: vae_class_name DiscreteVAE but field 'vae_params'"),
    "openai_paths": (dict(vae_class_name="OpenAIDiscreteVAE", vae_params=None),
                     r"edited.pt: vae_class_name OpenAIDiscreteVAE: pass .*--openai_encoder_path"),
    "deepspeed_aux": (dict(weights=lambda w: "To get a working standard checkpoint, look into consolidating"),
                      r"edited.pt: field 'weights' holds no weights .*zero_to_fp32"),
    "extra_weight": (dict(weights=lambda w: {**w, "transformer.layers.layers.9.0.scale": torch.ones(1, 1, 16)}),
                     r"edited.pt: weights \['transformer.layers.layers.9.0.scale'\] have no place"),
    "text_seq_len_edited": (dict(name="class_defaults", hparams=dict(text_seq_len=6)),
                            r"edited.pt: transformer.pos_emb has 22 positions, leaving 15 for the image after hparams "
                            r"text_seq_len 6 \+ 1, not a square grid: hparams text_seq_len does not match the weights"),
    "missing_weight": (dict(weights=lambda w: {k: v for k, v in w.items() if k != "text_pos_emb.weight"}),
                       r"edited.pt: weights lack 'text_pos_emb.weight'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_get_one_line_naming_file_field_and_fix(case, tmp_path):
    changes, message = BAD[case]
    with pytest.raises(ConversionError, match=message) as err:
        load_dallepytorch(_edited(tmp_path, **changes), Sources(bpe_path=str(VOCAB)))
    assert "\n" not in str(err.value)


def test_sparse_attn_without_sparse_attn_types_converts_with_a_note(tmp_path, capsys):
    """DALLE-pytorch 1.6.6's Transformer never read sparse_attn (only attn_types 'sparse' chose its sparse
    attention), so the weights compute the plain model's function."""
    edited = _edited(tmp_path, hparams=dict(sparse_attn=True))
    converted = load_dallepytorch(edited, Sources(bpe_path=str(VOCAB)))
    _check_same_function(converted.model, "plain")
    assert convert_main(["dallepytorch", str(edited), str(tmp_path / "out.pt"), "--bpe_path", str(VOCAB)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(r"note: \S*edited.pt: hparams sparse_attn=True had no effect", err), err


@pytest.mark.parametrize("version, noted", [("1.6.6", False), ("1.2.0", False), (None, False), ("1.7.0", True),
                                            (1.6, True), ("1.6", True), ("1.6.6rc1", True)])
def test_versions_outside_the_known_releases_convert_with_a_note(version, noted, tmp_path):
    note = io.StringIO()
    out = convert_file(_edited(tmp_path, version=version), tmp_path / "out.pt", Sources(bpe_path=str(VOCAB)), note=note)
    assert out.is_file()
    expected = f"note: {tmp_path}/edited.pt: the file says version {version!r}, not a DALLE-pytorch release (1.0.0 " \
               "to 1.6.6): converted as 1.6.6's format (its weights fit that layout)\n"
    assert note.getvalue() == (expected if noted else "")


def test_tokenizer_problems_name_the_vocabulary_and_the_fix(tmp_path):
    with pytest.raises(ConversionError, match=r"plain.pt: DALLE-pytorch checkpoints do not record .*--bpe_path"):
        load_dallepytorch(DATA / "plain.pt", Sources())
    clip_sized = _edited(tmp_path, weights=lambda w: w, hparams=dict(num_text_tokens=49408))
    with pytest.raises(ConversionError, match=r"SimpleTokenizer: pass CLIP's merges file"):
        load_dallepytorch(clip_sized, Sources())
    from dalle_lab.tokenizers import train_bpe

    other = train_bpe(["one two three four five six"], 30, tmp_path / "other.model")
    with pytest.raises(ConversionError, match=rf"num_text_tokens is 40 but --bpe_path {tmp_path}/other.model has "
                                              rf"{other.vocab_size} tokens"):
        load_dallepytorch(DATA / "plain.pt", Sources(bpe_path=str(other.path)))


def test_neither_format_and_dalle_lab_files_are_told_apart(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ConversionError, match=r"other.pt is neither a DALLE-pytorch .* nor a dalle_lab one"):
        load_dallepytorch(tmp_path / "other.pt", Sources(bpe_path=str(VOCAB)))
    (tmp_path / "text.txt").write_text("not a checkpoint")
    with pytest.raises(ConversionError, match=r"text.txt is not a readable torch file"):
        load_dallepytorch(tmp_path / "text.txt", Sources(bpe_path=str(VOCAB)))
    assert convert_main(["dallepytorch", str(tmp_path / "other.pt"), str(tmp_path / "out.pt")]) == 2
    assert not (tmp_path / "out.pt").exists()


def _cli_error(capsys, *argv) -> str:
    """The command line's stderr for a conversion that must fail: exit status 2 and one line, no traceback."""
    assert convert_main(["dallepytorch", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def _vae_files(tmp_path, kind):
    """A DALLE-pytorch file of `kind` (vae_class_name) and a valid pair of that VAE's files beside it."""
    from dalle_lab.vae import make_tiny_vqgan

    edited = _edited(tmp_path, vae_class_name=kind, vae_params=None,
                     weights=lambda w: {k: v for k, v in w.items() if not k.startswith("vae.")})
    if kind == "VQGanVAE":
        return edited, make_tiny_vqgan(tmp_path, image_size=16, n_embed=20)
    for name in ("encoder.pkl", "decoder.pkl"):
        torch.save(torch.nn.Linear(1, 1), tmp_path / name)
    return edited, (tmp_path / "encoder.pkl", tmp_path / "decoder.pkl")


VAE_FILE_PROBLEMS = {  # kind, which of the two files (0 / 1) is replaced by what, the message expected
    "vqgan_missing": ("VQGanVAE", 0, None, r"--vqgan_model_path \S*nonexistent does not exist"),
    "vqgan_junk_ckpt": ("VQGanVAE", 0, b"junk\n", r"--vqgan_model_path \S*junk is not a torch file"),
    "vqgan_not_taming": ("VQGanVAE", 0, "plain.pt", r"--vqgan_model_path \S*plain.pt does not load as the VQGAN"),
    "vqgan_bad_yaml": ("VQGanVAE", 1, b"x: [\n", r"--vqgan_config_path \S*junk is not a taming VQGAN config "
                                                 r"\(ParserError"),
    "openai_missing": ("OpenAIDiscreteVAE", 0, None, r"--openai_encoder_path \S*nonexistent does not exist"),
    "openai_junk_pkl": ("OpenAIDiscreteVAE", 1, b"hi\n", r"--openai_decoder_path \S*junk is not a torch file"),
}


@pytest.mark.parametrize("case", sorted(VAE_FILE_PROBLEMS))
def test_unreadable_vae_files_get_one_line_naming_the_flag_and_file(case, tmp_path, capsys):
    kind, which, replacement, message = VAE_FILE_PROBLEMS[case]
    edited, files = _vae_files(tmp_path, kind)
    files = list(files)
    if replacement is None:
        files[which] = tmp_path / "nonexistent"
    elif replacement == "plain.pt":
        files[which] = DATA / "plain.pt"
    else:
        files[which] = tmp_path / "junk"
        files[which].write_bytes(replacement)
    flags = ("--vqgan_model_path", "--vqgan_config_path") if kind == "VQGanVAE" else \
        ("--openai_encoder_path", "--openai_decoder_path")
    err = _cli_error(capsys, edited, tmp_path / "out.pt", "--bpe_path", VOCAB, flags[0], files[0], flags[1], files[1])
    assert re.search(rf"edited.pt: {message}", err), err
    assert not (tmp_path / "out.pt").exists()


def test_weights_whose_shape_does_not_follow_from_hparams_get_one_line(tmp_path, capsys):
    narrow = _edited(tmp_path, weights=lambda w: {**w, "text_emb.weight": w["text_emb.weight"][:, :8]})
    err = _cli_error(capsys, narrow, tmp_path / "out.pt", "--bpe_path", VOCAB)
    assert re.search(r"edited.pt: its hparams and its weights disagree: weight text_emb.weight is \(45, 8\)", err)


def test_a_json_vocabulary_without_hug_is_told_to_add_it(tmp_path, capsys):
    (tmp_path / "vocab.json").write_text('{"model": {}}')
    err = _cli_error(capsys, DATA / "plain.pt", tmp_path / "out.pt", "--bpe_path", tmp_path / "vocab.json")
    assert "vocab.json" in err and "add --hug" in err


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink", "hardlink", "vae_out"])
def test_the_input_file_is_never_overwritten(spelling, tmp_path, capsys):
    import os

    original = tmp_path / "in" / "dalle.pt"
    original.parent.mkdir()
    original.write_bytes((DATA / "plain.pt").read_bytes())
    before = original.read_bytes()
    outputs = {"same": [original], "dotted": [tmp_path / "in" / ".." / "in" / "dalle.pt"],
               "symlink": [tmp_path / "link.pt"], "hardlink": [tmp_path / "hard.pt"],
               "vae_out": [tmp_path / "out.pt", "--vae_out", original]}[spelling]
    if spelling == "symlink":
        (tmp_path / "link.pt").symlink_to(original)
    elif spelling == "hardlink":
        os.link(original, tmp_path / "hard.pt")
    err = _cli_error(capsys, original, *outputs, "--bpe_path", VOCAB)
    assert "is the input file itself" in err and "choose another output path" in err
    assert original.read_bytes() == before and not (tmp_path / "out.pt").exists()


def test_an_unwritable_output_gets_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    err = _cli_error(capsys, DATA / "plain.pt", tmp_path / "file" / "out.pt", "--bpe_path", VOCAB)
    assert "cannot write" in err and "out" in err and "choose a writable output path" in err


def test_a_dallepytorch_vae_file_is_named_as_one_and_pointed_to_the_dalle_file(tmp_path, capsys):
    ckpt = torch.load(DATA / "plain.pt", weights_only=True)
    weights = {k[len("vae."):]: v for k, v in ckpt["weights"].items() if k.startswith("vae.")}
    torch.save({"hparams": ckpt["vae_params"], "weights": weights}, tmp_path / "vae.pt")  # train_vae.py's format
    err = _cli_error(capsys, tmp_path / "vae.pt", tmp_path / "out.pt", "--bpe_path", VOCAB)
    assert re.search(r"vae.pt is a DALLE-pytorch VAE file .*, not a DALLE checkpoint: convert the dalle.pt .*"
                     r"train_dalle.py --vae_path \S*vae.pt", err), err


def test_dalle_lab_reader_points_dallepytorch_files_to_the_converter():
    from dalle_lab.training.checkpoint import CheckpointError, read_checkpoint

    with pytest.raises(CheckpointError, match=r"plain.pt is a DALLE-pytorch checkpoint: convert it first: python -m "
                                              r"dalle_lab.convert dallepytorch"):
        read_checkpoint(DATA / "plain.pt")


def test_openai_vae_reads_openais_pickled_modules_as_dallepytorch_did(tmp_path):
    dall_e = pytest.importorskip("dall_e", reason="OpenAI's DALL-E package (pip install DALL-E) is not installed")
    from dalle_lab.vae import OpenAIDiscreteVAE

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    encoder = dall_e.Encoder(n_hid=8, n_blk_per_group=1, requires_grad=False, device=cpu)
    decoder = dall_e.Decoder(n_init=8, n_hid=8, n_blk_per_group=1, requires_grad=False, device=cpu)
    torch.save(encoder, tmp_path / "encoder.pkl")  # OpenAI's files are whole pickled modules like these
    torch.save(decoder, tmp_path / "decoder.pkl")
    vae = OpenAIDiscreteVAE(tmp_path / "encoder.pkl", tmp_path / "decoder.pkl")
    images = torch.rand(1, 3, 256, 256)
    with torch.no_grad():
        codes = vae.get_codebook_indices(images)
        assert torch.equal(codes, encoder(dall_e.map_pixels(images)).argmax(dim=1).flatten(1))
        one_hot = torch.nn.functional.one_hot(codes.view(1, 32, 32), 8192).permute(0, 3, 1, 2).float()
        expected = dall_e.unmap_pixels(torch.sigmoid(decoder(one_hot).float()[:, :3]))
        _close(vae.decode(codes), expected)
    assert vae.identity["kind"] == "openai_discrete_vae"
    edited = _edited(tmp_path, vae_class_name="OpenAIDiscreteVAE", vae_params=None)
    sources = Sources(bpe_path=str(VOCAB), openai_encoder_path=str(tmp_path / "encoder.pkl"),
                      openai_decoder_path=str(tmp_path / "decoder.pkl"))
    with pytest.raises(ConversionError, match=r"edited.pt: its weights predict 20 image tokens on a 4x4 grid but the "
                                              r"image tokenizer given has 8192 on 32x32"):
        load_dallepytorch(edited, sources)


@pytest.mark.parametrize("name", ["class_defaults", "attn_types", "sandwich_stable"])
def test_cached_and_speculative_decoding_of_a_converted_model_follow_its_full_pass(name):
    """Greedy decoding through the KV cache (DALLE-pytorch's rotary rotates the cached values too) and through
    speculative windows picks the tokens a full uncached pass picks."""
    model = load_dallepytorch(DATA / f"{name}.pt", Sources(bpe_path=str(VOCAB))).model
    text = torch.load(DATA / f"{name}.out.pt", weights_only=True)["text"]
    runs = [model.generate_images(text, top_k=1, return_tokens=True, strategy=strategy)
            for strategy in ("uncached", "plain", "auto", "speculative")]  # auto: the fused step where it applies
    assert all(torch.equal(runs[0], run) for run in runs[1:])


def test_converted_checkpoints_feed_generate_and_continued_training(tmp_path):
    from PIL import Image

    from test_cli import script_main

    converted = convert_file(DATA / "class_defaults.pt", tmp_path / "c.pt", Sources(bpe_path=str(VOCAB)))
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(2):  # 16 px images, the converted DiscreteVAE's size
        Image.new("RGB", (16, 16), (90 * i, 40, 200)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text("a red\n")
    code = script_main("train_dalle.py", "--dalle_path", converted, "--image_text_folder", folder, "--max_steps", "1",
                       "--batch_size", "2", "--output_dir", tmp_path / "run", "--no-progress")
    assert code == 0
    trained = torch.load(tmp_path / "run" / "dalle.pt", weights_only=True)
    assert trained["config"]["rotary_style"] == "dallepytorch" and trained["vae"]["kind"] == "dallepytorch_discrete_vae"
    assert script_main("generate.py", "--dalle_path", tmp_path / "run" / "dalle.pt", "--text", "a red", "--num_images",
                       "1", "--outputs_dir", tmp_path / "out") == 0
    assert script_main("generate.py", "--dalle_path", DATA / "class_defaults.pt", "--bpe_path", VOCAB, "--text",
                       "a red", "--num_images", "1", "--outputs_dir", tmp_path / "direct") == 0
