"""A kubelet stand-in for end-to-end tests: Pods in the kmock emulator become local processes.

`Kubelet` polls the emulated API server for Pods and runs each container's
command as a local process, the way a kubelet runs a pod on its node. It only
plays the kubelet: what runs is the real code (`mlless supervisor`, `mlless
worker`, ...), against whatever services the pod's environment names. With
`knative=True` it also plays Knative Serving for `serving.knative.dev/v1`
Services (see `KnativeServing`), and with `openfaas=True` faas-netes and the
gateway for `openfaas.com/v1` Functions (see `OpenFaaS`).

As a kubelet, for each new Pod it:

- resolves the environment: `value`, `valueFrom.secretKeyRef` and
  `configMapKeyRef` (read from the API server; Secret data base64-decoded),
  `fieldRef`, `envFrom`, and `$(VAR)` references to earlier variables with
  Kubernetes' rules (`$$` escapes, an unresolvable reference stays literal);
  `command` and `args` are expanded against the whole container environment;
- materialises volumes: `configMap`, `secret` and `projected` (Secret and
  ConfigMap sources) volumes as files, `emptyDir` as an empty directory,
  each in a per-pod directory;
- runs the process with the resolved environment on top of a minimal base
  environment (PATH, LANG, PYTHONUNBUFFERED, HOSTNAME) - never the test's own;
- gives a pod with a service account (automountServiceAccountToken not
  false) a KUBECONFIG for the emulator, its analogue of the in-cluster token
  mount; KUBERNETES_SERVICE_HOST and the other service links are never set;
- writes the pod status: Pending, Running with `containerStatuses[].state.
  running`, then `state.terminated.exitCode` and Succeeded or Failed, honouring
  restartPolicy (Always and OnFailure restart after a short back-off, counted in
  restartCount; Never does not);
- on the Pod's deletion sends SIGTERM, then SIGKILL after
  terminationGracePeriodSeconds;
- logs each container's stdout and stderr to `<root>/logs/NS_POD_CONTAINER.log`.

Its liberties, since a pod here has no container image, filesystem or network
namespace of its own (each applies once to a literal env value, a ConfigMap
value or a command argument, before `$(VAR)` expansion; Secret values are
passed on as they are):

1. paths: a value that is a container `mountPath`, or starts with one plus
   `/` (also after `--flag=`), is rewritten to the volume's directory on the
   host (TMPDIR is also pointed at a volume mounted on /tmp);
2. ports: each declared `containerPort` is a free port on 127.0.0.1, and a
   value that equals the container port (also after `--flag=`) becomes it;
3. cluster DNS: in an `http(s)://NAME.NS.svc[.cluster.local]` URL the host is
   replaced by a local plain-HTTP proxy for that Service (`ServiceProxy`), whose backends
   are the copies `KnativeServing` runs; the short form `http(s)://NAME.NS[:port]` (what
   a pod's DNS search path completes) only for a Service the stand-in already serves,
   such as the OpenFaaS gateway (else `example.com` would be Service `example` of
   namespace `com`).

The image is ignored, except for what `images` says of its ENTRYPOINT and CMD,
which a container without `command` runs (as an OpenFaaS Function's does; the
liberties apply to them too, $(VAR) expansion does not, as on a node): `mlless`
runs the console script next to `sys.executable` (or `python -m mlless`), other
commands are looked up on the base PATH. Not emulated: init and sidecar
containers, probes (the served copies' readiness aside), resources, security
contexts, other volume types, workload controllers (StatefulSets and
Deployments get no pods), and Services other than the proxies.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import sys
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, TypeVar
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

Manifest = dict[str, Any]

#: Seconds between two polls of the API server.
POLL_INTERVAL = 0.1
#: Restart back-off: the first delay, doubled per restart up to the cap (a real kubelet: 10 s up to 5 min).
BACKOFF_INITIAL, BACKOFF_CAP = 0.5, 8.0
#: Grace that `close()` gives each process before SIGKILL (a pod's own terminationGracePeriodSeconds applies on deletion).
CLOSE_GRACE = 5.0
#: Request header lines the proxy passes on (hop-by-hop and Host are the proxy's own).
_FORWARDED_HEADERS = ("Content-Type", "Accept", "Authorization")

KNATIVE_SERVICES = "/apis/serving.knative.dev/v1/services"
OPENFAAS_FUNCTIONS = "/apis/openfaas.com/v1/functions"
_DNS_URL = re.compile(r"(?P<scheme>https?)://(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?(:(?P<port>\d+))?(?=[/?#]|$)")
#: `http://NAME.NS[:port]`, which a pod's DNS search path completes to NAME.NS.svc.cluster.local.
_SHORT_DNS_URL = re.compile(r"https?://(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)(:\d+)?(?=[/?#]|$)")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ConfigError(Exception):
    """A referenced Secret, ConfigMap or key is missing: the container waits (CreateContainerConfigError), as on a node."""


class Unsupported(Exception):
    """The pod needs something the stand-in does not emulate: the pod fails with this message."""


# ---- $(VAR) expansion ------------------------------------------------------------------------------


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion (k8s.io/kubernetes third_party/forked/golang/expansion).

    `$$` is an escaped `$`; `$(NAME)` becomes the value of NAME if defined,
    else stays as written; a `$` before anything else is kept.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(mapping[name] if name in mapping else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


# ---- the API server --------------------------------------------------------------------------------


class Api:
    """The few calls a kubelet makes, over HTTP to the emulator."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self._session

    async def get(self, path: str) -> Manifest | None:
        async with self.session.get(self.url + path) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def list(self, path: str) -> list[Manifest]:
        body = await self.get(path)
        return list((body or {}).get("items") or [])

    async def patch_status(self, path: str, status: Manifest) -> bool:
        """Merge-patch the status subresource; False if the object is gone."""
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(self.url + path + "/status", data=json.dumps({"status": status}), headers=headers) as resp:
            if resp.status == 404:
                return False
            resp.raise_for_status()
            return True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _object_path(kind_path: str, namespace: str, name: str) -> str:
    """'/api/v1/pods' + ns + name -> '/api/v1/namespaces/NS/pods/NAME'."""
    prefix, plural = kind_path.rsplit("/", 1)
    return f"{prefix}/namespaces/{namespace}/{plural}/{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one container, resolved -------------------------------------------------------------------------


