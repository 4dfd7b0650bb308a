"""The manifests: schema-valid, buildable, and configured as the deployment needs."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from typing import Any

import celpy
import jsonpatch
import kubernetes_validate
import pytest
import yaml

from runtime_hook.contract import (
    ASSIGNMENT_ANNOTATION,
    LEDGER_ANNOTATION,
    LIMITS_ANNOTATION,
    SHARED_RESOURCE,
    WHOLE_RESOURCE,
)
from runtime_hook.event_series import NODE_EVENTS_NAMESPACE
from runtime_hook.hook_cli import DEFAULT_STATE_DIR
from runtime_hook.node.agent import PLUGIN_DIR, POD_RESOURCES
from runtime_hook.node.cdi_files import DEFAULT_DIR as CDI_DIR
from runtime_hook.node.host_root import host_path
from runtime_hook.node.runtime_config import (
    BASE_SPEC,
    CONTAINERD_CONFIG,
    CONTAINERD_DROP_IN,
    CRIO_CONF,
    CRIO_HOOKS_DIR,
    DEFAULT_PREFIX,
)
from tests.deploy.manifests import (
    BASE,
    KUBECTL,
    KUBERNETES_VERSION,
    PATHS,
    ROOT,
    all_objects,
    build,
    documents,
    find,
    kustomize,
    manifest_files,
    needs_kubectl,
)
from webhook.config import Config, load_config
from webhook.vocabulary import HAMI_MARKERS, VOLCANO_NAMES

NAMESPACE = "vcuda-system"
# NVIDIA's runtime gives a container the GPUs named by mounts of /dev/null under this
# directory (accept-nvidia-visible-devices-as-volume-mounts).
NVIDIA_ALL_GPUS = "/var/run/nvidia-container-devices/all"


def _ids(path: Any) -> str:
    return path.name


DEVICE_PLUGIN_CONFIG = ROOT / "device-plugin" / "config.yaml"  # applied apart, not by -k
UNINSTALL = ROOT / "uninstall"  # applied apart, to remove vcuda from nodes


# DRA's are checked in tests/dra; monitoring's are prometheus-operator's kinds, whose schemas
# are not Kubernetes' (tests/monitoring checks them with Prometheus' own tools).
@pytest.mark.parametrize("path", [*(p for p in manifest_files()
                                    if p.parent not in (ROOT / "dra", ROOT / "monitoring")),
                                  DEVICE_PLUGIN_CONFIG], ids=_ids)
def test_every_manifest_validates_strictly_against_the_kubernetes_schemas(path: Any) -> None:
    for obj in documents(path):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_field_the_schema_does_not_know() -> None:
    deployment = copy.deepcopy(find("Deployment", "vcuda-webhook"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpsGet"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


_NOT_LISTED = {"kustomization.yaml", "kube-scheduler-config.yaml"}  # a node's file, not an object


def test_a_kustomization_lists_every_manifest_file() -> None:
    files = {p.resolve() for p in ROOT.rglob("*.yaml")
             if p.name not in _NOT_LISTED and not p.name.endswith("-patch.yaml")
             and not {"node", "device-plugin", "examples"} & set(p.relative_to(ROOT).parts)}
    assert files == set(manifest_files())


@needs_kubectl
@pytest.mark.parametrize("path", PATHS)
def test_each_path_builds_a_whole_install_labelled_as_vcudas(path: str) -> None:
    objects = kustomize(PATHS[path])
    base = {_key(o) for o in all_objects() if o in _base_objects()}
    assert base <= {_key(o) for o in objects}
    # The webhook's policy is off by default: its peers depend on the network.
    assert ("NetworkPolicy", "vcuda-webhook") not in {
        (o["kind"], o["metadata"]["name"]) for o in objects}
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vcuda"
        kubernetes_validate.validate(obj, "1.34" if path == "dra" else KUBERNETES_VERSION,
                                     strict=True)


def _base_objects() -> list[dict[str, Any]]:
    return [d for p in manifest_files() if p.parent == BASE for d in documents(p)]


@needs_kubectl
@pytest.mark.parametrize("resources,components", [
    (["placement", "dra"], []),                # two whole installs: the same objects twice
    (["dra"], ["placement/component"]),        # DRA's agent, then placement's patch of it
], ids=["two-overlays", "dra-then-placement"])
def test_placement_and_dra_together_do_not_build(resources: list[str], components: list[str],
                                                 tmp_path: Any) -> None:
    """A node takes one path; combined, the build fails instead of dropping --placement."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(ROOT / r, tmp_path) for r in resources],
        "components": [os.path.relpath(ROOT / c, tmp_path) for c in components]}))
    built = build(tmp_path)
    assert built.returncode != 0 and built.stdout == ""


def test_vcuda_owns_no_namespace_but_its_own() -> None:
    """`kubectl delete -k manifests/` must not delete software vcuda did not install; its
    objects elsewhere are kube-scheduler's binding to the API server's authentication reader
    and the node agent's and the extender's grants of Events about Nodes (which the API takes
    in default)."""
    assert [o["metadata"]["name"] for o in all_objects() if o["kind"] == "Namespace"] == [NAMESPACE]
    elsewhere = [_key(o) for o in all_objects()
                 if o["metadata"].get("namespace", NAMESPACE) != NAMESPACE]
    assert sorted(elsewhere) == [
        ("Role", "default", "vcuda-node-events"),
        ("Role", "default", "vcuda-scheduler-extender-events"),
        ("RoleBinding", "default", "vcuda-node-events"),
        ("RoleBinding", "default", "vcuda-scheduler-extender-events"),
        ("RoleBinding", "kube-system", "vcuda-scheduler-authentication-reader")]
    assert all(o["kind"] != "Namespace" and "namespace" not in o["metadata"]
               for o in documents(DEVICE_PLUGIN_CONFIG))


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


