#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<target>/).

Seeds come from the default model (models/SmolLM2-135M-Instruct.Q4_1.gguf):
its metadata and tensor table (vocabulary cut to its first VOCAB tokens so
each seed stays small, none of the 100 MB of weights), the tokenizer files a
Hugging Face directory of it holds (rebuilt from the same metadata), its chat
template and config; plus small hand-written files for the formats the model
does not use (safetensors, other chat families, HTTP heads). Rerun after
changing the harnesses' input formats:
  .venv/bin/python tests/fuzz/make_seeds.py [path/to/model.gguf]
Regression inputs (crashers, named crash-*) are committed beside the seeds
and are not touched here.
"""
import json
import os
import struct
import sys

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
VOCAB = 600  # tokens kept from the model's vocabulary

# GGUF metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 100_000, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- GGUF encoding (the format of engine/model/gguf_file.h) -------------------
def gstr(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack("<Q", len(b)) + b


def gvalue(vtype, v):
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(gvalue(etype, i) for i in items)
    return struct.pack(SCALAR[vtype], v)


def gguf_file(kvs, tensors, data=b"", version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, ggml_type, offset)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, v in kvs:
        out += gstr(key) + struct.pack("<I", vtype) + gvalue(vtype, v)
    for name, dims, ttype, offset in tensors:
        out += gstr(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, offset)
    if tensors:
        out += b"\0" * (-len(out) % alignment)
    return out + data


def model_metadata(reader):
    """The model's metadata as [(key, type, value)], the tokenizer cut to VOCAB."""
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    kept = set(tokens[:VOCAB])
    kvs = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = f.types[0]
        if vtype == STRING:
            kvs.append((key, STRING, bytes(f.parts[f.data[0]])))
        elif vtype == ARRAY:
            etype = f.types[1]
            if etype == STRING:
                items = [bytes(f.parts[i]) for i in f.data]
            else:
                items = [f.parts[i].tolist()[0] for i in f.data]
            if key == "tokenizer.ggml.merges":
                items = [m for m in items
                         if all(p in kept for p in m.decode().split(" ", 1))
                         and m.decode().replace(" ", "", 1) in kept]
            elif key.startswith("tokenizer.ggml."):
                items = items[:VOCAB]
            kvs.append((key, ARRAY, (etype, items)))
        else:
            kvs.append((key, vtype, f.parts[f.data[0]].tolist()[0]))
    return kvs


def tensor_bytes(ttype, dims):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
    n = 1
    for d in dims:
        n *= d
    return n // block_elems * block_bytes


def gguf_seeds(reader):
    kvs = model_metadata(reader)
    infos = [(t.name, [int(d) for d in t.shape], int(t.tensor_type),
              int(t.data_offset) - reader.data_offset) for t in reader.tensors]
    # The model's header and whole tensor table, without the weights: parsing
    # reaches the extent checks (which refuse it: the data is missing).
    write("gguf", "smollm2_header_no_data", gguf_file(kvs, infos))
    # The same metadata and a few small tensors that tile their data section:
    # a file the reader accepts and a tokenizer loads from.
    small = [("token_embd.weight", [32, 4], 8), ("blk.0.attn_norm.weight", [32], 0),
             ("blk.0.attn_q.weight", [32, 2], 3), ("output_norm.weight", [32], 1),
             ("rope_freqs.weight", [16], 30)]
    tensors, data = [], b""
    for name, dims, ttype in small:
        data += b"\0" * (-len(data) % 32)
        tensors.append((name, dims, ttype, len(data)))
        n = tensor_bytes(ttype, dims)
        data += bytes((i * 37 + 11) & 0xFF for i in range(n))
    write("gguf", "smollm2_small_tensors", gguf_file(kvs, tensors, data))
    write("gguf", "empty_v2", gguf_file([], [], version=2))
    write("gguf", "nested_arrays", gguf_file(
        [("a", ARRAY, (ARRAY, [(U8, [1, 2]), (STRING, ["x", "y"])])),
         ("general.alignment", U32, 64), ("f", F64, 1.5), ("b", BOOL, True), ("i", I64, -3),
         ("s", I16, -2), ("u", U16, 9), ("c", I8, -1), ("g", F32, 0.25)],
        [("t", [64], 0, 0)], bytes(256), alignment=64))
    return kvs


