"""What KServe, Knative, Kubernetes, Istio and Prometheus do with rendered objects.

Schema validation says an object will be accepted; these small models say
what the cluster then does with it, for the cases the chart tests assert
(``test_real_cluster*.py``). Each follows the named upstream behaviour, read
from its source or documentation, and no more of it than the tests need:

- Knative's ``rewriteUserLivenessProbe`` (pkg/reconciler/revision/resources):
  an ``httpGet``/``tcpSocket`` liveness probe is pointed at the container's one
  serving port (always up to 1.21; 1.22+ keeps a set port only with the
  ``multi-container-probing`` feature); ``exec`` probes are left alone.
- Knative's container security-context mask: ``privileged`` is not allowed
  at all before 1.17, only ``false`` from 1.17.
- KServe's storage-initializer injector: a ``pvc://claim/path`` entry of
  ``storageUris`` is mounted as the claim alone (empty subPath).
- NetworkPolicy: a connection is admitted when one ingress rule lists its port
  (or none) and has no ``from`` or a peer matching the client.
- Istio injection: a pod gets a sidecar unless ``sidecar.istio.io/inject`` is
  ``"false"``; a classic sidecar keeps running after the main container exits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KNATIVE_CUSTOM_LIVENESS_PORT = (1, 22)
"""First Knative that can keep a liveness probe's own port (multi-container-probing on)."""
KNATIVE_PRIVILEGED_KEY = (1, 17)
"""First Knative whose security-context mask admits ``privileged`` (false only)."""


def knative_liveness(container: dict, version: tuple[int, int], custom_ports: bool = False) -> dict:
    """The liveness probe the kubelet runs once Knative has rewritten ``container``'s."""
    probe = {
        k: (dict(v) if isinstance(v, dict) else v) for k, v in container["livenessProbe"].items()
    }
    user_port = container["ports"][0]["containerPort"]
    keep = custom_ports and version >= KNATIVE_CUSTOM_LIVENESS_PORT
    for handler in ("httpGet", "tcpSocket"):
        if handler in probe and not (keep and probe[handler].get("port")):
            probe[handler]["port"] = user_port
    return probe


def knative_refuses_security_context(context: Mapping, version: tuple[int, int]) -> bool:
    """Whether Knative's webhook refuses a container ``securityContext``."""
    if "privileged" not in context:
        return False
    return version < KNATIVE_PRIVILEGED_KEY or context["privileged"] is not False


def kserve_model_mount(predictor: dict, container: dict, mount_path: str) -> tuple[str, str] | None:
    """``(claim, subPath)`` that ends up at ``mount_path`` after KServe's injector, or None."""
    for entry in predictor.get("storageUris", []):
        if entry["uri"].startswith("pvc://") and entry["mountPath"] == mount_path:
            claim = entry["uri"][len("pvc://") :].split("/", 1)[0]
            return claim, ""  # the path is dropped
    volumes = {v["name"]: v for v in predictor.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim")
        if mount["mountPath"] == mount_path and claim:
            return claim["claimName"], mount.get("subPath", "")
    return None


@dataclass(frozen=True)
class Peer:
    """A client pod: its namespace's labels and its own labels."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def _matches(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    wanted = (selector or {}).get("matchLabels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


def _peer_matches(entry: Mapping, peer: Peer, policy_namespace: str) -> bool:
    if "namespaceSelector" in entry:
        if not _matches(entry["namespaceSelector"], peer.namespace_labels):
            return False
    elif peer.namespace != policy_namespace:  # a podSelector alone: the policy's namespace
        return False
    return "podSelector" not in entry or _matches(entry["podSelector"], peer.labels)


def admitted(policy: dict, port: int, peer: Peer) -> bool:
    """Whether ``policy`` (an ingress NetworkPolicy) admits ``peer`` to ``port``."""
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        namespace = policy["metadata"]["namespace"]
        if not peers or any(_peer_matches(p, peer, namespace) for p in peers):
            return True
    return False


def istio_sidecar(pod_template: dict, namespace_injects: bool = True) -> str | None:
    """``None`` (no sidecar), ``"native"`` or ``"classic"`` for a pod of ``pod_template``."""
    meta = pod_template["metadata"]
    label = meta.get("labels", {}).get("sidecar.istio.io/inject")
    annotation = meta.get("annotations", {}).get("sidecar.istio.io/inject")
    wanted = label if label is not None else annotation
    if wanted == "false" or (wanted is None and not namespace_injects):
        return None
    native = meta.get("annotations", {}).get("sidecar.istio.io/nativeSidecar") == "true"
    return "native" if native else "classic"


# ------------------------------------------------------------------------ PromQL, tiny

_QUERY = re.compile(
    r"^sum\((?:max by \((?P<by>[^)]*)\) \()?(?P<name>\w+)\{(?P<sel>[^}]*)\}\)?\)(?: / (?P<div>\d+))?$"
)
_MATCHER = re.compile(r'(\w+)(=~|=)"([^"]*)"')


def evaluate(query: str, series: Iterable[tuple[str, Mapping[str, str], float]]) -> float:
    """Evaluates the chart's KEDA query shapes over ``(name, labels, value)`` samples.

    ``sum(name{sel})``, ``sum(max by (l, ...) (name{sel}))``, optionally ``/ n``:
    what the presets render (a test fails if the chart renders another shape).
    """
    m = _QUERY.match(query)
    assert m, f"not a query shape this model knows: {query}"
    matchers = _MATCHER.findall(m["sel"])
    picked = [
        (labels, value)
        for name, labels, value in series
        if name == m["name"]
        and all(
            (re.fullmatch(v, labels.get(k, "")) if op == "=~" else labels.get(k) == v)
            for k, op, v in matchers
        )
    ]
    if m["by"]:
        keys = [k.strip() for k in m["by"].split(",")]
        groups: dict[tuple, float] = {}
        for labels, value in picked:
            key = tuple(labels.get(k, "") for k in keys)
            groups[key] = max(groups.get(key, value), value)
        total = sum(groups.values())
    else:
        total = sum(value for _, value in picked)
    return total / int(m["div"]) if m["div"] else total


def quantity_bytes(quantity: str | int) -> int:
    """A Kubernetes storage quantity in bytes (binary and decimal suffixes)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    text = str(quantity)
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)