# --- the MutatingWebhookConfiguration ---------------------------------------------------------

def _webhook() -> dict[str, Any]:
    [webhook] = find("MutatingWebhookConfiguration", "vcuda-webhook")["webhooks"]
    return webhook


def test_webhook_sees_pod_creates_and_updates_and_fails_closed() -> None:
    webhook = _webhook()
    [rule] = webhook["rules"]
    assert rule["resources"] == ["pods"] and rule["apiGroups"] == [""]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["timeoutSeconds"] <= 5


def test_webhook_skips_kube_system_and_its_own_namespace() -> None:
    [expression] = _webhook()["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    assert sorted(expression["values"]) == ["kube-system", NAMESPACE]


def test_webhook_calls_the_service_on_mutate_and_leaves_ca_bundle_to_the_tool() -> None:
    client_config = _webhook()["clientConfig"]
    service = find("Service", "vcuda-webhook")
    assert client_config["service"]["name"] == service["metadata"]["name"]
    assert client_config["service"]["namespace"] == service["metadata"]["namespace"]
    assert client_config["service"]["port"] == service["spec"]["ports"][0]["port"]
    assert client_config["service"]["path"] == "/mutate"
    assert "caBundle" not in client_config  # kubectl apply must not clear what vcuda-certs wrote


# --- matchConditions: evaluated with a CEL interpreter on pods --------------------------------

def _matches(pod: dict[str, Any], old: dict[str, Any] | None = None) -> bool:
    env = celpy.Environment()
    results = []
    for condition in _webhook()["matchConditions"]:
        program = env.program(env.compile(condition["expression"]))
        activation = {
            "object": celpy.json_to_cel(pod),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel({"operation": "UPDATE" if old else "CREATE"}),
        }
        results.append(bool(program.evaluate(activation)))
    return all(results)


def _pod(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, init: bool = False) -> dict[str, Any]:
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    container = {"name": "main", "image": "app", "resources": resources}
    spec: dict[str, Any] = {"containers": [{"name": "side", "image": "side"}]}
    spec.setdefault("initContainers" if init else "containers", []).append(container)
    metadata: dict[str, Any] = {"name": "p"}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def test_match_conditions_are_well_formed_cel() -> None:
    for condition in _webhook()["matchConditions"]:
        assert condition["name"] and condition["expression"].strip()
        celpy.Environment().compile(condition["expression"])  # raises on a syntax error


@pytest.mark.parametrize("resource", [
    "docker.com/vcuda-core", "docker.com/vcuda-memory",
    "tencent.com/vcuda-core", "tencent.com/vcuda-memory", "nvidia.com/gpu.shared",
    "vcuda.io/shared-gpu", "docker.com/vcuda-gpus", "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores", "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
])
def test_pods_naming_a_vcuda_or_shared_resource_are_sent(resource: str) -> None:
    assert _matches(_pod(limits={resource: "1"}))
    assert _matches(_pod(requests={resource: "1"}))
    assert _matches(_pod(limits={resource: "1"}, init=True))


@pytest.mark.parametrize("annotation", [LIMITS_ANNOTATION, ASSIGNMENT_ANNOTATION])
def test_pods_with_the_limits_or_assignment_annotation_are_sent(annotation: str) -> None:
    assert _matches(_pod(annotations={annotation: "{}"}))


@pytest.mark.parametrize("annotation", [LIMITS_ANNOTATION, ASSIGNMENT_ANNOTATION])
def test_an_update_that_removes_or_adds_the_annotation_is_sent(annotation: str) -> None:
    stored = _pod(annotations={annotation: '{"main": {"cores": 30}}'})
    assert _matches(_pod(), stored)
    assert _matches(stored, _pod())


@pytest.mark.parametrize("pod", [
    _pod(),
    _pod(limits={"cpu": "1", "memory": "1Gi"}),
    _pod(limits={"nvidia.com/gpu": "1"}),          # whole GPUs without vcuda: not ours
    _pod(limits={"example.com/vcuda-core": "30"}),  # a domain not configured
    _pod(annotations={"other.io/limits": "x"}),
], ids=["plain", "cpu-memory", "whole-gpu", "other-domain", "other-annotation"])
def test_pods_that_do_not_concern_vcuda_are_not_sent(pod: dict[str, Any]) -> None:
    assert not _matches(pod)
    assert not _matches(pod, _pod())


# --- the webhook Deployment --------------------------------------------------------------------

def _webhook_pod() -> dict[str, Any]:
    return find("Deployment", "vcuda-webhook")["spec"]["template"]


def test_webhook_runs_two_spread_replicas_protected_by_a_disruption_budget() -> None:
    deployment = find("Deployment", "vcuda-webhook")
    assert deployment["spec"]["replicas"] == 2
    labels = _webhook_pod()["metadata"]["labels"]
    pdb = find("PodDisruptionBudget", "vcuda-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [term] = _webhook_pod()["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    assert find("Service", "vcuda-webhook")["spec"]["selector"].items() <= labels.items()


def test_the_webhooks_network_policy_is_a_component_an_overlay_takes() -> None:
    component = yaml.safe_load((ROOT / "webhook-networkpolicy" / "kustomization.yaml")
                               .read_text())
    assert component["kind"] == "Component" and component["resources"] == ["networkpolicy.yaml"]


def test_only_addresses_outside_the_pod_network_and_prometheus_reach_the_webhook() -> None:
    policy = find("NetworkPolicy", "vcuda-webhook")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= _webhook_pod()["metadata"][
        "labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    api_server, prometheus = policy["ingress"]
    for rule in (api_server, prometheus):
        assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    assert api_server["from"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16", "10.42.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0"}}]
    # One peer with both selectors: Prometheus' pods of that namespace, not all of either.
    assert prometheus["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    monitor = yaml.safe_load((ROOT / "monitoring" / "webhook-servicemonitor.yaml").read_text())
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["https"]


@pytest.mark.parametrize("kind,name", [("Deployment", "vcuda-scheduler"),
                                       ("DaemonSet", "vcuda-scheduler-extender")])
def test_the_extenders_metrics_port_is_the_one_its_pod_monitor_scrapes(kind: str,
                                                                      name: str) -> None:
    [extender] = [c for c in find(kind, name)["spec"]["template"]["spec"]["containers"]
                  if c["command"][0] == "vcuda-scheduler-extender"]
    command = extender["command"]
    assert command[command.index("--host") + 1] == "127.0.0.1"  # its verbs stay local
    port = int(command[command.index("--metrics-port") + 1])
    assert extender["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    monitor = yaml.safe_load((ROOT / "monitoring" / "extender-podmonitor.yaml").read_text())
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    labels = find(kind, name)["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] in monitor["spec"]["selector"][
        "matchExpressions"][0]["values"]


def test_webhook_probes_health_and_readiness_over_https() -> None:
    [container] = _webhook_pod()["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_webhook_reads_its_settings_from_the_config_map_it_mounts(tmp_path: Any) -> None:
    [container] = find("Deployment", "vcuda-webhook")["spec"]["template"]["spec"]["containers"]
    [path] = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--config=")]
    [mount] = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    volumes = find("Deployment", "vcuda-webhook")["spec"]["template"]["spec"]["volumes"]
    [volume] = [v for v in volumes if v["name"] == mount["name"]]
    data = find("ConfigMap", volume["configMap"]["name"])["data"]
    (tmp_path / "config.json").write_text(data[path.rsplit("/", 1)[1]])
    config = load_config(tmp_path / "config.json")  # the webhook's own check of the file
    assert config.domains == Config().domains  # the matchConditions name these domains
    assert config.max_gpu_memory_from_nodes is True  # the Nodes' largest GPU bounds memory


def test_webhook_runs_unprivileged_with_a_read_only_root() -> None:
    spec = _webhook_pod()["spec"]
    [container] = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]


def test_webhook_mounts_the_serving_pair_as_a_directory_without_the_ca_key() -> None:
    spec = _webhook_pod()["spec"]
    [container] = spec["containers"]
    [volume] = [v for v in spec["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == _certs_flag("ensure", "--secret")
    assert sorted(i["key"] for i in volume["secret"]["items"]) == ["tls.crt", "tls.key"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert "subPath" not in mount  # a subPath mount never sees the kubelet's updates
    assert f"--cert-file={mount['mountPath']}/tls.crt" in container["args"]
    assert f"--key-file={mount['mountPath']}/tls.key" in container["args"]


# --- the certificate Job and CronJob, and their RBAC -------------------------------------------

def _certs_container(command: str) -> dict[str, Any]:
    if command == "ensure":
        pod = find("Job", "vcuda-certs-ensure")["spec"]["template"]
    else:
        pod = find("CronJob", "vcuda-certs-rotate")["spec"]["jobTemplate"]["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "vcuda-certs"
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["vcuda-certs", command]
    return container


def _certs_flag(command: str, flag: str) -> str:
    [value] = [a.split("=", 1)[1] for a in _certs_container(command)["args"]
               if a.startswith(flag + "=")]
    return value


@pytest.mark.parametrize("command", ["ensure", "rotate"])
def test_certs_jobs_name_the_objects_of_the_manifests_in_their_own_namespace(command: str) -> None:
    # No --namespace: vcuda-certs takes its pod's, wherever the install put it.
    assert not [a for a in _certs_container(command)["args"] if a.startswith("--namespace")]
    assert _certs_flag(command, "--service") == find("Service", "vcuda-webhook")["metadata"]["name"]
    assert _certs_flag(command, "--webhook-config") == "vcuda-webhook"
    find("MutatingWebhookConfiguration", _certs_flag(command, "--webhook-config"))


def test_the_ensure_job_stays_long_enough_to_read_why_it_failed() -> None:
    # A Job's pod template is immutable: an upgrade deletes it first (README, "Upgrade").
    assert find("Job", "vcuda-certs-ensure")["spec"]["ttlSecondsAfterFinished"] >= 3600


def test_rotation_runs_hourly_one_at_a_time() -> None:
    cron = find("CronJob", "vcuda-certs-rotate")["spec"]
    minute, hour, *_ = cron["schedule"].split()
    assert minute.isdigit() and hour == "*"
    assert cron["concurrencyPolicy"] == "Forbid"


def test_certs_rbac_grants_only_the_one_secret_and_the_one_webhook_configuration() -> None:
    role = find("Role", "vcuda-certs")
    secret = _certs_flag("ensure", "--secret")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    unnamed = [r for r in role["rules"] if not r.get("resourceNames")]
    assert named == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret],
                      "verbs": ["get", "update"]}]
    # create cannot be limited by name in RBAC: it is the only unnamed grant.
    assert unnamed == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    [rule] = find("ClusterRole", "vcuda-certs")["rules"]
    assert rule == {"apiGroups": ["admissionregistration.k8s.io"],
                    "resources": ["mutatingwebhookconfigurations"],
                    "resourceNames": ["vcuda-webhook"], "verbs": ["get", "patch"]}


def test_no_role_grants_wildcards() -> None:
    for obj in all_objects():
        for rule in obj.get("rules") or []:
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(field, []), f"{obj['metadata']['name']}: {rule}"


def test_the_webhook_may_list_nodes_and_nothing_else() -> None:
    objects = documents(BASE / "webhook-rbac.yaml")
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    [binding] = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    account = find("ServiceAccount", "vcuda-webhook")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vcuda-webhook",
                                    "namespace": account["metadata"]["namespace"]}]
    assert _webhook_pod()["spec"]["serviceAccountName"] == "vcuda-webhook"
    assert _webhook_pod()["spec"]["automountServiceAccountToken"] is True


def test_node_agent_may_only_read_and_annotate_nodes_and_patch_their_status() -> None:
    rules = find("ClusterRole", "vcuda-node")["rules"]
    assert sorted((r["resources"][0], tuple(r["verbs"])) for r in rules) == [
        ("nodes", ("get", "patch")), ("nodes/status", ("patch",))]


def test_node_agent_may_write_events_in_the_namespace_default_alone() -> None:
    """runtime_hook/node/kube_events.py creates its Node's Events and patches their counts in
    default, where the API takes Events about cluster-scoped objects (or kube-system)."""
    role = find("Role", "vcuda-node-events")
    assert role["metadata"]["namespace"] == NODE_EVENTS_NAMESPACE == "default"
    assert role["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                              "verbs": ["create", "patch"]}]
    binding = find("RoleBinding", "vcuda-node-events")
    assert binding["metadata"]["namespace"] == "default"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vcuda-node",
                                    "namespace": NAMESPACE}]
    for kind, name in (("DaemonSet", "vcuda-node"), ("DaemonSet", "vcuda-node-uninstall")):
        spec = find(kind, name)["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["command"][0] == "vcuda-node":  # install, uninstall: their Node's
                env = {e["name"]: e.get("valueFrom") for e in container.get("env", [])}
                assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_only_with_placement_does_the_node_agent_read_pods() -> None:
    """runtime_hook/node/placement_agent.py is the one caller of the pod reads."""
    component = yaml.safe_load((ROOT / "placement" / "component" / "kustomization.yaml")
                               .read_text())
    assert "node-rbac.yaml" in component["resources"]
    [rule] = find("ClusterRole", "vcuda-node-placement")["rules"]
    assert (rule["resources"], rule["verbs"]) == (["pods"], ["get", "list", "watch"])
    binding = find("ClusterRoleBinding", "vcuda-node-placement")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vcuda-node",
                                    "namespace": NAMESPACE}]


# --- priority: GKE admits system-* priority classes outside kube-system only under a quota -----

def _pod_templates() -> list[tuple[dict[str, Any], int]]:
    """Each pod template of the manifests, with how many pods it makes (a DaemonSet: one a node,
    counted for 5,000 nodes, the most a Kubernetes cluster is tested with)."""
    found = []
    for obj in all_objects():
        spec = obj.get("spec") or {}
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get(
            "template")
        if template:
            found.append((template, 5000 if obj["kind"] == "DaemonSet" else
                          spec.get("replicas", 1)))
    return found


def _quota_covers(quota: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    """The API server's scope match of a quota's PriorityClass expressions against a pod."""
    priority = pod_spec.get("priorityClassName")
    for expression in quota["spec"]["scopeSelector"]["matchExpressions"]:
        assert expression["scopeName"] == "PriorityClass"
        operator, values = expression["operator"], expression.get("values", [])
        if not {"In": priority in values, "NotIn": priority not in values,
                "Exists": priority is not None,
                "DoesNotExist": priority is None}[operator]:
            return False
    return True


def test_every_pod_of_a_system_priority_class_is_covered_by_a_quota_with_room_for_it() -> None:
    quotas = [o for o in all_objects() if o["kind"] == "ResourceQuota"]
    critical = [(t, n) for t, n in _pod_templates()
                if t["spec"].get("priorityClassName", "").startswith("system-")]
    assert {t["spec"]["priorityClassName"] for t, _ in critical} == {
        "system-node-critical", "system-cluster-critical"}
    for template, _ in critical:
        assert any(_quota_covers(q, template["spec"]) for q in quotas), template["metadata"]
    [quota] = quotas
    assert quota["metadata"]["namespace"] == NAMESPACE
    assert int(quota["spec"]["hard"]["pods"]) >= sum(n for _, n in critical)
    assert set(quota["spec"]["hard"]) == {"pods"}  # a cap on nothing else


def test_the_quota_leaves_pods_of_other_priorities_alone() -> None:
    [quota] = [o for o in all_objects() if o["kind"] == "ResourceQuota"]
    certs = find("Job", "vcuda-certs-ensure")["spec"]["template"]["spec"]
    assert "priorityClassName" not in certs and not _quota_covers(quota, certs)
    assert not _quota_covers(quota, {"priorityClassName": "high-priority"})


# --- node side: RuntimeClass, DaemonSet, device plugin -----------------------------------------

def test_runtime_class_vcuda_schedules_on_the_nodes_the_daemonset_covers() -> None:
    runtime_class = find("RuntimeClass", "vcuda")
    assert runtime_class["handler"] == "vcuda"
    daemonset = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]
    assert runtime_class["scheduling"]["nodeSelector"] == daemonset["nodeSelector"]


def test_node_daemonset_installs_then_runs_the_agent_on_the_host_root() -> None:
    spec = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]
    [install] = spec["initContainers"]
    [agent] = spec["containers"]
    assert install["command"] == ["vcuda-node", "install", "--host-root", "/host"]
    assert agent["command"] == ["vcuda-node", "run", "--host-root", "/host"]
    assert install["securityContext"]["privileged"] is True
    assert spec["serviceAccountName"] == "vcuda-node"


def test_only_namespaces_labelled_to_scrape_reach_the_node_agents_metrics() -> None:
    template = find("DaemonSet", "vcuda-node")["spec"]["template"]
    policy = find("NetworkPolicy", "vcuda-node")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"vcuda.io/scrape-node": "true"}}}]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    agent = next(c for c in template["spec"]["containers"] if c["name"] == "agent")
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in agent["ports"]
    assert "hostNetwork" not in template["spec"]  # on the pod network, where policy applies


