"""A private, Docker-compatible container engine for tests: `podman system service` with runc, cgroupfs, its own
config and storage under a short tmp folder (the comments below say why each setting is there), and images built
or imported locally (nothing can be pulled from a registry here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

# Why each setting: crun (Debian's default) refuses cgroups in hybrid mode; podman asks for nofile 1048576, which
# root cannot raise past its hard limit without CAP_SYS_RESOURCE (runc then fails setting rlimits); cgroupfs and a
# file events log because there is no systemd; exit_command_delay 5 s, since the default 300 s keeps two conmon
# processes alive per exec for five minutes.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
exit_command_delay = 5
tmp_dir = "{w}/tmp"
[engine.runtimes]
runc = ["{runc}"]
{extra_runtimes}"""

# gVisor as the engine's "runsc" runtime. Debian's runsc (2022) runs here on the ptrace platform only (kvm hangs,
# systrap is newer), with its own network stack off (sandboxes have no network anyway: network_mode none), and
# --host-uds=create: the agent's socket in its bind-mounted run folder must be one the host can connect to.
RUNSC_WRAPPER = """#!/bin/sh
exec {runsc} --platform=ptrace --network=none --host-uds=create "$@"
"""

STORAGE_CONF = """\
[storage]
driver = "overlay"
runroot = "{w}/runroot"
graphroot = "{w}/root"
"""

# The host's CA bundle, handed to image builds as a secret: pip in a build behind a TLS-intercepting proxy
# (as on this machine) trusts what the host trusts.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def skip_unless_podman() -> str:
    """The runc path, or skip the test with the reason podman cannot run here."""
    if os.geteuid() != 0:
        pytest.skip("the podman engine tests run podman as root")
    runc = shutil.which("runc")
    if shutil.which("podman") is None or runc is None:
        pytest.skip("podman and runc are not installed: apt-get install podman runc (scripts/install.sh does)")
    return runc


