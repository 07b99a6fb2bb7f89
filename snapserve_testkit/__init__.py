"""Python helpers shared by the tests (tests/python) and the benchmarks (bench/).

Nothing is installed: the repository root only has to be on sys.path.
tests/python/conftest.py and bench/common.py put it there before importing:

    ROOT = pathlib.Path(__file__).resolve().parents[N]  # the repository root
    sys.path.insert(0, str(ROOT))
    import snapserve_testkit

* paths:   ROOT, build_dir() and model_path() (SNAPSERVE_BUILD_DIR, SNAPSERVE_MODEL);
* proto:   load_stubs(), the Python gRPC stubs of generation.proto, protoc run
           in a child process;
* server:  free_port() and SnapserveProcess, a real `snapserve` child process on
           free loopback ports;
* calls:   wait_for(), stream_all() and check_serves() around gRPC calls;
* metrics: scrape() of /metrics and its text read through prometheus_client's
           parser (parse, value, total, types).
"""
from snapserve_testkit.paths import DEFAULT_MODEL, ROOT, build_dir, model_path
from snapserve_testkit.proto import load_stubs
from snapserve_testkit.server import ServerError, SnapserveProcess, free_port
from snapserve_testkit import metrics

__all__ = ["DEFAULT_MODEL", "ROOT", "build_dir", "model_path", "load_stubs", "ServerError",
           "SnapserveProcess", "free_port", "metrics"]
