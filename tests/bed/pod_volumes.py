"""
A pod's volumes on the node agent, as host directories its containers mount: emptyDir (a directory, or
tmpfs for medium Memory), a PersistentVolumeClaim (the node's directory for the claim), configMap and
secret, and projected volumes (the `kube-api-access-*` one: a bound ServiceAccount token, the cluster's CA,
the namespace), with the downward API fields they and env entries read.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

from .common import Body
from .pod_containers import PodState


class PodVolumes(PodState):
    """A part of `PodRunner`: the volumes of its pod, made under its directory."""

    def _prepare_volumes(self) -> dict[str, tuple[str, Body]]:
        """Volume name -> (kind, details) with host directories made; raises for what is unsupported."""
        out: dict[str, tuple[str, Body]] = {}
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        for volume in self.spec.get("volumes") or []:
            name = volume["name"]
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    out[name] = ("tmpfs", {"sizeLimit": empty.get("sizeLimit")})
                else:
                    path = self.dir / "volumes" / name
                    path.mkdir(parents=True, exist_ok=True)
                    path.chmod(0o777)  # as a kubelet makes an emptyDir
                    out[name] = ("dir", {"path": str(path)})
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if self.agent.api.get(f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}") is None:
                    raise LookupError(f'persistentvolumeclaim "{claim}" not found')
                path = self.agent.claim_dir(self.ns, claim)
                if fs_group is not None:  # a kubelet makes the volume group-owned by fsGroup, setgid
                    os.chown(path, 0, int(fs_group))
                    path.chmod(0o2775)
                out[name] = ("dir", {"path": str(path)})
            elif "configMap" in volume or "secret" in volume:
                kind = "configMap" if "configMap" in volume else "secret"
                source = volume[kind]
                data = self.agent.api.source_data(self.ns, kind, source.get("name") or source.get("secretName"))
                path = self.dir / "volumes" / name
                path.mkdir(parents=True, exist_ok=True)
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    target = path / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[item["key"]])
                    target.chmod(int(item.get("mode", source.get("defaultMode", 0o644))))
                out[name] = ("dir", {"path": str(path), "readOnly": True})
            elif "projected" in volume:
                out[name] = ("dir", {"path": str(self._project(name, volume["projected"])), "readOnly": True})
            else:
                kinds = sorted(set(volume) - {"name"})
                raise ValueError(f"volume {name!r}: {kinds} volumes are not supported by the test node agent")
        return out

    def _project(self, name: str, projected: Mapping[str, Any]) -> pathlib.Path:
        """A projected volume's files: what admission adds to every pod of a ServiceAccount
        (`kube-api-access-*`: a token, the cluster's CA from `kube-root-ca.crt`, the namespace), or a
        pod's own mix of those sources."""
        path = self.dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        default_mode = int(projected.get("defaultMode", 0o644))
        files: dict[str, tuple[str, int | None]] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[token["path"]] = (self._token(token), None)
            elif "configMap" in source or "secret" in source:
                kind = "configMap" if "configMap" in source else "secret"
                ref = source[kind]
                try:
                    data = self.agent.api.source_data(self.ns, kind, ref["name"])
                except LookupError:
                    if ref.get("optional"):
                        continue
                    raise
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = (data[item["key"]], item.get("mode"))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    files[item["path"]] = (self._field(item["fieldRef"]["fieldPath"]), item.get("mode"))
            else:
                raise ValueError(f"projected volume {name!r}: source {sorted(source)} is not supported by the "
                                 f"test node agent")
        for relative, (text, mode) in files.items():
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(int(mode if mode is not None else default_mode))
        return path

    def _token(self, source: Mapping[str, Any]) -> str:
        """A token of the pod's ServiceAccount, requested as its kubelet does: with the node's identity,
        bound to this pod (so it dies with it). The server stretches the default hour of a
        `kube-api-access` token to a year (--service-account-extend-token-expiration), so no test lives
        to see it refreshed; this agent does not refresh it."""
        account = self.spec.get("serviceAccountName") or "default"
        spec: Body = {"expirationSeconds": int(source.get("expirationSeconds", 3600)),
                      "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}}
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        answer = self.agent.api.request(
            "POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return answer["status"]["token"]

    def _field(self, path: str) -> str:
        """A downward API field of this pod, as a file or env var carries it."""
        values = {"metadata.name": self.name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
                  "status.podIP": self.ip, "status.hostIP": self.agent.host_ip,
                  "spec.nodeName": self.agent.node_name,
                  "spec.serviceAccountName": self.spec.get("serviceAccountName") or "default"}
        if path in values:
            return values[path]
        for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
            mapping = self.meta.get(key) or {}
            if path == prefix:
                return "\n".join(f'{k}="{v}"' for k, v in sorted(mapping.items()))
            if path.startswith(prefix + "['") and path.endswith("']"):
                return mapping.get(path[len(prefix) + 2:-2], "")
        raise ValueError(f"downward API field {path!r} is not supported by the test node agent")


__all__ = ["PodVolumes"]
