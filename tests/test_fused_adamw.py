"""dalle_lab.training.engine.adamw: the fused AdamW kernel wherever every parameter allows it, the default loop
otherwise, and the same updates as the loop up to float rounding."""
import torch

from dalle_lab.training.engine import adamw, make_optimizer


def test_cpu_float_parameters_get_the_fused_kernel():
    weight = torch.nn.Parameter(torch.randn(4, 3))
    assert adamw([weight], lr=1e-3).defaults["fused"] is True


def test_non_float_parameters_fall_back_to_the_loop():
    weight = torch.nn.Parameter(torch.randn(4, 3))
    counts = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    assert not adamw([weight, counts], lr=1e-3).defaults["fused"]


def test_fused_updates_match_the_loop():
    torch.manual_seed(0)
    fused_params = [torch.nn.Parameter(torch.randn(64, 32)) for _ in range(3)]
    loop_params = [torch.nn.Parameter(p.detach().clone()) for p in fused_params]
    start = [p.detach().clone() for p in fused_params]
    fused = adamw(fused_params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.96))
    loop = torch.optim.AdamW(loop_params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.96), foreach=False)
    for _ in range(5):
        for a, b in zip(fused_params, loop_params):
            grad = torch.randn_like(a)
            a.grad, b.grad = grad.clone(), grad.clone()
        fused.step()
        loop.step()
    for a, b, before in zip(fused_params, loop_params, start):
        assert (a - before).abs().max() > 1e-2  # the steps moved the weights, so the comparison means something
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_training_optimizer_is_fused_over_trainable_parameters_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    optimizer = make_optimizer(model, learning_rate=1e-3)
    assert optimizer.defaults["fused"] is True
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 3
