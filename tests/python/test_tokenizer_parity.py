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
from snapserve_testkit.server import startup_error

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


# ---- malformed Hugging Face files fail the server start cleanly -------------
# A wrong JSON type anywhere in tokenizer.json / tokenizer_config.json /
# config.json once escaped as nlohmann::json::type_error and aborted the
# server (SIGABRT); special-token ids outside the vocabulary were accepted and
# failed only when a prompt produced them. Each case must end the process with
# a non-zero exit code (not a signal) and a startup_failed line naming the
# file and the field.

SMOLLM_POST = {"type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}}],
               "pair": [], "special_tokens": {"<|endoftext|>": {
                   "id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}


def _set(path, value):
    """A mutation that sets data[path[0]][path[1]]... to `value`."""
    def mutate(data):
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value
    return mutate


def _first_vocab_entry_as_string(data):
    vocab = data["model"]["vocab"]
    key = next(iter(vocab))
    vocab[key] = str(vocab[key])


def _post_processor_ids(ids):
    def mutate(data):
        post = json.loads(json.dumps(SMOLLM_POST))
        post["special_tokens"]["<|endoftext|>"]["ids"] = ids
        data["post_processor"] = post
    return mutate


# (case, file, mutation of its parsed JSON (or the new top level), words the error must hold)
BAD_HF_FILES = [
    ("tokenizer_top_level_array", "tokenizer.json", lambda d: [], ["top level", "array"]),
    ("vocab_array", "tokenizer.json",
     lambda d: d["model"].__setitem__("vocab", list(d["model"]["vocab"])[:10]),
     ["model.vocab", "expected an object"]),
    ("vocab_id_string", "tokenizer.json", _first_vocab_entry_as_string, ["model.vocab[", "string"]),
    ("model_number", "tokenizer.json", _set(["model"], 7), ["model", "expected an object"]),
    ("added_tokens_object", "tokenizer.json", _set(["added_tokens"], {}),
     ["added_tokens", "expected an array"]),
    ("added_token_id_string", "tokenizer.json", _set(["added_tokens", 0, "id"], "0"),
     ["added_tokens[0].id", "string"]),
    ("added_token_number", "tokenizer.json", _set(["added_tokens", 0], 5),
     ["added_tokens[0]", "expected an object"]),
    ("added_token_id_past_model_vocab", "tokenizer.json", _set(["added_tokens", 0, "id"], 49152),
     ["added_tokens[0].id", "outside the vocabulary", "vocab_size 49152"]),
    ("merges_object", "tokenizer.json", _set(["model", "merges"], {"a": "b"}),
     ["model.merges", "expected an array"]),
    ("ignore_merges_number", "tokenizer.json", _set(["model", "ignore_merges"], 1),
     ["model.ignore_merges"]),
    ("pre_tokenizer_flag_string", "tokenizer.json",
     _set(["pre_tokenizer", "pretokenizers", 1, "add_prefix_space"], "no"),
     ["pre_tokenizer.pretokenizers[1].add_prefix_space"]),
    ("post_processor_array", "tokenizer.json", _set(["post_processor"], []),
     ["post_processor", "expected an object"]),
    ("post_processor_id_outside_vocab", "tokenizer.json", _post_processor_ids([999999]),
     ["post_processor.special_tokens", "999999", "outside the vocabulary"]),
    ("post_processor_id_string", "tokenizer.json", _post_processor_ids(["0"]),
     ["post_processor.special_tokens", "ids[0]", "string"]),
    ("config_top_level_array", "tokenizer_config.json", lambda d: [1, 2], ["top level"]),
    ("bos_token_number", "tokenizer_config.json", _set(["bos_token"], 1), ["bos_token"]),
    ("bos_token_content_number", "tokenizer_config.json", _set(["bos_token"], {"content": 1}),
     ["bos_token.content"]),
    ("chat_template_number", "tokenizer_config.json", _set(["chat_template"], 3),
     ["chat_template"]),
    ("chat_template_list_of_numbers", "tokenizer_config.json", _set(["chat_template"], [3]),
     ["chat_template[0]"]),
    ("model_config_top_level_array", "config.json", lambda d: [], ["top level"]),
    ("model_config_vocab_string", "config.json", _set(["vocab_size"], "49152"), ["vocab_size"]),
    ("model_config_rope_parameters_array", "config.json", _set(["rope_parameters"], [1]),
     ["rope_parameters", "must be an object"]),
]


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory, hf_converted, oracle):
    """A tiny random Llama with the default model's vocabulary (49152 ids) and
    its tokenizer files (the oracle's tokenizer.json, SmolLM2's
    tokenizer_config.json fields): cheap to load, so each bad case costs
    little more than a process start."""
    import torch
    import transformers
    d = tmp_path_factory.mktemp("hf_smollm_tokenizer")
    torch.manual_seed(5)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=49152, max_position_embeddings=512,
                                      bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(config).save_pretrained(d, safe_serialization=True)
    oracle.save(str(d / "tokenizer.json"))
    data = json.loads((d / "tokenizer.json").read_text())
    data["post_processor"] = SMOLLM_POST  # a TemplateProcessing to break below
    (d / "tokenizer.json").write_text(json.dumps(data))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
        "chat_template": hf_converted.chat_template}))
    return d


