"""The CloudWatch Logs Insights queries of docs/metrics.md (section "Logs
Insights queries") run over a real server's log lines: the `kv_cache_compressed` and
`inference_complete` events and the fields the queries read
(docs/metrics.md, "Logs")."""
import json
import math
import pathlib
import re

import grpc
import pytest

from test_server_e2e import LONG_PROMPT, SHORT_PROMPT, SNAPKV_CAPACITY, SNAPKV_WINDOW, wait_for


def _readme_queries():
    """The Logs Insights queries in docs/metrics.md's "Logs Insights queries"
    section, each as its list of pipeline stages."""
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    section = doc.split("## Logs Insights queries", 1)[1].split("\n#", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    assert len(blocks) == 2, blocks
    return [[stage.strip() for stage in block.strip().split("\n| ")] for block in blocks]


def _run_query(stages, raw_lines):
    """Evaluates the subset of the Logs Insights language those queries use
    (`filter @message like /re/`, `filter field = "value"`, `stats` with
    avg / max / percentile over a field or a field ratio), all lines in one
    bin. Returns {name: value}."""
    rows = [(line, json.loads(line)) for line in raw_lines if line.startswith("{")]
    stats = None
    for stage in stages[1:]:  # stages[0] is `fields ...`: a projection only
        if m := re.fullmatch(r"filter @message like /(.+)/", stage):
            rows = [(line, d) for line, d in rows if re.search(m.group(1), line)]
        elif m := re.fullmatch(r'filter (\w+) = "(.+)"', stage):
            rows = [(line, d) for line, d in rows if d.get(m.group(1)) == m.group(2)]
        elif stage.startswith("stats "):
            stats = stage[len("stats "):].rsplit(" by bin(", 1)[0]
        else:
            raise AssertionError(f"query stage not understood: {stage}")
    assert stats is not None and rows, (stages, len(rows))
    out = {}
    for agg in re.findall(r"\w+\([^)]*\) as \w+", stats):
        m = re.fullmatch(r"(avg|max|percentile)\(([\w ]+?)(?:\s*/\s*(\w+))?(?:,\s*(\d+))?\) as (\w+)",
                         agg.strip())
        assert m, agg
        fn, field, divisor, pct, name = m.groups()
        values = [d[field.strip()] / d[divisor] if divisor else d[field.strip()] for _, d in rows]
        if fn == "avg":
            out[name] = sum(values) / len(values)
        elif fn == "max":
            out[name] = max(values)
        else:  # nearest rank
            ordered = sorted(values)
            out[name] = ordered[max(0, math.ceil(int(pct) / 100 * len(ordered)) - 1)]
    return out


def test_logs_insights_queries_over_real_log_lines(start_server, model_path, pb):
    """The two queries, run over this server's own log lines: the
    compression query sees exactly the compressed requests (a `kv_cache_compressed`
    line each, with the Usage the client got), the latency query every call."""
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}", f"--kv-capacity={SNAPKV_CAPACITY}",
                           f"--kv-window={SNAPKV_WINDOW}"])
    stop = pb2.StoppingCriteria(max_new_tokens=2, ignore_eos=True)
    with grpc.insecure_channel(server.target) as ch:
        stub = pb2_grpc.GenerationStub(ch)
        snapkv = stub.Generate(pb2.GenerateRequest(request_id="q-snapkv", prompt=LONG_PROMPT,
                                                   stopping=stop), timeout=120)
        streaming = stub.Generate(pb2.GenerateRequest(
            request_id="q-streaming", prompt=LONG_PROMPT, stopping=stop,
            kv_compression=pb2.KvCompression(method=pb2.KvCompression.STREAMING_LLM,
                                             max_capacity_prompt=40, sink_tokens=4)),
            timeout=120)
        short = stub.Generate(pb2.GenerateRequest(request_id="q-short", prompt=SHORT_PROMPT,
                                                  stopping=stop), timeout=60)
    assert short.usage.kv_kept_entries == short.usage.kv_prompt_entries
    compressed = {"q-snapkv": (snapkv.usage, "snapkv"), "q-streaming": (streaming.usage,
                                                                         "streaming_llm")}
    for usage, _ in compressed.values():
        assert usage.kv_kept_entries < usage.kv_prompt_entries

    def lines():
        raw = server.logs().splitlines()
        done = [line for line in raw if '"kv_cache_compressed"' in line]
        return raw if len(done) == 2 and sum("inference_complete" in x for x in raw) == 3 else None
    raw = wait_for(lines, timeout=10)
    assert raw, server.logs()[-2000:]

    events = [json.loads(line) for line in raw if '"kv_cache_compressed"' in line]
    assert {e["request_id"] for e in events} == set(compressed)
    for e in events:
        usage, method = compressed[e["request_id"]]
        assert e["method"] == method
        assert (e["kv_original_size"], e["kv_compressed_size"]) == \
            (usage.kv_prompt_entries, usage.kv_kept_entries)
        assert e["compression_ratio"] == pytest.approx(usage.compression_ratio, rel=1e-6)
        # The log has the double, Usage the float32 of the same figure.
        assert usage.HasField("retained_attention_ratio")
        assert 0 < e["retained_attention"] <= 1
        assert e["retained_attention"] == pytest.approx(usage.retained_attention_ratio, rel=1e-6)
        assert pb2.KvCompression.Method.Name(usage.kv_method) == method.upper()
    assert not short.usage.HasField("retained_attention_ratio")
    assert short.usage.kv_method == pb2.KvCompression.NONE

    # What the eks-gpu overlay's Fluent Bit ships: every line the server wrote
    # (all JSON objects), and nothing that is not one.
    from deploy_manifests import fluent_bit_keeps
    assert all(fluent_bit_keeps(line) for line in raw if line.strip()), raw[:5]
    assert not fluent_bit_keeps("I1202 19:00:00.000 kubelet.go:1] not json")

    latency_query, compression_query = _readme_queries()
    got = _run_query(compression_query, raw)
    kept_shares = [u.kv_kept_entries / u.kv_prompt_entries for u, _ in compressed.values()]
    assert got["avg_kept_share"] == pytest.approx(sum(kept_shares) / 2, rel=1e-9)
    assert got["max_input_kv"] == max(u.kv_prompt_entries for u, _ in compressed.values())
    retained = [e["retained_attention"] for e in events]
    assert got["avg_retained_attention"] == pytest.approx(sum(retained) / 2, rel=1e-9)

    got = _run_query(latency_query, raw)
    durations = [json.loads(x)["duration_ms"] for x in raw if re.search("inference_complete", x)]
    assert len(durations) == 3
    assert got["p99"] == max(durations) and min(durations) <= got["avg_latency"] <= max(durations)
