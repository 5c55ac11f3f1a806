//! `orchard-agent --listen-tcp HOST:PORT`: the protocol over TCP, for sandboxes reached by address (a Pod IP).
//! Any pod of the cluster can reach that address, so a connection must first prove it knows the shared secret
//! in ORCHARD_AGENT_TOKEN: its first frame is {"op": "hello", "token": T}, within HELLO_TIMEOUT, else the
//! connection is closed unanswered. Then, as on the unix socket: the ready frame, and requests until the manager
//! goes (its commands outlive it). Connections are served side by side, so a peer that stalls blocks nobody.
//! SIGTERM kills every command and exits 0.

use crate::json::{self, Value};
use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub const TOKEN_ENV: &str = "ORCHARD_AGENT_TOKEN";
const MIN_TOKEN_LEN: usize = 16;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HELLO: usize = 4096; // an unauthenticated peer must not make us allocate what it claims
const MAX_CONNECTIONS: usize = 64;

static OPEN: AtomicUsize = AtomicUsize::new(0);

/// The token, taken out of the environment so no command inherits it.
fn take_token() -> String {
    let token = std::env::var(TOKEN_ENV).unwrap_or_default();
    std::env::remove_var(TOKEN_ENV);
    if token.len() < MIN_TOKEN_LEN {
        eprintln!("agent: --listen-tcp needs {} set to a secret of at least {} bytes", TOKEN_ENV, MIN_TOKEN_LEN);
        std::process::exit(2);
    }
    token
}

/// Equal without leaking, through timing, how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the peer's first frame is a hello with the right token.
fn hello_ok(stream: &mut TcpStream, token: &str) -> bool {
    let mut prefix = [0u8; 8];
    if stream.read_exact(&mut prefix).is_err() {
        return false; // closed (a TCP readiness probe), timed out, or broken
    }
    let total = u32::from_be_bytes(prefix[..4].try_into().unwrap()) as usize;
    let head_len = u32::from_be_bytes(prefix[4..].try_into().unwrap()) as usize;
    if !(4..=MAX_HELLO).contains(&total) || head_len != total - 4 {
        return false;
    }
    let mut raw = vec![0u8; head_len];
    if stream.read_exact(&mut raw).is_err() {
        return false;
    }
    let header = match std::str::from_utf8(&raw).map_err(|e| e.to_string()).and_then(json::loads) {
        Ok(header) => header,
        Err(_) => return false,
    };
    header.get("op").and_then(Value::as_str) == Some("hello")
        && header.get("token").and_then(Value::as_str).map_or(false, |t| same(t.as_bytes(), token.as_bytes()))
}

impl crate::Stream for TcpStream {
    fn dup(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn end(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

fn serve_peer(mut stream: TcpStream, token: &str) {
    let _ = stream.set_nodelay(true); // frames are small and latency-bound: no Nagle
    if stream.set_read_timeout(Some(HELLO_TIMEOUT)).is_err() || !hello_ok(&mut stream, token) {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    if stream.set_read_timeout(None).is_err() {
        return;
    }
    if let Err(err) = crate::serve_connection(stream) {
        eprintln!("agent: connection ended: {}", err);
    }
}

pub fn serve_tcp(addr: &str) -> ! {
    let token: &'static str = Box::leak(take_token().into_boxed_str());
    crate::sys::block_sigterm(); // before any thread starts: the signal thread below takes it
    let listener = match TcpListener::bind(addr) {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("agent: cannot listen on {}: {}", addr, err);
            std::process::exit(1);
        }
    };
    std::thread::Builder::new()
        .name("sigterm".into())
        .stack_size(64 * 1024)
        .spawn(|| {
            crate::sys::wait_sigterm();
            crate::stop();
        })
        .expect("signal thread");
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(stream) => stream,
            Err(_) => continue,
        };
        if OPEN.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            OPEN.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let spawned = std::thread::Builder::new().name("peer".into()).stack_size(2 << 20).spawn(move || {
            serve_peer(stream, token);
            OPEN.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            OPEN.fetch_sub(1, Ordering::SeqCst);
        }
    }
    unreachable!("incoming() never ends");
}
