"""The model the GPU machine serves in scripts/gpu-check.sh's end-to-end run.

The default model (SmolLM2-135M-Instruct, a 98 MB GGUF) does not fit the
64 MiB that the device tool carries, so the real weights stay here:

  extract GGUF DIR   (here, from scripts/gpu-carry.sh) writes DIR/meta.gguf,
                     the model's metadata with its tokenizer and no tensors
                     (about 2 MB), and DIR/tensors.json, its tensor table
                     (name, ggml shape, type)
  write DIR OUT      (there) writes OUT, a GGUF of the same architecture,
                     tokenizer and tensor shapes with seeded random weights:
                     matrices in F16 ~ N(0, 0.02), norm weights 1 + N(0, 0.05)
                     in F32. The same DIR and seed give the same bytes.

The weights mean nothing, so the end-to-end tests that run on it there are
the ones whose oracle holds for any weights: transformers run on the same
file, the server's own unary-vs-stream and batch results, block counts, status
codes (scripts/gpu-check.sh lists them and says why each other one is left
out). Only the gguf package and numpy are needed.
"""
import json
import pathlib
import sys

import numpy as np
import gguf

SEED = 20241
MATRIX_STD = 0.02
NORM_STD = 0.05


def _copy_fields(reader, writer, skip=()):
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in skip:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def _architecture(reader):
    return reader.fields["general.architecture"].contents()


def extract(model, out_dir):
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(model)
    writer = gguf.GGUFWriter(out_dir / "meta.gguf", _architecture(reader))
    # GGUFWriter writes general.architecture itself.
    _copy_fields(reader, writer, skip={"general.architecture"})
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    table = [{"name": t.name, "shape": [int(d) for d in t.shape], "type": t.tensor_type.name}
             for t in reader.tensors]
    (out_dir / "tensors.json").write_text(json.dumps(table))
    print(f"{out_dir / 'meta.gguf'}: {len(reader.fields)} fields, {len(table)} tensors listed")


def write(meta_dir, out, seed=SEED):
    meta_dir = pathlib.Path(meta_dir)
    reader = gguf.GGUFReader(meta_dir / "meta.gguf")
    table = json.loads((meta_dir / "tensors.json").read_text())
    writer = gguf.GGUFWriter(out, _architecture(reader))
    _copy_fields(reader, writer, skip={"general.architecture", "general.file_type"})
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(seed)
    for t in table:
        # ggml lists dimensions fastest first; numpy wants them slowest first.
        shape = tuple(reversed(t["shape"]))
        if len(shape) == 1:
            data = (1.0 + NORM_STD * rng.standard_normal(shape)).astype(np.float32)
        else:
            data = (MATRIX_STD * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)
        writer.add_tensor(t["name"], data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out}: {len(table)} tensors, seed {seed}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "extract":
        extract(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: gpu_check_model.py extract GGUF DIR | write DIR OUT.gguf")
