"""Attacks a sandboxed program can try on its own, run *inside* a sandbox by test_redteam.py (stdlib only: it runs
on any image's python3). Prints one JSON object per attempt: {"cls", "target", "through", "detail"}, where
`through` means the attempt got something a sandbox must never get.

Every probe is safe to run even where isolation is broken: a writable kernel file is only opened for writing,
never written; no probe reboots, sets the clock, loads a module or writes a sysctl.

    python3 redteam_probes.py [HOST:PORT ...]   # the arguments are TCP targets on the host to try to reach
"""

import ctypes
import errno
import json
import os
import socket
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
BLOCKED = {errno.EPERM, errno.EACCES, errno.EROFS, errno.ENOSYS, errno.ENOENT, errno.ENODEV, errno.ENXIO}
NR = {  # x86_64 syscall numbers
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "kexec_load": 246,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "io_uring_setup": 425,
    "iopl": 172,
    "ioperm": 173,
    "setns": 308,
    "fsopen": 430,
    "open_tree": 428,
    "clone3": 435,
    "open_by_handle_at": 304,
    "kcmp": 312,
    "swapoff": 168,
    "acct": 163,
    "syslog": 103,
    "quotactl": 179,
}
CLONE = {
    "NEWUSER": 0x10000000,
    "NEWNS": 0x00020000,
    "NEWNET": 0x40000000,
    "NEWPID": 0x20000000,
    "NEWUTS": 0x04000000,
    "NEWIPC": 0x08000000,
    "NEWCGROUP": 0x02000000,
    "NEWTIME": 0x00000080,
}
MASKED = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/timer_stats",
    "/proc/acpi",
    "/proc/scsi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kallsyms",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/sys/kernel",
    "/proc/sysrq-trigger",
]
READONLY = ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"]


def report(cls, target, through, detail=""):
    print(json.dumps({"cls": cls, "target": target, "through": bool(through), "detail": str(detail)[:200]}), flush=True)


def syscall(name, *args):
    """(return value, errno) of a raw syscall."""
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    rc = libc.syscall(NR[name], *args)
    return rc, ctypes.get_errno() if rc < 0 else 0