# --- Hugging Face tokenizer files, from the model's metadata -------------------
def hf_tokenizer_files(kvs, llama3_style=False):
    meta = {k: v for k, _, v in kvs}
    tokens = [t.decode() for t in meta["tokenizer.ggml.tokens"][1]]
    types = meta["tokenizer.ggml.token_type"][1]
    merges = [m.decode() for m in meta["tokenizer.ggml.merges"][1]]
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": types[i] == 3}
             for i in range(len(tokens)) if types[i] in (3, 4)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": not llama3_style}
    if llama3_style:
        pattern = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False}, byte_level]}
        post = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": tokens[1], "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [],
             "special_tokens": {tokens[1]: {"id": tokens[1], "ids": [1], "tokens": [tokens[1]]}}}]}
        merge_list = [m.split(" ", 1) for m in merges]
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                "use_regex": True}
        merge_list = merges
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre, "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": llama3_style,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merge_list}}
    template = meta["tokenizer.chat_template"].decode()
    config = {"add_prefix_space": False, "bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
              "eos_token": {"content": tokens[meta["tokenizer.ggml.eos_token_id"]],
                            "special": True},
              "clean_up_tokenization_spaces": False, "model_max_length": 8192,
              "tokenizer_class": "GPT2Tokenizer", "unk_token": tokens[0]}
    if llama3_style:
        config["chat_template"] = [{"name": "default", "template": template},
                                   {"name": "tool_use", "template": "{{ tools }}"}]
    else:
        config["chat_template"] = template
    return json.dumps(tokenizer, ensure_ascii=False), json.dumps(config, ensure_ascii=False)


def model_config(kvs):
    m = {k: v for k, _, v in kvs}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": m["llama.embedding_length"],
            "intermediate_size": m["llama.feed_forward_length"],
            "num_attention_heads": m["llama.attention.head_count"],
            "num_hidden_layers": m["llama.block_count"],
            "num_key_value_heads": m["llama.attention.head_count_kv"],
            "max_position_embeddings": m["llama.context_length"],
            "rms_norm_eps": m["llama.attention.layer_norm_rms_epsilon"],
            "rope_theta": m["llama.rope.freq_base"], "rope_scaling": None,
            "tie_word_embeddings": True, "vocab_size": m["llama.vocab_size"],
            "bos_token_id": m["tokenizer.ggml.bos_token_id"],
            "eos_token_id": m["tokenizer.ggml.eos_token_id"], "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16"}


def tokenizer_and_config_seeds(kvs):
    tok, cfg = hf_tokenizer_files(kvs)
    small_config = dict(model_config(kvs), vocab_size=VOCAB)
    # Also the reference tokenizer when the model is absent (reference_tokenizer.h).
    write("tokenizer_files", "smollm2_reduced", tok + "\0" + cfg)
    write("tokenizer_files", "smollm2_reduced_with_config",
          tok + "\0" + cfg + "\0" + json.dumps(small_config))
    tok3, cfg3 = hf_tokenizer_files(kvs, llama3_style=True)
    write("tokenizer_files", "llama3_style", tok3 + "\0" + cfg3)

    base = model_config(kvs)
    write("model_config", "smollm2", json.dumps(base, indent=2))
    write("model_config", "llama3_rope_scaling", json.dumps(dict(
        base, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192})))
    write("model_config", "rope_parameters", json.dumps(dict(
        {k: v for k, v in base.items() if k != "rope_theta"}, eos_token_id=[2, 0],
        rope_parameters={"rope_theta": 500000.0, "type": "linear", "factor": 2.0})))
    write("model_config", "mistral_sliding_window", json.dumps(dict(
        base, model_type="mistral", sliding_window=4096, head_dim=64,
        tie_word_embeddings=False)))
    return kvs


def chat_template_seeds(kvs):
    meta = {k: v for k, _, v in kvs}
    tokens = [t.decode() for t in meta["tokenizer.ggml.tokens"][1]]
    smol = meta["tokenizer.chat_template"].decode()
    convo = ["system", "You are terse.", "user", "Hi <|im_end|>", "assistant", "Hello!",
             "user", "2+2?"]
    write("chat_template", "smollm2", "\0".join(
        [smol, tokens[1], tokens[2], "\x01"] + convo))
    write("chat_template", "smollm2_default_system", "\0".join(
        [smol, tokens[1], tokens[2], "\x00", "user", "What is 2+2?", "tool", "4"]))
    llama3 = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
              "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
              "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
              "{% endif %}")
    write("chat_template", "llama3", "\0".join(
        [llama3, "<|begin_of_text|>", "<|eot_id|>", "\x01", "system", "  padded  ",
         "user", "hi", "ipython", "{}"]))
    mistral = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
               "[INST] {{ message['content'] }} [/INST]{% else %}{{ message['content'] }}"
               "{{ eos_token }}{% endif %}{% endfor %}")
    write("chat_template", "mistral", "\0".join(
        [mistral, "<s>", "</s>", "\x00", "user", "a", "assistant", "b", "user", "c"]))


