"""W4: prompts that share a long prefix (issue 49; docs/kv-cache-and-scheduling.md,
"Prefix cache").

* W4a: 8 requests one after another, each a shared 1,536-token prefix plus a
  distinct 128-token suffix: time to first token of the first (cold) request
  and of the other seven.
* W4b: 16 requests at once, a new shared 1,536-token prefix plus a distinct
  128-token suffix each, 64 new tokens: aggregate generated tokens/s, time
  to first token p50/p95.
* W4c: two snapserve replicas share one Redis (`--kv-store`, a `redis-server`
  started here on loopback): replica A serves a 1,536-token prefix plus a
  128-token suffix; once A has written the prefix's chunks, replica B serves
  the same prefix with another suffix. B's time to first token against B's
  own cold time on a prefix nobody computed (median of W4C_ROUNDS rounds).
  snapserve only; the first `--snapserve` flag set (it must turn the prefix
  cache on).

Drives snapserve over gRPC (started here, once per `--snapserve` flag set, or
an already running one with `--snapserve-target`) and, when given their URLs,
vLLM's OpenAI API (run with prefix caching on) and llama.cpp's server
(`cache_prompt: true`), which this script never starts. Every target gets the
same token ids: snapserve's tokenizer makes them from the Debian license texts,
and the peers must serve the same model. Greedy, EOS ignored. Each workload
uses text no earlier request used, so its first request is cold everywhere.

  .venv/bin/python bench/w4_prefix.py \
      --snapserve="--precision=auto --prefix-cache-memory=0.25" --snapserve="--precision=auto" \
      [--vllm-url=http://127.0.0.1:8000] [--llama-url=http://127.0.0.1:8080]

  .venv/bin/python bench/w4_prefix.py --workloads=W4c \
      --snapserve="--precision=auto --prefix-cache-memory=0.25"

Writes bench/results/runs/w4_prefix.json (or --out).
"""
import argparse
import http.client
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import common
from snapserve_testkit.calls import wait_for
from snapserve_testkit.metrics import total
from snapserve_testkit.server import free_port

PREFIX, SUFFIX = 1536, 128
W4A_REQUESTS, W4A_NEW = 8, 16
W4B_REQUESTS, W4B_NEW = 16, 64
W4C_ROUNDS, W4C_NEW = 3, 16
CHUNK = 256  # EngineOptions::prefix_cache_chunk_tokens


# --- clients: each stream() returns the send time, token arrival times and
# tokens per arrival, the prompt tokens the server says it reused, an error.

class SnapserveClient:
    name = "snapserve"

    def __init__(self, stub):
        self.stub = stub

    def stream(self, ids, max_new):
        r = common.stream_one(self.stub, common.make_request(ids, max_new))
        cached = r["usage"].cached_prompt_tokens if r["usage"] is not None else None
        return {"t0": r["t0"], "t1": r["t1"], "arrivals": r["arrivals"], "ntok": r["ntok"],
                "cached_tokens": cached, "error": r["error"]}


def server_sent_events(response):
    for raw in response:
        line = raw.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


