"""decode_threads: one thread for few-row decoding where OpenMP threads sleep between ops (OMP_WAIT_POLICY=PASSIVE),
the caller's count restored afterwards, errors included; under the default policy the count is left alone."""
import pytest
import torch

from dalle_lab.generate import threads
from dalle_lab.generate.threads import decode_threads


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_few_rows_run_on_one_thread_and_the_count_is_restored(two_threads):
    with decode_threads(rows=4):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_the_count_is_restored_when_the_block_raises(two_threads):
    with pytest.raises(RuntimeError, match="boom"):
        with decode_threads(rows=4):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_many_rows_or_disabled_keep_the_thread_count(two_threads):
    with decode_threads(rows=threads.SINGLE_THREAD_MAX_ROWS):
        assert torch.get_num_threads() == 2
    with decode_threads(rows=4, enabled=False):
        assert torch.get_num_threads() == 2


@pytest.mark.parametrize("policy", [None, "ACTIVE", "  "])
def test_spinning_threads_keep_the_thread_count(two_threads, monkeypatch, policy):
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY")
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    with decode_threads(rows=4):
        assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_WAIT_POLICY", " Passive ")
    with decode_threads(rows=4):
        assert torch.get_num_threads() == 1


def test_generation_restores_the_thread_count(two_threads):
    from dalle_lab.model import DALLE

    model = DALLE(dim=32, depth=1, heads=2, dim_head=16, num_text_tokens=50, text_seq_len=5, num_image_tokens=24,
                  image_fmap_size=2).eval()
    seen = []
    model.generate_images(torch.ones(2, 5, dtype=torch.long), return_tokens=True,
                          logits_callback=lambda i, cond, uncond: seen.append(torch.get_num_threads()))
    assert seen == [1] * 4  # the cached passes ran on one thread
    assert torch.get_num_threads() == 2


def test_speculative_window_passes_run_on_one_thread(two_threads, monkeypatch):
    from dalle_lab.model import DALLE
    from dalle_lab.generate.decoder import Decoder

    model = DALLE(dim=32, depth=1, heads=2, dim_head=16, num_text_tokens=50, text_seq_len=5, num_image_tokens=24,
                  image_fmap_size=2).eval()
    seen = []
    step = Decoder.step

    def recording_step(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "step", recording_step)
    model.generate_images(torch.ones(2, 5, dtype=torch.long), return_tokens=True, strategy="speculative")
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
