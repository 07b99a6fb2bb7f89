"""GgufFile on broken files: every failure is a clean error that names the file
and the problem; nothing crashes and nothing allocates what the file claims.

Valid base files are written with gguf-py's GGUFWriter (the reference writer)
and then damaged; offsets of the fields to damage come from gguf-py's
GGUFReader, not from our parser.
"""
import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from snapserve_testkit.server import startup_error


def _open_error(torch_ops, path):
    return torch_ops.gguf_open_error(str(path))


def _write_small(path, tensor_type=None):
    import gguf
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_string("general.name", "tiny")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_tensor("blk.0.attn_norm.weight", np.arange(64, dtype=np.float32))
    if tensor_type is None:
        w.add_tensor("blk.0.attn_q.weight", np.ones((4, 32), dtype=np.float32))
    else:
        qtype, (block, nbytes) = tensor_type, gguf.GGML_QUANT_SIZES[tensor_type]
        raw = np.zeros((4, 256 // block * nbytes), dtype=np.uint8)
        w.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _field_offset(path, key):
    """File offset of the key-length prefix of a metadata entry (via gguf-py)."""
    import gguf
    field = gguf.GGUFReader(str(path)).fields[key]
    return int(field.offset)


def test_small_valid_file_opens(torch_ops, tmp_path):
    path = _write_small(tmp_path / "ok.gguf")
    assert _open_error(torch_ops, path) == ""
    tensors = list(torch_ops.gguf_tensors(str(path)))
    assert tensors == ["blk.0.attn_norm.weight:F32:256", "blk.0.attn_q.weight:F32:512"]


def test_real_file_opens(torch_ops, model_path):
    import gguf
    assert _open_error(torch_ops, model_path) == ""
    ours = list(torch_ops.gguf_tensors(str(model_path)))
    ref = gguf.GGUFReader(str(model_path))
    assert ours == [f"{t.name}:{t.tensor_type.name}:{int(t.n_bytes)}" for t in ref.tensors]


def _all_quant_types():
    import gguf
    return [t.name for t in gguf.GGMLQuantizationType if t in gguf.GGML_QUANT_SIZES]


@pytest.mark.parametrize("qtype_name", _all_quant_types())
def test_every_ggml_type_is_named_and_sized_like_gguf_py(torch_ops, tmp_path, qtype_name):
    """The loader dequantizes few types; the reader must still accept the others
    and report them by the name gguf-py uses, with gguf-py's byte size."""
    import gguf
    qtype = gguf.GGMLQuantizationType[qtype_name]
    path = _write_small(tmp_path / f"{qtype_name}.gguf", tensor_type=qtype)
    assert _open_error(torch_ops, path) == ""
    ref = [t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.attn_q.weight"][0]
    ours = [t for t in torch_ops.gguf_tensors(str(path)) if t.startswith("blk.0.attn_q.weight:")]
    if int(qtype) > 39:
        # Types newer than the reader's table (MXFP4 = 39 is the last it
        # knows): named by number, size unknown.
        assert ours == [f"blk.0.attn_q.weight:unknown({int(qtype)}):0"]
    else:
        assert ours == [f"blk.0.attn_q.weight:{qtype_name}:{int(ref.n_bytes)}"]


def test_unknown_type_id_is_named_as_unknown(torch_ops, tmp_path):
    import gguf
    path = _write_small(tmp_path / "unknown.gguf")
    reader = gguf.GGUFReader(str(path))
    t = [t for t in reader.tensors if t.name == "blk.0.attn_q.weight"][0]
    type_field_offset = int(t.field.parts[-2].__array_interface__["data"][0] -
                            reader.data.__array_interface__["data"][0])
    del reader, t
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<I", data, type_field_offset)[0] == 0  # F32
    struct.pack_into("<I", data, type_field_offset, 99)
    path.write_bytes(bytes(data))
    assert _open_error(torch_ops, path) == ""
    assert "blk.0.attn_q.weight:unknown(99):0" in torch_ops.gguf_tensors(str(path))


def test_wrong_magic(torch_ops, tmp_path):
    path = _write_small(tmp_path / "magic.gguf")
    data = bytearray(path.read_bytes())
    data[0:4] = b"GGML"
    path.write_bytes(bytes(data))
    err = _open_error(torch_ops, path)
    assert str(path) in err and "magic" in err


def test_version_1(torch_ops, tmp_path):
    path = _write_small(tmp_path / "v1.gguf")
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, 1)
    path.write_bytes(bytes(data))
    err = _open_error(torch_ops, path)
    assert str(path) in err and "version 1" in err


@pytest.mark.parametrize("field,offset", [("tensor count", 8), ("metadata count", 16)])
def test_absurd_counts(torch_ops, tmp_path, field, offset):
    path = _write_small(tmp_path / "count.gguf")
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, offset, 2**60)
    path.write_bytes(bytes(data))
    err = _open_error(torch_ops, path)
    assert str(path) in err and field in err


def test_string_length_past_eof(torch_ops, tmp_path):
    path = _write_small(tmp_path / "strlen.gguf")
    value_len_offset = _field_offset(path, "general.name") + 8 + len("general.name") + 4
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<Q", data, value_len_offset)[0] == len("tiny")
    struct.pack_into("<Q", data, value_len_offset, len(data))
    path.write_bytes(bytes(data))
    err = _open_error(torch_ops, path)
    assert str(path) in err and "string 'general.name' extends past end of file" in err


def test_array_count_past_eof(torch_ops, tmp_path):
    path = _write_small(tmp_path / "arr.gguf")
    key = "tokenizer.ggml.tokens"
    count_offset = _field_offset(path, key) + 8 + len(key) + 4 + 4
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<Q", data, count_offset)[0] == 3
    struct.pack_into("<Q", data, count_offset, 2**60)
    path.write_bytes(bytes(data))
    err = _open_error(torch_ops, path)
    assert str(path) in err and f"array '{key}'" in err


def test_tensor_past_eof(torch_ops, model_path, tmp_path):
    """The real file minus its last byte: the tensor stored last no longer fits."""
    import gguf
    ref = gguf.GGUFReader(str(model_path))
    last = max(ref.tensors, key=lambda t: int(t.data_offset))
    path = tmp_path / "short.gguf"
    data = model_path.read_bytes()
    path.write_bytes(data[:-1])
    err = _open_error(torch_ops, path)
    assert err.startswith(f"{path}: tensor '{last.name}' extends past end of file"), err


# Cut points in the real file: inside the magic, the header, the metadata
# (tokens and merges arrays), the tensor infos, at the data section, in the data.
CUTS = [0, 3, 6, 20, 100, 5000, 400_000, 1_200_000, 1_785_000, 1_785_664, 50_000_000]


def test_truncated_real_file_in_subprocess(build_dir, model_path, tmp_path):
    """Runs in a child process so a crash fails the test instead of pytest, and
    measures the child's peak memory: opening must not allocate what is claimed."""
    data = model_path.read_bytes()
    paths = []
    for cut in CUTS:
        p = tmp_path / f"cut_{cut}.gguf"
        p.write_bytes(data[:cut])
        paths.append(str(p))
    bad_counts = tmp_path / "counts.gguf"
    bad_counts.write_bytes(data[:8] + struct.pack("<QQ", 2**60, 2**60) + data[24:100_000])
    paths.append(str(bad_counts))
    child = f"""
import json, resource, sys, torch
torch.ops.load_library({str(build_dir / 'tests' / 'libsnapserve_torch_ops.so')!r})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
errors = [torch.ops.snapserve.gguf_open_error(p) for p in {paths!r}]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"errors": errors, "grew_kb": after - before}}))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for path, err in zip(paths, result["errors"]):
        assert err.startswith(path + ": "), (path, err)
    past = ("extends past end of file", "fit in the file")
    expected = [("too small",), ("too small",), ("header",), ("header",)] + [past] * 7 + [
        ("count 1152921504606846976 does not fit in the file",)]
    for err, wants in zip(result["errors"], expected):
        assert any(w in err for w in wants), (err, wants)
    # Parsing the whole real tokenizer metadata needs ~30 MB; a claim of 2^60
    # entries must not show up as gigabytes.
    assert result["grew_kb"] < 512 * 1024, result


# ---- the real model file, corrupted but parseable: the server must refuse it --
# Each case damages models/SmolLM2-135M-Instruct.Q4_1.gguf at offsets found by
# gguf-py's GGUFReader and starts the real server binary on it: the start must
# fail within seconds with a positive exit code (a negative one is a signal)
# and exactly one startup_failed line whose error names the file and the
# problem. Before these checks the server loaded such files and answered
# `<|endoftext|>` forever (NaN rope base or epsilon, block_count lowered, a
# tensor type changed, tensors overlapping).

SERVER_ARGS = ["--port=0", "--metrics-port=0", "--kv-cache-memory=16MiB",
               "--default-kv-method=none"]


class ModelLayout:
    """File offsets in the real model, read with gguf-py (not our parser)."""

    def __init__(self, path):
        import gguf
        self.path = path
        self.reader = gguf.GGUFReader(str(path))
        self._base = self.reader.data.__array_interface__["data"][0]
        self.tensors = {t.name: t for t in self.reader.tensors}

    def _at(self, array):
        return int(array.__array_interface__["data"][0] - self._base)

    def value_offset(self, key):
        """Offset of a scalar metadata value."""
        return self._at(self.reader.fields[key].parts[-1])

    def tensor_field(self, name, part):
        """Offset of one field of a tensor info: 'n_dims', 'dims', 'type' or 'offset'."""
        parts = self.tensors[name].field.parts  # name length, name, n_dims, dims, type, offset
        return self._at(parts[{"name": 1, "n_dims": 2, "dims": 3, "type": 4, "offset": 5}[part]])

    def data_offset(self, name):
        """A tensor's offset relative to the data section (what the info stores)."""
        return int(self.tensors[name].data_offset) - int(self.reader.data_offset)

    def metadata_ranges(self):
        """[start, end) byte ranges of the header and of every metadata entry
        (only the key, type and count of the large tokenizer arrays and chat
        template, whose contents are text)."""
        big = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
               "tokenizer.chat_template"}
        ranges = [(0, 24)]
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            start = int(field.offset)
            end = start + sum(int(p.nbytes) for p in field.parts)
            if key in big:
                end = start + 8 + len(key) + 4 + 4 + 8  # key, type, element type / length, count
            ranges.append((start, end))
        return ranges

    def tensor_info_range(self):
        first = min(self._at(t.field.parts[0]) for t in self.reader.tensors)
        return first, int(self.reader.data_offset)