class HttpPeerClient:
    """vLLM (OpenAI /v1/completions) or llama.cpp (/completion), streaming."""

    def __init__(self, kind, url, model):
        self.kind, self.model = kind, model
        self.name = "vllm" if kind == "vllm" else "llama.cpp"
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80

    def body(self, ids, max_new):
        if self.kind == "vllm":
            return "/v1/completions", {
                "model": self.model, "prompt": ids, "max_tokens": max_new, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        return "/completion", {"prompt": ids, "n_predict": max_new, "temperature": 0.0,
                               "top_k": 1, "ignore_eos": True, "cache_prompt": True,
                               "stream": True}

    def stream(self, ids, max_new):
        path, body = self.body(ids, max_new)
        t0 = time.perf_counter()
        arrivals, ntok, cached, err = [], [], None, None
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=1800)
            conn.request("POST", path, body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                err = f"HTTP {resp.status}"
            else:
                for data in server_sent_events(resp):
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    now = time.perf_counter()
                    if self.kind == "vllm":
                        if any(c.get("text") for c in event.get("choices") or []):
                            arrivals.append(now)
                            ntok.append(1)
                        usage = event.get("usage") or {}
                        details = usage.get("prompt_tokens_details") or {}
                        if "cached_tokens" in details:
                            cached = details["cached_tokens"]
                    else:
                        if event.get("content") and not event.get("stop"):
                            arrivals.append(now)
                            ntok.append(1)
                        if event.get("stop"):
                            cached = (event.get("timings") or {}).get("cache_n",
                                                                      event.get("tokens_cached"))
            conn.close()
        except (OSError, ValueError) as e:
            err = repr(e)
        return {"t0": t0, "t1": time.perf_counter(), "arrivals": arrivals, "ntok": ntok,
                "cached_tokens": cached, "error": err}


# --- workloads ------------------------------------------------------------------

def prompts(ids, text_offset, count):
    """`count` prompts: one PREFIX-token prefix, then a distinct SUFFIX each,
    all from ids[text_offset:]."""
    prefix = ids[text_offset:text_offset + PREFIX]
    start = text_offset + PREFIX
    return [prefix + ids[start + i * SUFFIX:start + (i + 1) * SUFFIX] for i in range(count)]


def ttft(r):
    return r["arrivals"][0] - r["t0"] if r["arrivals"] else None


def w4a(client, ids, text_offset):
    runs = [client.stream(p, W4A_NEW) for p in prompts(ids, text_offset, W4A_REQUESTS)]
    times = [ttft(r) for r in runs]
    rest = [t for t in times[1:] if t is not None]
    return {"ttft_s": times, "ttft_first_s": times[0],
            "ttft_rest_median_s": common.median(rest),
            "rest_over_first": (common.median(rest) / times[0]) if rest and times[0] else None,
            "cached_tokens": [r["cached_tokens"] for r in runs],
            "errors": [r["error"] for r in runs if r["error"]]}


def w4b(client, ids, text_offset):
    batch = prompts(ids, text_offset, W4B_REQUESTS)
    runs = [None] * len(batch)
    barrier = threading.Barrier(len(batch))

    def go(i):
        barrier.wait()
        runs[i] = client.stream(batch[i], W4B_NEW)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(batch))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in runs if r["error"] is None and r["arrivals"]]
    generated = sum(sum(r["ntok"]) for r in runs)
    wall = max(r["t1"] for r in runs) - min(r["t0"] for r in runs)
    firsts = [ttft(r) for r in ok]
    return {"n_ok": len(ok), "generated": generated, "wall_s": wall,
            "aggregate_tok_s": generated / wall if wall > 0 else None,
            "ttft_p50_s": common.percentile(firsts, 50),
            "ttft_p95_s": common.percentile(firsts, 95),
            "cached_tokens": [r["cached_tokens"] for r in runs],
            "errors": [r["error"] for r in runs if r["error"]]}


class RedisServer:
    """redis-server on 127.0.0.1:<free port>: no persistence, 1 GiB at most."""

    def __init__(self):
        import redis
        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "/usr/bin/redis-server", "--bind", "127.0.0.1",
             "--port", str(self.port), "--save", "", "--appendonly", "no", "--maxmemory", "1gb",
             "--maxmemory-policy", "allkeys-lru", "--dir", self.dir.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)

        def up():
            try:
                return self.client.ping()
            except redis.exceptions.ConnectionError:
                return False

        assert wait_for(up, timeout=20), "redis-server did not start"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.dir.cleanup()


def w4c(flags, ids):
    """Replica B's first request on a prefix replica A computed, against B's
    cold requests."""
    store = RedisServer()
    shared = [*shlex.split(flags), f"--kv-store=redis://127.0.0.1:{store.port}",
              # Long enough that the wait never cuts a lookup short here.
              "--kv-store-wait=5000"]
    chunks = (PREFIX + SUFFIX - 1) // CHUNK
    rounds = []
    try:
        with common.Server(shared, log_name="bench-w4c-a") as a, \
                common.Server(shared, log_name="bench-w4c-b") as b:
            client_a, client_b = SnapserveClient(a.stub), SnapserveClient(b.stub)
            if ids is None:
                ids = common.corpus_ids(a)
            # From the corpus's end, away from W4a/W4b's text: per round a
            # prefix for B's cold run and one that A computes for B.
            step = PREFIX + 2 * SUFFIX
            base = len(ids) - W4C_ROUNDS * 2 * step
            for r in range(W4C_ROUNDS):
                cold_text = ids[base + 2 * r * step:base + (2 * r + 1) * step]
                shared_text = ids[base + (2 * r + 1) * step:base + (2 * r + 2) * step]
                cold = client_b.stream(cold_text[:PREFIX + SUFFIX], W4C_NEW)
                written = total(a.metrics_text(), "snapserve_kv_store_writes_total") or 0
                first = client_a.stream(shared_text[:PREFIX + SUFFIX], W4C_NEW)
                assert wait_for(lambda: (total(a.metrics_text(), "snapserve_kv_store_writes_total")
                                         or 0) >= written + chunks, timeout=120), "A wrote nothing"
                warm = client_b.stream(shared_text[:PREFIX] + shared_text[PREFIX + SUFFIX:],
                                       W4C_NEW)
                rounds.append({"b_cold_ttft_s": ttft(cold), "a_first_ttft_s": ttft(first),
                               "b_shared_ttft_s": ttft(warm),
                               "b_shared_cached_tokens": warm["cached_tokens"],
                               "errors": [x["error"] for x in (cold, first, warm) if x["error"]]})
            bytes_in = total(b.metrics_text(), "snapserve_kv_store_bytes_total",
                             {"direction": "in"})
            store_errors = total(b.metrics_text(), "snapserve_kv_store_errors_total")
    finally:
        store.stop()
    cold = common.median([x["b_cold_ttft_s"] for x in rounds])
    warm = common.median([x["b_shared_ttft_s"] for x in rounds])
    return {"flags": shared, "rounds": rounds, "b_cold_ttft_median_s": cold,
            "b_shared_ttft_median_s": warm, "cold_over_shared": cold / warm if warm else None,
            "b_bytes_read": bytes_in, "b_store_errors": store_errors}, ids


