"""The prefix cache's shared tier in Redis (docs/kv-cache-and-scheduling.md,
"Shared tier in Redis") through real snapserve processes and a real
`redis-server` that the tests start (loopback, an ephemeral port, no
persistence, bounded memory).

Oracles: a cold run of the same prompt on a server with the same flags
(greedy tokens and logprobs must be equal, bit for bit); the Redis project's
own Python client reads the entries, and zlib's CRC-32 checks their checksum
(the format is documented in engine/kv/store/chunk_entry.h); TLS against a
CA and certificate made with the openssl CLI.
"""
import pathlib
import shutil
import signal
import struct
import subprocess
import threading
import time
import zlib

import grpc
import pytest
import redis

from snapserve_testkit import metrics
from snapserve_testkit.calls import wait_for
from snapserve_testkit.server import free_port

GPL3 = pathlib.Path("/usr/share/common-licenses/GPL-3")
CHUNK = 256
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # the default model
# Header, tokens, then K and V in float32 (the CPU compute dtype).
ENTRY_BYTES = 64 + CHUNK * 4 + 2 * LAYERS * KV_HEADS * CHUNK * HEAD_DIM * 4
PREFIX, SUFFIX, MAX_NEW = 1100, 80, 6
# A prompt of PREFIX + SUFFIX tokens: its first four chunks go to the store.
SHARED_CHUNKS = (PREFIX + SUFFIX - 1) // CHUNK
FLAGS = ["--kv-cache-memory=512MiB", "--prefix-cache-memory=0.5", "--max-step-tokens=512",
         "--default-kv-method=none", "--kv-store-ttl=600",
         # Generous, so a loaded machine still reads every chunk in time.
         "--kv-store-wait=10000"]
KEY_PATTERN = "snapserve:kv:v1:*"


class RedisServer:
    """redis-server on 127.0.0.1:<ephemeral port>, no persistence, at most
    256 MiB (enough for 20 chunks), evicting least recently used keys."""

    def __init__(self, workdir, port=None):
        self.port = port or free_port()
        self.workdir = workdir
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port),
             "--save", "", "--appendonly", "no", "--maxmemory", "256mb",
             "--maxmemory-policy", "allkeys-lru", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        assert wait_for(self._ping, timeout=20), "redis-server did not start"

    def _ping(self):
        try:
            return self.client.ping()
        except redis.exceptions.ConnectionError:
            return False

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


def parse_entry(raw):
    """The header fields, tokens and checksum verdict of an entry."""
    (magic, version, dtype, fingerprint, layers, heads, dim, chunk, hash_, parent, payload, crc,
     zero) = struct.unpack_from("<4sHHQIIIIQQQII", raw)
    tokens = list(struct.unpack_from(f"<{chunk}i", raw, 64))
    return {"magic": magic, "version": version, "dtype": dtype, "fingerprint": fingerprint,
            "layout": (layers, heads, dim, chunk), "hash": hash_, "parent": parent,
            "payload": payload, "tokens": tokens, "zero": zero,
            "crc_ok": crc == zlib.crc32(raw[:56] + raw[64:])}


def with_checksum(raw):
    """`raw` with its CRC-32 recomputed: an intact entry of other content."""
    raw = bytearray(raw)
    struct.pack_into("<I", raw, 56, zlib.crc32(bytes(raw[:56]) + bytes(raw[64:])))
    return bytes(raw)


def entries_by_first_token(client):
    """{tuple(tokens): (key, raw)} of every entry in the store."""
    found = {}
    for key in client.scan_iter(KEY_PATTERN):
        raw = client.get(key)
        if raw is not None:
            found[tuple(parse_entry(raw)["tokens"])] = (key, raw)
    return found


def generate(stub, pb2, ids, rid):
    req = pb2.GenerateRequest(
        request_id=rid, input_ids=pb2.TokenIds(ids=ids),
        stopping=pb2.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True),
        logprobs=pb2.LogprobOptions(enabled=True, top_logprobs=3))
    r = stub.Generate(req, timeout=600)
    return {"tokens": list(r.token_ids),
            "logprobs": [(l.token_id, l.logprob, [(t.token_id, t.logprob) for t in l.top_logprobs])
                         for l in r.logprobs],
            "cached": r.usage.cached_prompt_tokens}


