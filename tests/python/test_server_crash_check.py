"""The server fixtures' crash check (conftest.py, snapserve_testkit/server.py):
a server that dies of a signal nobody sent to stop it fails the test that
started it, at the fixture's teardown; a server stopped by the fixture's own
SIGTERM, or one that refuses to start with an exit code, does not.

The fixture's generator is driven here by hand, so that its teardown's
failure is caught and checked instead of failing this test."""
import os
import signal

import pytest

from conftest import _server_factory


def test_a_server_killed_by_a_signal_fails_its_fixture(model_path):
    factory = _server_factory()
    start = next(factory)
    segv = start([f"--model={model_path}"])
    killed = start([f"--model={model_path}"])
    healthy = start([f"--model={model_path}"])
    refused = start(["--model=/nonexistent/model.gguf"], wait=False)
    assert refused.proc.wait(timeout=120) > 0
    for server, sig in ((segv, signal.SIGSEGV), (killed, signal.SIGKILL)):
        os.kill(server.pid, sig)
        assert server.proc.wait(timeout=120) == -sig

    with pytest.raises(pytest.fail.Exception) as failed:
        next(factory)  # the teardown: stops them all, then checks
    report = str(failed.value)
    assert f"snapserve pid {segv.pid} died by itself: killed by SIGSEGV" in report, report
    assert f"snapserve pid {killed.pid} died by itself: killed by SIGKILL" in report, report
    assert f"pid {healthy.pid} " not in report and f"pid {refused.pid} " not in report, report
    # The healthy one answered the fixture's SIGTERM by exiting cleanly.
    assert healthy.stopped_by_sigterm and healthy.proc.returncode == 0
    assert healthy.crash() is None and refused.crash() is None


def test_a_stop_that_needs_sigkill_is_reported(model_path):
    """A server that ignores the fixture's SIGTERM (here: stopped with SIGSTOP,
    so the SIGTERM waits) is killed after stop()'s timeout, and reported."""
    factory = _server_factory()
    start = next(factory)
    stuck = start([f"--model={model_path}"])
    os.kill(stuck.pid, signal.SIGSTOP)
    assert stuck.stop(timeout=1) == -signal.SIGKILL
    assert stuck.crash() == "did not exit after SIGTERM; killed with SIGKILL"
    with pytest.raises(pytest.fail.Exception) as failed:
        next(factory)
    assert f"snapserve pid {stuck.pid} did not exit after SIGTERM" in str(failed.value)
