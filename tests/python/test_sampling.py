"""engine/sampling (through torch.ops.snapserve) against reference
definitions computed here in torch, and against transformers' logits
processors.

Reference definition (docs/api.md, "GenerateRequest", `sampling`;
transformers' order):
repetition penalty (RepetitionPenaltyLogitsProcessor) -> greedy argmax (ties
to the lowest id) when temperature == 0, else logits / temperature -> keep the
top_k largest (ties to lower ids) -> keep the smallest prefix of the
remaining tokens, sorted by probability (ties to lower ids), whose cumulative
probability reaches top_p -> renormalize and draw.

Statistical checks draw N = 20000 tokens per case and compare the empirical
histogram with the reference distribution twice: Pearson's chi-square must
stay below df + 6 * sqrt(2 df) (the statistic has mean df and standard
deviation sqrt(2 df); this bound is exceeded by chance with probability far
below 1e-6), and the total-variation distance must stay below 0.03 (its
expected value here is about 0.01). Each case also checks that a plausible
wrong implementation (temperature ignored, filter skipped) is more than 0.06
away in total variation, so the bound actually separates right from wrong.
"""
import math

import pytest
import torch
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

N_DRAWS = 20000


def no_history(batch):
    return torch.full((batch, 1), -1, dtype=torch.int64)


def ref_probs(logits, temperature=1.0, top_k=0, top_p=1.0, penalty=1.0, history=None):
    """The reference distribution for one row of logits [V] (float64 math)."""
    x = logits.float().clone()
    if history is not None and penalty not in (0.0, 1.0):
        ids = torch.tensor([t for t in history if t >= 0], dtype=torch.int64)
        if len(ids):
            x = RepetitionPenaltyLogitsProcessor(penalty)(ids.unsqueeze(0), x.unsqueeze(0))[0]
    vocab = x.shape[0]
    if temperature == 0:
        p = torch.zeros(vocab, dtype=torch.float64)
        p[int(torch.argmax(x))] = 1.0  # torch.argmax returns the first maximum
        return p
    x = x.double() / temperature
    order = sorted(range(vocab), key=lambda i: (-float(x[i]), i))
    keep = order[:top_k] if 0 < top_k < vocab else order
    probs = torch.softmax(x[keep], 0)
    if 0 < top_p < 1:
        cum = torch.cumsum(probs, 0)
        n = int((cum < top_p).sum()) + 1  # first prefix whose mass reaches top_p
        keep, probs = keep[:n], torch.softmax(x[keep[:n]], 0)
    out = torch.zeros(vocab, dtype=torch.float64)
    out[keep] = probs
    return out


def params(batch, temperature=1.0, top_k=0, top_p=1.0, penalty=1.0, seed=0):
    return dict(temperature=[temperature] * batch, top_k=[top_k] * batch, top_p=[top_p] * batch,
                repetition_penalty=[penalty] * batch, seed=[seed] * batch)


def draw(torch_ops, logits, n, history=None, **kw):
    p = params(logits.shape[0], **kw)
    hist = history if history is not None else no_history(logits.shape[0])
    return torch_ops.sample(logits, p["temperature"], p["top_k"], p["top_p"],
                            p["repetition_penalty"], p["seed"], hist, n)


def chi_square(counts, expected_probs):
    support = expected_probs > 0
    expected = expected_probs[support] * counts.sum()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return stat, int(support.sum()) - 1


def total_variation(p, q):
    return 0.5 * float((p - q).abs().sum())


CASES = [
    # (temperature, top_k, top_p, wrong distribution's parameters)
    (1.0, 0, 1.0, dict(temperature=0.5)),
    (0.7, 0, 1.0, dict(temperature=1.0)),
    (1.5, 0, 1.0, dict(temperature=1.0)),
    (1.0, 5, 1.0, dict(top_k=0)),
    (1.0, 0, 0.6, dict(top_p=1.0)),
    (0.8, 8, 0.9, dict(temperature=0.8, top_k=0, top_p=0.9)),
]