def counter(server, name, labels=None):
    return metrics.total(server.metrics_text(), name, labels) or 0


def wait_written(server, chunks):
    assert wait_for(lambda: counter(server, "snapserve_kv_store_writes_total") >= chunks,
                    timeout=60), server.metrics_text()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replicas(start_module_server, model_path, store, pb):
    """Two replicas with identical flags sharing `store`, and the GPL's tokens."""
    pb2, pb2_grpc = pb
    servers = [start_module_server([f"--model={model_path}", *FLAGS, f"--kv-store={store.url}"])
               for _ in range(2)]
    with grpc.insecure_channel(servers[0].target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        ids = list(stub.Tokenize(pb2.TokenizeRequest(text=GPL3.read_text())).ids)
    assert len(ids) > 5 * (PREFIX + SUFFIX)
    return servers, ids


def stubs(servers, pb):
    _, pb2_grpc = pb
    channels = [grpc.insecure_channel(s.target) for s in servers]
    return channels, [pb2_grpc.GenerationStub(c) for c in channels]


def test_a_second_replica_starts_from_the_first_ones_prefill(replicas, store, pb):
    pb2, _ = pb
    (a, b), ids = replicas
    prompt = ids[:PREFIX + SUFFIX]
    channels, (stub_a, stub_b) = stubs((a, b), pb)
    try:
        cold = generate(stub_a, pb2, prompt, "shared-cold")
        wait_written(a, SHARED_CHUNKS)
        warm = generate(stub_b, pb2, prompt, "shared-warm")
    finally:
        for c in channels:
            c.close()
    assert cold["cached"] == 0
    assert warm["cached"] == SHARED_CHUNKS * CHUNK
    assert warm["tokens"] == cold["tokens"]
    assert warm["logprobs"] == cold["logprobs"]

    # What crossed the network, on both sides.
    assert counter(a, "snapserve_kv_store_writes_total") == SHARED_CHUNKS
    assert counter(a, "snapserve_kv_store_bytes_total", {"direction": "out"}) == (
        SHARED_CHUNKS * ENTRY_BYTES)
    assert counter(b, "snapserve_kv_store_reads_total", {"result": "hit"}) == SHARED_CHUNKS
    assert counter(b, "snapserve_kv_store_bytes_total", {"direction": "in"}) == (
        SHARED_CHUNKS * ENTRY_BYTES)
    assert counter(b, "snapserve_kv_store_errors_total") == 0
    # B computed only the tail, so it wrote nothing back.
    assert counter(b, "snapserve_kv_store_writes_total") == 0

    # The entries as Redis holds them: the documented format, a TTL, and a
    # chain whose first parent is the fingerprint every entry carries.
    entries = entries_by_first_token(store.client)
    chain = [entries[tuple(prompt[i * CHUNK:(i + 1) * CHUNK])] for i in range(SHARED_CHUNKS)]
    parsed = [parse_entry(raw) for _, raw in chain]
    for (key, raw), e in zip(chain, parsed):
        assert len(raw) == ENTRY_BYTES
        assert (e["magic"], e["version"], e["dtype"], e["zero"]) == (b"SKVC", 1, 1, 0)
        assert e["layout"] == (LAYERS, KV_HEADS, HEAD_DIM, CHUNK)
        assert e["payload"] == ENTRY_BYTES - 64 - 4 * CHUNK
        assert e["crc_ok"]
        assert key.decode() == f"snapserve:kv:v1:{e['hash']:016x}"
        assert 0 < store.client.ttl(key) <= 600
    assert parsed[0]["parent"] == parsed[0]["fingerprint"]
    for prev, cur in zip(parsed, parsed[1:]):
        assert cur["parent"] == prev["hash"]


def corrupt(raw):
    bad = bytearray(raw)
    bad[len(bad) // 2] ^= 0x40  # one bit of the payload
    return bytes(bad)


def truncate(raw):
    return raw[:len(raw) - 1000]


def other_model(raw):
    bad = bytearray(raw)
    struct.pack_into("<Q", bad, 8, struct.unpack_from("<Q", bad, 8)[0] ^ 1)
    return with_checksum(bytes(bad))


@pytest.mark.parametrize("kind,damage,slot", [("checksum", corrupt, 1), ("truncated", truncate, 2),
                                              ("wrong_model", other_model, 3)])
def test_a_damaged_or_foreign_entry_is_refused_and_recomputed(replicas, store, pb, kind, damage,
                                                              slot):
    pb2, _ = pb
    (a, b), ids = replicas
    start = slot * (PREFIX + SUFFIX)
    prompt = ids[start:start + PREFIX + SUFFIX]
    channels, (stub_a, stub_b) = stubs((a, b), pb)
    try:
        written = counter(a, "snapserve_kv_store_writes_total")
        cold = generate(stub_a, pb2, prompt, f"{kind}-cold")
        wait_written(a, written + SHARED_CHUNKS)
        key, raw = entries_by_first_token(store.client)[tuple(prompt[:CHUNK])]
        store.client.set(key, damage(raw), ex=600)
        errors = counter(b, "snapserve_kv_store_errors_total", {"kind": kind})
        again = generate(stub_b, pb2, prompt, f"{kind}-again")
    finally:
        for c in channels:
            c.close()
    # The first chunk was refused, so nothing after it could be used.
    assert again["cached"] == 0
    assert again["tokens"] == cold["tokens"]
    assert again["logprobs"] == cold["logprobs"]
    assert counter(b, "snapserve_kv_store_errors_total", {"kind": kind}) == errors + 1
    # The refused entry was deleted and B's own chunk written in its place.
    assert wait_for(lambda: (v := store.client.get(key)) is not None and v == raw, timeout=60)


def test_requests_succeed_while_redis_is_killed_and_restarted(start_server, model_path, pb,
                                                              tmp_path):
    pb2, pb2_grpc = pb
    store = RedisServer(tmp_path)
    try:
        server = start_server([f"--model={model_path}", *FLAGS, f"--kv-store={store.url}"])
        with grpc.insecure_channel(server.target) as channel:
            stub = pb2_grpc.GenerationStub(channel)
            ids = list(stub.Tokenize(pb2.TokenizeRequest(text=GPL3.read_text())).ids)
            prompts = [ids[i * 600:i * 600 + 600] for i in range(6)]
            first = generate(stub, pb2, prompts[0], "before")
            wait_written(server, 2)
            results, errors = [], []

            def traffic():
                for i, p in enumerate(prompts[1:4]):
                    try:
                        results.append(generate(stub, pb2, p, f"during-{i}"))
                    except grpc.RpcError as e:  # reported below
                        errors.append((e.code(), e.details()))

            worker = threading.Thread(target=traffic)
            worker.start()
            store.kill()  # while the traffic runs
            worker.join()
            assert not errors, errors
            assert len(results) == 3
            down = generate(stub, pb2, prompts[4], "down")
            assert counter(server, "snapserve_kv_store_errors_total") > 0
            # The same port again: the tier reconnects once its backoff (at
            # most SharedKvTier::kMaxBackoff, 5 s) has passed.
            store = RedisServer(tmp_path, port=store.port)
            time.sleep(6)
            after = generate(stub, pb2, prompts[5], "after")
            assert wait_for(lambda: store.client.dbsize() == 2, timeout=60)
    finally:
        store.stop()
    assert first["cached"] == down["cached"] == after["cached"] == 0
    log = server.logs()
    # One line per outage, one per recovery.
    assert log.count("unreachable, serving without it") == 1, log[-3000:]
    assert log.count("reachable again after") == 1, log[-3000:]


def test_entries_written_back_can_be_evicted_again(start_server, model_path, pb, tmp_path):
    """The writer reads entries in place, pinned until it is done: with room
    for two chunks, each new two-chunk prompt must still be able to evict the
    previous prompt's written chunks, so its repeat starts from the cache."""
    pb2, pb2_grpc = pb
    store = RedisServer(tmp_path)
    try:
        # 64 MiB x 0.4 holds two 11.25 MiB chunks.
        server = start_server([f"--model={model_path}", "--kv-cache-memory=64MiB",
                               "--prefix-cache-memory=0.4", "--default-kv-method=none",
                               f"--kv-store={store.url}"])
        assert "prefix cache: 2 chunks of 256 tokens" in server.logs(), server.logs()
        with grpc.insecure_channel(server.target) as channel:
            stub = pb2_grpc.GenerationStub(channel)
            ids = list(stub.Tokenize(pb2.TokenizeRequest(text=GPL3.read_text())).ids)
            prompts = [ids[i * 600:i * 600 + 600] for i in range(3)]
            for i, p in enumerate(prompts):
                assert generate(stub, pb2, p, f"cold-{i}")["cached"] == 0
                wait_written(server, 2 * (i + 1))
                assert generate(stub, pb2, p, f"again-{i}")["cached"] == 2 * CHUNK
    finally:
        store.stop()


def test_kv_store_without_a_prefix_cache_is_refused(start_server, model_path):
    server = start_server([f"--model={model_path}", "--kv-store=redis://127.0.0.1:1"],
                          wait=False)
    assert server.proc.wait(timeout=120) != 0
    assert "--kv-store needs --prefix-cache-memory" in server.logs(), server.logs()


def make_tls_files(d):
    """A CA and a certificate for 127.0.0.1 that it signs (openssl CLI)."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
            "server.key", "-out", "server.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
    return d / "ca.pem", d / "server.pem", d / "server.key"


def test_tls_and_auth_and_the_password_is_never_logged(start_server, model_path, pb, tmp_path):
    pb2, pb2_grpc = pb
    ca, cert, key = make_tls_files(tmp_path)
    password = "kv-store-secret-7f3a"
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", "0", "--tls-port",
         str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no", "--requirepass", password,
         "--save", "", "--appendonly", "no", "--maxmemory", "256mb", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca),
                         password=password)

    def up():
        try:
            return client.ping()
        except redis.exceptions.ConnectionError:
            return False

    try:
        assert wait_for(up, timeout=20), "redis-server with TLS did not start"
        flags = [f"--model={model_path}", *FLAGS, f"--kv-store=rediss://127.0.0.1:{port}",
                 f"--kv-store-tls-ca={ca}"]
        good = start_server(flags, env={"SNAPSERVE_KV_STORE_PASSWORD": password})
        (tmp_path / "wrong").write_text("not-the-password\n")
        wrong = start_server(flags + [f"--kv-store-password-file={tmp_path / 'wrong'}"])
        untrusted = start_server([f"--model={model_path}", *FLAGS,
                                  f"--kv-store=rediss://127.0.0.1:{port}"],
                                 env={"SNAPSERVE_KV_STORE_PASSWORD": password})
        with grpc.insecure_channel(good.target) as channel:
            stub = pb2_grpc.GenerationStub(channel)
            ids = list(stub.Tokenize(pb2.TokenizeRequest(text=GPL3.read_text())).ids)[:600]
            assert generate(stub, pb2, ids, "tls")["cached"] == 0
        wait_written(good, 2)
        assert client.dbsize() == 2
        # A refused AUTH or an unverifiable certificate costs hits, not requests.
        for server in (wrong, untrusted):
            with grpc.insecure_channel(server.target) as channel:
                stub = pb2_grpc.GenerationStub(channel)
                r = generate(stub, pb2, ids[:300] + ids[400:600], "refused")
            assert r["cached"] == 0 and len(r["tokens"]) == MAX_NEW
            assert counter(server, "snapserve_kv_store_errors_total", {"kind": "connect"}) > 0
            assert counter(server, "snapserve_kv_store_reads_total") == 0
        assert "WRONGPASS" in wrong.logs() or "AUTH" in wrong.logs(), wrong.logs()[-2000:]
        assert "certificate verify failed" in untrusted.logs(), untrusted.logs()[-2000:]
        for server in (good, wrong, untrusted):
            assert password not in server.logs()
        assert "not-the-password" not in wrong.logs()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
