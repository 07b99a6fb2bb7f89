"""Python stubs for snapserve/v1/generation.proto, generated with grpcio-tools."""
import importlib
import subprocess
import sys

from snapserve_testkit.paths import ROOT, build_dir

_STUBS = None


def load_stubs():
    """(generation_pb2, generation_pb2_grpc), generated into <build>/python_gen
    once per process.

    protoc runs in a child process: grpc_tools' compiler module carries its own
    C++ protobuf, whose GNU-unique symbols (process-wide, whatever the dlopen
    flags) would be shared with the protobuf copy inside libsentencepiece once
    the torch ops load a SentencePiece tokenizer in this process, and the two
    versions' layouts differ (a heap corruption seen in the SentencePiece tests).
    """
    global _STUBS
    if _STUBS is not None:
        return _STUBS
    out = build_dir() / "python_gen"
    out.mkdir(parents=True, exist_ok=True)
    proto = ROOT / "proto"
    rc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto}",
                         f"--python_out={out}", f"--grpc_python_out={out}",
                         str(proto / "snapserve" / "v1" / "generation.proto")]).returncode
    if rc != 0:
        raise RuntimeError("protoc failed on generation.proto")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    pb2 = importlib.import_module("snapserve.v1.generation_pb2")
    pb2_grpc = importlib.import_module("snapserve.v1.generation_pb2_grpc")
    _STUBS = (pb2, pb2_grpc)
    return _STUBS