@dataclass
class Launch:
    """What to exec for one container: the stand-in's version of a container config."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass(frozen=True)
class Image:
    """What the stand-in knows of an image: its ENTRYPOINT and CMD, for a container without `command`."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


@dataclass
class Sandbox:
    """A pod's node-side state: its directory, volume directories, port map and kubeconfig."""

    root: Path
    volumes: dict[str, Path] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)  # container port -> host port
    kubeconfig: Path | None = None


class Kubelet:
    """Runs the Pods of a kmock emulator as local processes (see the module docstring).

    Use as `async with Kubelet(url, root) as kubelet:` inside the test's event
    loop; `close()` stops every process it started. `report()` describes the
    pods and the tails of their logs, for a failing test's message.
    """

    def __init__(
        self, api_url: str, root: Path, knative: bool = False, openfaas: bool = False,
        openfaas_gateway: str = "http://gateway.openfaas:8080", images: Mapping[str, Image] | None = None,
    ) -> None:
        self.api = Api(api_url)
        self.api_url = api_url.rstrip("/")
        self.root = Path(root)
        self.log_dir = self.root / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.images = dict(images or {})
        self.pods: dict[str, PodRuntime] = {}  # by uid: a re-created pod of the same name is a new pod
        self.proxies: dict[tuple[str, str], Proxy] = {}
        self.knative = KnativeServing(self) if knative else None
        self.openfaas = OpenFaaS(self, openfaas_gateway) if openfaas else None
        self.errors: list[str] = []  # the stand-in's own failures (a test should fail on them, not wait)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._proxy_lock = asyncio.Lock()
        self._events = (self.log_dir / "kubelet.log").open("a", buffering=1)

    async def __aenter__(self) -> Kubelet:
        self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def start(self) -> None:
        self.event(f"kubelet stand-in for {self.api_url}, logs in {self.log_dir}")
        self._task = asyncio.create_task(self._loop(), name="kubelet")

    def event(self, message: str) -> None:
        if not self._events.closed:
            self._events.write(f"{now()} {message}\n")

    def error(self, what: str) -> None:
        """Record a bug of the stand-in (with the current traceback)."""
        self.errors.append(f"{what}: {traceback.format_exc()}")
        self.event(f"STAND-IN ERROR {self.errors[-1]}")

    # -- the sync loop

    def runtimes(self) -> list[PodRuntime]:
        """Every pod the stand-in runs: the API's Pods, then the Knative and OpenFaaS copies."""
        return (
            list(self.pods.values())
            + (self.knative.runtimes() if self.knative else [])
            + (self.openfaas.runtimes() if self.openfaas else [])
        )

    async def _loop(self) -> None:
        if self.openfaas is not None:
            await self.openfaas.start()  # before any pod resolves the gateway's address
        while not self._closing:
            try:
                if self.knative is not None:
                    await self.knative.sync()
                if self.openfaas is not None:
                    await self.openfaas.sync()
                await self._sync_pods()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.event(f"API error (retrying): {exc!r}")
            except Exception:
                self.error("sync loop")
            await asyncio.sleep(POLL_INTERVAL)

    async def _sync_pods(self) -> None:
        seen: set[str] = set()
        for pod in await self.api.list("/api/v1/pods"):
            meta = pod["metadata"]
            uid = meta.get("uid") or f"{meta.get('namespace')}/{meta['name']}"
            seen.add(uid)
            runtime = self.pods.get(uid)
            if meta.get("deletionTimestamp"):
                if runtime is not None:
                    runtime.delete()
            elif runtime is None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                self.pods[uid] = PodRuntime(self, pod, report=True)
        for uid, runtime in self.pods.items():
            if uid not in seen:
                runtime.delete()

    async def close(self) -> None:
        """Stop the loop, every process (SIGTERM, SIGKILL after CLOSE_GRACE) and the proxies."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        runtimes = self.runtimes()
        for runtime in runtimes:
            runtime.delete(grace=CLOSE_GRACE)
        await asyncio.gather(*(r.task for r in runtimes), return_exceptions=True)
        for proxy in self.proxies.values():
            await proxy.close()
        await self.api.close()
        self.event("kubelet stand-in stopped")
        self._events.close()

    # -- resolving a container

    async def proxy_for(self, namespace: str, name: str) -> Proxy:
        """The local address of Service NAME.NS (created on first use, as pods resolve it before its backends exist)."""
        async with self._proxy_lock:
            key = (namespace, name)
            if key not in self.proxies:
                proxy = ServiceProxy(self, namespace, name)
                await proxy.start()
                self.proxies[key] = proxy
                self.event(f"cluster DNS: {name}.{namespace}.svc.cluster.local -> 127.0.0.1:{proxy.port}")
            return self.proxies[key]

    async def prepare_sandbox(self, pod: Manifest, root: Path) -> Sandbox:
        """Volumes, ports and the service-account kubeconfig of a pod (before any container starts)."""
        meta, spec = pod["metadata"], pod["spec"]
        ns = meta["namespace"]
        if spec.get("initContainers"):
            raise Unsupported("init containers are not emulated")
        box = Sandbox(root)
        (root / "cwd").mkdir(parents=True, exist_ok=True)
        for volume in spec.get("volumes") or []:
            path = root / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume:
                pass
            elif "configMap" in volume or "secret" in volume:
                secret = "secret" in volume
                if not await self._project(path, ns, volume["name"], volume["secret" if secret else "configMap"], secret):
                    continue
            elif "projected" in volume:  # as OpenFaaS mounts a Function's secrets
                for source in volume["projected"].get("sources") or []:
                    if not ("secret" in source or "configMap" in source):
                        raise Unsupported(f"volume {volume['name']}: projected {sorted(source)} is not emulated")
                    secret = "secret" in source
                    await self._project(path, ns, volume["name"], source["secret" if secret else "configMap"], secret)
            else:
                raise Unsupported(f"volume {volume['name']}: only configMap, secret, projected and emptyDir volumes are emulated")
            box.volumes[volume["name"]] = path
        for container in spec.get("containers") or []:
            for port in container.get("ports") or []:
                box.ports.setdefault(int(port["containerPort"]), free_port())
        account = spec.get("serviceAccountName") or spec.get("serviceAccount")
        if account and spec.get("automountServiceAccountToken") is not False:
            box.kubeconfig = root / "serviceaccount" / "kubeconfig"
            box.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
            box.kubeconfig.write_text(
                "apiVersion: v1\nkind: Config\n"
                f"clusters: [{{name: kmock, cluster: {{server: '{self.api_url}'}}}}]\n"
                f"users: [{{name: {account}, user: {{token: 'system:serviceaccount:{ns}:{account}'}}}}]\n"
                f"contexts: [{{name: in-cluster, context: {{cluster: kmock, user: {account}, namespace: {ns}}}}}]\n"
                "current-context: in-cluster\n"
            )
        return box

    async def _project(self, path: Path, namespace: str, volume: str, source: Manifest, secret: bool) -> bool:
        """Write a Secret's or ConfigMap's keys (or its `items`) as read-only files; False if it is optional and missing."""
        name = source.get("secretName" if "secretName" in source else "name")
        obj = await self.api.get(_object_path("/api/v1/secrets" if secret else "/api/v1/configmaps", namespace, name))
        if obj is None:
            if source.get("optional"):
                return False
            raise ConfigError(f"volume {volume}: {'Secret' if secret else 'ConfigMap'} {name} not found")
        data = _decoded_data(obj, secret)
        for item in source.get("items") or [{"key": k, "path": k} for k in data]:
            if item["key"] not in data:
                raise ConfigError(f"volume {volume}: key {item['key']} not in {name}")
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                target.chmod(0o644)
            target.write_bytes(data[item["key"]])
            target.chmod(0o444)
        return True

    async def resolve_container(self, pod: Manifest, container: Manifest, box: Sandbox) -> Launch:
        """The argv, environment and working directory of one container, resolved as a kubelet would."""
        meta = pod["metadata"]
        ns = meta["namespace"]
        mounts = sorted(
            ((m["mountPath"].rstrip("/") or "/", box.volumes[m["name"]] / m.get("subPath", "")) for m in container.get("volumeMounts") or [] if m["name"] in box.volumes),
            key=lambda m: -len(m[0]),
        )
        missing = [m["name"] for m in container.get("volumeMounts") or [] if m["name"] not in box.volumes]
        if missing:
            raise Unsupported(f"container {container['name']}: no volume named {', '.join(missing)}")

        async def literal(value: str) -> str:
            return await self._rewrite(value, mounts, box.ports)

        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            ref = source.get("configMapRef") or source.get("secretRef") or {}
            secret = "secretRef" in source
            obj = await self.api.get(_object_path("/api/v1/secrets" if secret else "/api/v1/configmaps", ns, ref.get("name", "")))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"envFrom: {'Secret' if secret else 'ConfigMap'} {ref.get('name')} not found")
            for key, raw in _decoded_data(obj, secret).items():
                env[prefix + key] = raw.decode() if secret else await literal(raw.decode())
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = expand(await literal(str(var.get("value", ""))), env)
                continue
            value = await self._value_from(pod, var["valueFrom"], name)
            if value is not None:
                env[name] = value if "secretKeyRef" in var["valueFrom"] else await literal(value)

        command = [expand(await literal(a), env) for a in container.get("command") or []]
        args = [expand(await literal(a), env) for a in container.get("args") or []]
        if not command:
            # A container runtime's rule: ENTRYPOINT, then the pod's args if it has any, else CMD (not $(VAR)-expanded).
            image = self.images.get(container.get("image", ""))
            if image is None:
                raise Unsupported(f"container {container['name']}: no command, and the stand-in knows no default command of image {container.get('image')!r}")
            command = [await literal(a) for a in image.entrypoint]
            args = args if container.get("args") else [await literal(a) for a in image.cmd]
            if not command and not args:
                raise Unsupported(f"container {container['name']}: image {container.get('image')!r} has neither ENTRYPOINT nor CMD")
        base = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HOSTNAME": meta["name"],
            # The image holds the tree under test: a checkout run with PYTHONPATH set runs its own code in the pods too.
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
        }
        tmp = next((host for path, host in mounts if path == "/tmp"), None)
        if tmp is not None:
            base["TMPDIR"] = str(tmp)
        if box.kubeconfig is not None:
            base["KUBECONFIG"] = str(box.kubeconfig)
        working_dir = container.get("workingDir")
        cwd = Path(await literal(working_dir)) if working_dir else box.root / "cwd"
        if not cwd.is_dir():
            raise Unsupported(f"container {container['name']}: workingDir {working_dir} is not a mounted volume")
        return Launch(_executable(command + args, base["PATH"]), {**base, **env}, cwd)

    async def _value_from(self, pod: Manifest, source: Manifest, name: str) -> str | None:
        ns = pod["metadata"]["namespace"]
        for key, path, secret in (("secretKeyRef", "/api/v1/secrets", True), ("configMapKeyRef", "/api/v1/configmaps", False)):
            if key in source:
                ref = source[key]
                obj = await self.api.get(_object_path(path, ns, ref["name"]))
                data = _decoded_data(obj, secret) if obj is not None else {}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    what = "Secret" if secret else "ConfigMap"
                    raise ConfigError(f"env {name}: {what} {ref['name']} {'has no key ' + ref['key'] if obj else 'not found'}")
                return data[ref["key"]].decode()
        if "fieldRef" in source:
            return _field(pod, source["fieldRef"]["fieldPath"])
        raise Unsupported(f"env {name}: valueFrom {sorted(source)} is not emulated")

    async def _rewrite(self, value: str, mounts: list[tuple[str, Path]], ports: Mapping[int, int]) -> str:
        """The stand-in's three liberties (module docstring), applied once to a literal value."""
        flag, sep, rest = value.partition("=") if value.startswith("-") else ("", "", value)
        for mount, host in mounts:
            if rest == mount or rest.startswith(mount.rstrip("/") + "/"):
                rest = str(host) + rest[len(mount) :]
                break
        if rest.isdigit() and int(rest) in ports:
            rest = str(ports[int(rest)])
        for match in reversed(list(_DNS_URL.finditer(rest))):
            proxy = await self.proxy_for(match["ns"], match["name"])
            rest = f"{rest[: match.start()]}http://127.0.0.1:{proxy.port}{rest[match.end():]}"
        for match in reversed(list(_SHORT_DNS_URL.finditer(rest))):
            proxy = self.proxies.get((match["ns"], match["name"]))  # only a Service the stand-in serves (not example.com)
            if proxy is not None:
                rest = f"{rest[: match.start()]}http://127.0.0.1:{proxy.port}{rest[match.end():]}"
        return f"{flag}{sep}{rest}"

    # -- diagnostics

    def pod(self, namespace: str, name: str) -> PodRuntime | None:
        """The newest runtime of the pod of that name (a re-created pod has a new one)."""
        found = [r for r in self.pods.values() if r.namespace == namespace and r.name == name]
        return found[-1] if found else None

    def report(self, tail: int = 40) -> str:
        """Every pod's last known status and the tail of every log, for a failing test's message."""
        lines = [f"kubelet stand-in logs: {self.log_dir}"]
        for runtime in self.runtimes():
            containers = ", ".join(
                f"{s.name} {json.dumps(s.state)} restarts {s.restart_count}" for s in runtime.containers.values()
            )
            lines.append(f"pod {runtime.namespace}/{runtime.name}: {runtime.phase()} {runtime.failure or ''} ({containers})")
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()
            lines.append(f"---- {path.name} (last {min(tail, len(text))} of {len(text)} lines)")
            lines.extend(text[-tail:])
        return "\n".join(lines)


