"""Controlled experiments run with the library (each module has a `main`, run with `python -m`).

- loss_weighting: the CogView question, loss_img_weight 1 vs 7 and a short vs long text context, at equal compute
  over several seeds, with a report of confidence intervals and plots (docs/experiments.md).
"""
