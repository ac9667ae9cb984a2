"""generate.py's folder never disagrees with its manifest: a caption folder an earlier run wrote into is refused,
--overwrite replaces its images and manifest lines, two captions never share a folder, and a bar shows progress."""
import json
from pathlib import Path

import pytest

from dalle_lab.cli.generate import main


def run(checkpoint, out, *flags, text="a red circle|a blue square", seed=0):
    return main(["--dalle_path", str(checkpoint), "--text", text, "--num_images", "2", "--batch_size", "2",
                 "--seed", str(seed), "--outputs_dir", str(out), "--device", "cpu", *map(str, flags)])


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def in_step(out: Path) -> None:
    """Every manifest line names an image on disk, and every caption image on disk has exactly one line."""
    listed = [r["file"] for r in records(out)]
    on_disk = sorted(str(p.relative_to(out)) for p in out.glob("*/*.png") if p.name != "grid.png")
    assert sorted(listed) == on_disk


def test_a_second_run_into_the_same_caption_folder_is_refused_and_overwrite_replaces_it(tiny_dalle_checkpoint,
                                                                                          tmp_path, capsys):
    out = tmp_path / "outputs"
    assert run(tiny_dalle_checkpoint, out) == 0
    first = records(out)
    first_bytes = (out / "a_red_circle" / "0.png").read_bytes()
    assert run(tiny_dalle_checkpoint, out, seed=1) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'a_red_circle'} already holds images of an earlier run" in err
    assert "(and 1 more" in err and "--overwrite" in err and "another --outputs_dir" in err
    assert records(out) == first and (out / "a_red_circle" / "0.png").read_bytes() == first_bytes  # untouched

    # another caption into the same folder: the manifest is shared, the earlier captions' lines stay
    assert run(tiny_dalle_checkpoint, out, text="a green triangle") == 0
    assert len(records(out)) == 6
    in_step(out)

    # --overwrite with one image fewer: the stale 1.png and its line go, the other captions' lines stay
    assert main(["--dalle_path", str(tiny_dalle_checkpoint), "--text", "a red circle", "--num_images", "1",
                 "--seed", "1", "--outputs_dir", str(out), "--device", "cpu", "--overwrite"]) == 0
    after = records(out)
    assert [r["seed"] for r in after if r["caption"] == "a red circle"] == [1]
    assert sum(r["caption"] == "a blue square" for r in after) == 2 and len(after) == 5
    assert not (out / "a_red_circle" / "1.png").exists()
    in_step(out)


def test_two_captions_that_share_a_folder_are_refused_before_sampling(tiny_dalle_checkpoint, tmp_path, capsys):
    out = tmp_path / "outputs"
    assert run(tiny_dalle_checkpoint, out, text="a red circle|a red  circle") == 1
    err = capsys.readouterr().err
    assert "'a red circle' and 'a red  circle' would both write to" in err and "give each caption once" in err
    assert run(tiny_dalle_checkpoint, out, text="A Red Circle|a red circle") == 1  # one folder where case is ignored
    assert "'A Red Circle' and 'a red circle' would both write to" in capsys.readouterr().err
    assert not out.exists()


def test_empty_entries_of_text_are_left_out_with_a_note(tiny_dalle_checkpoint, tmp_path, capsys):
    out = tmp_path / "outputs"
    assert run(tiny_dalle_checkpoint, out, text="a red circle||") == 0
    assert "2 empty caption(s) in --text left out" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["a_red_circle"]


def test_the_progress_bar_counts_captions_and_is_off_without_a_terminal(tiny_dalle_checkpoint, tmp_path, capsys,
                                                                        monkeypatch):
    import sys

    assert run(tiny_dalle_checkpoint, tmp_path / "a") == 0
    assert "caption/s" not in capsys.readouterr().err  # pytest's stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert run(tiny_dalle_checkpoint, tmp_path / "b") == 0
    assert "2/2" in capsys.readouterr().err
    assert run(tiny_dalle_checkpoint, tmp_path / "c", "--no_progress") == 0
    assert "2/2" not in capsys.readouterr().err


@pytest.mark.parametrize("alias", ["--output_dir", "--out_dir", "--out"])
def test_the_vocabularys_other_names_for_the_output_folder_work(tiny_dalle_checkpoint, tmp_path, alias):
    assert main(["--dalle_path", str(tiny_dalle_checkpoint), "--text", "a red circle", "--num_images", "1",
                 alias, str(tmp_path), "--device", "cpu"]) == 0
    assert (tmp_path / "a_red_circle" / "0.png").is_file()
