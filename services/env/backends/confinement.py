"""What a `local` sandbox may not touch even as root inside: read-only and masked /proc paths (runc's defaults)
and a default seccomp filter, compiled with libseccomp, that bubblewrap loads before the agent starts.

Root in a `local` sandbox is the host's uid 0 with every capability dropped. Capabilities do not guard most
sysctls (a plain write to /proc/sys/kernel/core_pattern needs only uid 0), keyrings are not namespaced, and a new
user namespace hands back capabilities: those are what this module closes. The docker and kubernetes backends
get the same from their container runtime's defaults (never privileged, RuntimeDefault seccomp).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import FailedPrecondition

READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
"""runc's default read-only paths: the kernel's knobs stay readable, no write reaches the host."""
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/kallsyms",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
"""runc's default masked paths (plus /proc/kallsyms and /proc/key-users): files read as /dev/null, folders as an
empty read-only
tmpfs. They tell a sandbox about the host's hardware, kernel memory and other users' keys."""

DENIED_SYSCALLS = (
    # keyrings are global to the kernel, not per sandbox
    "add_key",
    "keyctl",
    "request_key",
    # mounts and the root: a sandbox's view of the filesystem is fixed when it starts
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # other namespaces: joining one (setns); making one is refused by the flag rules below
    "setns",
    # the kernel itself: modules, kexec, BPF, perf, reboot, swap, clocks, accounting, quotas, the kernel log
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "reboot",
    "swapon",
    "swapoff",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "lookup_dcookie",
    "nfsservctl",
    "sysfs",
    "_sysctl",
    "uselib",
    "ustat",
    "get_kernel_syms",
    "query_module",
    "vm86",
    "vm86old",
    "iopl",
    "ioperm",
    # primitives of many kernel exploits, unneeded by ordinary programs
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "kcmp",
)
"""Syscalls every sandbox gets EPERM for: Docker's default profile refuses each of them to a container without
CAP_SYS_ADMIN and friends. Everything else is allowed (a deny list, so compilers, interpreters and test runners run
unchanged); calls made for another architecture (32-bit int 0x80 on x86_64) kill the process."""

NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
"""clone() and unshare() with any of these flags get EPERM: a new user namespace would give a sandbox back every
capability inside it (and with them mount, a new network stack, ...)."""

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_MASKED_EQ = 7


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class Confinement:
    """The bubblewrap arguments of the /proc masks, and the compiled seccomp filter."""

    bwrap_args: tuple[str, ...]
    seccomp_bpf: bytes


def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise FailedPrecondition(
            "libseccomp is not installed: the local backend compiles its sandboxes' seccomp "
            "filter with it; run scripts/install.sh or `apt-get install libseccomp2`"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def compile_seccomp() -> bytes:
    """The default filter as a BPF program for the native architecture (what `bwrap --seccomp FD` loads)."""
    lib = _libseccomp()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise FailedPrecondition("libseccomp could not make a filter (seccomp_init failed)")
    eperm = _ACT_ERRNO | errno.EPERM
    try:

        def add(name: str, action: int, *args: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return  # not a syscall of this architecture (vm86 on x86_64 and the like)
            array = (_ArgCmp * len(args))(*args) if args else None
            if rc := lib.seccomp_rule_add_array(ctx, action, nr, len(args), array):
                raise FailedPrecondition(f"libseccomp refused the rule for {name}: {os.strerror(-rc)}")

        for name in DENIED_SYSCALLS:
            add(name, eperm)
        for flag in NAMESPACE_FLAGS.values():
            add("unshare", eperm, _ArgCmp(0, _CMP_MASKED_EQ, flag, flag))
            add("clone", eperm, _ArgCmp(0, _CMP_MASKED_EQ, flag, flag))  # x86_64, arm64: flags are argument 0
        # clone3 passes its flags in a struct a filter cannot read: ENOSYS makes glibc fall back to clone(),
        # which the rules above see (Docker's profile does the same).
        add("clone3", _ACT_ERRNO | errno.ENOSYS)
        fd = os.memfd_create("orchard-seccomp", os.MFD_CLOEXEC)
        try:
            if rc := lib.seccomp_export_bpf(ctx, fd):
                raise FailedPrecondition(f"libseccomp could not export the filter: {os.strerror(-rc)}")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def proc_mask_args(root: Path = Path("/")) -> tuple[str, ...]:
    """bwrap arguments (after `--proc /proc`) that make READONLY_PATHS read-only and mask MASKED_PATHS, for those
    this kernel has (bwrap cannot mount over a path that does not exist, and /proc cannot be written to)."""
    args: list[str] = []
    for path in READONLY_PATHS:
        if (root / path.lstrip("/")).exists():
            args += ["--ro-bind", path, path]
    for path in MASKED_PATHS:
        if path.startswith("/sys/"):
            continue  # local sandboxes mount no sysfs at all
        host = root / path.lstrip("/")
        if host.is_dir():
            args += ["--tmpfs", path, "--remount-ro", path]
        elif host.exists():
            args += ["--ro-bind", "/dev/null", path]
    return tuple(args)


@functools.cache
def default_confinement() -> Confinement:
    """The confinement of every local sandbox on this host, computed once per process."""
    if platform.machine() not in ("x86_64", "aarch64"):
        raise FailedPrecondition(
            f"the local backend's seccomp filter supports x86_64 and aarch64, not {platform.machine()}"
        )
    return Confinement(bwrap_args=proc_mask_args(), seccomp_bpf=compile_seccomp())
