#!/usr/bin/env bash
# Boots the cgroup v2 test VM and runs OUT/command.sh in it as root: Debian's kernel as a user-mode Linux process
# (package user-mode-linux) on a pure cgroup v2 hierarchy, with the host's / (this checkout, its venv, the agent)
# as its read-only root and tmpfs where programs write; OUT is shared writable. Leaves OUT/output.log (the
# command's output) and OUT/rc (its exit status); the console goes to stdout. Exits when the VM halts, with that status.
#     scripts/vm/boot.sh OUT        (ORCHARD_VM_MEMORY, default 3G)
set -euo pipefail
out=$(cd "${1:?usage: boot.sh OUT (a folder with command.sh)}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
command -v linux.uml >/dev/null || { echo "boot.sh: no linux.uml: apt-get install user-mode-linux" >&2; exit 2; }
command -v modprobe >/dev/null || { echo "boot.sh: no modprobe (the VM loads its modules with it): apt-get install kmod" >&2; exit 2; }
rm -f "$out/rc" "$out/output.log"
# The VM's memory is a file in TMPDIR: /dev/shm keeps it in RAM.
TMPDIR=/dev/shm linux.uml mem="${ORCHARD_VM_MEMORY:-3G}" root=/dev/root rootfstype=hostfs rootflags=/ ro \
  init="$here/guest_init.sh" orchard_out="$out" cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 \
  con0=null,fd:1 con=null ssl=null quiet < /dev/null
[[ -f "$out/rc" ]] || { echo "boot.sh: the VM stopped before its command finished" >&2; exit 3; }
exit "$(cat "$out/rc")"
