"""The monitoring artifacts: Prometheus's alerting rules (promtool's check and
rule unit tests), the Grafana dashboard, and the metrics the autoscaler
reads through prometheus-adapter; every metric name they use must exist in
the /metrics text of a real running snapserve. Oracles: promtool (Debian
`prometheus`: `check rules` and rule unit tests) and that scrape.
"""
import json
import re

import yaml

from conftest import ROOT
from deploy_manifests import OVERLAYS, hpa_metric_names, promtool_binary, render, run
from snapserve_testkit import metrics

RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
ADAPTER_VALUES = ROOT / "deploy" / "prometheus" / "prometheus-adapter-values.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "snapserve.json"
METRIC_RE = re.compile(r"snapserve_[a-z_]+")


# --- Prometheus rules ----------------------------------------------------------

def load_rules():
    return yaml.safe_load(RULES.read_text())


def test_promtool_check_rules():
    r = run([promtool_binary(), "check", "rules", RULES])
    assert r.returncode == 0, r.stdout + r.stderr
    alerts = {rule["alert"]: rule for g in load_rules()["groups"] for rule in g["rules"] if "alert" in rule}
    for name in ("SnapserveHighErrorRate", "SnapserveTTFTHighP99", "SnapserveKVCacheNearlyFull",
                 "SnapserveQueueGrowing", "SnapserveCompressionRatioDrop",
                 "SnapserveRetainedAttentionLow"):
        assert name in alerts, f"missing alert {name}"
    for name, rule in alerts.items():
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            assert ann.get(key), f"{name} lacks annotation {key}"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert name in alerts_doc(), f"docs/metrics.md 'Alerts' does not explain {name}"


def alerts_doc():
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert "\n## Alerts" in text, "docs/metrics.md has no '## Alerts' section"
    return text.split("\n## Alerts", 1)[1].split("\n## ", 1)[0]


# promtool rule unit tests: synthetic series that must (and must not) fire each
# alert. Annotations are stripped from a copy of the rules (promtool compares them
# verbatim); `promtool check rules` above already parsed their templates.
PROMTOOL_TESTS = """
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="snapserve", namespace="ns", pod="p", instance="10.0.0.1:9464"}'
        values: '0x10'
    alert_rule_test:
      - {eval_time: 4m, alertname: SnapserveTargetDown, exp_alerts: []}
      - eval_time: 6m
        alertname: SnapserveTargetDown
        exp_alerts:
          - exp_labels: {severity: critical, job: snapserve, namespace: ns, pod: p, instance: "10.0.0.1:9464"}

  - interval: 1m
    input_series:
      - {series: 'snapserve_requests_total{namespace="ns", pod="p", status="OK"}', values: '0+60x30'}
      - {series: 'snapserve_requests_total{namespace="ns", pod="p", status="INTERNAL"}', values: '0+10x30'}
      # Client errors do not count.
      - {series: 'snapserve_requests_total{namespace="ok", pod="q", status="OK"}', values: '0+60x30'}
      - {series: 'snapserve_requests_total{namespace="ok", pod="q", status="INVALID_ARGUMENT"}', values: '0+30x30'}
      - {series: 'snapserve_requests_total{namespace="ok", pod="q", status="CANCELLED"}', values: '0+30x30'}
      # A flood of calls without the token does not dilute the server's failures.
      - {series: 'snapserve_requests_total{namespace="flood", pod="r", status="OK"}', values: '0+60x30'}
      - {series: 'snapserve_requests_total{namespace="flood", pod="r", status="INTERNAL"}', values: '0+10x30'}
      - {series: 'snapserve_requests_total{namespace="flood", pod="r", status="UNAUTHENTICATED"}', values: '0+10000x30'}
    alert_rule_test:
      - {eval_time: 10m, alertname: SnapserveHighErrorRate, exp_alerts: []}
      - eval_time: 20m
        alertname: SnapserveHighErrorRate
        exp_alerts:
          - exp_labels: {severity: critical, namespace: ns}
          - exp_labels: {severity: critical, namespace: flood}

  - interval: 1m
    input_series:
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="ns", pod="p", le="1"}', values: '0+0x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="ns", pod="p", le="2.5"}', values: '0+0x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="ns", pod="p", le="5"}', values: '0+10x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="ns", pod="p", le="+Inf"}', values: '0+10x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="fast", pod="q", le="1"}', values: '0+10x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="fast", pod="q", le="2.5"}', values: '0+10x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="fast", pod="q", le="5"}', values: '0+10x30'}
      - {series: 'snapserve_time_to_first_token_seconds_bucket{namespace="fast", pod="q", le="+Inf"}', values: '0+10x30'}
    alert_rule_test:
      - eval_time: 20m
        alertname: SnapserveTTFTHighP99
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns}

  - interval: 1m
    input_series:
      - {series: 'snapserve_kv_cache_usage_ratio{namespace="ns", pod="full"}', values: '0.95x30'}
      - {series: 'snapserve_kv_cache_usage_ratio{namespace="ns", pod="half"}', values: '0.5x30'}
    alert_rule_test:
      - {eval_time: 5m, alertname: SnapserveKVCacheNearlyFull, exp_alerts: []}
      - eval_time: 15m
        alertname: SnapserveKVCacheNearlyFull
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns, pod: full}

  - interval: 1m
    input_series:
      - {series: 'snapserve_requests_waiting{namespace="ns", pod="growing"}', values: '0+5x40'}
      - {series: 'snapserve_requests_waiting{namespace="ns", pod="steady"}', values: '20x40'}
    alert_rule_test:
      - eval_time: 30m
        alertname: SnapserveQueueGrowing
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns, pod: growing}

  # Mean ratio 8x for a day, then 2x: below 70% of yesterday's.
  - interval: 1m
    input_series:
      - {series: 'snapserve_kv_compression_ratio_sum{namespace="ns", pod="p"}', values: '0+8x1440 11522+2x119'}
      - {series: 'snapserve_kv_compression_ratio_count{namespace="ns", pod="p"}', values: '0+1x1560'}
      - {series: 'snapserve_kv_compression_ratio_sum{namespace="same", pod="q"}', values: '0+8x1560'}
      - {series: 'snapserve_kv_compression_ratio_count{namespace="same", pod="q"}', values: '0+1x1560'}
    alert_rule_test:
      - {eval_time: 1430m, alertname: SnapserveCompressionRatioDrop, exp_alerts: []}
      - eval_time: 1530m
        alertname: SnapserveCompressionRatioDrop
        exp_alerts:
          - exp_labels: {severity: info, namespace: ns}

  # p10 of retained attention: namespace ns has 20% of requests at <= 0.5 (p10
  # falls in the lowest bucket), namespace good has all at >= 0.95.
  - interval: 1m
    input_series:
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="ns", pod="p", le="0.5"}', values: '0+2x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="ns", pod="p", le="0.9"}', values: '0+4x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="ns", pod="p", le="1"}', values: '0+10x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="ns", pod="p", le="+Inf"}', values: '0+10x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="good", pod="q", le="0.5"}', values: '0+0x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="good", pod="q", le="0.9"}', values: '0+0x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="good", pod="q", le="0.95"}', values: '0+0x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="good", pod="q", le="1"}', values: '0+10x60'}
      - {series: 'snapserve_kv_retained_attention_ratio_bucket{namespace="good", pod="q", le="+Inf"}', values: '0+10x60'}
    alert_rule_test:
      - {eval_time: 10m, alertname: SnapserveRetainedAttentionLow, exp_alerts: []}
      - eval_time: 40m
        alertname: SnapserveRetainedAttentionLow
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns}
"""