def in_child(fn):
    """Run fn() in a forked child (namespace changes must not touch the prober); its exit status is fn's answer:
    0 = it got through, else the errno it got."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(fn())
        except BaseException:
            os._exit(255)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def sysctls():
    """Every file under /proc/sys (and the read-only trees) opened for writing: none may open."""
    for tree in READONLY:
        if os.path.isfile(tree):
            paths = [tree]
        else:
            paths = [os.path.join(d, f) for d, _, files in os.walk(tree) for f in files]
        for path in paths:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                report(
                    "writable-sysctl",
                    path,
                    err.errno not in BLOCKED and err.errno != errno.EINVAL,
                    errno.errorcode.get(err.errno, err.errno),
                )
                continue
            os.close(fd)  # opened: that is the hole (nothing was written)
            report("writable-sysctl", path, True, "opened for writing")


def core_pattern():
    for path in (
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/modprobe",
        "/proc/sys/fs/binfmt_misc/register",
        "/proc/sys/kernel/panic",
        "/proc/sys/vm/drop_caches",
    ):
        try:
            fd = os.open(path, os.O_WRONLY)
            os.close(fd)
            report("core-pattern", path, True, "opened for writing")
        except OSError as err:
            report("core-pattern", path, err.errno not in BLOCKED, errno.errorcode.get(err.errno, err.errno))


def masked_paths():
    for path in MASKED:
        if not os.path.exists(path):
            report("masked-path", path, False, "absent")
            continue
        try:
            if os.path.isdir(path):
                got = os.listdir(path)
            else:
                with open(path, "rb") as f:
                    got = f.read(4096)
            report("masked-path", path, bool(got), f"{len(got)} entries/bytes")
        except OSError as err:
            report(
                "masked-path",
                path,
                err.errno not in BLOCKED and err.errno != errno.EIO,
                errno.errorcode.get(err.errno, err.errno),
            )


def keyrings():
    rc, err = syscall("add_key", b"user", b"orchard-redteam", b"x", 1, -2)  # KEY_SPEC_PROCESS_KEYRING
    report("keyring", "add_key", rc >= 0, err)
    rc, err = syscall("keyctl", 1, 0, 0, 0, 0)  # KEYCTL_JOIN_SESSION_KEYRING (anonymous)
    report("keyring", "keyctl(JOIN_SESSION_KEYRING)", rc >= 0, err)
    rc, err = syscall("request_key", b"user", b"orchard-redteam", 0, 0)
    report("keyring", "request_key", rc >= 0 or err not in BLOCKED | {errno.ENOKEY}, err)


def namespaces():
    for name, flag in CLONE.items():
        code = in_child(lambda flag=flag: 0 if syscall("unshare", flag)[0] == 0 else syscall("unshare", flag)[1])
        report("user-namespace" if name == "NEWUSER" else "namespace", f"unshare(CLONE_{name})", code == 0, code)
    rc, err = syscall("clone3", 0, 0)
    report("namespace", "clone3", err != errno.ENOSYS and err not in BLOCKED, err)
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    rc, err = syscall("setns", fd, 0)
    os.close(fd)
    report("namespace", "setns", rc == 0, err)
    if os.path.exists("/usr/bin/unshare"):  # the util-linux tool, as a policy would call it
        code = os.system("/usr/bin/unshare -Ur true >/dev/null 2>&1")
        report("user-namespace", "unshare -Ur true", code == 0, code)


def mounts():
    os.makedirs("/tmp/orchard-redteam-mnt", exist_ok=True)
    rc, err = syscall("mount", b"none", b"/tmp/orchard-redteam-mnt", b"tmpfs", 0, 0)
    report("mount", "mount tmpfs", rc == 0, err)
    rc, err = syscall("mount", b"none", b"/proc/sys", 0, 0x20 | 0x1000 | 0x4000, 0)  # MS_REMOUNT|BIND (rw)
    report("mount", "remount /proc/sys rw", rc == 0, err)
    rc, err = syscall("umount2", b"/proc/sys", 2)
    report("mount", "umount /proc/sys", rc == 0, err)
    rc, err = syscall("pivot_root", b"/tmp", b"/tmp/orchard-redteam-mnt")
    report("mount", "pivot_root", rc == 0, err)
    rc, err = syscall("fsopen", b"tmpfs", 0)
    report("mount", "fsopen", rc >= 0, err)
    rc, err = syscall("open_tree", -100, b"/", 1)  # OPEN_TREE_CLONE
    report("mount", "open_tree", rc >= 0, err)


def raw_sockets():
    for family, kind, proto, name in (
        (socket.AF_PACKET, socket.SOCK_RAW, 0x0300, "AF_PACKET raw"),
        (socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300, "AF_PACKET dgram"),
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "AF_INET raw ICMP"),
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, "AF_INET raw"),
        (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, "AF_INET6 raw"),
    ):
        try:
            socket.socket(family, kind, proto).close()
            report("raw-socket", name, True, "opened")
        except OSError as err:
            report("raw-socket", name, err.errno not in BLOCKED | {errno.EAFNOSUPPORT}, err.errno)


def kernel_calls():
    attr = ctypes.create_string_buffer(128)
    ctypes.memmove(attr, (ctypes.c_uint32 * 4)(2, 4, 4, 1), 16)  # BPF_MAP_CREATE: array, 4-byte keys/values
    calls = {
        "bpf(MAP_CREATE)": ("bpf", 0, attr, 128),
        "perf_event_open": ("perf_event_open", ctypes.create_string_buffer(128), 0, -1, -1, 0),
        "userfaultfd": ("userfaultfd", 0),
        "kexec_load": ("kexec_load", 0, 0, 0, 0),
        "init_module": ("init_module", 0, 0, b""),
        "finit_module": ("finit_module", -1, b"", 0),
        "delete_module": ("delete_module", b"orchard_redteam_none", 0),
        "io_uring_setup": ("io_uring_setup", 1, ctypes.create_string_buffer(120)),
        "iopl": ("iopl", 3),
        "ioperm": ("ioperm", 0x80, 1, 1),
        "open_by_handle_at": ("open_by_handle_at", -100, ctypes.create_string_buffer(16), 0),
        "swapoff": ("swapoff", b"/orchard-redteam-none"),
        "acct(NULL)": ("acct", 0),
        "syslog(READ_ALL)": ("syslog", 3, ctypes.create_string_buffer(64), 64),
        "quotactl": ("quotactl", 0x800002, b"/", 0, 0),  # Q_GETQUOTA-ish: needs CAP_SYS_ADMIN
    }
    for target, (name, *args) in calls.items():
        rc, err = syscall(name, *args)
        report("kernel-call", target, rc >= 0 or err not in BLOCKED, errno.errorcode.get(err, err))


def egress(targets):
    """TCP to the host's own addresses, the cloud metadata service, public resolvers and private ranges; UDP DNS;
    name resolution. None may answer."""
    tcp = [
        *targets,
        "169.254.169.254:80",
        "1.1.1.1:53",
        "8.8.8.8:443",
        "10.0.0.1:80",
        "172.17.0.1:2375",
        "10.88.0.1:80",
        "192.168.0.1:80",
        "[2606:4700:4700::1111]:443",
        "[fd00::1]:80",
    ]
    for target in tcp:
        host, port = target.rsplit(":", 1)
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(3)
                s.connect((host, int(port)))
            report("egress", f"tcp {target}", True, "connected")
        except OSError as err:
            report("egress", f"tcp {target}", False, err.errno or "timeout")
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04pypi\x03org\x00\x00\x01\x00\x01"
    for resolver in ("8.8.8.8", "1.1.1.1", "169.254.169.254"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(2)
                s.sendto(query, (resolver, 53))
                s.recvfrom(512)
            report("egress", f"udp dns {resolver}", True, "answered")
        except OSError as err:
            report("egress", f"udp dns {resolver}", False, err.errno or "timeout")
    for name in ("pypi.org", "metadata.google.internal"):
        try:
            socket.getaddrinfo(name, 443)
            report("egress", f"resolve {name}", True, "resolved")
        except OSError as err:
            report("egress", f"resolve {name}", False, err)


def main():
    for probe in (sysctls, core_pattern, masked_paths, keyrings, namespaces, mounts, raw_sockets, kernel_calls):
        probe()
    egress(sys.argv[1:])


if __name__ == "__main__":
    main()
