"""A local Kubernetes test cluster: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
loopback, three fake Nodes, and the test kubelet (`devtools.cluster.kubelet`) running the pods bound to them.

The binaries come from Debian's `kubernetes` source package, built once by `devtools/cluster/build.sh` into a
cache folder (`~/.cache/conch-k8s`, docs/test-cluster.md). Everything a run writes lives in one state folder
(default `var/cluster/`): certificates, the admin kubeconfig (`kubeconfig`, absolute paths inside), etcd's data,
one log per component, the kubelet's container logs, and `pids/`, the record of every process started, which the
next start sweeps so that a crashed run leaves nothing behind.

Nodes (Kubernetes "Nodes"; GPU resources and labels as NVIDIA's device plugin and GPU Feature Discovery publish
them): `gpu-a` with 2 `nvidia.com/gpu` (NVIDIA-A10), `gpu-b` with 7 `nvidia.com/mig-1g.10gb`
(NVIDIA-A100-SXM4-40GB), both tainted `nvidia.com/gpu:NoSchedule`; `cpu-a` without GPUs.

Development tooling: used as a library (`Cluster(...).start()`) by the `kube_cluster` pytest fixture
(tests/kube/fixtures.py) and bench/reconcile.py, and in the foreground by `python -m devtools.cluster`
(`make cluster`, devtools/cluster/__main__.py).
"""

from __future__ import annotations

import base64
import ctypes
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"
DEFAULT_STATE_DIR = REPO_ROOT / "var" / "cluster"
NAMESPACE = "conch"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
CONTROLLERS = "deployment,replicaset,garbagecollector,namespace,horizontalpodautoscaling,disruption,job"
SERVICE_CIDR = "10.96.0.0/16"


@dataclass(frozen=True)
class FakeNode:
    """A Node object the test kubelet answers for: its name, GPU resources and GPU product label."""

    name: str
    gpu_resources: dict[str, int]
    product: str | None
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110


NODES: tuple[FakeNode, ...] = (
    FakeNode("gpu-a", {"nvidia.com/gpu": 2}, "NVIDIA-A10"),
    FakeNode("gpu-b", {"nvidia.com/mig-1g.10gb": 7}, "NVIDIA-A100-SXM4-40GB"),
    FakeNode("cpu-a", {}, None),
)


class ClusterError(RuntimeError):
    """The cluster could not be built or started; the message names the component and its log."""


