"""The C++ SentencePiece tokenizer (engine/tokenizer/sentencepiece_model.*)
against transformers' fast tokenizer and the sentencepiece library.

A Llama-style SentencePiece BPE model (byte_fallback, identity normalization,
add_dummy_prefix, no whitespace collapsing, split digits) is trained here with
the `sentencepiece` package, and written as a Hugging Face directory.

Oracle: transformers' LlamaTokenizer built from that tokenizer.model, with the
*legacy* Llama rules put back: normalizer Prepend("▁") + Replace(" ", "▁"), no
pre-tokenizer. That is what the original Llama-2 and Mistral-7B-v0.1
tokenizer.json files on the Hub hold, and what the sentencepiece library does
when each stretch of text between special tokens is encoded on its own; the C++
follows it. transformers 5.23 builds a different pre-tokenizer when converting
tokenizer.model (Metaspace(prepend_scheme="always"), which adds no "▁" to text
that already starts with a space, unlike the sentencepiece library; and its
legacy LlamaConverter fails), so test_default_conversion_differs_from_library
documents that case, and test_oracle_matches_sentencepiece_library shows the
oracle agrees with the library itself.

Decoding follows HF's Llama decoder (Replace, ByteFallback, Fuse, Strip one
leading space) except for invalid UTF-8: one U+FFFD per invalid byte as the
sentencepiece library does, where HF's ByteFallback also replaces the valid
characters of a run of byte pieces that holds an invalid byte (which would force
a streaming decoder to hold every byte-fallback run until it ends);
test_invalid_bytes_follow_the_library documents that case.
"""
import json
import os
import pathlib
import random
import shutil

import pytest

from tokenizer_corpus import HANDPICKED, ROOT, corpus

SP_SPECIALS = ["<s>", "</s>", "<unk>"]
# Mistral-7B-Instruct-v0.1's template.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}")
SP_HANDPICKED = [
    "<s>", "</s>", "<unk>", "<s>hello</s> x", " <s> ", "a</s>b", "<s><s>", "</s> ", "<s",
    "[INST] hi [/INST]answer</s>[INST] more [/INST]", " leading space", "  two", "\u2581",
    "\u2581\u2581x", "x\u2581y", "tab\t<s>\n", "<0x41>", "<0xFF> bytes",
]
CORPUS = corpus(SP_SPECIALS + ["<s", "/s>", "<unk"]) + SP_HANDPICKED
PLAIN = [s for s in CORPUS if not any(t in s for t in SP_SPECIALS)]


def _training_text():
    rng = random.Random(5)
    lines = []
    for p in sorted(pathlib.Path("/usr/share/common-licenses").glob("*")):
        if p.is_file():
            lines += [l for l in p.read_text(errors="ignore").splitlines() if l.strip()]
    for p in sorted(ROOT.glob("engine/**/*.h"))[:30]:
        lines += p.read_text(errors="ignore").splitlines()
    cjk = [chr(c) for c in range(0x4E00, 0x4E40)] + list("ひらがなカタカナ")
    for _ in range(400):
        lines.append("".join(rng.choice(cjk) for _ in range(rng.randrange(2, 12))))
        lines.append(" ".join(str(rng.randrange(10 ** rng.randrange(1, 8))) for _ in range(4)))
        lines.append("".join(rng.choice("😀🚀✅ αβγ Привет мир") for _ in range(8)))
    return [l for l in lines if l.strip()]


@pytest.fixture(scope="session")
def sp_dir(tmp_path_factory):
    """tokenizer.model + tokenizer_config.json (no tokenizer.json)."""
    import sentencepiece as spm
    d = tmp_path_factory.mktemp("sp_llama")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_text()), model_prefix=str(d / "m"), vocab_size=3000,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_digits=True,
        allow_whitespace_only_pieces=True, character_coverage=0.9995, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, max_sentence_length=1 << 20, num_threads=1, minloglevel=2)
    shutil.move(str(d / "m.model"), str(d / "tokenizer.model"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "legacy": True,
        "clean_up_tokenization_spaces": False, "chat_template": MISTRAL_TEMPLATE}))
    return d


@pytest.fixture(scope="session")
def sp_lib(sp_dir):
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))


