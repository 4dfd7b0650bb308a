"""vcuda's manifests as the README applies them (``kubectl apply -k``), checked by the real
apiserver in a server-side dry run: schemas, the CEL of the webhook's matchConditions and of
the ValidatingAdmissionPolicy (compiled and type-checked there), RBAC objects, defaults.
Nothing is created, so no pod asks for the image the manifests name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.cluster.kube import Cluster

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


@pytest.fixture(scope="module")
def vcuda_namespace(cluster: Cluster) -> str:
    """The namespace of manifests/base/namespace.yaml, created: the dry run of the objects in it
    needs it to exist."""
    cluster.ok("apply", "-f", str(MANIFESTS / "base" / "namespace.yaml"))
    return "vcuda-system"


@pytest.mark.parametrize("kustomization", [".", "dra", "uninstall"])
def test_every_object_passes_the_apiservers_validation(cluster: Cluster, vcuda_namespace: str,
                                                       kustomization: str,
                                                       tmp_path: Path) -> None:
    built = list(yaml.safe_load_all(cluster.ok("kustomize", str(MANIFESTS / kustomization))))
    for obj in built:
        if obj and obj["kind"] == "Job":  # the installed Job's template cannot change
            obj["metadata"]["name"] += "-dry-run"
    objects = tmp_path / "objects.yaml"
    objects.write_text(yaml.safe_dump_all([o for o in built if o]))
    result = cluster.kubectl("apply", "-f", str(objects), "--dry-run=server")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.endswith("(server dry run)") for line in lines), result.stdout


def test_the_admission_policys_cel_has_no_type_warnings(cluster: Cluster,
                                                        vcuda_namespace: str) -> None:
    """The apiserver type-checks a policy's expressions against the resources it matches and
    puts what fails in the policy's status."""
    cluster.ok("apply", "-f", str(MANIFESTS / "base" / "node-policy.yaml"))
    name = "vcuda-node-own-node"
    cluster.ok("wait", f"validatingadmissionpolicy/{name}", "--timeout=60s",
               "--for=jsonpath={.status.observedGeneration}=1")
    status = cluster.get("validatingadmissionpolicy", name)["status"]
    assert status.get("typeChecking", {}).get("expressionWarnings", []) == []