def _documented_patch(path: Any) -> str:
    """The kustomize patch shown in the comment that opens ``path``."""
    lines = [line[4:] for line in path.read_text().splitlines() if line.startswith("#   ")]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(KUBECTL is None,
                    reason="kubectl is not installed; the overlay is built where it is present")
def test_the_node_policys_documented_patch_names_other_scrapers(tmp_path: Any) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(ROOT, overlay)}]\n"  # kustomize wants it relative
        + _documented_patch(ROOT / "base" / "node-networkpolicy.yaml"))
    built = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True,
                           text=True, check=True, timeout=120).stdout
    [policy] = [o for o in yaml.safe_load_all(built)
                if o and o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "vcuda-node"]
    assert policy["spec"]["ingress"][0]["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)


def _host_mounts(container: dict[str, Any],
                 daemonset: dict[str, Any] | None = None) -> dict[str, tuple[str, bool]]:
    """Each mount of a host path: where, from which node path, and whether it is writable."""
    spec = (daemonset or find("DaemonSet", "vcuda-node"))["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    return {m["mountPath"]: (volumes[m["name"]], not m.get("readOnly", False))
            for m in container["volumeMounts"]}


def _uninstall() -> dict[str, Any]:
    [daemonset] = documents(UNINSTALL / "node-uninstall.yaml")
    return daemonset


def test_the_node_uninstall_runs_with_the_installs_privileges_and_mounts() -> None:
    install_pod = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]
    [install] = install_pod["initContainers"]
    spec = _uninstall()["spec"]["template"]["spec"]
    assert spec["hostPID"] is install_pod["hostPID"] is True  # restarts the runtime as install
    [uninstall] = spec["initContainers"]
    assert uninstall["command"] == ["vcuda-node", "uninstall", "--host-root", "/host"]
    assert _host_mounts(uninstall, _uninstall()) == _host_mounts(install)
    assert uninstall["securityContext"] == install["securityContext"]
    assert uninstall["image"] == install["image"]
    [done] = spec["containers"]  # then waits, so that the rollout ends when every node is clean
    assert "volumeMounts" not in done and done["securityContext"]["capabilities"] == {
        "drop": ["ALL"]}
    assert done["securityContext"]["runAsNonRoot"] is True