def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 13 + 5) & 0xFF for i in range(n))
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    write("safetensors", "three_dtypes", safetensors_file(
        [("model.embed_tokens.weight", "BF16", [8, 4]), ("model.norm.weight", "F32", [4]),
         ("lm_head.weight", "F16", [8, 4])], {"format": "pt"}))
    write("safetensors", "scalar_and_empty", safetensors_file(
        [("scalar", "F32", []), ("empty", "F16", [0, 3])]))
    write("safetensors", "header_only", struct.pack("<Q", 2) + b"{}")


def http_seeds():
    heads = {
        "get_metrics": "GET /metrics HTTP/1.1\r\nHost: localhost:9464\r\n"
                       "User-Agent: Prometheus/2.45.0\r\nAccept: text/plain\r\n\r\n",
        "bare_lf": "GET /metrics?name[]=x HTTP/1.0\nHost: a\n\n",
        "leading_crlf": "\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\n",
        "bad_version": "POST /metrics HTTP/2.0\r\nContent-Length: 3\r\n\r\nabc",
        "partial": "GET /metr",
        "spaces": "GET  /metrics  HTTP/1.1\r\n\r\n",
    }
    for name, text in heads.items():
        write("http_request_head", name, text)


def codec_seeds(kvs):
    meta = {k: v for k, _, v in kvs}
    tokens = [t.decode() for t in meta["tokenizer.ggml.tokens"][1]]
    texts = {
        "english": "\x00The quick brown fox jumps over the lazy dog. It's 12:45, isn't it?",
        "code": "\x01def f(x):\n\treturn x ** 2  # square\n\n\nprint(f(12345))\r\n",
        "special_tokens": "\x00" + tokens[1] + "user\nHi" + tokens[2] + "\n" + tokens[0],
        "split_special": "\x02" + tokens[1] + "system\n" + tokens[2],
        "segmented": "\x05user text <|im_end|>\n" + tokens[1] + "assistant\nmore\nlast",
        "unicode": "\x00caf\u00e9 na\u00efve \u4f60\u597d\u4e16\u754c \U0001F600\U0001F680 "
                   "\u0645\u0631\u062d\u0628\u0627 \u00a0\u2003\u3000 \u0661\u0662\u0663",
    }
    for name, text in texts.items():
        write("tokenizer_codec", name, text)
    write("tokenizer_codec", "invalid_utf8",
          b"\x00ok \xff\xfe \xe4\xbd \xc3( \xed\xa0\x80 \xf0\x9f\x98 \xc0\xaf end")


def incremental_seeds(kvs):
    meta = {k: v for k, _, v in kvs}
    tokens = [t.decode() for t in meta["tokenizer.ggml.tokens"][1]]
    index = {t: i for i, t in enumerate(tokens)}
    # GPT-2's byte-to-character map: the tokens that stand for single bytes.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
                 + list(range(0xAE, 0xFF + 1)))
    byte_char, extra = {}, 0
    for b in range(256):
        if b in printable:
            byte_char[b] = chr(b)
        else:
            byte_char[b] = chr(256 + extra)
            extra += 1

    def ids_of(data):
        return [index[byte_char[b]] for b in data if byte_char[b] in index]

    def seed(flags, ids):
        return bytes([flags]) + b"".join(struct.pack("<H", i) for i in ids)

    word_ids = [index[t] for t in ("Hello", ",", "\u0120world", "!") if t in index]
    write("incremental_decoder", "words", seed(0, word_ids))
    write("incremental_decoder", "split_characters",
          seed(0, ids_of("\u4f60\U0001F600\u00e9".encode())))
    write("incremental_decoder", "truncated_character", seed(0, ids_of(b"a\xe4\xbd")))
    write("incremental_decoder", "specials_skipped", seed(1, [1] + word_ids + [2, 0]))
    write("incremental_decoder", "out_of_range", seed(0, [len(tokens) + 3, 65535] + word_ids))


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = gguf.GGUFReader(model)
    kvs = gguf_seeds(reader)
    tokenizer_and_config_seeds(kvs)
    chat_template_seeds(kvs)
    codec_seeds(kvs)
    incremental_seeds(kvs)
    safetensors_seeds()
    http_seeds()


if __name__ == "__main__":
    main()