# PR_SET_PDEATHSIG (linux/prctl.h): the child gets SIGKILL when the thread that started it dies, so a crashed
# parent leaves no component behind. Resolved here, in the parent: the child only makes the call.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """`preexec_fn` for children that must not outlive this process."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(start: int = 20000) -> int:
    """Return a TCP port >= `start` that nothing listens on at 127.0.0.1 (probed by binding it)."""
    for port in range(start + secrets.randbelow(20000), 65000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ClusterError(f"no free TCP port on 127.0.0.1 above {start}")


def ensure_binaries() -> Path:
    """Return the folder holding kube-apiserver, kube-controller-manager, kube-scheduler and etcd; build them first
    with `devtools/cluster/build.sh` when they are missing (~5 minutes, apt must be reachable). Raises ClusterError."""
    try:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
        )
    except OSError as exc:
        raise ClusterError(f"cannot run {BUILD_SCRIPT}: {exc}") from None
    folder = Path(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    if result.returncode != 0 or folder is None or not (folder / "kube-apiserver").is_file():
        raise ClusterError(
            f"{BUILD_SCRIPT} failed (exit code {result.returncode}); the Kubernetes binaries are built from "
            "Debian's source package and need apt-get with deb-src access (see docs/test-cluster.md)"
        )
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Certificates


def _write_key(path: Path, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _certificate(
    *, subject: str, public_key: Any, issuer: str, signing_key: Any, ca: bool, addresses: tuple[str, ...] = ()
) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if addresses:
        names: list[x509.GeneralName] = []
        for address in addresses:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(address)))
            except ValueError:
                names.append(x509.DNSName(address))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def ensure_certificates(folder: Path) -> None:
    """Write (once) a CA, the apiserver's and the kubelet's serving certificates, and the service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    if (folder / "sa.pub").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_pem = _certificate(
        subject="conch-test-ca", public_key=ca_key.public_key(), issuer="conch-test-ca", signing_key=ca_key, ca=True
    )
    (folder / "ca.crt").write_bytes(ca_pem)
    _write_key(folder / "ca.key", ca_key)
    issuer = x509.load_pem_x509_certificate(ca_pem).subject.rfc4514_string().removeprefix("CN=")
    serving = {
        "apiserver": (
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "10.96.0.1",
        ),
        "kubelet": ("127.0.0.1", "localhost", *(node.name for node in NODES)),
    }
    for name, addresses in serving.items():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = _certificate(
            subject=name, public_key=key.public_key(), issuer=issuer, signing_key=ca_key, ca=False, addresses=addresses
        )
        (folder / f"{name}.crt").write_bytes(pem)
        _write_key(folder / f"{name}.key", key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(folder / "sa.key", sa_key)
    (folder / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


# ----------------------------------------------------------------------------------------------------------------
# Processes


class Component:
    """One control-plane process: its command line, log file and pid record (`pids/<name>.json`)."""

    def __init__(self, name: str, argv: list[str], *, state_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = state_dir / "logs" / f"{name}.log"
        self.pid_path = state_dir / "pids" / f"{name}.json"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"# conch cluster: starting {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # out of reach of the terminal's Ctrl-C: stopped in order by us
                preexec_fn=die_with_parent,
                close_fds=True,
            )
        record_process(self.pid_path, self.process.pid)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, wait up to `timeout_s` seconds, then SIGKILL; wait for the exit."""
        if self.process is None:
            return
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.pid_path.unlink(missing_ok=True)
        self.process = None

    def failure(self, what: str) -> ClusterError:
        tail = self.log_path.read_text(errors="replace").splitlines()[-15:] if self.log_path.exists() else []
        return ClusterError(f"{self.name} {what}; log {self.log_path}:\n" + "\n".join(tail))


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def record_process(path: Path, pid: int) -> None:
    """Write `{pid, create_time}` of a process leading its own group, for `sweep_stale_processes`."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return
    path.write_text(json.dumps({"pid": pid, "create_time": created}))


def sweep_stale_processes(pid_dir: Path) -> None:
    """SIGKILL the process group of every recorded process that still runs (an earlier run that crashed)."""
    for record in sorted(pid_dir.glob("**/*.json")) if pid_dir.is_dir() else []:
        try:
            data = json.loads(record.read_text())
            proc = psutil.Process(int(data["pid"]))
            if abs(proc.create_time() - float(data["create_time"])) < 0.01:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
        except (psutil.Error, ValueError, KeyError, OSError):
            pass
        record.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------------------
# The cluster


class Cluster:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler, fake Nodes and the test kubelet.

    `start()` returns once the API server is ready, the Nodes exist and the kubelet watches; `stop()` stops all in
    order (kubelet and its containers, scheduler, controller-manager, apiserver, etcd). `fake_containers=True`
    makes the kubelet mark pods Running and Ready without starting anything. `backoff_base_s` is the kubelet's
    first crash-loop delay (10 s on a real kubelet); `probe_scale` multiplies every probe period. `nodes` replaces
    the default Nodes (e.g. bigger CPU nodes for a benchmark with hundreds of pods).
    """

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE_DIR,
        *,
        fake_containers: bool = False,
        backoff_base_s: float | None = None,
        probe_scale: float | None = None,
        bin_dir: Path | None = None,
        nodes: tuple[FakeNode, ...] = NODES,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.namespace = NAMESPACE
        self.kubeconfig_path = self.state_dir / "kubeconfig"
        self.fake_containers = fake_containers
        self.backoff_base_s = backoff_base_s
        self.probe_scale = probe_scale
        self.bin_dir = bin_dir
        self.nodes = nodes
        self.token = ""
        self.apiserver_port = 0
        self.kubelet: Any = None
        self._components: dict[str, Component] = {}

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    # -- life cycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything (see the class docstring). Raises ClusterError naming the component that failed."""
        bin_dir = self.bin_dir or ensure_binaries()
        sweep_stale_processes(self.state_dir / "pids")
        for transient in ("etcd", "logs", "kubelet"):
            shutil.rmtree(self.state_dir / transient, ignore_errors=True)
        certs = self.state_dir / "certs"
        ensure_certificates(certs)
        self.token = secrets.token_hex(16)
        (certs / "tokens.csv").write_text(f"{self.token},admin,admin-uid,system:masters\n")
        etcd_port, peer_port = free_port(), free_port()
        self.apiserver_port = free_port()
        self._write_kubeconfig(certs / "ca.crt")
        state = self.state_dir
        self._components = {
            "etcd": Component(
                "etcd",
                [
                    str(bin_dir / "etcd"),
                    "--name=conch",
                    f"--data-dir={state / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-cluster=conch=http://127.0.0.1:{peer_port}",
                    "--log-level=warn",
                ],
                state_dir=state,
            ),
            "kube-apiserver": Component(
                "kube-apiserver",
                [
                    str(bin_dir / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.apiserver_port}",
                    "--insecure-port=0",
                    f"--tls-cert-file={certs / 'apiserver.crt'}",
                    f"--tls-private-key-file={certs / 'apiserver.key'}",
                    f"--client-ca-file={certs / 'ca.crt'}",
                    f"--token-auth-file={certs / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-account-key-file={certs / 'sa.pub'}",
                    f"--service-account-signing-key-file={certs / 'sa.key'}",
                    "--disable-admission-plugins=ServiceAccount",
                    # Pod logs are proxied to the kubelet at the node's InternalIP and daemonEndpoints port.
                    "--kubelet-preferred-address-types=InternalIP",
                    "--profiling=false",
                ],
                state_dir=state,
            ),
            "kube-controller-manager": Component(
                "kube-controller-manager",
                [
                    str(bin_dir / "kube-controller-manager"),
                    f"--kubeconfig={self.kubeconfig_path}",
                    "--leader-elect=false",
                    "--port=0",
                    "--secure-port=0",
                    f"--controllers={CONTROLLERS}",
                    # Client-side rate limits of a test cluster: hundreds of Deployments at once in benchmarks.
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                    "--profiling=false",
                ],
                state_dir=state,
            ),
            "kube-scheduler": Component(
                "kube-scheduler",
                [
                    str(bin_dir / "kube-scheduler"),
                    f"--kubeconfig={self.kubeconfig_path}",
                    "--leader-elect=false",
                    "--port=0",
                    "--secure-port=0",
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                    "--profiling=false",
                ],
                state_dir=state,
            ),
        }
        try:
            self._components["etcd"].start()
            self._wait(self._components["etcd"], f"http://127.0.0.1:{etcd_port}/health", timeout_s=30)
            self.start_apiserver()
            self._components["kube-controller-manager"].start()
            self._components["kube-scheduler"].start()
            self._create_nodes()
            self._start_kubelet()
            for name in ("kube-controller-manager", "kube-scheduler"):
                if not self._components[name].running():
                    raise self._components[name].failure("exited during start-up")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the kubelet (and every container it runs), scheduler, controller-manager, apiserver, then etcd."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            component = self._components.get(name)
            if component is not None:
                component.stop()

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (clients then get connection refused) and wait for its exit.

        SIGTERM, then SIGKILL after 3 s: once it stopped listening, 1.20's graceful shutdown lingers longer than
        the 15 s a full stop allows, and what tests need is the server gone.
        """
        self._components["kube-apiserver"].stop(timeout_s=3.0)

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver on the same port and wait until `/readyz` answers ok."""
        component = self._components["kube-apiserver"]
        if component.running():
            return
        component.start()
        self._wait(component, f"{self.server_url}/readyz", timeout_s=60)

    def exited_components(self) -> list[Component]:
        """The control-plane processes that are not running (after `start()`: those that exited since)."""
        return [component for component in self._components.values() if not component.running()]

    # -- clients --------------------------------------------------------------------------------------------

    def api_client(self) -> Any:
        """Return a new `kubernetes.client.ApiClient` authenticated as the cluster admin."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig_path))

    def _write_kubeconfig(self, ca_path: Path) -> None:
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "conch-test",
                    # The CA inline (not a path): the kubeconfig works wherever it is copied or registered from.
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": base64.b64encode(ca_path.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [
                {"name": "conch-test", "context": {"cluster": "conch-test", "user": "admin", "namespace": NAMESPACE}}
            ],
            "current-context": "conch-test",
        }
        self.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: every kubeconfig reader accepts it.
        self.kubeconfig_path.write_text(json.dumps(document, indent=2) + "\n")
        self.kubeconfig_path.chmod(0o600)

    def _wait(self, component: Component, url: str, *, timeout_s: float) -> None:
        context = ssl.create_default_context(cafile=str(self.state_dir / "certs" / "ca.crt"))
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        deadline = time.monotonic() + timeout_s
        while True:
            if not component.running():
                raise component.failure("exited during start-up")
            try:
                with urllib.request.urlopen(request, timeout=2, context=context) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise component.failure(f"did not answer {url} within {timeout_s:g} s")
            time.sleep(0.2)

    def _create_nodes(self) -> None:
        from kubernetes import client

        with self.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            for node in self.nodes:
                labels = {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                }
                if node.product:
                    labels["nvidia.com/gpu.product"] = node.product
                core.create_node(
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels}}
                )
                # The TaintNodesByCondition admission plugin adds `node.kubernetes.io/not-ready`: a merge patch
                # replaces the whole list with the taints the node really has.
                core.patch_node(
                    node.name,
                    {"spec": {"taints": [GPU_TAINT] if node.gpu_resources else None}},
                    _content_type="application/merge-patch+json",
                )

    def node_status(self, node: FakeNode, kubelet_port: int) -> dict[str, Any]:
        """The `status` of a Node as its kubelet would report it: resources, Ready, address, kubelet port."""
        resources = {"cpu": node.cpu, "memory": node.memory, "pods": str(node.pods), "ephemeral-storage": "100Gi"}
        resources.update({name: str(count) for name, count in node.gpu_resources.items()})
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "conch test kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "nodeInfo": {
                "machineID": node.name,
                "systemUUID": node.name,
                "bootID": node.name,
                "kernelVersion": os.uname().release,
                "osImage": "conch test kubelet",
                "containerRuntimeVersion": "conch://0.1",
                "kubeletVersion": "v1.20.2",
                "kubeProxyVersion": "v1.20.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _start_kubelet(self) -> None:
        from devtools.cluster.kubelet import Kubelet

        self.kubelet = Kubelet(
            api_client_factory=self.api_client,
            node_names=[node.name for node in self.nodes],
            state_dir=self.state_dir / "kubelet",
            certificate=(self.state_dir / "certs" / "kubelet.crt", self.state_dir / "certs" / "kubelet.key"),
            fake_containers=self.fake_containers,
            backoff_base_s=self.backoff_base_s,
            probe_scale=self.probe_scale,
        )
        self.kubelet.start()
        from kubernetes import client

        with self.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            for node in self.nodes:
                core.patch_node_status(
                    node.name,
                    {"status": self.node_status(node, self.kubelet.port)},
                    _content_type="application/strategic-merge-patch+json",
                )
