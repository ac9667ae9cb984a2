"""The fine-tuning optimizer choice (AlignConfig.optimizer): SGD with momentum takes steps proportional to the
gradient, AdamW stays the default, a bad name is one clear error."""
import pytest
import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.trainer import make_optimizer


def test_sgd_first_step_is_lr_times_the_gradient_and_adamw_is_the_default():
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = make_optimizer([weight], AlignConfig(optimizer="sgd", lr=0.1, momentum=0.9))
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0.9
    (weight * torch.tensor([1.0, 10.0, 0.01])).sum().backward()
    optimizer.step()  # the first momentum buffer is the gradient itself
    torch.testing.assert_close(weight.detach(), torch.tensor([1.0 - 0.1, -2.0 - 1.0, 3.0 - 0.001]))
    assert isinstance(make_optimizer([weight], AlignConfig()), torch.optim.AdamW)


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd', not 'lion'"):
        AlignConfig(optimizer="lion")