def test_hf_model_dir_serves(hf_model_dir, start_server, pb):
    """The unmutated directory starts: the failures below are the mutations'."""
    import grpc
    pb2, pb2_grpc = pb
    server = start_server([f"--model={hf_model_dir}", "--kv-cache-memory=16MiB",
                           "--default-kv-method=none"])
    with grpc.insecure_channel(server.target) as ch:
        ids = pb2_grpc.GenerationStub(ch).Tokenize(
            pb2.TokenizeRequest(text="hello", add_special_tokens=True), timeout=10).ids
    assert list(ids)[0] == 0  # the post-processor's <|endoftext|>


@pytest.mark.parametrize("case", [c[0] for c in BAD_HF_FILES])
def test_bad_hf_file_fails_the_start_cleanly(case, hf_model_dir, tmp_path, build_dir):
    import shutil
    import subprocess
    (_, name, mutate, words), = [c for c in BAD_HF_FILES if c[0] == case]
    d = tmp_path / "model"
    shutil.copytree(hf_model_dir, d)
    data = json.loads((d / name).read_text())
    replaced = mutate(data)
    (d / name).write_text(json.dumps(data if replaced is None else replaced))
    out = subprocess.run([str(build_dir / "server" / "snapserve"), f"--model={d}", "--port=0",
                          "--metrics-port=0", "--kv-cache-memory=16MiB",
                          "--default-kv-method=none"],
                         capture_output=True, text=True, timeout=60)
    error = startup_error(out)
    assert f"{d}/{name}" in error, error
    for word in words:
        assert word in error, (word, error)


# ---- the safetensors index may not name files outside the model directory ---

def _indexed_copy(hf_model_dir, tmp_path, shard_name):
    """A copy of hf_model_dir whose weights are named through a
    model.safetensors.index.json that maps every tensor to `shard_name`; the
    one real shard is moved to tmp_path/outside.safetensors (a valid file
    outside the directory) unless `shard_name` is a plain name inside it."""
    import shutil
    from safetensors import safe_open
    d = tmp_path / "model"
    shutil.copytree(hf_model_dir, d)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    if "/" in shard_name or shard_name == "..":
        shutil.move(d / "model.safetensors", tmp_path / "outside.safetensors")
    else:
        (d / "model.safetensors").rename(d / shard_name)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: shard_name for name in names}}))
    return d


def test_indexed_shards_inside_the_directory_serve(hf_model_dir, tmp_path, start_server, pb):
    """Control for the guard below: the same index with a plain shard name loads."""
    import grpc
    pb2, pb2_grpc = pb
    d = _indexed_copy(hf_model_dir, tmp_path, "model-00001-of-00001.safetensors")
    server = start_server([f"--model={d}", "--kv-cache-memory=16MiB", "--default-kv-method=none"])
    with grpc.insecure_channel(server.target) as ch:
        info = pb2_grpc.GenerationStub(ch).GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
    assert info.vocab_size == 49152


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/../../outside.safetensors",
                                   "ABSOLUTE", ".."])