def test_promtool_rule_unit_tests(tmp_path):
    rules = load_rules()
    for g in rules["groups"]:
        for rule in g["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    t = yaml.safe_load(PROMTOOL_TESTS)
    t["rule_files"] = ["rules.yaml"]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(t))
    r = run([promtool_binary(), "test", "rules", "tests.yaml"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


# --- every metric name used exists in a real scrape ------------------------------

def promql_sources():
    """(where, PromQL text) for the dashboard, the rules and the autoscaler."""
    out = []
    dash = json.loads(DASHBOARD.read_text())
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f"dashboard panel '{p['title']}'", t["expr"]))
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"dashboard variable {v['name']}", q))
    for g in load_rules()["groups"]:
        for rule in g["rules"]:
            out.append((f"rule {rule.get('alert') or rule.get('record')}", rule["expr"]))
    adapter = yaml.safe_load(ADAPTER_VALUES.read_text())
    for rule in adapter["rules"]["custom"]:
        out.append(("prometheus-adapter seriesQuery", rule["seriesQuery"]))
        out.append(("prometheus-adapter metricsQuery", rule["metricsQuery"]))
    for overlay in OVERLAYS:
        for name in hpa_metric_names(render(overlay)):
            out.append((f"HPA in overlays/{overlay}", name))
    return out


def test_dashboard_panels():
    dash = json.loads(DASHBOARD.read_text())
    text = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for name in ("snapserve_time_to_first_token_seconds", "snapserve_inter_token_latency_seconds",
                 "snapserve_generated_tokens_total", "snapserve_kv_compression_ratio",
                 "snapserve_kv_cache_usage_ratio", "snapserve_requests_running",
                 "snapserve_requests_waiting", "snapserve_batch_size", "snapserve_requests_total",
                 "snapserve_kv_retained_attention_ratio"):
        assert name in text, f"dashboard has no panel on {name}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"


def test_hpa_metric_is_served_by_adapter():
    adapter = yaml.safe_load(ADAPTER_VALUES.read_text())
    served = {r["name"]["as"] for r in adapter["rules"]["custom"]}
    for overlay in OVERLAYS:
        for name in hpa_metric_names(render(overlay)):
            assert name in served, f"HPA metric {name} is not exposed by prometheus-adapter"


def test_metric_names_exist_in_real_scrape(start_server, model_path):
    server = start_server([f"--model={model_path}"])
    body = server.metrics_text()
    samples = {s.name for s in metrics.parse(body) if s.name.startswith("snapserve_")}
    families = {k: v for k, v in metrics.types(body).items() if k.startswith("snapserve_")}
    assert "snapserve_requests_waiting" in samples, body[:2000]
    missing = []
    used = set()
    for where, expr in promql_sources():
        for name in METRIC_RE.findall(expr):
            used.add(name)
            if name not in samples:
                kind = families.get(name)
                hint = f" (a {kind}: use {name}_bucket/_sum/_count)" if kind == "histogram" else ""
                missing.append(f"{where}: {name}{hint}")
        if "histogram_quantile" in expr:
            assert "_bucket" in expr, f"{where}: histogram_quantile without a _bucket series"
    assert not missing, "metric names not exported by snapserve:\n" + "\n".join(missing)
    # Every metric family of docs/metrics.md shows up somewhere in the dashboard or rules.
    unused = sorted(f for f in families if not any(u == f or u.startswith(f + "_") for u in used))
    assert not unused, f"exported metrics that no dashboard/rule/autoscaler uses: {unused}"
