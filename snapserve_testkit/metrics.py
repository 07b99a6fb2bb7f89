"""The /metrics endpoint: scrape() and the reading of its Prometheus text
format (version 0.0.4) that the tests and the benchmarks use. The text is
parsed by prometheus_client, the Prometheus project's own Python parser, so
every reading also checks the format: a malformed line raises ValueError."""
import collections
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Sample = collections.namedtuple("Sample", "name labels value")


def scrape(port, host="127.0.0.1", timeout=10):
    """The text of http://host:port/metrics (a status other than 200 raises)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
        if r.status != 200:
            raise RuntimeError(f"/metrics answered HTTP {r.status}")
        return r.read().decode()


def families(text):
    """The metric families of `text`, as prometheus_client parses them."""
    return list(text_string_to_metric_families(text))


def parse(text):
    """Every sample as Sample(name, labels dict, float value), in order."""
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in families(text) for s in family.samples]


def types(text):
    """{family name: type}, the family named as in its `# TYPE` line (a
    counter with its `_total`; prometheus_client names the family without)."""
    return {f.name + "_total" if f.type == "counter" else f.name: f.type
            for f in families(text)}


def value(text, name, labels=None):
    """The value of the sample `name` whose label set is exactly `labels`
    (None: no labels); LookupError when there is none."""
    want = {k: str(v) for k, v in (labels or {}).items()}
    for s in parse(text):
        if s.name == name and s.labels == want:
            return s.value
    raise LookupError(f"{name}{labels or ''} not in /metrics")


def total(text, name, labels=None):
    """The sum of the samples `name` whose labels include `labels`; None when
    there is none."""
    want = {k: str(v) for k, v in (labels or {}).items()}
    found = [s.value for s in parse(text)
             if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]
    return sum(found) if found else None


def idle(text):
    """Whether /metrics says no request runs and no KV block is held: what a
    server shows once its traffic has ended, if nothing leaked."""
    return (value(text, "snapserve_kv_cache_usage_ratio") == 0
            and value(text, "snapserve_requests_running") == 0)