def _decoded_data(obj: Manifest, secret: bool) -> dict[str, bytes]:
    """A Secret's or ConfigMap's keys as bytes (an emulator may keep a Secret's stringData as sent)."""
    if secret:
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        data.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
    else:
        data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _field(pod: Manifest, path: str) -> str:
    """fieldRef: metadata.name/namespace/uid, labels['k'], annotations['k'], spec.*, status.podIP/hostIP."""
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((pod["metadata"].get(match[1]) or {}).get(match[2], ""))
    if path in ("status.podIP", "status.hostIP", "status.podIPs", "status.hostIPs"):
        return "127.0.0.1"
    value: Any = pod
    for part in path.split("."):
        value = (value or {}).get(part) if isinstance(value, dict) else None
    if path == "spec.nodeName" and not value:
        value = "kubelet-stand-in"
    if value is None:
        raise Unsupported(f"fieldRef {path} is not emulated")
    return str(value)


def _executable(argv: list[str], path: str) -> list[str]:
    """The container's command on this machine: mlless and python from this interpreter, others from PATH."""
    head, rest = argv[0], argv[1:]
    if head == "mlless":
        script = Path(sys.executable).with_name("mlless")
        return [str(script), *rest] if script.exists() else [sys.executable, "-m", "mlless", *rest]
    if head in ("python", "python3"):
        return [sys.executable, *rest]
    if "/" not in head:
        found = shutil.which(head, path=path)
        if found:
            return [found, *rest]
    return argv  # an image path that does not exist here fails to start (StartError), as on a node


