"""scripts/gpu-check.sh --dry-run: the GPU check's own lists against the tests.

The GPU check runs on a lent machine that `make test` never sees, so its list
of GPU test files can go stale unnoticed; its dry run, which needs no CUDA,
compares that list with the `gpu`-marked tests pytest collects. The oracle
here is independent of pytest's collection: the test files whose source
names the marker (`pytest.mark` followed by `.gpu`). A negative case that
cannot pass by accident: a copy of tests/python with one more GPU test file,
which the dry run must refuse by name.
"""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
TESTS = ROOT / "tests" / "python"
# Spelled in two pieces so that this file itself does not name the marker.
MARKER = "pytest.mark" + ".gpu"


def dry_run(tests_dir=None):
    env = dict(os.environ, PYTHON=sys.executable)
    if tests_dir is not None:
        env["GPU_CHECK_TESTS_DIR"] = str(tests_dir)
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


def gpu_files(tests_dir):
    return sorted(p.name for p in tests_dir.glob("test_*.py") if MARKER in p.read_text())


def test_dry_run_names_every_gpu_test_file():
    files = gpu_files(TESTS)
    assert "test_paged_attention.py" in files and "test_model_cuda.py" in files, files
    rc, out = dry_run()
    assert rc == 0, out
    assert "dry run: consistent" in out, out
    for name in files:
        # Each runs in a pytest process of its own, GPU tests only.
        assert f"-m gpu tests/python/{name} >" in out, f"{name} not run:\n{out}"
    # Every end-to-end suite is either run against the CUDA server or left
    # out with a reason.
    for name in ("test_server_e2e.py", "test_logprobs.py", "test_snapkv_e2e.py",
                 "test_batching_invariance.py"):
        assert f"tests/python/{name} >" in out or f"e2e left out: {name} (" in out, name


def test_dry_run_refuses_an_unlisted_gpu_test_file(tmp_path):
    copy = tmp_path / "tests" / "python"
    shutil.copytree(TESTS, copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    extra = copy / "test_zz_unlisted_gpu.py"
    extra.write_text("import pytest\n\n\n"
                     f"@{MARKER}\n"
                     "def test_needs_a_gpu():\n"
                     "    assert True\n")
    assert gpu_files(copy) == sorted(gpu_files(TESTS) + [extra.name])
    rc, out = dry_run(copy)
    assert rc != 0, out
    assert f"FAIL: {extra.name} holds @{MARKER} tests but is not in GPU_TEST_FILES" in out, out
    assert "dry run: FAIL" in out, out
