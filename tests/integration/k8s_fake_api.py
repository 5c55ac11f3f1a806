"""A FAKE Kubernetes API server for the kubernetes backend's tests: no cluster can run on the test machine.

It serves, over real HTTP to the real `kubernetes` client, the few endpoints the backend uses: Pods (list, watch
with resourceVersion, create, patch, delete) and NetworkPolicies (list, create, patch, delete) of any namespace.
Every object created, replaced or patched is checked with kubernetes-validate (strict, Kubernetes 1.37) and
refused with 422 like an API server would. A created Pod "runs": its sandbox container's command starts as a
host process (the agent binary standing in for the emptyDir copy, $(VAR)s expanded, status.podIP = a loopback
address of its own), and watch events report it Pending, then Running with its IP and Ready once the agent
listens, then Failed if the process dies. No images, no kubelet, no network policy enforcement: sandbox
commands run on this host's filesystem, unless the fake is given a `rootfs`: then each pod's container runs in
bubblewrap on an overlay of its own over that root filesystem (as a container runtime gives a container a
writable layer over its image), its agent bound in at /.orchard/bin (a mount of its own, as the emptyDir is),
still in the host's network namespace (its loopback "Pod IP"); that needs root.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

K8S_VERSION = "1.37.0"
AGENT_IN_POD = "/.orchard/bin/orchard-agent"
ROUTE = re.compile(r"^/(?:api/v1|apis/networking\.k8s\.io/v1)/namespaces/([^/]+)/(pods|networkpolicies)(?:/([^/]+))?$")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether a label selector (k=v, k!=v, k, !k; comma-separated) matches labels."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902, the "replace" and "add" operations on object members (all the backend sends)."""
    result = copy.deepcopy(target)
    for op in ops:
        assert op["op"] in ("replace", "add"), op
        *parents, last = op["path"].lstrip("/").split("/")
        node = result
        for key in parents:
            node = node[key]
        node[last] = op["value"]
    return result