@pytest.mark.parametrize("temperature,top_k,top_p,wrong", CASES)
def test_samples_follow_reference_distribution(torch_ops, temperature, top_k, top_p, wrong):
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(1, 24, generator=gen) * 1.5
    want = ref_probs(logits[0], temperature, top_k, top_p)
    tokens = draw(torch_ops, logits, N_DRAWS, temperature=temperature, top_k=top_k, top_p=top_p,
                  seed=99)[0]
    counts = torch.bincount(tokens, minlength=24).double()
    assert counts[want == 0].sum() == 0, "drew a token the filters exclude"
    stat, df = chi_square(counts, want)
    assert stat < df + 6 * math.sqrt(2 * df), (stat, df)
    empirical = counts / counts.sum()
    assert total_variation(empirical, want) < 0.03
    # The check has power: a wrong implementation would be far outside it.
    bad = ref_probs(logits[0], **{**dict(temperature=temperature, top_k=top_k, top_p=top_p),
                                  **wrong})
    assert total_variation(empirical, bad) > 0.06


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_probabilities_match_reference(torch_ops, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, vocab = 6, 300
    logits = torch.randn(batch, vocab, generator=gen) * 3
    temperature = [0.0, 0.5, 1.0, 1.3, 0.9, 2.0]
    top_k = [0, 0, 10, 0, 50, 299]
    top_p = [1.0, 0.8, 1.0, 0.5, 0.95, 0.3]
    penalty = [1.0, 1.3, 0.8, 1.0, 2.0, 1.1]
    history = torch.randint(0, vocab, (batch, 40), generator=gen)
    got = torch_ops.sampling_probs(logits, temperature, top_k, top_p, penalty, history)
    for b in range(batch):
        want = ref_probs(logits[b], temperature[b], top_k[b], top_p[b], penalty[b],
                         history[b].tolist())
        torch.testing.assert_close(got[b].double(), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("seed", [5, 6])
def test_probabilities_match_transformers_warpers(torch_ops, seed):
    """Second oracle: transformers' temperature / top-k / top-p warpers (no
    exact ties in continuous random logits, where the tie rules could differ)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 500, generator=gen) * 2
    for temperature, top_k, top_p in [(0.7, 40, 0.9), (1.2, 0, 0.5), (1.0, 7, 1.0)]:
        scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        want = torch.softmax(scores.double(), -1)[0]
        got = torch_ops.sampling_probs(logits, [temperature], [top_k], [top_p], [1.0],
                                       no_history(1))[0]
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_repetition_penalty_matches_transformers(torch_ops):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 100, generator=gen) * 4
    history = torch.randint(0, 100, (4, 30), generator=gen)  # repeats included
    for penalty in [1.2, 0.7, 2.0]:
        want = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
        got = torch_ops.repetition_penalty(logits, history, penalty)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_same_seed_same_tokens_whatever_the_batch(torch_ops):
    gen = torch.Generator().manual_seed(8)
    vocab = 1000
    row = torch.randn(1, vocab, generator=gen)
    p = dict(temperature=0.9, top_k=100, top_p=0.95, penalty=1.1, seed=777)
    hist = torch.randint(0, vocab, (1, 20), generator=gen)
    alone = torch_ops.sample(row, [p["temperature"]], [p["top_k"]], [p["top_p"]], [p["penalty"]],
                             [p["seed"]], hist, 300)[0]
    # The same request at different positions among others (greedy rows,
    # other seeds and parameters, longer histories).
    for position, batch in [(0, 3), (2, 3), (4, 7)]:
        others = torch.randn(batch, vocab, generator=gen)
        others[position] = row[0]
        temperature = [0.0 if b % 2 else 1.3 for b in range(batch)]
        top_k = [5] * batch
        top_p = [0.5] * batch
        penalty = [1.0] * batch
        seeds = [b + 1 for b in range(batch)]
        history = torch.randint(0, vocab, (batch, 50), generator=gen)
        history[position] = -1
        history[position, :20] = hist[0]
        temperature[position], top_k[position], top_p[position] = (
            p["temperature"], p["top_k"], p["top_p"])
        penalty[position], seeds[position] = p["penalty"], p["seed"]
        got = torch_ops.sample(others, temperature, top_k, top_p, penalty, seeds, history, 300)
        assert torch.equal(got[position], alone)
    other_seed = torch_ops.sample(row, [p["temperature"]], [p["top_k"]], [p["top_p"]],
                                  [p["penalty"]], [778], hist, 300)[0]
    assert not torch.equal(other_seed, alone)


def test_greedy_ties_go_to_lowest_id(torch_ops):
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -1.0, -3.0]])
    # All-greedy batch (device argmax path) and mixed batch (host path).
    got = draw(torch_ops, logits, 3, temperature=0.0)
    assert got.tolist() == [[1] * 3, [0] * 3, [0] * 3]
    mixed = torch_ops.sample(logits, [0.0, 0.0, 0.0], [0] * 3, [1.0] * 3, [1.0, 1.5, 1.0],
                             [0] * 3, no_history(3), 1)
    assert mixed[:, 0].tolist() == [1, 0, 0]


def test_greedy_on_bfloat16_logits(torch_ops):
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 2000, generator=gen).to(torch.bfloat16)
    got = draw(torch_ops, logits, 1, temperature=0.0)[:, 0]
    assert torch.equal(got, logits.float().argmax(-1))