@pytest.fixture(scope="session")
def hf_default(sp_dir):
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(sp_dir))


@pytest.fixture(scope="session")
def oracle(sp_dir):
    """transformers' tokenizer for the directory with the legacy Llama rules."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from tokenizers import normalizers
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(sp_dir))
    tok.backend_tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.backend_tokenizer.pre_tokenizer = None
    return tok


@pytest.fixture(scope="session")
def sp_json_dir(sp_dir, oracle, tmp_path_factory):
    """As sp_dir plus the oracle's (non byte-level) tokenizer.json, the layout of
    Llama-2 / Mistral-7B-v0.1 on the Hub; the C++ must still use tokenizer.model."""
    d = tmp_path_factory.mktemp("sp_llama_json")
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(sp_dir / name, d / name)
    oracle.backend_tokenizer.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(params=["model_only", "with_tokenizer_json"])
def path(request, sp_dir, sp_json_dir):
    return str(sp_dir if request.param == "model_only" else sp_json_dir)


def test_corpus_is_large_and_varied(sp_lib):
    assert len(CORPUS) >= 2000 and len(PLAIN) >= 1500
    assert sum(any(t in s for t in SP_SPECIALS) for s in CORPUS) >= 50
    byte_ids = {i for i in range(sp_lib.get_piece_size()) if sp_lib.is_byte(i)}
    assert len(byte_ids) == 256
    # The corpus exercises byte fallback and multi-character pieces.
    assert sum(any(i in byte_ids for i in sp_lib.encode(s)) for s in PLAIN) >= 200
    assert sum(any(len(sp_lib.id_to_piece(i)) >= 4 for i in sp_lib.encode(s)) for s in PLAIN) >= 500


def test_oracle_matches_sentencepiece_library(oracle, sp_lib):
    mismatches = [s for s in PLAIN if oracle.encode(s, add_special_tokens=False) != sp_lib.encode(s)]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]!r}"


def test_default_conversion_differs_from_library(hf_default, sp_lib):
    """Documents why the oracle is not transformers' conversion as is."""
    pre = json.loads(hf_default.backend_tokenizer.to_str())["pre_tokenizer"]
    assert pre["type"] == "Metaspace" and pre["prepend_scheme"] == "always", pre
    assert hf_default.encode(" x", add_special_tokens=False) != sp_lib.encode(" x")


def test_ids_match_hf(torch_ops, path, oracle):
    mismatches = []
    for s in CORPUS:
        want = oracle.encode(s, add_special_tokens=False)
        got = list(torch_ops.tokenize(path, s, False))
        if got != want:
            mismatches.append((s, got, want))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]!r}"


def test_add_special_tokens_matches_hf(torch_ops, path, oracle, sp_lib):
    assert list(torch_ops.tokenizer_info(path)) == [sp_lib.get_piece_size(), 1, 2, 1]
    for s in HANDPICKED + SP_HANDPICKED:
        assert list(torch_ops.tokenize(path, s, True)) == oracle.encode(s), s


def test_decode_roundtrip_and_matches_hf(torch_ops, path, oracle):
    # U+2581 is SentencePiece's space symbol: text holding it decodes with a
    # space there (in HF and the library too), so it cannot round-trip.
    for s in PLAIN:
        ids = list(torch_ops.tokenize(path, s, False))
        assert torch_ops.detokenize(path, ids) == (s if "\u2581" not in s else s.replace("\u2581", " "))
    for s in CORPUS:
        ids = oracle.encode(s)
        for skip in (False, True):
            assert torch_ops.detokenize(path, ids, skip) == \
                oracle.decode(ids, skip_special_tokens=skip), (s, skip)


def _assert_stream(torch_ops, path, ids, want):
    deltas = list(torch_ops.detokenize_stream(path, ids))
    for d in deltas:
        d.encode("utf-8")  # whole characters only
        assert "\ufffd" not in d or "\ufffd" in want
    assert "".join(deltas) == want


