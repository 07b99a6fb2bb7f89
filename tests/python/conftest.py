"""Shared pytest fixtures and the skip policy of `make test`.

A skipped test counts as a failure unless it carries the `gpu` marker (GPU-only
tests skip visibly on a machine without CUDA); a module skipped at collection
and an XPASS count as failures too (the skip policy below, and xfail_strict in
pytest.ini). The C++ code under test is
reached through the torch-ops library built in tests/torch_ops/ or through the
real `snapserve` binary; both come from SNAPSERVE_BUILD_DIR (default: build/).
"""
import pathlib
import sys

import pytest

# The helpers shared with bench/ live in snapserve_testkit/ at the repository
# root, imported from there without installing anything.
ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import snapserve_testkit as testkit  # noqa: E402

BUILD_DIR = testkit.build_dir()
MODEL_PATH = testkit.model_path()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skips visibly without one")
    config.addinivalue_line("markers", "slow: long-running (real model, long prompts)")


# The skip policy. Three ways a test can check less than a run claims, each
# made a failure here:
#  - a skipped test without the `gpu` marker (the marker itself, through
#    get_closest_marker: not any keyword that happens to be named "gpu", such
#    as a test or module name);
#  - a module skipped while it is collected (pytest.importorskip, or
#    pytest.skip(allow_module_level=True)): its tests never become items, so
#    only the collection report shows it. GPU-only modules mark their tests
#    instead of skipping the module;
#  - an XPASS: pytest.ini sets xfail_strict = true, so an xfail test that
#    passes fails; one marked strict=False is caught here.
# An XFAIL (a strict xfail test that fails as expected) is not a skip.
_illegal_skips = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    xfailed = hasattr(report, "wasxfail")
    if report.skipped and not xfailed and item.get_closest_marker("gpu") is None:
        _illegal_skips.append(f"{report.nodeid} (skipped: {_skip_reason(report)})")
    elif report.passed and xfailed and report.when == "call":
        _illegal_skips.append(f"{report.nodeid} (XPASS: marked xfail but passed)")


def pytest_collectreport(report):
    if report.skipped:
        _illegal_skips.append(f"{report.nodeid} (module skipped at collection: "
                              f"{_skip_reason(report)})")


def _skip_reason(report):
    # longrepr of a skip is (path, line, "Skipped: reason").
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return report.longrepr[2]
    return str(report.longrepr)


def pytest_sessionfinish(session, exitstatus):
    if _illegal_skips:
        print("\nRequired tests were skipped or passed unexpectedly (only @pytest.mark.gpu "
              "tests may skip; no module may skip; no XPASS):")
        for entry in _illegal_skips:
            print(f"  {entry}")
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
def hf_model_dir(model_path, tmp_path_factory):
    """The default model as a Hugging Face directory (float32 safetensors,
    config.json, tokenizer.json), written by transformers from its own
    loading of the GGUF: the dense-weight models (--dtype=bfloat16 weights,
    --decode-dot) are tested on it, since GGUF matrices stay in blocks."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = tmp_path_factory.mktemp("hf-model")
    kwargs = dict(gguf_file=model_path.name)
    AutoTokenizer.from_pretrained(model_path.parent, **kwargs).save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(model_path.parent, dtype=torch.float32, **kwargs)
    # transformers will not save_pretrained a model it loaded from GGUF, so
    # the config and the tensors are written separately; a tied LM head is
    # the embedding itself and is left out, as save_pretrained would.
    model.config.save_pretrained(path)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()
               if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.fixture(scope="session")
def torch_ops():
    """Loads libsnapserve_torch_ops.so and returns torch.ops.snapserve."""
    import torch
    lib = BUILD_DIR / "tests" / "libsnapserve_torch_ops.so"
    assert lib.is_file(), f"{lib} not built (run `make build`)"
    torch.ops.load_library(str(lib))
    return torch.ops.snapserve


@pytest.fixture(scope="module")
def pipe(model_path):
    """The transformers SnapKV reference pipeline on the default model
    (reference/hf_snapkv_pipeline.py), loaded once per module."""
    import torch
    from reference.hf_snapkv_pipeline import SnapKVPipeline
    torch.manual_seed(0)
    return SnapKVPipeline.load(model_path)


# --- gRPC stubs and a real snapserve process ------------------------------

@pytest.fixture(scope="session")
def pb():
    """(generation_pb2, generation_pb2_grpc): snapserve_testkit.load_stubs()
    (protoc in a child process; its docstring says why)."""
    return testkit.load_stubs()


def _server_factory():
    """Yields start(args, env=None, wait=True, precision="exact") -> snapserve_testkit.SnapserveProcess
    (SERVING when wait; its log BUILD_DIR/snapserve-test-<port>.log); every
    process started is stopped when the fixture ends."""
    started = []

    def start(args, env=None, wait=True, precision="exact"):
        s = testkit.SnapserveProcess(args, env, precision=precision)
        started.append(s)
        if wait:
            s.wait_serving()
        return s

    yield start
    for s in started:
        s.stop()
    _fail_on_crashes(started)


def _fail_on_crashes(processes):
    """Fails the test (at the fixture's teardown) when a server it started
    died of a signal that stop() did not send: a crash the test itself may
    not have noticed, as when the answer it checked came before it."""
    crashes = [f"snapserve pid {s.pid} {problem}; log {s.log_path}:\n{s.logs()[-2000:]}"
               for s in processes if (problem := s.crash())]
    if crashes:
        pytest.fail("\n".join(crashes), pytrace=False)


@pytest.fixture
def start_server():
    """Factory: start_server(args) -> SnapserveProcess (SERVING); stopped at teardown."""
    yield from _server_factory()


@pytest.fixture(scope="module")
def start_module_server():
    """As start_server, but the processes live for the whole test module (one
    server shared by many slow cases); stopped at module teardown."""
    yield from _server_factory()


@pytest.fixture(scope="module")
def stub(server, pb):
    """A Generation stub on the module's own `server` fixture (a module that
    uses it defines `server`, usually with start_module_server)."""
    import grpc
    _, pb2_grpc = pb
    with grpc.insecure_channel(server.target) as channel:
        yield pb2_grpc.GenerationStub(channel)