@pytest.fixture(scope="module")
def layout(model_path):
    return ModelLayout(model_path)


@pytest.fixture(scope="module")
def model_bytes(model_path):
    return model_path.read_bytes()


def _start_server(build_dir, path, timeout=60):
    binary = str(build_dir / "server" / "snapserve")
    return subprocess.run([binary, f"--model={path}"] + SERVER_ARGS,
                          capture_output=True, text=True, errors="replace", timeout=timeout)


def _value(key):
    return lambda lay: lay.value_offset(key)


def _tensor(name, part):
    return lambda lay: lay.tensor_field(name, part)


def _const(v):
    return lambda lay: v


def _data_section_size(lay):
    return len(lay.reader.data) - int(lay.reader.data_offset)


def _letter_of(name, index):
    return lambda lay: lay.tensor_field(name, "name") + index


# (case, edits: [(offset(layout), struct format, value(layout))], words the error must hold)
RMS = "llama.attention.layer_norm_rms_epsilon"
DOWN = "blk.0.ffn_down.weight"  # Q4_1, dims {1536, 576}; the tensor after it is blk.0.ffn_gate
BAD_MODEL_FILES = [
    ("rope_base_nan", [(_value("llama.rope.freq_base"), "<f", _const(float("nan")))],
     ["rope_theta is nan", "finite and positive"]),
    ("rope_base_inf", [(_value("llama.rope.freq_base"), "<f", _const(float("inf")))],
     ["rope_theta is inf", "finite and positive"]),
    ("rms_eps_nan", [(_value(RMS), "<f", _const(float("nan")))],
     ["rms_norm_eps is nan", "finite and positive"]),
    ("rms_eps_inf", [(_value(RMS), "<f", _const(float("-inf")))],
     ["rms_norm_eps is -inf", "finite and positive"]),
    ("block_count_lowered", [(_value("llama.block_count"), "<I", _const(29))],
     ["tensor 'blk.29.", "not part of a llama model with 29 layers"]),
    ("block_count_raised", [(_value("llama.block_count"), "<I", _const(31))],
     ["tensor 'blk.30.attn_norm.weight' is missing", "31 layers"]),
    ("block_count_absurd", [(_value("llama.block_count"), "<I", _const(2**31))],
     ["num_hidden_layers is 2147483648"]),
    ("heads_do_not_divide", [(_value("llama.attention.head_count_kv"), "<I", _const(2))],
     ["num_key_value_heads (2) must divide num_attention_heads (9)"]),
    ("head_count_changed", [(_value("llama.attention.head_count"), "<I", _const(8))],
     ["partial rotary embeddings"]),  # 576 / 8 = 72 != rope.dimension_count 64
    ("eos_outside_vocab", [(_value("tokenizer.ggml.eos_token_id"), "<I", _const(70000))],
     ["eos_token_id 70000 is outside the vocabulary (vocab_size 49152)"]),
    ("overlapping_tensors",
     [(_tensor("blk.0.ffn_gate.weight", "offset"), "<Q", lambda lay: lay.data_offset(DOWN))],
     [f"tensor '{DOWN}'", "overlaps tensor 'blk.0.ffn_gate.weight'"]),
    ("extent_past_eof",
     [(_tensor(DOWN, "offset"), "<Q", lambda lay: _data_section_size(lay) - 32)],
     [f"tensor '{DOWN}' extends past end of file"]),
    ("n_dims_1", [(_tensor(DOWN, "n_dims"), "<I", _const(1))],
     ["tensor ", "bytes long (ggml allows 63)"]),
    ("type_q4_1_to_q8_0", [(_tensor(DOWN, "type"), "<I", _const(8))],
     [f"tensor '{DOWN}'", "overlaps"]),  # 34 bytes a block instead of 20: runs into the next
    ("type_q4_1_to_q4_0", [(_tensor(DOWN, "type"), "<I", _const(2))],
     [f"before tensor 'blk.0.ffn_gate.weight'", f"tensor '{DOWN}', is smaller"]),  # 18 bytes
    ("type_q4_1_to_q4_k", [(_tensor("blk.0.ffn_gate.weight", "type"), "<I", _const(12))],
     ["tensor 'blk.0.ffn_gate.weight' of type Q4_K has ne[0]=576, not a multiple of its block "
      "size 256"]),
    ("type_f32_to_i32", [(_tensor("blk.0.attn_norm.weight", "type"), "<I", _const(26))],
     ["tensor 'blk.0.attn_norm.weight' has type I32, expected F32, F16 or BF16"]),
    ("missing_tensor",
     [(_letter_of("blk.3.attn_q.weight", len("blk.3.attn_")), "<c", _const(b"Q"))],
     ["tensor 'blk.3.attn_q.weight' is missing"]),  # renamed to blk.3.attn_Q.weight
    ("wrong_shape", [(_tensor(DOWN, "dims"), "<QQ", _const((576, 1536)))],
     [f"tensor '{DOWN}' has shape [576, 1536], the metadata implies [1536, 576]"]),
]