def test_the_node_uninstall_cleans_its_own_node_as_the_node_agent() -> None:
    """The agent's account may change its own Node (node-policy.yaml); uninstall names it."""
    spec = _uninstall()["spec"]["template"]["spec"]
    [uninstall] = spec["initContainers"]
    assert spec["serviceAccountName"] == "vcuda-node"
    assert spec.get("automountServiceAccountToken", True) is True
    [node_name] = [e for e in uninstall["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_node_uninstall_runs_only_where_asked_and_never_beside_the_install() -> None:
    uninstall = _uninstall()["spec"]["template"]["spec"]["nodeSelector"]
    install = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]["nodeSelector"]
    assert uninstall == {"vcuda.io/uninstall": "true"}
    assert install == {"vcuda.io/enabled": "true"}
    assert _uninstall()["metadata"]["namespace"] == NAMESPACE


def test_the_uninstall_kustomization_sets_the_image_as_the_main_one_does() -> None:
    main = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    uninstall = yaml.safe_load((UNINSTALL / "kustomization.yaml").read_text())
    assert uninstall["images"] == main["images"]
    assert uninstall["resources"] == ["node-uninstall.yaml"]
    assert uninstall["labels"] == main["labels"]


def test_the_node_pods_see_the_host_read_only_and_write_only_where_install_and_the_agent_write(
) -> None:
    spec = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]
    [install] = spec["initContainers"]
    [agent] = spec["containers"]
    assert _host_mounts(install) == {"/host": ("/", False), "/host/etc": ("/etc", True),
                                     "/host/usr/local/vcuda": (DEFAULT_PREFIX, True)}
    assert _host_mounts(agent) == {"/host": ("/", False),
                                   "/host/run/vcuda": (DEFAULT_STATE_DIR, True),
                                   NVIDIA_ALL_GPUS: ("/dev/null", False)}
    for node_path in (BASE_SPEC, CONTAINERD_CONFIG, CONTAINERD_DROP_IN, CRIO_CONF,
                      CRIO_HOOKS_DIR, f"{DEFAULT_PREFIX}/lib/libvcuda.so"):
        assert node_path.startswith(("/etc/", DEFAULT_PREFIX + "/")), node_path
    for container in (install, agent):  # install makes no mounts; the agent none outside DRA
        assert all(m.get("mountPropagation") != "Bidirectional" for m in container["volumeMounts"])


