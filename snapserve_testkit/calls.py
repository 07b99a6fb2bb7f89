"""Small helpers around gRPC calls, shared by the end-to-end tests."""
import time


def wait_for(predicate, timeout=10.0, interval=0.1):
    """Polls `predicate` until it returns something truthy or `timeout`
    seconds pass; returns its last value either way."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return value
        time.sleep(interval)


def stream_all(stub, request, timeout=60):
    """Every message of one GenerateStream call."""
    return list(stub.GenerateStream(request, timeout=timeout))


def check_serves(stub, pb2, prompt):
    """The server still answers a small valid request: one token, a finish
    reason, a counted prompt."""
    r = stub.Generate(pb2.GenerateRequest(prompt=prompt,
                                          stopping=pb2.StoppingCriteria(max_new_tokens=1)),
                      timeout=60)
    assert r.finish_reason in (pb2.LENGTH, pb2.EOS)
    assert r.usage.prompt_tokens > 0