class FakeKubernetes:
    """The fake API's state and the host processes standing in for pods' containers."""

    def __init__(self, agent_path: Path, log_dir: Path, rootfs: Path | None = None) -> None:
        self.agent_path = agent_path
        self.log_dir = log_dir
        self.rootfs = rootfs
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, namespace, name) -> object
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # pods: (rv, namespace, type, object)
        self.oldest_rv = 0  # watches from before this get 410 Gone
        self.requests: list[tuple[str, str]] = []  # (method, path?query) of every call, for tests
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._rv = itertools.count(1)
        self._watch_epoch = 0  # bumped to end every open watch
        self._cond = threading.Condition()
        base = f"127.{random.randint(64, 250)}.{random.randint(0, 250)}"
        self._free_ips = [f"{base}.{n}" for n in range(2, 250)]
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Path, namespace: str) -> Path:
        """Write a kubeconfig that points the client here; returns path."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "preferences": {},
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
                    ],
                }
            )
        )
        return path

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._watch_epoch += 1
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        for key in list(self.procs):
            self._kill(key)

    # ---- what tests look at or do ----

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        with self._cond:
            return [
                copy.deepcopy(o)
                for (res, ns, _), o in self.objects.items()
                if res == "pods" and ns == namespace and selects(selector, o["metadata"].get("labels") or {})
            ]

    def policies(self, namespace: str) -> dict[str, dict[str, Any]]:
        with self._cond:
            return {
                name: copy.deepcopy(o)
                for (res, ns, name), o in self.objects.items()
                if res == "networkpolicies" and ns == namespace
            }

    def seed(self, resource: str, obj: dict[str, Any]) -> None:
        """Store an object as if an earlier process had made it (a pod is not started)."""
        with self._cond:
            self._store(resource, obj["metadata"]["namespace"], obj, "ADDED")

    def end_watches(self) -> None:
        """End every open watch, as an API server does at its timeout; clients resume from their version."""
        with self._cond:
            self._watch_epoch += 1
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget the event history: resuming a watch from an older version gets 410 Gone, then a relist."""
        with self._cond:
            self.oldest_rv = next(self._rv)
            self.events.clear()
            self._watch_epoch += 1
            self._cond.notify_all()

    def kill_container(self, namespace: str, name: str) -> None:
        """SIGKILL a pod's container process, as the OOM killer would."""
        proc = self.procs.get((namespace, name))
        if proc is not None:
            proc.kill()

    def evict(self, namespace: str, name: str, message: str) -> None:
        """End a pod as the kubelet's eviction does: phase Failed, reason Evicted, a DisruptionTarget condition, its
        container terminated (exit code 137); the pod object stays."""
        with self._cond:
            pod = self.objects[("pods", namespace, name)]
            status = copy.deepcopy(pod.get("status") or {})
        now = _now()
        status.update(phase="Failed", reason="Evicted", message=message)
        status["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": message}
        ]
        for cs in status.get("containerStatuses") or []:
            cs.update(ready=False, state={"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}})
        self._kill((namespace, name))
        self._set_status(namespace, name, status)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod behind its owner's back (another client, a lost node's taint manager)."""
        with self._cond:
            obj = self.objects[("pods", namespace, name)]
            obj["metadata"]["deletionTimestamp"] = _now()
            self._store("pods", namespace, obj, "DELETED")
        self._kill((namespace, name))

    # ---- the store (hold self._cond) ----

    def _store(self, resource: str, namespace: str, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        rv = next(self._rv)
        meta = obj.setdefault("metadata", {})
        meta.update(namespace=namespace, resourceVersion=str(rv))
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        if kind == "DELETED":
            self.objects.pop((resource, namespace, meta["name"]), None)
        else:
            self.objects[resource, namespace, meta["name"]] = obj
        if resource == "pods":
            self.events.append((rv, namespace, kind, copy.deepcopy(obj)))
            self._cond.notify_all()
        return obj

    def _set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        with self._cond:
            pod = self.objects.get(("pods", namespace, name))
            if pod is not None:
                pod["status"] = status
                self._store("pods", namespace, pod, "MODIFIED")

    # ---- pods' containers as host processes ----

    def _run_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]
        with self._cond:
            ip = self._free_ips.pop(0)
        env: dict[str, str] = {}
        for var in container.get("env", []):
            if "valueFrom" in var:
                assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", var
                env[var["name"]] = ip
            else:
                env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), var["value"])
        argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), a) for a in container["command"]]
        assert argv[0] == AGENT_IN_POD, argv
        workdir = container.get("workingDir", "/")
        cwd = workdir
        if self.rootfs is None:
            argv[0] = str(self.agent_path)
            os.makedirs(workdir, exist_ok=True)  # as the container runtime does
        else:
            argv, cwd = self._rooted(name, argv, workdir), "/"
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        self.procs[namespace, name] = proc
        port = container["ports"][0]["containerPort"]
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection((ip, port), timeout=1).close()  # the agent drops a silent peer
                break
            except OSError:
                time.sleep(0.005)
        started = _now()
        self._set_status(
            namespace,
            name,
            {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "startTime": started,
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": started}},
                    }
                ],
            },
        )
        code = proc.wait()
        self._unmount(name)
        with self._cond:
            self._free_ips.append(ip)
            pod_now = self.objects.get(("pods", namespace, name))
            if pod_now is None or self.procs.get((namespace, name)) is not proc:
                return  # deleted
        reason = "OOMKilled" if code == -signal.SIGKILL else ("Completed" if code == 0 else "Error")
        self._set_status(
            namespace,
            name,
            {
                "phase": "Failed" if code else "Succeeded",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": started,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": 137 if code < 0 else code,
                                "reason": reason,
                                "startedAt": started,
                                "finishedAt": _now(),
                            }
                        },
                    }
                ],
            },
        )

    def _rooted(self, name: str, argv: list[str], workdir: str) -> list[str]:
        """bwrap argv running argv on a fresh overlay of self.rootfs (the pod's writable layer)."""
        assert self.rootfs is not None
        top = self.log_dir / "pods" / name
        for part in ("upper", "work", "root"):
            (top / part).mkdir(parents=True)
        options = f"lowerdir={self.rootfs},upperdir={top / 'upper'},workdir={top / 'work'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(top / "root")], check=True)
        (top / "root" / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)  # as the container runtime does
        # A new PID namespace with bwrap's reaper as its init: killing bwrap (--die-with-parent) ends every
        # process of the "container", as a runtime ends a container's.
        return [
            *("bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"),
            *("--bind", str(top / "root"), "/", "--proc", "/proc", "--dev", "/dev"),
            *("--ro-bind", str(self.agent_path), AGENT_IN_POD, "--chdir", workdir, "--", AGENT_IN_POD, *argv[1:]),
        ]

    def _unmount(self, name: str) -> None:
        root = self.log_dir / "pods" / name / "root"
        if self.rootfs is not None and root.exists():
            subprocess.run(["umount", "-l", str(root)], check=False, capture_output=True)

    def _kill(self, key: tuple[str, str]) -> None:
        proc = self.procs.pop(key, None)
        if proc is not None and self.rootfs is not None:
            proc.kill()  # bwrap passes no SIGTERM on; the kernel ends its PID namespace with it
            proc.wait()
            self._unmount(key[1])
            return
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the agent kills its commands and exits
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    # ---- HTTP ----

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # watches stream chunked, as the API server's do
            disable_nagle_algorithm = True  # as Go's net/http: no 40 ms delayed-ACK stall between header and body

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"null")

            def _route(self) -> tuple[str, str, str | None, dict[str, str]] | None:
                url = urlparse(self.path)
                fake.requests.append((self.command, self.path))
                found = ROUTE.match(url.path)
                if found is None:
                    self._reply(404, _status(404, "NotFound", f"the fake serves no {url.path}"))
                    return None
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                return found[2], found[1], found[3], query

            def do_GET(self) -> None:
                routed = self._route()
                if routed is None:
                    return
                resource, ns, name, query = routed
                if name is not None:
                    with fake._cond:
                        obj = fake.objects.get((resource, ns, name))
                    if obj is None:
                        return self._reply(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
                    return self._reply(200, obj)
                # As the API server's strconv.ParseBool: clients send "true" or (Python's) "True".
                if query.get("watch", "").lower() in ("1", "t", "true"):
                    return self._watch(ns, query)
                selector = query.get("labelSelector", "")
                with fake._cond:
                    items = [
                        copy.deepcopy(o)
                        for (res, n, _), o in fake.objects.items()
                        if res == resource and n == ns and selects(selector, o["metadata"].get("labels") or {})
                    ]
                    version = str(next(fake._rv))
                kind, api = ("PodList", "v1") if resource == "pods" else ("NetworkPolicyList", "networking.k8s.io/v1")
                self._reply(
                    200, {"kind": kind, "apiVersion": api, "metadata": {"resourceVersion": version}, "items": items}
                )

            def _watch(self, ns: str, query: dict[str, str]) -> None:
                selector, since = query.get("labelSelector", ""), int(query.get("resourceVersion") or 0)
                deadline = time.monotonic() + int(query.get("timeoutSeconds", "300"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.close_connection = True

                def chunk(data: bytes) -> None:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                try:
                    self._events(ns, selector, since, deadline, chunk)
                    chunk(b"")  # the end of the stream
                except OSError:
                    pass  # the client went away

            def _events(self, ns: str, selector: str, since: int, deadline: float, chunk: Any) -> None:
                with fake._cond:
                    epoch = fake._watch_epoch
                    if since < fake.oldest_rv:
                        gone = _status(410, "Expired", f"too old resource version: {since} ({fake.oldest_rv})")
                        chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                        return
                while True:
                    with fake._cond:
                        while True:
                            if fake._watch_epoch != epoch or time.monotonic() > deadline:
                                return
                            new = [
                                (rv, kind, obj)
                                for rv, n, kind, obj in fake.events
                                if rv > since and n == ns and selects(selector, obj["metadata"].get("labels") or {})
                            ]
                            if new:
                                break
                            fake._cond.wait(0.5)
                    since = new[-1][0]
                    chunk(b"".join(json.dumps({"type": k, "object": o}).encode() + b"\n" for _, k, o in new))

            def _invalid(self, obj: dict[str, Any]) -> bool:
                try:
                    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
                except kubernetes_validate.ValidationError as err:
                    self._reply(422, _status(422, "Invalid", f"kubernetes-validate: {err}"))
                    return True
                return False

            def do_POST(self) -> None:
                routed = self._route()
                if routed is None:
                    return
                resource, ns, _, _ = routed
                obj = self._body()
                if self._invalid(obj):
                    return
                name = obj["metadata"]["name"]
                with fake._cond:
                    if (resource, ns, name) in fake.objects:
                        return self._reply(409, _status(409, "AlreadyExists", f'{resource} "{name}" already exists'))
                    if resource == "pods":
                        obj["status"] = {"phase": "Pending"}
                    stored = copy.deepcopy(fake._store(resource, ns, obj, "ADDED"))
                if resource == "pods":
                    threading.Thread(target=fake._run_pod, args=(ns, copy.deepcopy(stored)), daemon=True).start()
                self._reply(201, stored)

            def do_PUT(self) -> None:
                routed = self._route()
                if routed is None:
                    return
                resource, ns, name, _ = routed
                obj = self._body()
                if self._invalid(obj):
                    return
                with fake._cond:
                    if (resource, ns, name) not in fake.objects:
                        return self._reply(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
                    stored = copy.deepcopy(fake._store(resource, ns, obj, "MODIFIED"))
                self._reply(200, stored)

            def do_PATCH(self) -> None:
                routed = self._route()
                if routed is None:
                    return
                resource, ns, name, _ = routed
                kind = self.headers.get("Content-Type")
                if kind not in ("application/merge-patch+json", "application/json-patch+json"):
                    return self._reply(415, _status(415, "UnsupportedMediaType", f"the fake takes no {kind}"))
                patch = self._body()
                with fake._cond:
                    current = None if name is None else fake.objects.get((resource, ns, name))
                    if current is None:
                        return self._reply(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
                    patched = (
                        merge_patch(current, patch)
                        if kind == "application/merge-patch+json"
                        else json_patch(current, patch)
                    )
                    if self._invalid({k: v for k, v in patched.items() if k != "status"}):
                        return
                    stored = copy.deepcopy(fake._store(resource, ns, patched, "MODIFIED"))
                self._reply(200, stored)

            def do_DELETE(self) -> None:
                routed = self._route()
                if routed is None:
                    return
                resource, ns, name, _ = routed
                with fake._cond:
                    obj = None if name is None else fake.objects.get((resource, ns, name))
                    if name is None or obj is None:
                        return self._reply(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
                    obj["metadata"]["deletionTimestamp"] = _now()
                    stored = copy.deepcopy(fake._store(resource, ns, obj, "DELETED"))
                if resource == "pods":
                    fake._kill((ns, name))
                self._reply(200, stored)

        return Handler
