"""The precision parity reports: what bf16, fp16 and emulated TPU-default precision (dalle_lab.numerics) do to a
reward model's embeddings and scores (dalle_lab.rewards).

    parity.py            `python -m dalle_lab.precision.parity` (dalle-parity): the LAION aesthetic scorer's report
    aesthetic_parity.py  that report's measurements, tables and figure: per image, per layer, head only
    clip_parity.py       `python -m dalle_lab.precision.clip_parity`: the same for the project's own CLIP
    inputs.py            what they compare on: image folders, CLIP embedding folders, DALLE samples, Twemoji
    measures.py          the cosines and number formats both reports share
    gap_stats.py         the arithmetic of the fine-tuning gap study (a low-precision reward's apparent gain)

The modes themselves and the fine-tuning guard (reward_gap) live in dalle_lab.numerics.
"""
