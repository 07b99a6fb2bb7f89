"""Where the build and the model are: SNAPSERVE_BUILD_DIR (default build/) and
SNAPSERVE_MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf), read at each call."""
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build_dir():
    return pathlib.Path(os.environ.get("SNAPSERVE_BUILD_DIR", ROOT / "build"))


def model_path():
    return pathlib.Path(os.environ.get("SNAPSERVE_MODEL", DEFAULT_MODEL))
