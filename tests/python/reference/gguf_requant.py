"""Writes GGUF files whose matrices are in chosen block formats, for tests.

The `gguf` package quantizes the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0) but only decodes the K-quants, so the K-quant encoders here are our own:
simple (min/max per sub-block, round to nearest), not llama.cpp's optimised
search. Quality is not what they are for: a test compares the server and
transformers on the *same* file, so all that matters is that the blocks are
valid, which test_quant_blocks.py checks by decoding them with
gguf.quants.dequantize.
"""
import numpy as np

QK = 256


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_scale_min(sc, mn):
    """8 six-bit scales and mins (n, 8) -> the 12-byte Q4_K/Q5_K packing."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _minmax_k(blocks, levels):
    """Sub-blocks of 32 with y = (d*sc)*q - (dmin*m): returns d, dmin, sc, m, q."""
    n = blocks.shape[0]
    x = blocks.reshape(n, 8, 32)
    lo = np.minimum(x.min(-1), 0.0)
    hi = x.max(-1)
    scale = (hi - lo) / levels
    mins = -lo
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (mins.max(-1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63)
        m = np.where(dmin[:, None] > 0, np.rint(mins / dmin[:, None]), 0).clip(0, 63)
        step = (d[:, None] * sc)[..., None]
        off = (dmin[:, None] * m)[..., None]
        q = np.where(step > 0, np.rint((x + off) / step), 0).clip(0, levels).astype(np.uint8)
    return d, dmin, sc, m, q


def quantize_q4_k(blocks):
    n = blocks.shape[0]
    d, dmin, sc, m, q = _minmax_k(blocks, 15)
    # sub-block j in byte run j // 2, low nibble for even j, high for odd
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(n, 128)
    return np.concatenate([_f16(d), _f16(dmin), _pack_scale_min(sc, m), qs], axis=1)


def quantize_q5_k(blocks):
    n = blocks.shape[0]
    d, dmin, sc, m, q = _minmax_k(blocks, 31)
    low = q & 0x0F
    qs = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(n, 128)
    qh = np.zeros((n, 32), dtype=np.uint8)
    for j in range(8):
        qh |= ((q[:, j, :] >> 4) & 1) << j
    return np.concatenate([_f16(d), _f16(dmin), _pack_scale_min(sc, m), qh, qs], axis=1)


def quantize_q6_k(blocks):
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16)
    amax = np.abs(x).max(-1)
    sub = amax / 31
    d = (sub.max(-1) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(sub / d[:, None]), 0).clip(-128, 127)
        step = (d[:, None] * sc)[..., None]
        q = np.where(step > 0, np.rint(x / step), 0).clip(-32, 31).astype(np.int16) + 32
    q = q.reshape(n, 256).astype(np.uint8)
    ql = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 64), dtype=np.uint8)
    for e in range(256):
        h, r = divmod(e, 128)
        ql[:, 64 * h + r % 64] |= (q[:, e] & 0x0F) << (4 * (r // 64))
        qh[:, 32 * h + r % 32] |= (q[:, e] >> 4) << (2 * (r // 32))
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16(d)], axis=1)


K_ENCODERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantize(values, type_name):
    """float32 [rows, cols] -> uint8 [rows, row_bytes] blocks of `type_name`."""
    import gguf
    qtype = gguf.GGMLQuantizationType[type_name]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    values = np.ascontiguousarray(values, dtype=np.float32)
    rows, cols = values.shape
    assert cols % block == 0, (type_name, values.shape)
    if type_name in K_ENCODERS:
        blocks = K_ENCODERS[type_name](values.reshape(-1, block))
        return blocks.reshape(rows, -1)
    return gguf.quants.quantize(values, qtype)


def requantize_file(src, dst, choose_type):
    """Copies GGUF `src` to `dst`, re-encoding each 2-D tensor to
    choose_type(name, shape) (a type name, "F32" for the decoded values, or
    None to keep it as it is)."""
    import gguf
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # PyTorch order
        target = choose_type(t.name, shape) if len(shape) == 2 else None
        if target is None:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        if target == "F32":
            writer.add_tensor(t.name, np.ascontiguousarray(values, dtype=np.float32))
            continue
        blocks = quantize(values, target)
        writer.add_tensor(t.name, blocks, raw_shape=blocks.shape,
                          raw_dtype=gguf.GGMLQuantizationType[target])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