def test_the_agent_sees_what_the_hook_mounts_on_the_host_after_it_started() -> None:
    """Each limited container's account is a tmpfs the hook mounts in the state dir."""
    [agent] = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]["containers"]
    propagation = {m["mountPath"]: m.get("mountPropagation") for m in agent["volumeMounts"]}
    assert propagation["/host"] == propagation["/host/run/vcuda"] == "HostToContainer"


def test_the_agent_runs_unprivileged_in_the_hosts_pid_namespace_with_two_capabilities() -> None:
    spec = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]
    [agent] = spec["containers"]
    # NVML numbers GPU processes in the asking process's pid namespace.
    assert spec["hostPID"] is True
    context = agent["securityContext"]
    assert "privileged" not in context and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    assert context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_agent_asks_nvidias_runtime_for_every_gpu_by_mount_and_by_variable() -> None:
    """A runtime that reads device lists from mounts ignores the variable of an unprivileged
    container; one that reads only the variable takes it."""
    [agent] = find("DaemonSet", "vcuda-node")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML, no compute
    assert _host_mounts(agent)[NVIDIA_ALL_GPUS] == ("/dev/null", False)


PLACEMENT_COMPONENT = ROOT / "placement" / "component"


def _with_placement() -> dict[str, Any]:
    patch = yaml.safe_load((PLACEMENT_COMPONENT / "daemonset-patch.yaml").read_text())
    return jsonpatch.apply_patch(find("DaemonSet", "vcuda-node"), patch)


