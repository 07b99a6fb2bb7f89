"""Where the build and the model are, and how test servers are started:
SNAPSERVE_BUILD_DIR (default build/), SNAPSERVE_MODEL (default
models/SmolLM2-135M-Instruct.Q4_1.gguf) and SNAPSERVE_TEST_SERVER_ARGS, read
at each call."""
import os
import pathlib
import shlex

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build_dir():
    return pathlib.Path(os.environ.get("SNAPSERVE_BUILD_DIR", ROOT / "build"))


def model_path():
    return pathlib.Path(os.environ.get("SNAPSERVE_MODEL", DEFAULT_MODEL))


def extra_server_args():
    """SNAPSERVE_TEST_SERVER_ARGS split as a shell would, e.g.
    "--device=cuda --dtype=bfloat16": flags every test server takes after its
    own (the last of a repeated flag wins), so that scripts/gpu-check.sh runs
    the end-to-end suites against a server on CUDA. Unset: none."""
    return shlex.split(os.environ.get("SNAPSERVE_TEST_SERVER_ARGS", ""))