# ---- a pod's processes ---------------------------------------------------------------------------


@dataclass
class ContainerState:
    name: str
    image: str
    state: Manifest = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Manifest = field(default_factory=dict)
    restart_count: int = 0
    started: bool = False  # ever started
    done: bool = False  # terminated and will not restart
    exit_code: int | None = None
    pid: int | None = None

    def to_status(self) -> Manifest:
        running = "running" in self.state
        status = {
            "name": self.name, "image": self.image, "imageID": "", "ready": running, "started": running,
            "restartCount": self.restart_count, "state": self.state, "lastState": self.last_state,
        }
        if self.pid is not None:
            status["containerID"] = f"standin://{self.pid}"
        return status


class PodRuntime:
    """One pod on the stand-in node: its sandbox, one supervised process per container, its status."""

    def __init__(self, kubelet: Kubelet, pod: Manifest, report: bool, sandbox_dir: Path | None = None, on_start: Callable[[PodRuntime], Awaitable[None]] | None = None) -> None:
        self.kubelet = kubelet
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.uid = pod["metadata"].get("uid") or str(uuid.uuid4())
        self.spec = pod["spec"]
        self.report_status = report
        self.sandbox_dir = sandbox_dir or kubelet.root / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.on_start = on_start
        self.policy = self.spec.get("restartPolicy") or "Always"
        self.grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        self.containers = {c["name"]: ContainerState(c["name"], c.get("image", "")) for c in self.spec.get("containers") or []}
        self.box: Sandbox | None = None
        self.failure: str | None = None  # an Unsupported message
        self.start_time = now()
        self.deleting = asyncio.Event()
        self._lock = asyncio.Lock()
        self.task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")

    def delete(self, grace: float | None = None) -> None:
        """Stop the pod's processes: SIGTERM, then SIGKILL after the grace period (the pod's, or `grace` if shorter)."""
        if not self.deleting.is_set():
            if grace is not None:
                self.grace = min(self.grace, grace)
            if not self.task.done():
                self.kubelet.event(f"{self.namespace}/{self.name}: stopping (grace {self.grace:g}s)")
            self.deleting.set()

    # -- status

    def phase(self) -> str:
        if self.failure is not None:
            return "Failed"
        states = list(self.containers.values())
        if not states or any(not s.started and not s.done for s in states):
            return "Pending"
        if all(s.done for s in states):
            return "Succeeded" if all(s.exit_code == 0 for s in states) else "Failed"
        return "Running"

    def status(self) -> Manifest:
        phase = self.phase()
        ready = phase == "Running" and all("running" in s.state for s in self.containers.values())
        status: Manifest = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": self.start_time,
            "conditions": [
                {"type": t, "status": "True" if ok else "False", "lastTransitionTime": now()}
                for t, ok in (("PodScheduled", True), ("Initialized", True), ("ContainersReady", ready), ("Ready", ready))
            ],
            "containerStatuses": [s.to_status() for s in self.containers.values()],
        }
        if self.failure is not None:
            status.update(reason="StandInUnsupported", message=self.failure)
        return status

    async def publish(self) -> None:
        if not self.report_status:
            return
        async with self._lock:  # in order, and each write is the latest state
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                await self.kubelet.api.patch_status(_object_path("/api/v1/pods", self.namespace, self.name), self.status())

    # -- lifecycle

    async def _run(self) -> None:
        kubelet = self.kubelet
        try:
            while self.box is None:
                try:
                    self.box = await kubelet.prepare_sandbox(self.pod, self.sandbox_dir)
                except ConfigError as exc:
                    for s in self.containers.values():
                        s.state = {"waiting": {"reason": "ContainerCreating", "message": str(exc)}}
                    await self.publish()
                    if await self._deleted_within(1.0):
                        return
            await self.publish()
            await asyncio.gather(*(self._run_container(c) for c in self.spec.get("containers") or []))
        except Unsupported as exc:
            self.failure = str(exc)
            self.deleting.set()  # the pod's other containers stop too
            kubelet.event(f"{self.namespace}/{self.name}: cannot run: {exc}")
            await self.publish()
            return
        except Exception:
            self.failure = "the kubelet stand-in failed (see kubelet.log)"
            self.deleting.set()
            kubelet.error(f"pod {self.namespace}/{self.name}")
            await self.publish()
            return
        kubelet.event(f"{self.namespace}/{self.name}: {self.phase()}")

    async def _deleted_within(self, seconds: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.deleting.wait(), timeout=seconds)
        return self.deleting.is_set()

    async def _run_container(self, container: Manifest) -> None:
        state = self.containers[container["name"]]
        log_path = self.kubelet.log_dir / f"{self.namespace}_{self.name}_{container['name']}.log"
        backoff = BACKOFF_INITIAL
        while not self.deleting.is_set():
            assert self.box is not None
            try:
                launch = await self.kubelet.resolve_container(self.pod, container, self.box)
            except ConfigError as exc:
                state.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                await self.publish()
                if await self._deleted_within(1.0):
                    return
                continue
            started_at = now()
            with log_path.open("ab") as log:
                log.write(f"==== {started_at} start #{state.restart_count} of pod {self.uid}: {launch.argv}\n".encode())
                log.flush()
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *launch.argv, env=launch.env, cwd=launch.cwd, stdin=asyncio.subprocess.DEVNULL,
                        stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                    )
                except OSError as exc:
                    log.write(f"==== cannot start: {exc}\n".encode())
                    proc = None
            if proc is None:
                code, reason = 128, "StartError"
            else:
                state.pid, state.started = proc.pid, True
                state.state = {"running": {"startedAt": started_at}}
                self.kubelet.event(f"{self.namespace}/{self.name}/{container['name']}: started pid {proc.pid}: {' '.join(launch.argv)}")
                await self.publish()
                if self.on_start is not None:
                    await self.on_start(self)
                code = await self._wait(proc)
                reason = "Completed" if code == 0 else "Error"
            with log_path.open("ab") as log:
                log.write(f"==== {now()} exited with {code}\n".encode())
            self.kubelet.event(f"{self.namespace}/{self.name}/{container['name']}: exited with {code}")
            terminated = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now()}}
            state.exit_code = code
            restart = not self.deleting.is_set() and (self.policy == "Always" or (self.policy == "OnFailure" and code != 0))
            if not restart:
                state.state, state.done = terminated, True
                await self.publish()
                return
            state.last_state = terminated
            state.restart_count += 1
            state.state = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {backoff:g}s restarting failed container"}}
            await self.publish()
            if await self._deleted_within(backoff):
                return
            backoff = min(2 * backoff, BACKOFF_CAP)

    async def _wait(self, proc: asyncio.subprocess.Process) -> int:
        """The exit code (128 + signal when killed, as a container runtime reports it); stops the process on deletion."""
        waiting = asyncio.ensure_future(proc.wait())
        deleted = asyncio.ensure_future(self.deleting.wait())
        await asyncio.wait({waiting, deleted}, return_when=asyncio.FIRST_COMPLETED)
        deleted.cancel()
        if not waiting.done():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # to the container's PID 1 only
            try:
                await asyncio.wait_for(asyncio.shield(waiting), timeout=self.grace)
            except asyncio.TimeoutError:
                self.kubelet.event(f"{self.namespace}/{self.name}: pid {proc.pid} outlived its grace period, SIGKILL")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the container's cgroup goes, with anything left in it
        code = await waiting
        return 128 - code if code < 0 else code


