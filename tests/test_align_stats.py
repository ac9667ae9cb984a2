"""Advantages per prompt: DDPO's tracker (buffer + min count), GRPO group normalisation, clipping."""
import numpy as np
import pytest

from dalle_lab.align.stat_tracking import PerPromptStatTracker, clip_advantages, group_normalize


def test_group_normalize_is_per_prompt():
    prompts = ["a", "a", "b", "b", "c", "c"]
    rewards = [1.0, 3.0, 100.0, 104.0, 5.0, 5.0]
    adv = group_normalize(prompts, rewards)
    np.testing.assert_allclose(adv, [-1, 1, -1, 1, 0, 0], atol=1e-5)


def test_tracker_uses_batch_stats_below_min_count_then_prompt_stats():
    tracker = PerPromptStatTracker(buffer_size=4, min_count=3)
    first = tracker.update(["a", "b"], [0.0, 10.0])  # each prompt has 1 reward: batch statistics
    np.testing.assert_allclose(first, [-1, 1], atol=1e-5)
    tracker.update(["a", "a"], [2.0, 4.0])  # "a" now has 3 rewards: 0, 2, 4
    adv = tracker.update(["a"], [6.0])  # buffer 0,2,4,6 (len 4, the maximum)
    buffer = np.array([0.0, 2.0, 4.0, 6.0])
    np.testing.assert_allclose(adv, [(6 - buffer.mean()) / buffer.std()], rtol=1e-5)
    tracker.update(["a"], [8.0])  # the oldest (0) falls out of the buffer
    assert list(tracker.buffers["a"]) == [2.0, 4.0, 6.0, 8.0]


def test_tracker_state_round_trip():
    tracker = PerPromptStatTracker(buffer_size=8, min_count=2)
    tracker.update(["a", "a", "b"], [1.0, 2.0, 3.0])
    restored = PerPromptStatTracker()
    restored.load_state_dict(tracker.state_dict())
    np.testing.assert_allclose(restored.update(["a"], [5.0]), tracker.update(["a"], [5.0]))


def test_tracker_rejects_impossible_min_count_and_mismatch():
    with pytest.raises(ValueError, match="min_count"):
        PerPromptStatTracker(buffer_size=2, min_count=3)
    with pytest.raises(ValueError, match="prompts"):
        PerPromptStatTracker().update(["a"], [1.0, 2.0])


def test_clip_advantages():
    np.testing.assert_allclose(clip_advantages([-10, 0.5, 7], 5), [-5, 0.5, 5])
    np.testing.assert_allclose(clip_advantages([-10, 7], None), [-10, 7])
