"""examples/kubernetes: every document is valid against the Kubernetes API's schemas (offline,
with the schemas kubernetes-validate bundles, strict: an unknown field is an error), and the
broker's ConfigMap and environment are settings the broker accepts -- loaded through its own
configuration parser -- that agree with the Services, ports and probes around them."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from txmq.broker.config import BrokerConfig, env_name, load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kubernetes"
#: The Kubernetes release the example is checked against (its schemas ship with
#: kubernetes-validate); the example needs 1.28+ for the pod-index label.
KUBERNETES = "1.33.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                out.append((f"{path.name}: {doc['kind']} {doc['metadata']['name']}", doc))
    return out


DOCS = documents()


def find(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_example_has_what_it_promises() -> None:
    kinds = sorted(where.split(": ")[1] for where, _ in DOCS)
    assert kinds == [
        "ConfigMap txmq",
        "PodDisruptionBudget etcd",
        "PodDisruptionBudget txmq",
        "Service etcd",
        "Service txmq",
        "StatefulSet etcd",
        "StatefulSet txmq",
    ]


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=[w for w, _ in DOCS])
def test_every_document_is_valid_against_the_kubernetes_schemas(doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{exc.message} at {'.'.join(map(str, exc.path))}", pytrace=False)


def broker_container() -> dict[str, Any]:
    spec = find("StatefulSet", "txmq")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return dict(container)


def replica_config(tmp_path: Path, ordinal: int) -> BrokerConfig:
    """What replica ``ordinal`` runs with: the ConfigMap's file, then its environment (the
    downward-API values as Kubernetes fills them in)."""
    config = tmp_path / "broker.toml"
    config.write_text(find("ConfigMap", "txmq")["data"]["broker.toml"], encoding="utf-8")
    pod = f"txmq-{ordinal}"
    filled = {
        "metadata.name": pod,
        "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
        "status.podIP": f"10.0.0.{ordinal + 10}",
    }
    env: dict[str, str] = {}
    for var in broker_container()["env"]:
        if "valueFrom" in var:
            env[var["name"]] = filled[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = str(var["value"])
            for name, earlier in env.items():
                value = value.replace(f"$({name})", earlier)
            env[var["name"]] = value
    known = {env_name(f.name) for f in fields(BrokerConfig)} | {"TXMQ_CONFIG"}
    unknown = sorted(n for n in env if n.startswith("TXMQ_") and n not in known)
    assert not unknown, f"environment variables the broker does not read: {unknown}"
    assert env["TXMQ_CONFIG"] == str(broker_container()["args"][-1])
    return load_config(config, env=env)


def test_the_configmap_and_environment_are_settings_the_broker_accepts(tmp_path: Path) -> None:
    configs = [replica_config(tmp_path, i) for i in range(3)]
    sts = find("StatefulSet", "txmq")
    assert sts["spec"]["replicas"] == 3 == configs[0].in_sync_replicas
    # One group, a replica id per pod, each replicating through its stable DNS name.
    assert {c.broker_name for c in configs} == {"g1"}
    assert [c.broker_id for c in configs] == [0, 1, 2]
    service = sts["spec"]["serviceName"]
    assert [c.broker_i_p2 for c in configs] == [f"txmq-{i}.{service}" for i in range(3)]
    assert configs[0].min_in_sync_replicas == 2
    # etcd: the members of etcd.yaml, by the names its headless Service gives them.
    etcd = find("StatefulSet", "etcd")
    members = [
        f"{etcd['metadata']['name']}-{i}.{etcd['spec']['serviceName']}:2379"
        for i in range(etcd["spec"]["replicas"])
    ]
    assert configs[0].etcd_endpoints.split(",") == members
    # The ports the container and the Service name are the broker's.
    container = broker_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"remoting": configs[0].listen_port, "ops": configs[0].metrics_port}
    assert {p["name"]: p["port"] for p in find("Service", service)["spec"]["ports"]} == ports
    assert configs[0].bind_address == "0.0.0.0"
    assert configs[0].healthz_loop_stall_seconds > 0
    # The store is on the claimed volume; the config file where --config says.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == configs[0].store_path_root_dir
    assert mounts["config"] == container["args"][-1]


def test_probes_and_the_disruption_budget() -> None:
    container = broker_container()
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    labels = find("StatefulSet", "txmq")["spec"]["template"]["metadata"]["labels"]
    pdb = find("PodDisruptionBudget", "txmq")["spec"]
    assert pdb["minAvailable"] == 2
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    # Both headless Services publish pods before they are ready: followers reach their leader,
    # and etcd members each other, before either is ready.
    for name in ("txmq", "etcd"):
        spec = find("Service", name)["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