# ---- serving copies: proxies, Knative Serving, OpenFaaS ---------------------------------------------


@dataclass
class Backend:
    """One copy of a served workload (a Knative revision, an OpenFaaS Function), as a proxy sees it."""

    runtime: PodRuntime
    port: int
    capacity: int  # requests one copy takes at a time (containerConcurrency, max_inflight); 0 = unlimited
    ready: bool = False
    inflight: int = 0

    def free(self) -> bool:
        return self.ready and not self.runtime.deleting.is_set() and (self.capacity == 0 or self.inflight < self.capacity)


@dataclass
class Handled:
    """One request a proxy forwarded: what it asked for, which copy answered, and how."""

    target: str
    method: str
    path: str  # as forwarded to the copy
    copy: str | None
    status: int


class Proxy:
    """A local plain-HTTP front that forwards each request to a free copy, as an activator or gateway does.

    A request waits (as Knative's activator buffers, and the OpenFaaS gateway
    waits for a replica) until a copy is ready and below its capacity; a copy
    that answers 429 or refuses the connection is skipped and another tried,
    until the timeout. Subclasses say which copies serve a request (`_handle`).
    """

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.port = 0
        self.handled: list[Handled] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._requests = itertools.count(1)
        self._next = itertools.count()  # round robin over the copies

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def forward(self, request: web.Request, target: str, backends: Callable[[], list[Backend]], path_qs: str, timeout: float) -> web.Response:
        """Send `request` to `path_qs` on a free copy among `backends()` (looked up anew while waiting)."""
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k in _FORWARDED_HEADERS}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        number = next(self._requests)
        turn = next(self._next)
        while loop.time() < deadline:
            copies = backends()
            start = turn % max(1, len(copies))
            backend = next((b for b in copies[start:] + copies[:start] if b.free()), None)
            if backend is None:
                await asyncio.sleep(0.05)
                continue
            backend.inflight += 1
            try:
                left = aiohttp.ClientTimeout(total=max(1.0, deadline - loop.time()))
                url = f"http://127.0.0.1:{backend.port}{path_qs}"
                async with self._session.request(request.method, url, data=body, headers=headers, timeout=left) as resp:
                    payload = await resp.read()
            except aiohttp.ClientConnectorError:
                backend.ready = False  # not listening (any more): never reached it, so another copy may take it
                continue
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.kubelet.event(f"proxy {target} #{number}: {backend.runtime.name} failed: {exc!r}")
                self.handled.append(Handled(target, request.method, path_qs, backend.runtime.name, 502))
                return web.Response(status=502, text=f"{backend.runtime.name}: {exc!r}\n")
            finally:
                backend.inflight -= 1
            if resp.status == 429:
                await asyncio.sleep(0.05)  # busy: another copy
                continue
            self.kubelet.event(f"proxy {target} #{number}: {request.method} {path_qs} -> {backend.runtime.name}: {resp.status}")
            self.handled.append(Handled(target, request.method, path_qs, backend.runtime.name, resp.status))
            return web.Response(status=resp.status, body=payload, content_type=resp.content_type)
        self.handled.append(Handled(target, request.method, path_qs, None, 504))
        return web.Response(status=504, text=f"no copy of {target} answered within {timeout:g}s\n")