class PodmanEngine:
    """One `podman system service` on a unix socket; `host` is its DOCKER_HOST address."""

    def __init__(self, runc: str) -> None:
        # A short folder: unix socket paths under it must fit in sockaddr_un.
        self.dir = Path(
            subprocess.run(
                ["mktemp", "-d", "/tmp/orchard-podman.XXXXXX"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        (self.dir / "tmp").mkdir()
        runsc = shutil.which("runsc")
        extra = ""
        if runsc is not None:  # sandboxes with ISOLATION_GVISOR run on it
            wrapper = self.dir / "runsc-ptrace"
            wrapper.write_text(RUNSC_WRAPPER.format(runsc=runsc))
            wrapper.chmod(0o755)
            extra = f'runsc = ["{wrapper}"]\n'
        self.gvisor = runsc is not None
        (self.dir / "containers.conf").write_text(CONTAINERS_CONF.format(w=self.dir, runc=runc, extra_runtimes=extra))
        (self.dir / "storage.conf").write_text(STORAGE_CONF.format(w=self.dir))
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(self.dir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.dir / "storage.conf"),
        }
        self.socket = self.dir / "podman.sock"
        self.host = f"unix://{self.socket}"
        self._services = [self._serve(self.socket)]
        self._gvisor_host: str | None = None

    def _serve(self, socket: Path, *flags: str) -> subprocess.Popen[bytes]:
        service = subprocess.Popen(
            ["podman", *flags, "system", "service", "--time=0", f"unix://{socket}"],
            env=self.env,
            cwd=self.dir,  # conmon writes an `oom` file into its working dir when an exec is OOM-killed
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while not socket.exists():
            if service.poll() is not None:
                raise RuntimeError(f"podman system service failed: {service.stderr.read()!r}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise RuntimeError("podman system service did not listen within 10 s")
            time.sleep(0.02)
        return service

    @property
    def gvisor_host(self) -> str:
        """A second API service on the same storage whose containers all run on gVisor (podman's compat API ignores
        a per-container runtime); started on first use."""
        assert self.gvisor, "runsc is not installed"
        if self._gvisor_host is None:
            socket = self.dir / "gvisor.sock"
            self._services.append(self._serve(socket, "--runtime", "runsc"))
            self._gvisor_host = f"unix://{socket}"
        return self._gvisor_host

    def podman(
        self, *args: str, timeout: float = 120, input_bytes: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        """Run the podman CLI on this engine's config and storage."""
        out = subprocess.run(
            ["podman", *args], env=self.env, input=input_bytes, capture_output=True, timeout=timeout, check=False
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} failed ({out.returncode}): {out.stderr.decode(errors='replace')[-3000:]}"
            )
        return out

    def import_rootfs(self, rootfs: Path, ref: str, *changes: str) -> None:
        """Import a root filesystem folder as image `ref` (tar piped to `podman import`)."""
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            flags = [arg for change in changes for arg in ("--change", change)]
            out = subprocess.run(
                ["podman", "import", *flags, "-", ref],
                env=self.env,
                stdin=tar.stdout,
                capture_output=True,
                timeout=300,
                check=False,
            )
        finally:
            tar.stdout.close()  # type: ignore[union-attr]
            tar.wait()
        assert out.returncode == 0, f"podman import {ref} failed: {out.stderr.decode(errors='replace')[-2000:]}"

    def import_over(self, base_ref: str, base_rootfs: Path, rootfs: Path, ref: str) -> None:
        """Import rootfs as image `ref` built on base_ref (imported from base_rootfs): only the paths rootfs adds or
        changes (by size, mtime and mode) are copied, as a layer committed over the base; several times faster than
        importing a whole root filesystem (nothing it lacks is removed: rootfs must be a superset, as an image
        built FROM the base is)."""
        paths = []
        for top, dirs, files in os.walk(rootfs):
            for name in dirs + files:
                rel = os.path.relpath(os.path.join(top, name), rootfs)
                ours = os.lstat(rootfs / rel)
                try:
                    theirs = os.lstat(base_rootfs / rel)
                except FileNotFoundError:
                    paths.append(rel)
                    continue
                if (theirs.st_size, int(theirs.st_mtime), theirs.st_mode) != (
                    ours.st_size,
                    int(ours.st_mtime),
                    ours.st_mode,
                ):
                    paths.append(rel)
        container = self.podman("create", base_ref, "/bin/true").stdout.decode().strip()
        try:
            listing = self.dir / f"import-{container[:12]}.list"
            listing.write_bytes("".join(f"./{p}\0" for p in paths).encode())
            tar = subprocess.Popen(
                ["tar", "-C", str(rootfs), "--null", "--no-recursion", "-T", str(listing), "-c"],
                stdout=subprocess.PIPE,
            )
            out = subprocess.run(
                ["podman", "cp", "-", f"{container}:/"],
                env=self.env,
                stdin=tar.stdout,
                capture_output=True,
                timeout=300,
                check=False,
            )
            tar.stdout.close()  # type: ignore[union-attr]
            tar.wait()
            assert out.returncode == 0, f"podman cp into {ref} failed: {out.stderr.decode(errors='replace')[-2000:]}"
            self.podman("commit", container, ref)
        finally:
            self.podman("rm", "-f", container)

    def build(
        self, context: Path, dockerfile: Path, tag: str, *, target: str = "", timeout: float = 900, **build_args: str
    ) -> None:
        """Build an image from a Dockerfile on the host network (pip and apt reach their registries)."""
        args = ["build", "--format", "docker", "--network", "host", "-f", str(dockerfile), "-t", tag]
        if target:
            args += ["--target", target]
        if HOST_CA_BUNDLE.is_file():
            args += ["--secret", f"id=ca_bundle,src={HOST_CA_BUNDLE}"]
        for name, value in build_args.items():
            args += ["--build-arg", f"{name}={value}"]
        self.podman(*args, str(context), timeout=timeout)

    def close(self) -> None:
        """Remove every container, stop the service and delete the storage."""
        self.podman("rm", "--all", "--force", "--time", "0", timeout=60, check=False)
        for service in self._services:
            service.terminate()
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        # The storage's overlay mounts go with the storage.
        self.podman("system", "reset", "--force", timeout=120, check=False)
        subprocess.run(["umount", "-R", str(self.dir / "root" / "overlay")], capture_output=True, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