def _apply(layout, data, edits):
    data = bytearray(data)
    for where, fmt, value in edits:
        v = value(layout)
        struct.pack_into(fmt, data, where(layout), *(v if isinstance(v, tuple) else (v,)))
    return bytes(data)


@pytest.mark.parametrize("case", [c[0] for c in BAD_MODEL_FILES])
def test_corrupt_model_file_fails_the_start(case, layout, model_bytes, build_dir, tmp_path):
    import time
    (_, edits, words), = [c for c in BAD_MODEL_FILES if c[0] == case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(_apply(layout, model_bytes, edits))
    started = time.monotonic()
    error = startup_error(_start_server(build_dir, path))
    assert time.monotonic() - started < 30
    assert str(path) in error, error
    for word in words:
        assert word in error, (word, error)
    assert len(error) < 1000, error


def test_extra_unknown_tensor_fails_the_start(layout, build_dir, tmp_path):
    """The whole model rewritten by gguf-py's GGUFWriter plus one tensor no
    Llama layer reads."""
    import gguf
    path = tmp_path / "extra.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    for key, field in layout.reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in layout.reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.add_tensor("blk.0.attn_q_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    error = startup_error(_start_server(build_dir, path))
    assert f"{path}: tensor 'blk.0.attn_q_norm.weight' is not part of a llama model" in error, error


def test_same_size_type_change_is_not_detectable(layout, model_bytes, tmp_path, torch_ops):
    """A type code corrupted into another type with the same bytes per
    element keeps every extent, so the file itself stays well formed: only
    the loader's accepted types per tensor can catch it (F32 -> I32 is refused
    by type_f32_to_i32 above). F16 <-> BF16 is accepted by both and would be
    served: undetectable from the structure alone."""
    data = _apply(layout, model_bytes,
                  [(_tensor("blk.0.attn_norm.weight", "type"), "<I", _const(26))])
    path = tmp_path / "i32.gguf"
    path.write_bytes(data)
    assert _open_error(torch_ops, path) == ""  # the file itself is well formed


# ---- the vocabulary: token types outside llama.cpp's enum, tokens not UTF-8 ---
# Such a file is well formed, so only the tokenizer can refuse it. Each case
# is the real model's metadata written again by gguf-py's GGUFWriter with one
# entry replaced; gguf-py is the oracle that the entry is invalid (its
# TokenType enum lacks the value; its reader cannot decode the token).

IM_END = 2  # <|im_end|>, a control token (type 3) in the real model


def _write_model(layout, path, replace, with_tensors=True):
    """The real model rewritten by GGUFWriter, metadata values replaced by
    `replace` (key -> new contents); without tensors when only the tokenizer
    is read."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch="llama")
    for key, field in layout.reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        value = replace[key] if key in replace else field.contents()
        w.add_key_value(key, value, field.types[0], sub_type=sub)
    if with_tensors:
        for t in layout.reader.tensors:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_reader_token(path, key, index):
    import gguf
    return gguf.GGUFReader(str(path)).fields[key].contents(index)


def _with_entry(layout, key, index, value):
    values = layout.reader.fields[key].contents()
    values[index] = value
    return {key: values}


def test_rewritten_vocabulary_tokenizes_like_the_original(layout, model_path, torch_ops,
                                                          tmp_path):
    """The writer path itself changes nothing: the cases below differ from
    a working file only in the entry they replace."""
    path = _write_model(layout, tmp_path / "same.gguf", {}, with_tensors=False)
    text = "<|im_start|>user\nHi there<|im_end|>\n"
    assert list(torch_ops.tokenize(str(path), text, True)) == list(
        torch_ops.tokenize(str(model_path), text, True))
    assert IM_END in torch_ops.tokenize(str(path), text, True)


@pytest.mark.parametrize("value", [99, 7, -1])
def test_token_type_outside_the_enum_is_refused(layout, torch_ops, tmp_path, value):
    import gguf
    with pytest.raises(ValueError):
        gguf.TokenType(value)  # the oracle: not a token type
    key = "tokenizer.ggml.token_type"
    assert layout.reader.fields[key].contents(IM_END) == gguf.TokenType.CONTROL
    path = _write_model(layout, tmp_path / f"type_{value}.gguf",
                        _with_entry(layout, key, IM_END, value), with_tensors=False)
    assert gguf.GGUFReader(str(path)).fields[key].contents(IM_END) == value
    with pytest.raises(RuntimeError) as err:
        torch_ops.tokenize(str(path), "Hi", True)
    assert (f"{path}: tokenizer.ggml.token_type[{IM_END}] is {value}, not a llama.cpp token type"
            in str(err.value)), str(err.value)


@pytest.mark.parametrize("token,offset,byte", [(b"\xc4\xa0\xff", 2, "ff"),
                                               (b"ab\xc3", 2, "c3"),  # cut inside a character
                                               (b"\xed\xa0\x80", 0, "ed")])  # a surrogate
def test_token_that_is_not_utf8_is_refused(layout, torch_ops, tmp_path, token, offset, byte):
    key, index = "tokenizer.ggml.tokens", 1000
    with pytest.raises(UnicodeDecodeError):
        token.decode("utf-8")
    path = _write_model(layout, tmp_path / "not_utf8.gguf",
                        _with_entry(layout, key, index, token), with_tensors=False)
    with pytest.raises(UnicodeDecodeError):  # the oracle's reader cannot decode it either
        _gguf_reader_token(path, key, index)
    with pytest.raises(RuntimeError) as err:
        torch_ops.tokenize(str(path), "Hi", True)
    assert (f"{path}: tokenizer.ggml.tokens[{index}] is not valid UTF-8 (byte 0x{byte} at offset "
            f"{offset})" in str(err.value)), str(err.value)


def test_server_refuses_a_control_token_with_a_corrupt_type(layout, build_dir, tmp_path):
    """The whole model with <|im_end|>'s type set to 99: accepted, it would be
    read as plain text and every chat prompt would tokenize differently."""
    path = _write_model(layout, tmp_path / "im_end_99.gguf",
                        _with_entry(layout, "tokenizer.ggml.token_type", IM_END, 99))
    error = startup_error(_start_server(build_dir, path))
    assert f"{path}: tokenizer.ggml.token_type[{IM_END}] is 99, not a llama.cpp" in error, error


# ---- seeded random byte flips in the structural bytes ------------------------
# Every outcome must be a clean start or a refusal with a message; never a
# signal, never a silent exit. All flips go through Engine::Create in one
# child process (a server start per flip would take minutes); a few of each
# outcome then go through the real server binary.

FLIPS = 100


def test_random_byte_flips_start_or_refuse_cleanly(layout, model_path, build_dir, tmp_path, pb,
                                                   start_server):
    import random

    import grpc
    rng = random.Random(15)
    # Half in the header and metadata, half in the tensor infos (8x larger):
    # flips there are almost all refused, flips in metadata values often start.
    ranges = layout.metadata_ranges()
    sizes = [end - start for start, end in ranges]
    flips = []
    for i in range(FLIPS):
        start, end = (rng.choices(ranges, weights=sizes)[0] if i % 2 == 0
                      else layout.tensor_info_range())
        flips.append((rng.randrange(start, end), rng.randrange(1, 256)))
    work = tmp_path / "flip.gguf"
    child = f"""
import json, sys, torch
torch.ops.load_library({str(build_dir / 'tests' / 'libsnapserve_torch_ops.so')!r})
data = bytearray(open({str(model_path)!r}, 'rb').read())
for pos, xor in {flips!r}:
    data[pos] ^= xor
    open({str(work)!r}, 'wb').write(data)
    data[pos] ^= xor
    print(json.dumps([pos, xor]), flush=True)
    print(json.dumps(torch.ops.snapserve.engine_start_error({str(work)!r})), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         errors="replace", timeout=240)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, (
        f"exit {out.returncode} after flip {lines[-1] if lines else None}: {out.stderr[-2000:]}")
    results = [(tuple(json.loads(lines[i])), json.loads(lines[i + 1]))
               for i in range(0, len(lines), 2)]
    assert len(results) == FLIPS
    refused = [(flip, err) for flip, err in results if err]
    started = [flip for flip, err in results if not err]
    for flip, err in refused:
        assert str(work) in err and len(err) < 1200, (flip, err)
    print(f"byte flips: {len(refused)} refused, {len(started)} started")
    assert refused and started, "the sweep must reach both outcomes to test either"

    # The real server on a few of each: the same refusal in its
    # startup_failed line, and a clean start that answers a request.
    pb2, pb2_grpc = pb
    data = bytearray(model_path.read_bytes())

    def write_flipped(pos, xor):
        data[pos] ^= xor
        work.write_bytes(data)
        data[pos] ^= xor

    for (pos, xor), err in refused[:3]:
        write_flipped(pos, xor)
        logged = startup_error(_start_server(build_dir, work))
        if "\\x" not in err:  # else it quotes bytes the op escaped and the log did not
            assert logged == err, (pos, xor)
    for pos, xor in started[:2]:
        write_flipped(pos, xor)
        server = start_server([f"--model={work}", "--kv-cache-memory=16MiB",
                               "--default-kv-method=none"])
        with grpc.insecure_channel(server.target) as ch:
            one_token = pb2.StoppingCriteria(max_new_tokens=1)
            r = pb2_grpc.GenerationStub(ch).Generate(
                pb2.GenerateRequest(prompt="Hello", stopping=one_token), timeout=60)
        assert r.finish_reason in (pb2.LENGTH, pb2.EOS), (pos, xor)
        assert server.stop() == 0, (pos, xor, server.logs()[-2000:])
