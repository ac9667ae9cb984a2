"""What a results file records about its origin: the commit (and whether the tree was dirty), the CPU kind and the
load. Checked on a throw-away git repository and on made-up /proc/cpuinfo texts, so it holds on any machine."""
import builtins
import io
import json
import subprocess

import pytest

from dalle_lab import provenance

CPUINFO = ("processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse avx2 {extra}\n\n"
           "processor\t: 1\nmodel name\t: Some CPU 9000\nflags\t\t: fpu\n")


def fake_cpuinfo(monkeypatch, text):
    real_open = builtins.open

    def opener(path, *args, **kwargs):
        if path == "/proc/cpuinfo":
            if text is None:
                raise FileNotFoundError(path)
            return io.StringIO(text)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", opener)


@pytest.mark.parametrize("extra, native", [("avx512f avx512_bf16 amx_bf16", True), ("avx512f", False)])
def test_cpu_kind_reads_the_first_processors_flags(monkeypatch, extra, native):
    fake_cpuinfo(monkeypatch, CPUINFO.format(extra=extra))
    assert provenance.cpu_kind() == {"model": "Some CPU 9000", "avx512_bf16": native}


def test_cpu_kind_without_cpuinfo_says_it_does_not_know(monkeypatch):
    fake_cpuinfo(monkeypatch, None)
    assert provenance.cpu_kind()["avx512_bf16"] is None


def test_git_state_names_the_commit_and_sees_edits_to_tracked_files(tmp_path):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    assert provenance.git_state(tmp_path) == {"commit": None, "dirty": None}  # not a checkout
    git("init", "-q")
    (tmp_path / "a.txt").write_text("one")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = git("rev-parse", "HEAD")
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "untracked.json").write_text("{}")  # run outputs do not make the code dirty
    assert provenance.git_state(tmp_path)["dirty"] is False
    (tmp_path / "a.txt").write_text("two")
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": True}
    assert provenance.git_commit(tmp_path) == head


def test_lab_results_files_carry_the_machine_unless_the_record_has_one(tmp_path):
    from lab.common import write_results

    path = write_results({"value": 1}, tmp_path / "r.json")
    record = json.loads(path.read_text())
    assert record["value"] == 1 and set(record["machine"]) == {"cpu", "cpu_count", "load_average"}
    assert set(record["machine"]["cpu"]) == {"model", "avx512_bf16"}
    kept = json.loads(write_results({"machine": "given"}, tmp_path / "s.json").read_text())
    assert kept == {"machine": "given"}
