#!/usr/bin/env bash
# Build the native agent (agent-rs/: std-only Rust, statically linked) into
# agent-rs/target/x86_64-unknown-linux-gnu/release/orchard-agent and print that path.
# Skips the build when the binary is newer than every source. Needs cargo (no crates: no network): rustc 1.63
# (Debian 12's) or newer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CRATE="$ROOT/agent-rs"
TARGET="x86_64-unknown-linux-gnu"
BIN="$CRATE/target/$TARGET/release/orchard-agent"

if [[ -x "$BIN" ]] && [[ -z "$(find "$CRATE/src" "$CRATE/Cargo.toml" -newer "$BIN" -print -quit)" ]]; then
    echo "$BIN"
    exit 0
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "build_agent.sh: cargo is not installed: cannot build the native agent (Debian 12: apt-get install cargo; or https://rustup.rs)" >&2
    exit 1
fi
echo "build_agent.sh: building the native agent (cargo build --release, static)" >&2
(cd "$CRATE" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet --target "$TARGET" >&2)
touch "$BIN"  # cargo keeps an up-to-date binary's old mtime: mark it as newer than the sources
echo "$BIN"
