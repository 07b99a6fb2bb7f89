"""Shared pytest fixtures and the skip policy of `make test`.

A skipped test counts as a failure unless it carries the `gpu` marker (GPU-only
tests skip visibly on a machine without CUDA). The C++ code under test is
reached through the torch-ops library built in tests/torch_ops/ or through the
real `snapserve` binary; both come from SNAPSERVE_BUILD_DIR (default: build/).
"""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("SNAPSERVE_BUILD_DIR", ROOT / "build"))
MODEL_PATH = pathlib.Path(
    os.environ.get("SNAPSERVE_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skips visibly without one")
    config.addinivalue_line("markers", "slow: long-running (real model, long prompts)")


_illegal_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and "gpu" not in report.keywords:
        _illegal_skips.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _illegal_skips:
        print("\nRequired tests were skipped (only @pytest.mark.gpu tests may skip):")
        for nodeid in _illegal_skips:
            print(f"  {nodeid}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def cuda_available():
    import torch
    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def build_dir():
    return BUILD_DIR


@pytest.fixture(scope="session")
def model_path():
    assert MODEL_PATH.is_file(), f"default model missing: {MODEL_PATH} (run `make model`)"
    return MODEL_PATH


@pytest.fixture(scope="session")
def torch_ops():
    """Loads libsnapserve_torch_ops.so and returns torch.ops.snapserve."""
    import torch
    lib = BUILD_DIR / "tests" / "libsnapserve_torch_ops.so"
    assert lib.is_file(), f"{lib} not built (run `make build`)"
    torch.ops.load_library(str(lib))
    return torch.ops.snapserve