def test_streamed_deltas_concatenate_to_decode(torch_ops, path, oracle, sp_lib):
    for s in CORPUS[::3]:
        _assert_stream(torch_ops, path, oracle.encode(s), oracle.decode(oracle.encode(s)))
        ids = oracle.encode(s, add_special_tokens=False)
        _assert_stream(torch_ops, path, ids, oracle.decode(ids))
    n = sp_lib.get_piece_size()
    rng = random.Random(13)
    # Random non-byte pieces (specials included): HF's decoder is the reference.
    pieces = [i for i in range(n) if not sp_lib.is_byte(i)]
    for _ in range(300):
        ids = [rng.choice(pieces) for _ in range(rng.randrange(1, 30))]
        want = oracle.decode(ids, skip_special_tokens=False)
        assert torch_ops.detokenize(path, ids) == want
        _assert_stream(torch_ops, path, ids, want)
    # Random pieces and bytes, cutting characters anywhere: the library's decoder
    # is the reference (it drops control pieces; a first <0x20> keeps its space).
    ordinary = [i for i in range(n) if not (sp_lib.is_control(i) or sp_lib.is_unknown(i))]
    for _ in range(500):
        ids = [rng.choice(ordinary) for _ in range(rng.randrange(1, 30))]
        if sp_lib.id_to_piece(ids[0]) == "<0x20>":
            continue
        want = sp_lib.decode(ids)
        assert torch_ops.detokenize(path, ids) == want, ids
        _assert_stream(torch_ops, path, ids, want)


def test_dummy_prefix_is_dropped_once(torch_ops, path, oracle):
    for s in ["x", " x", "  x", "\n x", "\u2581x"]:
        ids = oracle.encode(s, add_special_tokens=False)
        want = oracle.decode(ids)
        assert torch_ops.detokenize(path, ids) == want == s.replace("\u2581", " ")
        assert "".join(torch_ops.detokenize_stream(path, ids)) == want


def test_invalid_bytes_follow_the_library(torch_ops, path, oracle, sp_lib):
    ids = [sp_lib.piece_to_id("<0x41>"), sp_lib.piece_to_id("<0xFF>")]
    assert sp_lib.decode(ids) == "A\ufffd"
    assert oracle.decode(ids) == "\ufffd\ufffd"  # HF: the whole run of byte pieces
    assert torch_ops.detokenize(path, ids) == "A\ufffd"
    # A truncated character: one U+FFFD per byte, in both references.
    ids = [sp_lib.piece_to_id("<0xE3>"), sp_lib.piece_to_id("<0x81>"), sp_lib.piece_to_id("x")]
    assert torch_ops.detokenize(path, ids) == sp_lib.decode(ids) == oracle.decode(ids) == \
        "\ufffd\ufffdx"