def test_the_placement_component_is_valid_and_patches_the_node_daemonset() -> None:
    kustomization = yaml.safe_load((PLACEMENT_COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    [patch] = kustomization["patches"]
    assert (patch["path"], patch["target"]["kind"], patch["target"]["name"]) == (
        "daemonset-patch.yaml", "DaemonSet", "vcuda-node")
    kubernetes_validate.validate(_with_placement(), KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("var_run", ["/run", "../run"])  # Debian and Ubuntu's, RHEL's
def test_with_placement_the_agent_may_write_where_its_device_plugins_write_and_nowhere_else(
    var_run: str, tmp_path: Any
) -> None:
    spec = _with_placement()["spec"]["template"]["spec"]
    [agent] = spec["containers"]
    assert agent["command"] == ["vcuda-node", "run", "--host-root", "/host", "--placement"]
    writable = {path: node for path, (node, rw) in _host_mounts(agent, _with_placement()).items()
                if rw}
    # Where the agent writes: each directory as it resolves the node's links under /host.
    node = tmp_path / "node"
    (node / "var").mkdir(parents=True)
    (node / "var" / "run").symlink_to(var_run)
    used = ["/host" + host_path(str(node), d).removeprefix(str(node)) for d in (PLUGIN_DIR,
                                                                                 CDI_DIR)]
    assert set(writable) == {"/host/run/vcuda", *used}
    assert {path: writable[path] for path in used} == {  # each the node's directory it names
        path: path.removeprefix("/host") for path in used}
    assert writable["/host/run/vcuda"] == DEFAULT_STATE_DIR
    assert POD_RESOURCES.startswith("/var/lib/kubelet/") and not POD_RESOURCES.startswith(
        PLUGIN_DIR)  # a socket it connects to: read-only is enough
    assert "privileged" not in agent["securityContext"]


def test_device_plugin_config_advertises_shared_replicas_as_the_shared_resource() -> None:
    [config_map] = documents(DEVICE_PLUGIN_CONFIG)
    shared = yaml.safe_load(config_map["data"]["vcuda-shared"])
    slicing = shared["sharing"]["timeSlicing"]
    assert slicing["renameByDefault"] is True  # nvidia.com/gpu becomes nvidia.com/gpu.shared
    assert slicing["failRequestsGreaterThanOne"] is True
    [resource] = slicing["resources"]
    assert resource["name"] == "nvidia.com/gpu" and resource["replicas"] >= 2
    assert "sharing" not in yaml.safe_load(config_map["data"]["exclusive"])


def test_device_plugin_names_gpus_by_volume_mounts_the_only_list_the_hook_trusts() -> None:
    [config_map] = documents(DEVICE_PLUGIN_CONFIG)
    for name in ("exclusive", "vcuda-shared"):
        plugin = yaml.safe_load(config_map["data"][name])["flags"]["plugin"]
        assert plugin["deviceListStrategy"] == "volume-mounts", name


def test_every_container_uses_the_one_fully_qualified_image_the_kustomization_sets() -> None:
    images = set()
    for obj in all_objects():
        pod = obj.get("spec", {}).get("template") or \
            obj.get("spec", {}).get("jobTemplate", {}).get("spec", {}).get("template")
        if pod:
            for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
                images.add(container["image"])
    # vcuda-scheduler, unchanged, at a tag that pulls nothing until set to the cluster's
    upstream = {f"{KUBE_SCHEDULER}:SET-TO-THE-CLUSTER-VERSION"}
    [entry] = yaml.safe_load((BASE / "kustomization.yaml").read_text())["images"]
    assert images == {f"{entry['name']}:{entry['newTag']}"} | upstream
    registry = entry["name"].split("/")[0]
    assert registry.endswith(".invalid")  # never resolves: an unset image fails at pull


# --- the node agent changes only its own node ----------------------------------------------------

def _own_node_policy_allows(username: str, node: str, token_node: str | None) -> bool:
    policy = find("ValidatingAdmissionPolicy", "vcuda-node-own-node")["spec"]
    extra = {"authentication.kubernetes.io/node-name": [token_node]} if token_node else {}
    env = celpy.Environment()
    activation: dict[str, Any] = {"request": celpy.json_to_cel(
        {"name": node, "userInfo": {"username": username, "extra": extra}})}
    for condition in policy["matchConditions"]:
        if not env.program(env.compile(condition["expression"])).evaluate(activation):
            return True  # the policy does not apply to this request
    activation["variables"] = celpy.json_to_cel({
        v["name"]: env.program(env.compile(v["expression"])).evaluate(activation)
        for v in policy["variables"]})
    return all(bool(env.program(env.compile(v["expression"])).evaluate(activation))
               for v in policy["validations"])


AGENT = f"system:serviceaccount:{NAMESPACE}:vcuda-node"
KUBE_SCHEDULER = "registry.k8s.io/kube-scheduler"


def test_the_node_agent_may_change_its_own_node() -> None:
    assert _own_node_policy_allows(AGENT, "gpu-1", token_node="gpu-1")


def test_the_node_agent_may_not_change_another_node() -> None:
    assert not _own_node_policy_allows(AGENT, "gpu-2", token_node="gpu-1")


def test_a_node_agent_token_not_bound_to_a_pod_may_change_no_node() -> None:
    assert not _own_node_policy_allows(AGENT, "gpu-1", token_node=None)


def test_the_own_node_policy_leaves_other_users_alone() -> None:
    assert _own_node_policy_allows("system:node:gpu-1", "gpu-2", token_node=None)
    assert _own_node_policy_allows("system:serviceaccount:team:vcuda-node-x", "gpu-2", None)


def test_the_own_node_policy_holds_in_whichever_namespace_vcuda_is_installed() -> None:
    assert not _own_node_policy_allows("system:serviceaccount:gpu-ops:vcuda-node", "gpu-2",
                                       token_node="gpu-1")


def test_the_own_node_policy_covers_nodes_and_their_status_and_denies() -> None:
    policy = find("ValidatingAdmissionPolicy", "vcuda-node-own-node")["spec"]
    [rule] = policy["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"nodes", "nodes/status"} and "UPDATE" in rule["operations"]
    binding = find("ValidatingAdmissionPolicyBinding", "vcuda-node-own-node")["spec"]
    assert binding == {"policyName": "vcuda-node-own-node", "validationActions": ["Deny"]}


# --- placement: the second scheduler and the extender -------------------------------------------

def _scheduler_config() -> dict[str, Any]:
    return yaml.safe_load(find("ConfigMap", "vcuda-scheduler-config")["data"]["config.yaml"])


def test_vcuda_scheduler_is_leader_elected_and_calls_the_extender_for_vcudas_resources() -> None:
    config = _scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["leaderElection"] == {"leaderElect": True, "resourceName": "vcuda-scheduler"}
    # The Lease lives in the pod's own namespace, whichever that is.
    [kube_scheduler] = [c for c in _scheduler_pod()["containers"]
                        if c["name"] == "kube-scheduler"]
    assert "--leader-elect-resource-namespace=$(POD_NAMESPACE)" in kube_scheduler["command"]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.namespace"}}} in kube_scheduler["env"]
    assert [p["schedulerName"] for p in config["profiles"]] == ["vcuda-scheduler"]
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter", "prioritize", "bind")
    assert extender["nodeCacheCapable"] is True  # names only: the extender watches the nodes
    assert extender["ignorable"] is False
    assert {r["name"] for r in extender["managedResources"]} == {SHARED_RESOURCE,
                                                                 WHOLE_RESOURCE}


def _scheduler_pod() -> dict[str, Any]:
    return find("Deployment", "vcuda-scheduler")["spec"]["template"]["spec"]


ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _account_volume(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    [mount] = [m for m in container.get("volumeMounts", []) if m["mountPath"] == ACCOUNT_DIR]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return volume


def test_the_extender_holds_its_own_accounts_token_and_kube_scheduler_its_own() -> None:
    spec = _scheduler_pod()
    assert spec["serviceAccountName"] == "vcuda-scheduler"
    assert spec["automountServiceAccountToken"] is False  # no token for every container
    containers = {c["name"]: c for c in spec["containers"]}
    scheduler = _account_volume(spec, containers["kube-scheduler"])["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 3607} in [
        s.get("serviceAccountToken") for s in scheduler]
    secret = _account_volume(spec, containers["extender"])["secret"]
    token = find("Secret", secret["secretName"])
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "vcuda-scheduler-extender"}
    assert sorted(i["key"] for i in secret["items"]) == ["ca.crt", "namespace", "token"]
    find("ServiceAccount", "vcuda-scheduler-extender")


def test_the_extender_listens_on_loopback_only_where_its_scheduler_reaches_it() -> None:
    scheduler = _scheduler_pod()
    daemonset = find("DaemonSet", "vcuda-scheduler-extender")["spec"]["template"]["spec"]
    for spec in (scheduler, daemonset):
        [extender] = [c for c in spec["containers"] if "/vcuda/vcuda:" in c["image"]]
        assert extender["command"] == ["vcuda-scheduler-extender", "--host", "127.0.0.1",
                                       "--port", "8888", "--metrics-port", "9401"]
    assert daemonset["serviceAccountName"] == "vcuda-scheduler-extender"
    assert daemonset["hostNetwork"] is True
    assert daemonset["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    [kube_scheduler] = [c for c in scheduler["containers"] if c["name"] == "kube-scheduler"]
    assert "--config=/etc/vcuda-scheduler/config.yaml" in kube_scheduler["command"]


def test_the_extender_may_read_pods_bind_them_watch_and_write_nodes_and_tell_them_nothing_else(
        ) -> None:
    rules = find("ClusterRole", "vcuda-scheduler-extender")["rules"]
    assert sorted((r["resources"][0], tuple(r["verbs"])) for r in rules) == [
        ("nodes", ("get", "list", "watch", "patch")), ("pods", ("get",)),
        ("pods/binding", ("create",))]
    events = find("Role", "vcuda-scheduler-extender-events")
    assert events["metadata"]["namespace"] == NODE_EVENTS_NAMESPACE
    assert events["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                                "verbs": ["create", "patch"]}]
    extender = f"system:serviceaccount:{NAMESPACE}:vcuda-scheduler-extender"
    bound = {b["roleRef"]["name"] for b in all_objects() if b["kind"].endswith("RoleBinding")
             and any(f"system:serviceaccount:{s['namespace']}:{s['name']}" == extender
                     for s in b["subjects"])}
    assert bound == {"vcuda-scheduler-extender",  # none of kube-scheduler's roles
                     "vcuda-scheduler-extender-events"}


def test_kube_scheduler_may_read_the_api_servers_authentication_configuration() -> None:
    binding = find("RoleBinding", "vcuda-scheduler-authentication-reader")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "extension-apiserver-authentication-reader"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vcuda-scheduler",
                                    "namespace": NAMESPACE}]
    leases = find("Role", "vcuda-scheduler-leader-election")["rules"]
    assert {name for rule in leases for name in rule.get("resourceNames", [])} == {
        "vcuda-scheduler"}


def test_match_conditions_name_the_webhooks_default_resources_and_annotation() -> None:
    defaults = Config()
    wanted = {r for _, core, memory in defaults.vcuda_keys for r in (core, memory)}
    wanted |= {defaults.shared_resource, SHARED_RESOURCE, LIMITS_ANNOTATION,
               ASSIGNMENT_ANNOTATION, *defaults.gpus_keys.values(), *VOLCANO_NAMES,
               *HAMI_MARKERS}
    [condition] = _webhook()["matchConditions"]
    assert set(re.findall(r"'([^']+)'", condition["expression"])) - {"UPDATE"} == wanted


def test_the_webhook_runs_at_a_priority_that_is_not_evicted_first() -> None:
    assert _webhook_pod()["spec"]["priorityClassName"] == "system-cluster-critical"


# --- the extender's writes: the GPU ledger annotation of a Node, nothing else -------------------

EXTENDER = f"system:serviceaccount:{NAMESPACE}:vcuda-scheduler-extender"


def _node(annotations: dict[str, str] | None = None, **changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"metadata": {"name": "gpu-1", "labels": {"vcuda.io/enabled": "true"},
                                         "annotations": {"vcuda.io/gpus": "{}"}},
                            "spec": {"podCIDR": "10.244.1.0/24"}}
    if annotations is not None:
        node["metadata"]["annotations"] = annotations
    for path, value in changes.items():
        section, key = path.split("__")
        node[section if section == "spec" else "metadata"].__setitem__(key, value)
    return node


def _extender_policy_allows(username: str, old: dict[str, Any], new: dict[str, Any]) -> bool:
    policy = find("ValidatingAdmissionPolicy", "vcuda-scheduler-extender-ledger-only")["spec"]
    env = celpy.Environment()
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel({"operation": "UPDATE", "userInfo": {"username": username}}),
        "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
    for condition in policy["matchConditions"]:
        if not env.program(env.compile(condition["expression"])).evaluate(activation):
            return True
    activation["variables"] = celpy.json_to_cel({
        v["name"]: env.program(env.compile(v["expression"])).evaluate(activation)
        for v in policy["variables"]})
    return all(bool(env.program(env.compile(v["expression"])).evaluate(activation))
               for v in policy["validations"])


def test_the_extender_may_write_the_gpu_ledger_of_a_node() -> None:
    ledger = {"vcuda.io/gpus": "{}", LEDGER_ANNOTATION: '{"uid": {}}'}
    assert _extender_policy_allows(EXTENDER, _node(), _node(ledger))
    assert _extender_policy_allows(EXTENDER, _node(ledger), _node())  # and take its line back


@pytest.mark.parametrize("new", [
    _node({"vcuda.io/gpus": "forged"}),                          # another annotation changed
    _node({"vcuda.io/gpus": "{}", "other.io/x": "1"}),           # one added
    _node({}),                                                   # one removed
    _node(metadata__labels={}),                                  # labels
    _node(metadata__finalizers=["x"]),
    _node(spec__unschedulable=True),                             # the spec: cordon, taints
], ids=["annotation", "added", "removed", "labels", "finalizers", "spec"])
def test_the_extender_may_change_nothing_else_of_a_node_in_any_namespace(
        new: dict[str, Any]) -> None:
    assert not _extender_policy_allows(EXTENDER, _node(), new)
    assert not _extender_policy_allows(
        "system:serviceaccount:gpu-ops:vcuda-scheduler-extender", _node(), new)
    assert _extender_policy_allows("system:kube-scheduler", _node(), new)


def test_the_extender_policy_covers_node_updates_and_denies() -> None:
    policy = find("ValidatingAdmissionPolicy", "vcuda-scheduler-extender-ledger-only")["spec"]
    [rule] = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"] and rule["operations"] == ["UPDATE"]
    binding = find("ValidatingAdmissionPolicyBinding", "vcuda-scheduler-extender-ledger-only")
    assert binding["spec"]["validationActions"] == ["Deny"]


# --- a namespace of one's own --------------------------------------------------------------------

@needs_kubectl
def test_a_namespace_override_keeps_the_policies_and_moves_the_accounts(tmp_path: Any) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "namespace": "gpu-ops", "resources": [os.path.relpath(PATHS["placement"], tmp_path)]}))
    objects = kustomize(tmp_path)
    for obj in objects:
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "gpu-ops", obj["metadata"]["name"]
    text = yaml.safe_dump_all(objects)
    # What stays: the webhook's exclusion of the old name (matchConditions send no pod of
    # vcuda's own either way); README, "Install with kustomize", says to patch it.
    assert text.count(NAMESPACE) == 1
    assert NAMESPACE in _webhook()["namespaceSelector"]["matchExpressions"][0]["values"]