def test_weight_map_outside_the_directory_fails_the_start(shard, hf_model_dir, tmp_path,
                                                          build_dir):
    """A weight_map entry that leaves the model directory (path traversal, an
    absolute path) stops startup with an error naming the entry, although the
    file it points at exists and is a valid shard."""
    import subprocess
    if shard == "ABSOLUTE":
        shard = str(tmp_path / "outside.safetensors")
    d = _indexed_copy(hf_model_dir, tmp_path, shard)
    assert shard == ".." or (d / shard).resolve().is_file(), "the target must exist"
    out = subprocess.run([str(build_dir / "server" / "snapserve"), f"--model={d}", "--port=0",
                          "--metrics-port=0", "--kv-cache-memory=16MiB",
                          "--default-kv-method=none"],
                         capture_output=True, text=True, timeout=60)
    error = startup_error(out)
    assert f"shard name `{shard}`" in error and "inside the model directory" in error, error
    assert '"serving"' not in out.stdout + out.stderr


# ---- while the model loads: health NOT_SERVING, calls UNAVAILABLE ------------

def test_loading_state_then_serving(hf_model_dir, tmp_path, start_server, pb):
    """The gRPC port listens before the model is loaded (so probes get an
    answer); until the load ends health is NOT_SERVING and every Generation
    call is UNAVAILABLE "model is loading"; then health turns SERVING.

    No timing: the model directory's config.json is a named pipe, so the load
    blocks opening it until the test releases it. On release the test opens
    the pipe for the waiting reader, puts a regular config.json in its place
    (later readers, such as the tokenizer's, open that) and writes the real
    contents to the reader."""
    import errno
    import os
    import shutil
    import threading
    import time

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    pb2, pb2_grpc = pb
    d = tmp_path / "model"
    shutil.copytree(hf_model_dir, d)
    config = (d / "config.json").read_bytes()
    (tmp_path / "config.json").write_bytes(config)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")

    release, done = threading.Event(), threading.Event()

    def serve_config():
        release.wait()
        while not done.is_set():
            try:
                # Succeeds once the server is blocked opening the pipe.
                fd = os.open(d / "config.json", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:  # ENXIO: no reader yet
                assert e.errno == errno.ENXIO, e
                time.sleep(0.02)
                continue
            os.replace(tmp_path / "config.json", d / "config.json")
            os.set_blocking(fd, True)
            try:
                os.write(fd, config)
            finally:
                os.close(fd)
            return
    writer = threading.Thread(target=serve_config, daemon=True)
    writer.start()

    server = start_server([f"--model={d}", "--kv-cache-memory=16MiB",
                           "--default-kv-method=none"], wait=False)
    try:
        with grpc.insecure_channel(server.target) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            stub = pb2_grpc.GenerationStub(ch)
            grpc.channel_ready_future(ch).result(timeout=60)
            for service in ("", "snapserve.v1.Generation"):
                r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING, service
            watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=120)
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING

            small = pb2.GenerateRequest(prompt="hi",
                                        stopping=pb2.StoppingCriteria(max_new_tokens=1))
            for name, call in [
                    ("Generate", lambda: stub.Generate(small, timeout=10)),
                    ("GenerateStream", lambda: list(stub.GenerateStream(small, timeout=10))),
                    ("Tokenize", lambda: stub.Tokenize(pb2.TokenizeRequest(text="hi"),
                                                       timeout=10)),
                    ("GetModelInfo", lambda: stub.GetModelInfo(pb2.GetModelInfoRequest(),
                                                               timeout=10))]:
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
                assert err.value.details() == "model is loading", (name, err.value.details())
            assert '"serving"' not in server.logs(), "the load did not wait for config.json"

            release.set()
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
            info = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
            assert info.vocab_size == 49152
    finally:
        done.set()
        release.set()
        writer.join(timeout=10)
