"""TLS, mutual TLS and Prometheus metrics of the shared service runtime, with real certificates (openssl)
and a real server on a loopback port."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.wrappers_pb2 import StringValue
from runtime_test_service import SERVICE, DemoServicer, DemoSettings, add_demo_servicer

from orchard.runtime import GrpcServer
from orchard.runtime.settings import SettingsError, load_settings

pytestmark = pytest.mark.timeout(60)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=orchard-test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
    )
    for name, san in (("server", "DNS:localhost,IP:127.0.0.1"), ("client", "DNS:client")):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
        )
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(d / f"{name}.ext"),
            "-out",
            str(d / f"{name}.pem"),
        )
    return d


@pytest.fixture
async def servers() -> AsyncIterator[list[GrpcServer]]:
    started: list[GrpcServer] = []
    yield started
    for server in started:
        await server.stop()


async def _start(servers: list[GrpcServer], **settings: object) -> GrpcServer:
    server = GrpcServer(DemoSettings(**{"grace_period_s": 0.5, **settings}), name="demo")  # type: ignore[arg-type]
    server.add_service(add_demo_servicer, DemoServicer(), SERVICE)
    await server.start()
    servers.append(server)
    return server


async def _echo(channel: grpc.aio.Channel, value: str) -> str:
    call = channel.unary_unary(f"/{SERVICE}/Echo", StringValue.SerializeToString, StringValue.FromString)
    return (await call(StringValue(value=value), timeout=5)).value  # type: ignore[no-any-return]


def _creds(pki: Path, *, client_cert: bool) -> grpc.ChannelCredentials:
    if client_cert:
        return grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(), (pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes()
        )
    return grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())


async def test_tls(pki: Path, servers: list[GrpcServer]) -> None:
    """With a certificate and key the port speaks TLS: a TLS client gets through, a plaintext one does not."""
    server = await _start(servers, tls_cert_file=pki / "server.pem", tls_key_file=pki / "server.key")
    async with grpc.aio.secure_channel(f"localhost:{server.port}", _creds(pki, client_cert=False)) as channel:
        assert await _echo(channel, "hello") == "hello"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as plain:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _echo(plain, "hello")
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls(pki: Path, servers: list[GrpcServer]) -> None:
    """With a client CA, only clients presenting a certificate it signed get through."""
    server = await _start(
        servers, tls_cert_file=pki / "server.pem", tls_key_file=pki / "server.key", tls_client_ca_file=pki / "ca.pem"
    )
    async with grpc.aio.secure_channel(f"localhost:{server.port}", _creds(pki, client_cert=True)) as channel:
        assert await _echo(channel, "mutual") == "mutual"
    async with grpc.aio.secure_channel(f"localhost:{server.port}", _creds(pki, client_cert=False)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _echo(channel, "no cert")
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert-file", "/nonexistent.pem", "--tls-key-file", "/nonexistent.key"], "does not exist"),
        (["--tls-client-ca-file", "/etc/hostname"], "needs tls_cert_file"),
    ],
)
def test_tls_settings_are_checked(flags: list[str], message: str) -> None:
    """Half-configured or missing TLS files are refused at start-up with a message naming the problem."""
    with pytest.raises(SettingsError, match=message):
        load_settings(DemoSettings, flags)


async def test_metrics_endpoint(servers: list[GrpcServer]) -> None:
    """/metrics serves Prometheus text with per-method RPC counts and latency histograms."""
    server = await _start(servers, metrics_port=0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for _ in range(3):
            await _echo(channel, "counted")
        with pytest.raises(grpc.aio.AioRpcError):
            await _echo(channel, "not_found")
    assert server.metrics_port is not None
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    method = f"/{SERVICE}/Echo"
    ok = f'orchard_rpcs_total{{code="OK",method="{method}",service="demo"}}'
    missing = f'orchard_rpcs_total{{code="NOT_FOUND",method="{method}",service="demo"}}'
    assert any(line.startswith(ok) and float(line.split()[-1]) >= 3 for line in body.splitlines())
    assert any(line.startswith(missing) for line in body.splitlines())
    assert "orchard_rpc_duration_seconds_bucket" in body


async def test_sdk_over_mutual_tls(pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reaches an env service that requires mutual TLS, given the CA and a client certificate."""
    from orchard import AsyncSandboxClient
    from orchard.services.env.server import build
    from orchard.services.env.settings import EnvSettings

    settings = EnvSettings(
        port=0,
        state_dir=tmp_path / "state",
        log_format="text",
        tls_cert_file=pki / "server.pem",
        tls_key_file=pki / "server.key",
        tls_client_ca_file=pki / "ca.pem",
    )
    server, _ = await build(settings)
    port = await server.start()
    try:
        monkeypatch.setenv("ORCHARD_TLS_CA_FILE", str(pki / "ca.pem"))
        monkeypatch.setenv("ORCHARD_TLS_CERT_FILE", str(pki / "client.pem"))
        monkeypatch.setenv("ORCHARD_TLS_KEY_FILE", str(pki / "client.key"))
        async with AsyncSandboxClient(target=f"https://localhost:{port}") as client:
            async with await client.create_sandbox("host") as sandbox:
                assert (await sandbox.exec("echo over-tls")).stdout == "over-tls\n"
    finally:
        await server.stop()
