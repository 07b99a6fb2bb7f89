"""A real Prometheus scrapes a real snapserve (docs/metrics.md): after a known set
of requests, PromQL over the scraped series gives back exactly what was sent."""
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import grpc
import pytest

from snapserve_testkit import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
CAPACITY = 64
WINDOW = 16
LONG = 2 * CAPACITY  # SnapKV keeps CAPACITY of LONG entries: ratio exactly 2
SHORT = 20           # method NONE: ratio 1


def http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class Prometheus:
    def __init__(self, tmp_path, metrics_port):
        self.port = free_port()
        self.dir = tmp_path / "prometheus"
        (self.dir / "data").mkdir(parents=True)
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: snapserve\n"
            "    scrape_interval: 1s\n"
            "    scrape_timeout: 900ms\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics_port}']\n")
        self.log = open(self.dir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def logs(self):
        self.log.flush()
        return (self.dir / "prometheus.log").read_text()

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.logs()}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"prometheus not ready:\n{self.logs()}")

    def query(self, promql):
        """The single value of an instant query (None when the result is empty)."""
        body = http_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert body["status"] == "success", body
        result = body["data"]["result"]
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def wait_value(self, promql, expected, timeout=30):
        deadline = time.time() + timeout
        value = None
        while time.time() < deadline:
            value = self.query(promql)
            if value is not None and value == pytest.approx(expected):
                return value
            time.sleep(0.5)
        raise AssertionError(f"{promql} = {value}, expected {expected}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path):
    started = []

    def start(metrics_port):
        p = Prometheus(tmp_path, metrics_port)
        started.append(p)
        p.wait_ready()
        return p

    yield start
    for p in started:
        p.stop()


def test_prometheus_scrapes_what_was_sent(start_server, model_path, pb, prometheus_for):
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}", f"--kv-capacity={CAPACITY}",
                           f"--kv-window={WINDOW}"])
    prom = prometheus_for(server.metrics_port)
    prom.wait_value('up{job="snapserve"}', 1)

    n_snapkv, n_none, n_invalid = 3, 2, 2
    prompt_tokens = completion_tokens = 0
    with grpc.insecure_channel(server.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        text = "The metrics of a server tell how it behaves under load. " * 30
        ids = list(stub.Tokenize(pb2.TokenizeRequest(text=text), timeout=10).ids)
        assert len(ids) >= LONG
        stopping = pb2.StoppingCriteria(max_new_tokens=2, ignore_eos=True)
        for i in range(n_snapkv):
            r = stub.Generate(pb2.GenerateRequest(
                input_ids=pb2.TokenIds(ids=ids[i:i + LONG]), stopping=stopping), timeout=120)
            assert (r.usage.kv_prompt_entries, r.usage.kv_kept_entries) == (LONG, CAPACITY)
            prompt_tokens += r.usage.prompt_tokens
            completion_tokens += r.usage.completion_tokens
        for i in range(n_none):
            r = stub.Generate(pb2.GenerateRequest(
                input_ids=pb2.TokenIds(ids=ids[i:i + SHORT]), stopping=stopping,
                kv_compression=pb2.KvCompression(method=pb2.KvCompression.NONE)), timeout=120)
            assert r.usage.compression_ratio == 1
            prompt_tokens += r.usage.prompt_tokens
            completion_tokens += r.usage.completion_tokens
        for _ in range(n_invalid):
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(pb2.GenerateRequest(prompt=""), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    n_ok = n_snapkv + n_none
    # Wait for a scrape that saw the last request.
    prom.wait_value('snapserve_requests_total{status="OK"}', n_ok)
    prom.wait_value('snapserve_requests_total{status="INVALID_ARGUMENT"}', n_invalid)
    assert prom.query('sum(snapserve_requests_total)') == n_ok + n_invalid
    assert prom.query('snapserve_requests_total{status="UNAVAILABLE"}') == 0

    # Compression ratio histogram: n_snapkv observations of 2, n_none of 1.
    assert prom.query("snapserve_kv_compression_ratio_count") == n_ok
    assert prom.query("snapserve_kv_compression_ratio_sum") == pytest.approx(
        2.0 * n_snapkv + 1.0 * n_none)
    assert prom.query('snapserve_kv_compression_ratio_bucket{le="1"}') == n_none
    assert prom.query('snapserve_kv_compression_ratio_bucket{le="1.5"}') == n_none
    assert prom.query('snapserve_kv_compression_ratio_bucket{le="2"}') == n_ok
    # Median falls in the (1.5, 2] bucket, the top quantile at its bound,
    # the lowest in the first bucket.
    median = prom.query("histogram_quantile(0.5, sum by (le) (snapserve_kv_compression_ratio_bucket))")
    assert 1.5 < median <= 2.0
    assert prom.query("histogram_quantile(0.99, snapserve_kv_compression_ratio_bucket)") <= 2.0
    assert prom.query("histogram_quantile(0.2, snapserve_kv_compression_ratio_bucket)") <= 1.0
    mean = prom.query("sum(snapserve_kv_compression_ratio_sum) / "
                      "sum(snapserve_kv_compression_ratio_count)")
    assert mean == pytest.approx((2.0 * n_snapkv + n_none) / n_ok)

    before = n_snapkv * LONG + n_none * SHORT
    after = n_snapkv * CAPACITY + n_none * SHORT
    assert prom.query("snapserve_kv_entries_before_total") == before
    assert prom.query("snapserve_kv_entries_after_total") == after
    assert prom.query("snapserve_kv_entries_before_total / snapserve_kv_entries_after_total") == \
        pytest.approx(before / after)
    assert prom.query("snapserve_prompt_tokens_total") == prompt_tokens == before
    assert prom.query("snapserve_generated_tokens_total") == completion_tokens == 2 * n_ok
    assert prom.query("snapserve_snapkv_duration_seconds_count") == n_snapkv
    assert prom.query("snapserve_time_to_first_token_seconds_count") == n_ok
    assert prom.query("snapserve_request_duration_seconds_count") == n_ok + n_invalid
    # One decode step per request after its first token (max_new_tokens=2, alone).
    assert prom.query("snapserve_batch_size_count") == n_ok
    assert prom.query("snapserve_inter_token_latency_seconds_count") == n_ok
    # Idle again: nothing running or waiting, the whole cache free.
    prom.wait_value("snapserve_requests_running", 0)
    prom.wait_value("snapserve_requests_waiting", 0)
    prom.wait_value("snapserve_kv_cache_usage_ratio", 0)
