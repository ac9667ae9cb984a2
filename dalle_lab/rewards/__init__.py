"""Rewards for fine-tuning and for the precision-parity tools: `reward(images, prompts) -> scores`.

    builtin.py     JPEG size, the Shapes checker, total variation, brightness (plain functions)
    aesthetic.py   the LAION aesthetic predictor on a local CLIP (a torch model with a precision setting)
    clip.py        the project's own small CLIP (trained by clip_train.py on clip_data.py) and the clip_score reward
    preprocess.py  CLIP's image preprocessing in torch ops (differentiable), shared by both CLIP rewards
    registry.py    names -> rewards, weighted sums (`get_reward("a:1+b:0.5")`)
    worker.py      scoring in a background thread while the next batch samples
"""
from dalle_lab.rewards.aesthetic import aesthetic_reward
from dalle_lab.rewards.builtin import (brightness, jpeg_compressibility, jpeg_incompressibility, jpeg_size_kb,
                                       negative_total_variation, shapes_exact, shapes_faithfulness)
from dalle_lab.rewards.clip import clip_score_reward
from dalle_lab.rewards.registry import BUILTIN_REWARDS, get_reward, is_differentiable, weighted_sum
from dalle_lab.rewards.worker import RewardWorker

__all__ = ["BUILTIN_REWARDS", "RewardWorker", "aesthetic_reward", "brightness", "clip_score_reward", "get_reward", "is_differentiable", "jpeg_compressibility",
           "jpeg_incompressibility", "jpeg_size_kb", "negative_total_variation", "shapes_exact", "shapes_faithfulness",
           "weighted_sum"]