CONVERSATIONS = [
    [("user", "hi")],
    [("user", "Hello"), ("assistant", "Hi! How can I help?"), ("user", "Tell me a joke.")],
    [("user", "  spaces  \n"), ("assistant", " ")],
    [("user", "日本語で答えて 😀"), ("assistant", "はい</s>"), ("user", "<s> inside")],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_mistral_chat_template_matches_transformers(torch_ops, path, oracle, conversation):
    messages = [{"role": r, "content": c} for r, c in conversation]
    want = oracle.apply_chat_template(messages, tokenize=False)
    got = torch_ops.chat_template(path, [r for r, _ in conversation],
                                  [c for _, c in conversation], False)
    assert got == want
    want_ids = oracle.apply_chat_template(messages, tokenize=True)
    if not isinstance(want_ids, list):
        want_ids = want_ids["input_ids"]
    assert list(torch_ops.tokenize(path, got, False)) == list(want_ids)


def test_mistral_chat_template_rejects_system_role(torch_ops, path):
    with pytest.raises(RuntimeError, match="'system'"):
        torch_ops.chat_template(path, ["system", "user"], ["x", "y"], True)


def test_gguf_llama_vocabulary_is_refused(torch_ops, tmp_path, sp_lib):
    import gguf
    import numpy as np
    p = tmp_path / "llama-vocab.gguf"
    w = gguf.GGUFWriter(str(p), arch="llama")
    w.add_tokenizer_model("llama")
    n = sp_lib.get_piece_size()
    w.add_token_list([sp_lib.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp_lib.get_score(i) for i in range(n)])
    w.add_token_types([3 if sp_lib.is_control(i) else 6 if sp_lib.is_byte(i) else 1
                       for i in range(n)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert torch_ops.gguf_open_error(str(p)) == ""  # the file itself is fine
    with pytest.raises(RuntimeError) as e:
        torch_ops.tokenize(str(p), "hello", False)
    msg = str(e.value)
    assert str(p) in msg and "tokenizer.ggml.model 'llama'" in msg and "'gpt2'" in msg
    assert "tokenizer.model" in msg


@pytest.mark.parametrize("content", [b"", b"\x0a\xff\xffgarbage", b"\x00" * 64])
def test_bad_tokenizer_model_is_an_error_naming_the_file(torch_ops, tmp_path, content):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(content)
    with pytest.raises(RuntimeError) as e:
        torch_ops.tokenize(str(d), "x", False)
    assert f"{d / 'tokenizer.model'}: not a valid SentencePiece model" in str(e.value)


def test_directory_without_tokenizer_files(torch_ops, tmp_path):
    with pytest.raises(RuntimeError) as e:
        torch_ops.tokenize(str(tmp_path), "x", False)
    assert str(tmp_path / "tokenizer.json") in str(e.value) and "tokenizer.model" in str(e.value)


# ---- inside the real server ------------------------------------------------
# The server process also loads gRPC's system libprotobuf, which clashes with
# the protobuf copy inside libsentencepiece (engine/tokenizer/sentencepiece_shim.h);
# these tests show the isolated module works there: ids over gRPC match the
# oracle and a tiny Llama model with this vocabulary generates what
# transformers generates.

@pytest.fixture(scope="module")
def sp_model_server(sp_dir, start_module_server, tmp_path_factory):
    import torch
    import transformers
    d = tmp_path_factory.mktemp("sp_tiny_llama")
    for f in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(sp_dir / f, d / f)
    torch.manual_seed(11)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=3000,
                                   max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                                   initializer_range=0.1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(d, safe_serialization=True)
    hf = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    server = start_module_server([f"--model={d}", "--default-kv-method=none",
                                  "--kv-cache-memory=64MiB", "--shutdown-grace=5"])
    return server, hf


def test_server_tokenizes_like_the_oracle(sp_model_server, pb, oracle):
    import grpc
    pb2, pb2_grpc = pb
    server, _ = sp_model_server
    sample = CORPUS[::10]
    with grpc.insecure_channel(server.target) as ch:
        stub = pb2_grpc.GenerationStub(ch)
        for s in sample:
            for special in (False, True):
                got = list(stub.Tokenize(pb2.TokenizeRequest(text=s, add_special_tokens=special),
                                         timeout=10).ids)
                want = oracle(s, add_special_tokens=special)["input_ids"]
                assert got == want, repr(s)
    assert len(sample) >= 200


def test_server_generates_like_transformers(sp_model_server, pb, oracle, sp_lib):
    import grpc
    import torch
    pb2, pb2_grpc = pb
    server, hf = sp_model_server
    prompt = "The license grants you the freedom to share and change"
    ids = oracle(prompt)["input_ids"]
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    with grpc.insecure_channel(server.target) as ch:
        stub = pb2_grpc.GenerationStub(ch)
        r = stub.Generate(pb2.GenerateRequest(
            prompt=prompt, stopping=pb2.StoppingCriteria(max_new_tokens=12, ignore_eos=True)),
            timeout=60)
    assert list(r.token_ids) == want
    # The text is the sentencepiece library's decoding of those ids. Where
    # byte pieces spell invalid UTF-8 the library replaces each byte that
    # starts no valid sequence (engine/tokenizer/unicode.h, Utf8LossyPerByte),
    # while transformers' ByteFallback decoder replaces every byte piece of
    # such a run, valid ASCII ones too; random weights do generate such runs
    # (which ones depends on the vocabulary this module trains, from files of
    # the repository). Elsewhere the two agree, and transformers is checked.
    text = sp_lib.decode(want)
    assert r.text == text
    if "\ufffd" not in text:
        assert r.text == oracle.decode(want, skip_special_tokens=False)
    assert r.usage.prompt_tokens == len(ids)
