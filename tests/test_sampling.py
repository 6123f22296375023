"""Seeded sampling: Gumbel noise that is a pure function of (seed, request, position, token), and
samples that follow the softmax."""

import math

import torch

from perfkit.engine.sampling import choose, gumbel_noise


def test_noise_is_gumbel_and_a_function_of_its_key():
    positions = torch.arange(4000).expand(3, 4000)
    g = gumbel_noise(7, positions, 50)
    assert g.shape == (3, 4000, 50) and g.dtype == torch.float32
    assert abs(g.mean().item() - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(g.std().item() - math.pi / math.sqrt(6)) < 0.01
    assert torch.equal(g, gumbel_noise(7, positions, 50))
    assert torch.equal(g[:, 100:200], gumbel_noise(7, positions[:, 100:200], 50))  # same position, same noise
    assert not torch.equal(g, gumbel_noise(8, positions, 50))  # seed
    assert not torch.equal(g[0], g[1])  # request
    assert not torch.equal(g[:, :10], g[:, 10:20])  # position
    corr = torch.corrcoef(torch.stack([g[0, :, 0], g[0, :, 1], g[1, :, 0]]))
    assert corr.abs().fill_diagonal_(0).max() < 0.05  # tokens and requests look independent


def test_samples_follow_the_softmax_and_temperature_zero_is_argmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])
    n = 40000
    positions = torch.arange(n)[None, :]
    for temperature in (1.0, 0.5, 2.0):
        tokens = choose(logits.expand(1, n, 5), positions, temperature=temperature, seed=1)
        freq = torch.bincount(tokens[0], minlength=5).double() / n
        want = (logits / temperature).softmax(-1).double()
        chi2 = (n * (freq - want) ** 2 / want).sum().item()
        assert chi2 < 18.5, (temperature, chi2)  # 99.9% point of chi-square with 4 degrees of freedom
    assert torch.equal(
        choose(logits.expand(2, 3, 5), torch.zeros(2, 3, dtype=torch.int64), temperature=0, seed=9),
        torch.zeros(2, 3, dtype=torch.int64),
    )


def test_tensor_and_python_hashes_agree():
    from perfkit.engine.sampling import _mix32, _mix32_int

    xs = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1]
    assert _mix32(torch.tensor(xs)).tolist() == [_mix32_int(x) for x in xs]
    assert len({_mix32_int(x) for x in range(10000)}) == 10000  # a bijection on 32 bits: no collisions here
