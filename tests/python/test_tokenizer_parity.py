"""The C++ tokenizer (engine/tokenizer) against Hugging Face tokenizers.

Oracle: the vocabulary and merges come from transformers' GGUF conversion
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), the splitting rules from
the `tokenizers` library. SmolLM2's GGUF says `tokenizer.ggml.pre = "smollm"`,
i.e. the original tokenizer.json's pre-tokenizer
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)];
transformers' conversion (checked with transformers 5.23) replaces it by plain
ByteLevel, which tokenizes some text differently (e.g. "a  1": original
a|ĠĠ|1, converted a|Ġ|Ġ|1). snapserve follows the original, so the oracle is the
converted tokenizer with the original pre-tokenizer put back;
test_gguf_conversion_drops_digit_splitting documents the difference.
"""
import json
import random
import unicodedata

import pytest

from tokenizer_corpus import HANDPICKED, corpus

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="session")
def hf_converted(model_path):
    import os
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)


def original_rules(converted):
    """The converted tokenizer with SmolLM2's original pre-tokenizer."""
    from tokenizers import Tokenizer, pre_tokenizers
    tok = Tokenizer.from_str(converted.backend_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return tok


@pytest.fixture(scope="session")
def oracle(hf_converted):
    return original_rules(hf_converted)


CORPUS = corpus()


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 2000
    assert any("<|im_end|>" in s for s in CORPUS)
    assert any(any(unicodedata.category(c) == "Lo" for c in s) for s in CORPUS)


def test_gguf_conversion_drops_digit_splitting(hf_converted, oracle):
    """Documents why the oracle is not transformers' converted tokenizer as is."""
    pre = json.loads(hf_converted.backend_tokenizer.to_str())["pre_tokenizer"]
    assert pre["type"] == "ByteLevel", pre  # no Digits step: the conversion lost it
    s = "a  1"
    assert hf_converted.encode(s, add_special_tokens=False) != oracle.encode(s).ids


def test_ids_match_hf(torch_ops, model_path, oracle):
    path = str(model_path)
    mismatches = []
    for s in CORPUS:
        want = oracle.encode(s, add_special_tokens=False).ids
        got = list(torch_ops.tokenize(path, s, False))
        if got != want:
            mismatches.append((s, got, want))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]!r}"


def test_add_special_tokens_matches_hf(torch_ops, model_path, oracle):
    # SmolLM2 adds no BOS (tokenizer.ggml.add_bos_token = false).
    for s in HANDPICKED:
        assert list(torch_ops.tokenize(str(model_path), s, True)) == oracle.encode(s).ids


def test_decode_roundtrip_and_matches_hf(torch_ops, model_path, oracle):
    path = str(model_path)
    for s in CORPUS:
        ids = list(torch_ops.tokenize(path, s, False))
        text = torch_ops.detokenize(path, ids)
        assert text == s
        assert text == oracle.decode(ids, skip_special_tokens=False)
    ids = oracle.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert torch_ops.detokenize(path, ids, True) == oracle.decode(ids, skip_special_tokens=True)


def _assert_stream(torch_ops, path, ids, want):
    deltas = list(torch_ops.detokenize_stream(path, ids))
    for d in deltas:
        d.encode("utf-8")  # a str that round-trips: no lone surrogate, whole characters
        assert "\ufffd" not in d or "\ufffd" in want
    assert "".join(deltas) == want


def test_streamed_deltas_concatenate_to_decode(torch_ops, model_path, oracle):
    path = str(model_path)
    for s in CORPUS[::3]:
        ids = oracle.encode(s).ids
        _assert_stream(torch_ops, path, ids, s)
    # Random ids cut characters anywhere; the lossy decode must still agree.
    rng = random.Random(11)
    for _ in range(300):
        ids = [rng.randrange(49152) for _ in range(rng.randrange(1, 30))]
        want = oracle.decode(ids, skip_special_tokens=False)
        assert torch_ops.detokenize(path, ids) == want
        _assert_stream(torch_ops, path, ids, want)


CONVERSATIONS = [
    [("user", "hi")],
    [("system", "Be brief."), ("user", "What is 2+2?")],
    [("user", "Hello"), ("assistant", "Hi! How can I help?"), ("user", "Tell me a joke.")],
    [("system", ""), ("user", "  spaces  \n")],
    [("user", "日本語で答えて 😀"), ("assistant", "はい"), ("user", "<|im_end|> inside")],
    [("assistant", "I speak first"), ("user", "ok")],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(torch_ops, model_path, hf_converted, conversation,
                                            add_generation_prompt):
    messages = [{"role": r, "content": c} for r, c in conversation]
    want = hf_converted.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)
    got = torch_ops.chat_template(str(model_path), [r for r, _ in conversation],
                                  [c for _, c in conversation], add_generation_prompt)
    assert got == want


def test_chat_template_unknown_role(torch_ops, model_path):
    with pytest.raises(RuntimeError, match="'wizard'"):
        torch_ops.chat_template(str(model_path), ["wizard"], ["x"], True)


@pytest.mark.parametrize("name", ["gpt2", "llama-bpe", "smollm"])
def test_pretokenizer_splits_match_hf(torch_ops, name):
    from tokenizers import Regex, pre_tokenizers as P
    gpt2 = P.Split(Regex(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
                   "isolated")
    ref = {
        "gpt2": gpt2,
        "llama-bpe": P.Split(Regex(LLAMA3_PATTERN), "isolated"),
        "smollm": P.Sequence([P.Digits(individual_digits=True), gpt2]),
    }[name]
    mismatches = []
    for s in CORPUS:
        want = [p for p, _ in ref.pre_tokenize_str(s)]
        got = list(torch_ops.pretokenize(name, s))
        if got != want:
            mismatches.append((s, got, want))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]!r}"


def _save_hf_dir(tok, directory, config):
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory)


def test_hf_directory_matches_gguf_oracle(torch_ops, tmp_path, oracle, hf_converted):
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
              "chat_template": hf_converted.chat_template}
    path = _save_hf_dir(oracle, tmp_path / "smollm2", config)
    assert list(torch_ops.tokenizer_info(path)) == [49152, 1, 2, 0]
    for s in CORPUS[::2]:
        assert list(torch_ops.tokenize(path, s, True)) == oracle.encode(s).ids
    assert torch_ops.chat_template(path, ["user"], ["hi"], True) == \
        hf_converted.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)


def test_hf_directory_llama3_rules(torch_ops, tmp_path, oracle):
    """Llama-3 splitting, ignore_merges and a BOS post-processor, on SmolLM2's vocabulary."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers as P, processors
    tok = Tokenizer.from_str(oracle.to_str())
    tok.pre_tokenizer = P.Sequence([
        P.Split(Regex(LLAMA3_PATTERN), "isolated"),
        P.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(data))
    path = _save_hf_dir(tok, tmp_path / "llama3ish", {"bos_token": "<|endoftext|>"})
    assert list(torch_ops.tokenizer_info(path))[1:] == [0, -1, 1]
    mismatches = [s for s in CORPUS if list(torch_ops.tokenize(path, s, True)) != tok.encode(s).ids]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]!r}"
