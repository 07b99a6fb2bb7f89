"""Greedy decoding with transformers, the oracle of the model-parity tests."""
import torch


@torch.no_grad()
def hf_greedy(model, ids, max_new):
    """Greedy decoding through transformers' own KV cache (no generate():
    random models may emit EOS, which must not stop the comparison)."""
    out = model(torch.tensor([ids]), use_cache=True)
    past, tokens = out.past_key_values, []
    for _ in range(max_new):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokens
