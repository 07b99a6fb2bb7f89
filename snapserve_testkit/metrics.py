"""The /metrics endpoint: scrape() and the one parser of the Prometheus text
format (version 0.0.4) that the tests and the benchmarks use."""
import collections
import re
import urllib.request

Sample = collections.namedtuple("Sample", "name labels value")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_TYPE = re.compile(r"^#\s*TYPE\s+(\S+)\s+(\S+)")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def scrape(port, host="127.0.0.1", timeout=10):
    """The text of http://host:port/metrics (a status other than 200 raises)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
        if r.status != 200:
            raise RuntimeError(f"/metrics answered HTTP {r.status}")
        return r.read().decode()


def parse(text):
    """Every sample line as Sample(name, labels dict, float value), in order;
    comment and blank lines are skipped."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        labels = {k: re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], v)
                  for k, v in _LABEL.findall(m.group(2) or "")}
        out.append(Sample(m.group(1), labels, float(m.group(3))))
    return out


def types(text):
    """{family name: type} from the `# TYPE` lines."""
    return dict(m.groups() for m in map(_TYPE.match, text.splitlines()) if m)


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
