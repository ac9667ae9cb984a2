"""Advantages from rewards: per-prompt statistics (DDPO) or group normalisation (GRPO), then clipping.

Different prompts have different attainable rewards ("a red circle" may compress better than "three blue stars"),
so a raw reward would mostly teach the policy which prompts are easy. Normalising each reward by the statistics of
its own prompt turns it into "better or worse than usual for this prompt".
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from dalle_lab.stats import groups_of


class PerPromptStatTracker:
    """DDPO-style running statistics per prompt.

    Each prompt keeps its last `buffer_size` rewards. Once a prompt has at least `min_count` rewards its own mean and
    std normalise it; before that (a prompt seen once or twice) the statistics of the whole current batch are used,
    because a std from two samples is mostly noise.
    """

    def __init__(self, buffer_size: int = 32, min_count: int = 16, eps: float = 1e-6):
        if min_count > buffer_size:
            raise ValueError(f"min_count ({min_count}) cannot exceed buffer_size ({buffer_size}): "
                             "a prompt could never reach it")
        self.buffer_size = buffer_size
        self.min_count = min_count
        self.eps = eps
        self.buffers: dict[str, deque] = {}

    def update(self, prompts: Sequence[str], rewards) -> np.ndarray:
        """Add this batch's rewards to the buffers and return one advantage per reward (numpy float64)."""
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if len(prompts) != len(rewards):
            raise ValueError(f"{len(prompts)} prompts for {len(rewards)} rewards")
        prompts = list(prompts)
        for prompt in dict.fromkeys(prompts):
            mask = np.array([p == prompt for p in prompts])
            buffer = self.buffers.setdefault(prompt, deque(maxlen=self.buffer_size))
            buffer.extend(rewards[mask].tolist())
        batch_mean, batch_std = rewards.mean(), rewards.std()
        advantages = np.empty_like(rewards)
        for i, (prompt, reward) in enumerate(zip(prompts, rewards)):
            buffer = self.buffers[prompt]
            if len(buffer) >= self.min_count:
                mean, std = np.mean(buffer), np.std(buffer)
            else:
                mean, std = batch_mean, batch_std
            advantages[i] = (reward - mean) / (std + self.eps)
        return advantages

    def stats(self) -> dict[str, float]:
        counts = [len(buffer) for buffer in self.buffers.values()]
        return {"prompts_tracked": len(counts), "mean_buffer_len": float(np.mean(counts)) if counts else 0.0}

    def state_dict(self) -> dict:
        return {"buffer_size": self.buffer_size, "min_count": self.min_count,
                "buffers": {prompt: list(buffer) for prompt, buffer in self.buffers.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.buffer_size, self.min_count = state["buffer_size"], state["min_count"]
        self.buffers = {prompt: deque(values, maxlen=self.buffer_size) for prompt, values in state["buffers"].items()}


def _groups(prompts: Sequence[str], n: int) -> list[np.ndarray]:
    """Index arrays of the samples of each prompt (a GRPO group), in first-seen order."""
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} rewards")
    return [np.asarray(index) for index in groups_of(prompts)]


def centred_parts(prompts: Sequence[str], parts) -> np.ndarray:
    """(B, K) or (B,) rewards minus the mean of their group (same prompt in this batch), column by column."""
    parts = np.asarray(parts, dtype=np.float64)
    centred = np.empty_like(parts)
    for index in _groups(prompts, len(parts)):
        centred[index] = parts[index] - parts[index].mean(axis=0)
    return centred


def reward_scale(prompts: Sequence[str], rewards, std: str = "group", eps: float = 1e-6) -> np.ndarray:
    """(B,) one over the reward std that normalises each sample's advantage: its group's (GRPO) or the whole
    batch's (`std="batch"`, Flow-GRPO's choice). Why the batch's: with a group's own std, a group of seven exact
    images and one that misses one attribute gives the miss -2.65 and a group whose rewards differ by a hair gets
    advantages of +-1; the batch's std keeps an advantage proportional to how much better or worse the sample was."""
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if std == "batch":
        _groups(prompts, len(rewards))  # the length check
        return np.full(len(rewards), 1.0 / (rewards.std() + eps))
    if std != "group":
        raise ValueError(f"advantage std must be 'group' or 'batch', not {std!r}")
    scale = np.empty_like(rewards)
    for index in _groups(prompts, len(rewards)):
        scale[index] = 1.0 / (rewards[index].std() + eps)
    return scale


def flat_groups(prompts: Sequence[str], parts) -> np.ndarray:
    """(B,) bool: samples whose group has no spread in any reward part (all its advantages are 0)."""
    parts = np.asarray(parts, dtype=np.float64).reshape(len(prompts), -1)
    flat = np.zeros(len(parts), dtype=bool)
    for index in _groups(prompts, len(parts)):
        flat[index] = bool((parts[index] == parts[index][:1]).all())
    return flat


def group_normalize(prompts: Sequence[str], rewards, eps: float = 1e-6, std: str = "group") -> np.ndarray:
    """GRPO-style advantages: each reward minus the mean of the samples for the same prompt in this batch, over their
    std (or the batch's: reward_scale). A group whose samples all scored the same gets advantage 0."""
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    return centred_parts(prompts, rewards) * reward_scale(prompts, rewards, std, eps)


def clip_advantages(advantages, max_abs: float | None) -> np.ndarray:
    """Clip advantages to [-max_abs, max_abs] (DDPO uses 5) so one outlier image cannot dominate an update."""
    advantages = np.asarray(advantages, dtype=np.float64)
    return advantages if max_abs is None else np.clip(advantages, -max_abs, max_abs)