def run_workloads(client, ids, round_index):
    # Each round and workload on text nobody has seen: 2 x (PREFIX + 16 x SUFFIX)
    # tokens apart.
    span = PREFIX + W4B_REQUESTS * SUFFIX
    base = round_index * 2 * span
    common.log(f"{client.name}: W4a")
    a = w4a(client, ids, base)
    common.log(f"{client.name}: W4b")
    b = w4b(client, ids, base + span)
    return {"W4a": a, "W4b": b}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--snapserve", action="append", default=None,
                    help="flags of one snapserve server to start (repeatable). Default: the "
                         "default preset with --prefix-cache-memory=0.25, then without")
    ap.add_argument("--snapserve-target", help="host:port of a running snapserve instead")
    ap.add_argument("--vllm-url", help="vLLM's OpenAI API, e.g. http://127.0.0.1:8000")
    ap.add_argument("--vllm-model", default="smollm2", help="the model name vLLM serves")
    ap.add_argument("--llama-url", help="llama.cpp's server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--workloads", default="W4a,W4b,W4c",
                    help="which to run, comma-separated (W4c: snapserve only, needs redis-server)")
    ap.add_argument("--out", default="runs/w4_prefix.json")
    args = ap.parse_args()
    workloads = set(args.workloads.split(","))
    flag_sets = args.snapserve if args.snapserve is not None else [
        "--precision=auto --prefix-cache-memory=0.25", "--precision=auto"]

    results = {"workloads": {"W4a": f"{W4A_REQUESTS} sequential, {PREFIX}-token shared prefix + "
                                    f"{SUFFIX}-token distinct suffix, {W4A_NEW} new tokens",
                             "W4b": f"{W4B_REQUESTS} concurrent, {PREFIX} shared + {SUFFIX} "
                                    f"distinct, {W4B_NEW} new tokens",
                             "W4c": f"replica B's first request on a {PREFIX}-token prefix "
                                    f"replica A computed (+ {SUFFIX}-token suffix, {W4C_NEW} new "
                                    f"tokens), one Redis, against B's cold request; median of "
                                    f"{W4C_ROUNDS}"},
               "machine": common.machine_info(), "command": " ".join(sys.argv), "targets": []}
    ids = None
    round_index = 0

    def record(name, flags, client):
        nonlocal round_index
        if not workloads & {"W4a", "W4b"}:
            return
        out = {"target": name, "flags": flags, **run_workloads(client, ids, round_index)}
        round_index += 1
        results["targets"].append(out)
        common.log(json.dumps({k: out[k] for k in ("target", "flags")}),
                   f"W4a first {out['W4a']['ttft_first_s']:.3f}s rest "
                   f"{out['W4a']['ttft_rest_median_s']:.3f}s; W4b "
                   f"{out['W4b']['aggregate_tok_s']:.1f} tok/s p50 {out['W4b']['ttft_p50_s']:.2f}s")

    if args.snapserve_target:
        import grpc
        _, pb2_grpc = common.pb()
        channel = grpc.insecure_channel(args.snapserve_target)
        stub = pb2_grpc.GenerationStub(channel)

        class Remote:
            pass

        remote = Remote()
        remote.stub = stub
        ids = common.corpus_ids(remote)
        record("snapserve", args.snapserve_target, SnapserveClient(stub))
    else:
        for flags in flag_sets if workloads & {"W4a", "W4b"} else []:
            with common.Server(shlex.split(flags)) as server:
                if ids is None:
                    ids = common.corpus_ids(server)
                record("snapserve", flags, SnapserveClient(server.stub))
        if "W4c" in workloads:
            common.log("snapserve: W4c")
            results["W4c_result"], ids = w4c(flag_sets[0], ids)
            c = results["W4c_result"]
            common.log(f"W4c B cold {c['b_cold_ttft_median_s']:.3f}s, B on A's prefix "
                       f"{c['b_shared_ttft_median_s']:.3f}s ({c['cold_over_shared']:.1f}x)")
    if args.vllm_url:
        record("vllm", args.vllm_url, HttpPeerClient("vllm", args.vllm_url, args.vllm_model))
    if args.llama_url:
        record("llama.cpp", args.llama_url, HttpPeerClient("llama", args.llama_url, None))
    assert ids is not None and len(ids) > 8 * (PREFIX + W4B_REQUESTS * SUFFIX), "corpus too short"
    common.write_json(args.out, results)


if __name__ == "__main__":
    main()
