"""The deployment artifacts as the deploy tests read them: the tools that
check them (kustomize, promtool), the kustomize overlays rendered once per
session, and the pieces of those manifests several tests look at.

Shared by test_deploy.py (image and Kubernetes manifests),
test_deploy_monitoring.py (Prometheus rules, Grafana, the autoscaler's
metrics) and test_logs_insights.py (the log shipper's filter). A missing
tool is a failure that says how to install it, never a skip.
"""
import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT

KUSTOMIZE = ROOT / ".deps" / "kustomize" / "usr" / "bin" / "kustomize"
OVERLAYS = ["cpu", "eks-gpu"]


def kustomize_binary():
    if not (KUSTOMIZE.is_file() and os.access(KUSTOMIZE, os.X_OK)):
        pytest.fail(f"kustomize missing at {KUSTOMIZE}: run `bash scripts/setup.sh kustomize`")
    return KUSTOMIZE


def promtool_binary():
    path = shutil.which("promtool") or ("/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)
    if path is None:
        pytest.fail("promtool missing: run `bash scripts/setup.sh system` (Debian package prometheus)")
    return path


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


# --- rendered manifests --------------------------------------------------------

_rendered_cache = {}


def render(overlay):
    if overlay not in _rendered_cache:
        r = run([kustomize_binary(), "build", ROOT / "deploy" / "k8s" / "overlays" / overlay])
        assert r.returncode == 0, f"kustomize build overlays/{overlay} failed:\n{r.stderr}"
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        assert docs, f"overlays/{overlay} rendered nothing"
        _rendered_cache[overlay] = docs
    return _rendered_cache[overlay]


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


# The eks-gpu overlay's log shipper (fluent-bit.yaml) brings its own
# ConfigMap, ServiceAccount and Namespace; `one` means the application's.
LOG_SHIPPER = "fluent-bit"


def is_log_shipper(doc):
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/name") == LOG_SHIPPER


def one(docs, kind):
    found = [d for d in of_kind(docs, kind) if not is_log_shipper(d)]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def fluent_bit_sections(conf):
    """Fluent Bit's classic config as [(section, {key: value})]."""
    sections = []
    for line in conf.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1], {}))
        else:
            key, _, value = line.partition(" ")
            sections[-1][1][key] = value.strip()
    return sections


def fluent_bit_config():
    """The eks-gpu overlay's Fluent Bit sections and its rendered documents."""
    docs = [d for d in render("eks-gpu") if is_log_shipper(d)]
    (cm,) = of_kind(docs, "ConfigMap")
    return fluent_bit_sections(cm["data"]["fluent-bit.conf"]), cm, docs


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def hpa_metric_names(docs):
    names = []
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        for m in hpa["spec"]["metrics"]:
            kind = {"Pods": "pods", "External": "external", "Object": "object"}.get(m["type"])
            if kind:
                names.append(m[kind]["metric"]["name"])
    return names


def fluent_bit_keeps(line):
    """Whether the overlay's grep filter passes a log line to CloudWatch."""
    sections, _, _ = fluent_bit_config()
    (grep,) = [kv for name, kv in sections if name == "FILTER" and kv["Name"] == "grep"]
    key, _, pattern = grep["Regex"].partition(" ")
    assert key == "log"
    return re.search(pattern, line) is not None