class ServiceProxy(Proxy):
    """What `NAME.NS.svc.cluster.local` reaches: the copies `KnativeServing` runs for Service NAME."""

    def __init__(self, kubelet: Kubelet, namespace: str, name: str) -> None:
        super().__init__(kubelet)
        self.namespace = namespace
        self.name = name
        self.backends: list[Backend] = []
        self.timeout = 300.0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        return await self.forward(request, f"{self.name}.{self.namespace}", lambda: self.backends, request.path_qs, self.timeout)


_C = TypeVar("_C", bound="_Copies")


class _Copies:
    """The copies of one version of a served workload: each a `PodRuntime` (restartPolicy Always), a `Backend` once up.

    `scale_to` adds or stops copies; `ready_check` is the readiness probe, a
    TCP connect or an HTTP GET of `probe_path` answering 200.
    """

    def __init__(self, kubelet: Kubelet, what: str, namespace: str, name: str, capacity: int, sandbox_root: Path,
                 shared: list[Backend] | None = None, probe_path: str | None = None) -> None:
        self.kubelet = kubelet
        self.what = what  # "knative ns/svc", for events
        self.namespace = namespace
        self.name = name  # of the version: copy pods are named after it
        self.capacity = capacity
        self.sandbox_root = sandbox_root
        self.backends: list[Backend] = []
        self.shared = shared  # a proxy's list across versions, kept in step with `backends`
        self.probe_path = probe_path
        self._copies = itertools.count()
        self._probes: set[asyncio.Task[None]] = set()

    def copy_pod(self, index: int) -> Manifest:
        raise NotImplementedError

    def live(self) -> list[Backend]:
        return [b for b in self.backends if not b.runtime.deleting.is_set()]

    def scale_to(self, replicas: int) -> None:
        live = self.live()
        for backend in live[replicas:]:
            backend.ready = False
            backend.runtime.delete()
        for _ in range(replicas - len(live)):
            pod = self.copy_pod(next(self._copies))
            runtime = PodRuntime(
                self.kubelet, pod, report=False,
                sandbox_dir=self.sandbox_root / f"{self.namespace}_{pod['metadata']['name']}", on_start=self._probe,
            )
            # The port is the sandbox's; known once it is prepared, so the backend learns it on start.
            backend = Backend(runtime, port=0, capacity=self.capacity)
            self.backends.append(backend)
            if self.shared is not None:
                self.shared.append(backend)
            self.kubelet.event(f"{self.what}: copy {pod['metadata']['name']} of {self.name}")
        for backend in [b for b in self.backends if b.runtime.task.done()]:
            self.backends.remove(backend)
            if self.shared is not None:
                self.shared.remove(backend)

    async def _probe(self, runtime: PodRuntime) -> None:
        """Readiness, from each (re)start of the copy's container until it first passes."""
        backend = next(b for b in self.backends if b.runtime is runtime)
        assert runtime.box is not None
        container_port = int(((runtime.spec.get("containers") or [{}])[0].get("ports") or [{"containerPort": 8080}])[0]["containerPort"])
        backend.port = runtime.box.ports[container_port]
        backend.ready = False

        async def probe() -> None:
            while not runtime.deleting.is_set() and not runtime.task.done():
                if await self._ready(backend.port):
                    backend.ready = True
                    self.kubelet.event(f"{self.what}: {runtime.name} ready on 127.0.0.1:{backend.port}")
                    return
                await asyncio.sleep(0.1)

        task = asyncio.create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _ready(self, port: int) -> bool:
        if self.probe_path is None:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return False
            writer.close()
            return True
        try:
            async with self.kubelet.api.session.get(f"http://127.0.0.1:{port}{self.probe_path}", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False


def _stopping(versions: list[_C]) -> list[_C]:
    """Replaced versions that still have copies to stop (each pass forgets the copies that have ended)."""
    for version in versions:
        version.scale_to(0)
    return [v for v in versions if v.backends]


def _digest(spec: Manifest, drop: Callable[[Manifest], None]) -> str:
    """What makes a new version: the spec without what `drop` removes from a copy of it (the scale settings)."""
    spec = json.loads(json.dumps(spec))
    drop(spec)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


# ---- Knative Serving -------------------------------------------------------------------------------


class KnativeServing:
    """`serving.knative.dev/v1` Services as `min-scale` local copies of their container behind a `ServiceProxy`.

    Each copy is run like a pod (restartPolicy Always; PORT, K_SERVICE,
    K_REVISION and K_CONFIGURATION set as Knative does; its containerPort a
    free local port). A change of the scale annotations adds or stops copies;
    any other change of the template is a new revision, whose copies replace
    the old ones. The Service's status gets the cluster-local address and
    Ready once every copy accepts connections.
    """

    SCALE_KEYS = ("autoscaling.knative.dev/min-scale", "autoscaling.knative.dev/initial-scale")

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.services: dict[str, _Revision] = {}  # by the Service's uid
        self.retired: list[_Revision] = []  # replaced revisions whose copies are still stopping

    def runtimes(self) -> list[PodRuntime]:
        return [b.runtime for rev in [*self.services.values(), *self.retired] for b in rev.backends]

    async def sync(self) -> None:
        seen = set()
        for ksvc in await self.kubelet.api.list(KNATIVE_SERVICES):
            meta = ksvc["metadata"]
            uid = meta.get("uid") or f"{meta['namespace']}/{meta['name']}"
            seen.add(uid)
            template = (ksvc.get("spec") or {}).get("template") or {}
            annotations = (template.get("metadata") or {}).get("annotations") or {}
            scale = next((int(annotations[k]) for k in self.SCALE_KEYS if k in annotations), 1)
            digest = _digest(template, _drop_knative_scale)
            rev = self.services.get(uid)
            if meta.get("deletionTimestamp"):
                scale = 0
            if rev is None or rev.digest != digest:
                if rev is not None:
                    rev.scale_to(0)
                    self.retired.append(rev)
                proxy = await self.kubelet.proxy_for(meta["namespace"], meta["name"])
                assert isinstance(proxy, ServiceProxy)
                number = 1 if rev is None else rev.number + 1
                rev = self.services[uid] = _Revision(self.kubelet, ksvc, template, digest, number, proxy)
            rev.scale_to(scale)
            await rev.publish_status()
        for uid, rev in self.services.items():
            if uid not in seen:
                rev.scale_to(0)
        self.retired = _stopping(self.retired)


def _drop_knative_scale(template: Manifest) -> None:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    for key in list(annotations):
        if key.startswith("autoscaling.knative.dev/"):
            del annotations[key]


class _Revision(_Copies):
    def __init__(self, kubelet: Kubelet, ksvc: Manifest, template: Manifest, digest: str, number: int, proxy: ServiceProxy) -> None:
        namespace, service = ksvc["metadata"]["namespace"], ksvc["metadata"]["name"]
        spec = template.get("spec") or {}
        super().__init__(
            kubelet, f"knative {namespace}/{service}", namespace, f"{service}-{number:05d}",
            capacity=int(spec.get("containerConcurrency") or 0), sandbox_root=kubelet.root / "knative", shared=proxy.backends,
        )
        self.ksvc = ksvc
        self.service = service
        self.template = template
        self.digest = digest
        self.number = number
        self.proxy = proxy
        proxy.timeout = float(spec.get("timeoutSeconds") or 300)
        self._published: bool | None = None

    def copy_pod(self, index: int) -> Manifest:
        spec = json.loads(json.dumps(self.template.get("spec") or {}))
        for key in ("containerConcurrency", "timeoutSeconds"):
            spec.pop(key, None)
        spec["restartPolicy"] = "Always"
        spec.setdefault("terminationGracePeriodSeconds", int(self.proxy.timeout))
        for container in spec.get("containers") or []:
            ports = container.setdefault("ports", [{"containerPort": 8080}])
            knative_env = [
                {"name": "PORT", "value": str(ports[0]["containerPort"])},
                {"name": "K_SERVICE", "value": self.service},
                {"name": "K_CONFIGURATION", "value": self.service},
                {"name": "K_REVISION", "value": self.name},
            ]
            container["env"] = knative_env + list(container.get("env") or [])
        name = f"{self.name}-deployment-{index}"
        return {"metadata": {"name": name, "namespace": self.namespace, "uid": str(uuid.uuid4()), "labels": {"serving.knative.dev/revision": self.name}}, "spec": spec}

    async def publish_status(self) -> None:
        live = self.live()
        ready = bool(live) and all(b.ready for b in live)
        if ready == self._published:
            return
        address = f"http://{self.service}.{self.namespace}.svc.cluster.local"
        condition = {"status": "True" if ready else "Unknown", "lastTransitionTime": now()}
        status = {
            "observedGeneration": self.ksvc["metadata"].get("generation", 1),
            "url": address,
            "address": {"url": address},
            "latestCreatedRevisionName": self.name,
            "conditions": [{"type": t, **condition} for t in ("ConfigurationsReady", "RoutesReady", "Ready")],
        }
        if ready:
            status["latestReadyRevisionName"] = self.name
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            if await self.kubelet.api.patch_status(_object_path(KNATIVE_SERVICES, self.namespace, self.service), status):
                self._published = ready


# ---- OpenFaaS --------------------------------------------------------------------------------------

#: Where faas-netes mounts a Function's secrets, one file per key.
OPENFAAS_SECRETS_DIR = "/var/openfaas/secrets"
OPENFAAS_PORT = 8080
_SCALE_MIN = "com.openfaas.scale.min"
_DURATION = re.compile(r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?")


def go_duration(text: str | None, default: float) -> float:
    """Seconds of an OpenFaaS timeout ("300s", "1m30s", or a bare number of seconds)."""
    if not text:
        return default
    text = str(text).strip()
    if text.replace(".", "", 1).isdigit():
        return float(text)
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groupdict().values()):
        return default
    return sum(float(match[u] or 0) * f for u, f in (("h", 3600), ("m", 60), ("s", 1)))


class OpenFaaS:
    """`openfaas.com/v1` Functions and the OpenFaaS gateway, played: what faas-netes and the gateway do.

    Each Function runs as `com.openfaas.scale.min` copies (1 if unset) of the
    pod faas-netes would make: one container named after the function, with
    no command, so the image's default command runs (the Kubelet's `images`
    must know it); its `environment` as env vars; its `secrets` projected as
    files, one per key, under /var/openfaas/secrets; an emptyDir on /tmp when
    `readOnlyRootFilesystem`; port 8080, ready once GET /_/health answers 200.
    A change of the scale labels adds or stops copies; any other change of the
    spec redeploys (new copies replace the old). A Function has no status.

    The gateway (`OpenFaaSGateway`) answers at `gateway_url`'s host, which pods
    reach under that name (`gateway.openfaas`, also with `.svc[.cluster.local]`).
    """

    def __init__(self, kubelet: Kubelet, gateway_url: str = "http://gateway.openfaas:8080", functions_namespace: str = "openfaas-fn") -> None:
        host = urlparse(gateway_url).hostname or ""
        name, _, namespace = host.partition(".")
        if not name or not namespace or "." in namespace:
            raise ValueError(f"gateway URL {gateway_url!r}: the host must be SERVICE.NAMESPACE")
        self.kubelet = kubelet
        self.gateway = OpenFaaSGateway(kubelet, self, functions_namespace)
        self.gateway_service = (namespace, name)
        self.functions: dict[str, _FunctionDeployment] = {}  # by the Function's uid
        self.retired: list[_FunctionDeployment] = []  # replaced deployments whose copies are still stopping

    def runtimes(self) -> list[PodRuntime]:
        return [b.runtime for dep in [*self.functions.values(), *self.retired] for b in dep.backends]

    async def start(self) -> None:
        await self.gateway.start()
        self.kubelet.proxies[self.gateway_service] = self.gateway
        namespace, name = self.gateway_service
        self.kubelet.event(f"openfaas: gateway {name}.{namespace} -> 127.0.0.1:{self.gateway.port}")

    def deployment(self, namespace: str, name: str) -> _FunctionDeployment | None:
        """The current deployment of function `name` (spec.name) in `namespace`."""
        return next((d for d in self.functions.values() if d.namespace == namespace and d.function == name and not d.gone), None)

    async def sync(self) -> None:
        seen = set()
        for fn in await self.kubelet.api.list(OPENFAAS_FUNCTIONS):
            meta = fn["metadata"]
            uid = meta.get("uid") or f"{meta['namespace']}/{meta['name']}"
            seen.add(uid)
            spec = fn.get("spec") or {}
            scale = int((spec.get("labels") or {}).get(_SCALE_MIN, 1))
            digest = _digest(spec, _drop_openfaas_scale)
            dep = self.functions.get(uid)
            if meta.get("deletionTimestamp"):
                scale = 0
            if dep is None or dep.digest != digest:
                if dep is not None:
                    dep.retire()
                    self.retired.append(dep)
                number = 1 if dep is None else dep.number + 1
                dep = self.functions[uid] = _FunctionDeployment(self.kubelet, fn, digest, number)
            dep.scale_to(scale)
        for uid, dep in self.functions.items():
            if uid not in seen:
                dep.retire()
        self.retired = _stopping(self.retired)


def _drop_openfaas_scale(spec: Manifest) -> None:
    labels = spec.get("labels") or {}
    for key in list(labels):
        if key.startswith("com.openfaas.scale."):
            del labels[key]


class _FunctionDeployment(_Copies):
    def __init__(self, kubelet: Kubelet, fn: Manifest, digest: str, number: int) -> None:
        meta, spec = fn["metadata"], fn.get("spec") or {}
        function = spec.get("name") or meta["name"]
        environment = {str(k): str(v) for k, v in (spec.get("environment") or {}).items()}
        super().__init__(
            kubelet, f"openfaas {meta['namespace']}/{function}", meta["namespace"], f"{function}-{digest[:5]}",
            capacity=int(environment.get("max_inflight") or 0), sandbox_root=kubelet.root / "openfaas", probe_path="/_/health",
        )
        self.function = function
        self.spec = spec
        self.environment = environment
        self.digest = digest
        self.number = number
        self.gone = False
        self.timeout = go_duration(environment.get("exec_timeout") or environment.get("write_timeout"), 300.0)

    def retire(self) -> None:
        self.gone = True
        self.scale_to(0)

    def copy_pod(self, index: int) -> Manifest:
        container: Manifest = {
            "name": self.function,
            "image": self.spec.get("image", ""),
            "env": [{"name": k, "value": v} for k, v in self.environment.items()],
            "ports": [{"containerPort": OPENFAAS_PORT, "protocol": "TCP"}],
            "volumeMounts": [],
        }
        volumes: list[Manifest] = []
        if self.spec.get("secrets"):
            volume = f"{self.function}-projected-secrets"
            volumes.append({"name": volume, "projected": {"sources": [{"secret": {"name": s}} for s in self.spec["secrets"]]}})
            container["volumeMounts"].append({"name": volume, "mountPath": OPENFAAS_SECRETS_DIR, "readOnly": True})
        if self.spec.get("readOnlyRootFilesystem"):
            volumes.append({"name": "temp", "emptyDir": {}})
            container["volumeMounts"].append({"name": "temp", "mountPath": "/tmp"})
        labels = {"faas_function": self.function, **{str(k): str(v) for k, v in (self.spec.get("labels") or {}).items()}}
        return {
            "metadata": {"name": f"{self.name}-{index}", "namespace": self.namespace, "uid": str(uuid.uuid4()), "labels": labels},
            "spec": {
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": int(self.timeout) + 2,
                "containers": [container],
                "volumes": volumes,
            },
        }


class OpenFaaSGateway(Proxy):
    """The gateway: /function/NAME[.NS][/PATH] goes to PATH (default /) on an idle copy of function NAME.

    NS defaults to the functions namespace. An idle copy has fewer requests
    in flight than its Function's `max_inflight` (any ready copy without
    one); the gateway waits for one up to the Function's exec_timeout. An
    unknown function answers 404.
    """

    def __init__(self, kubelet: Kubelet, openfaas: OpenFaaS, functions_namespace: str) -> None:
        super().__init__(kubelet)
        self.openfaas = openfaas
        self.functions_namespace = functions_namespace

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        match = re.fullmatch(r"/function/(?P<fn>[^/?#]+)(?P<rest>/[^?#]*)?", request.path)
        if match is None:
            return web.Response(status=404, text=f"no route for {request.path}: the gateway serves /function/NAME[.NAMESPACE]\n")
        name, _, namespace = match["fn"].partition(".")
        namespace = namespace or self.functions_namespace
        path_qs = (match["rest"] or "/") + (f"?{request.query_string}" if request.query_string else "")
        deployment = self.openfaas.deployment(namespace, name)
        if deployment is None:
            self.handled.append(Handled(f"{name}.{namespace}", request.method, path_qs, None, 404))
            return web.Response(status=404, text=f"error finding function {name}.{namespace}: not found\n")

        def backends() -> list[Backend]:
            current = self.openfaas.deployment(namespace, name)
            return current.backends if current is not None else []

        return await self.forward(request, f"{name}.{namespace}", backends, path_qs, deployment.timeout)
