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
    assert err == f"{path}: tensor '{last.name}' extends past end of file"


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
