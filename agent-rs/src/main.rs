//! Orchard's in-sandbox agent as one static binary, standard library only: frames (u32 total length, u32
//! header length, JSON header, raw body) over stdin/stdout, a unix socket or TCP. Every op, frame and error
//! is written down in ../PROTOCOL.md: ping, exec, cancel, pty, pty_input, pty_resize, pty_ack, write, read,
//! list, stat, info.
//!
//! Threads, not an event loop: the main thread reads requests and answers the bounded ones (files, terminal
//! input and sizes) itself; each exec has a thread (started with posix_spawn, watched in one epoll over its pipes
//! and its pidfd; plus one feeding its stdin, when it has one), each terminal one; one writer thread owns stdout,
//! fed by a queue, so frames stay whole and each request's frames stay in order (an exec's exit frame is written by
//! its own thread when nothing is queued: one wake-up less).
//!
//! `orchard-agent` serves one manager on stdin/stdout and ends with it (its commands too).
//! `orchard-agent --listen PATH` serves the same protocol on a unix socket at PATH instead (mode 0600; a
//! stale socket there is replaced), one connection at a time, each opened by its own ready frame. When a
//! connection closes, its commands keep running but their frames are dropped, and its terminals are killed;
//! the next connection starts afresh (new request ids, new exec marks). SIGTERM kills every command, removes
//! PATH and exits 0.
//! `orchard-agent --listen-tcp HOST:PORT` serves it over TCP to managers that send the shared token first
//! (see tcp.rs). `orchard-agent --install DEST` copies this binary to DEST (mode 0755) and exits: how a
//! Kubernetes init container puts the agent into a sandbox image from an image holding nothing else.

mod exec;
mod files;
mod frame;
mod json;
mod pty;
mod sys;
mod tcp;

use files::{field, Failure};
use json::{obj, s, Value};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

/// One per connection (one in all on stdin/stdout), with the commands it started.
static AGENTS: Mutex<Vec<Arc<exec::Agent>>> = Mutex::new(Vec::new());

/// The manager is gone (or SIGTERM came): so are the commands, and the agent.
fn stop() -> ! {
    for agent in AGENTS.lock().unwrap().iter() {
        agent.out.close();
        agent.kill_all();
    }
    std::process::exit(0);
}

/// In every exec's mark, so an agent that sees other agents' processes never matches theirs.
fn random_tag() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    hasher.write_u32(std::process::id());
    format!("{:012x}", hasher.finish() & 0xffff_ffff_ffff)
}

fn memory() -> Vec<(String, Value)> {
    let mut found = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/self/smaps_rollup") {
        for line in text.lines() {
            let (key, rest) = match line.split_once(':') {
                Some(pair) => pair,
                None => continue,
            };
            if ["Rss", "Pss", "Private_Dirty", "Private_Clean"].contains(&key) {
                if let Some(kib) = rest.split_whitespace().next().and_then(|n| n.parse::<i64>().ok()) {
                    found.push((format!("{}_kib", key.to_lowercase()), Value::Int(kib)));
                }
            }
        }
    }
    found
}

fn with_id(mut items: Vec<(&'static str, Value)>, rid: &Value) -> Value {
    items.push(("id", rid.clone()));
    items.push(("ev", s("ok")));
    obj(items)
}

fn handle(agent: &Arc<exec::Agent>, header: Value, body: Vec<u8>) {
    let rid = header.get("id").cloned().unwrap_or(Value::Int(-1));
    let op = header.get("op").and_then(Value::as_str).unwrap_or("").to_string();
    let result: Result<Value, Failure> = (|| {
        Ok(match op.as_str() {
            "exec" => {
                let id = rid.as_i64().ok_or_else(|| Failure::Internal("TypeError: id must be an integer".into()))?;
                exec::start(agent, id, &header, body.clone()); // replies with its own events
                return Ok(Value::Null);
            }
            "ping" => with_id(vec![], &rid),
            "cancel" => {
                let target = field(&header, "target")?.as_i64().unwrap_or(-1);
                let reason = header.get("reason").cloned().unwrap_or(s("cancelled"));
                agent.cancel(target, reason, || agent.out.send(&with_id(vec![], &rid), b""));
                return Ok(Value::Null);
            }
            "write" => with_id(files::write_part(&header, &body)?, &rid),
            "read" => {
                let (head, data) = files::read_part(&header)?;
                agent.out.send(&with_id(head, &rid), &data);
                return Ok(Value::Null);
            }
            "list" => with_id(files::list_dir(files::str_field(&header, "path")?)?, &rid),
            "stat" => with_id(vec![("info", files::file_info(files::str_field(&header, "path")?)?)], &rid),
            "info" => {
                let mut items = memory();
                items.push(("pid".into(), Value::Int(std::process::id() as i64)));
                items.push(("agent".into(), s("native")));
                items.push(("id".into(), rid.clone()));
                items.push(("ev".into(), s("ok")));
                Value::Obj(items)
            }
            "pty" => {
                let id = rid.as_i64().ok_or_else(|| Failure::Internal("TypeError: id must be an integer".into()))?;
                pty::start(agent, id, &header)?; // replies with its own events
                return Ok(Value::Null);
            }
            "pty_input" | "pty_resize" | "pty_ack" => {
                let target = field(&header, "target")?;
                let term = target.as_i64().and_then(|t| agent.ptys.lock().unwrap().get(&t).cloned());
                if let Some(term) = term {
                    match op.as_str() {
                        "pty_input" => {
                            term.type_input(rid.clone(), body.clone(), agent); // answered once typed
                            return Ok(Value::Null);
                        }
                        "pty_resize" => {
                            let (rows, cols) = pty::window(&header)?;
                            term.resize(rows, cols).map_err(|e| Failure::os(&e, "").without_name())?;
                        }
                        _ => term.ack(files::int_field(&header, "consumed")?),
                    }
                }
                with_id(vec![], &rid) // a terminal that has ended: nothing to do
            }
            _ => return Err(Failure::Internal(format!("ValueError: unknown op '{}'", op))),
        })
    })();
    match result {
        Ok(Value::Null) => {}
        Ok(reply) => agent.out.send(&reply, b""),
        Err(failure) => agent.out.send(&failure.reply(&rid), b""),
    }
}

fn ready_frame() -> Vec<u8> {
    frame::encode(&obj(vec![("id", Value::Int(0)), ("ev", s("ready")), ("pid", Value::Int(std::process::id() as i64))]), b"")
}

/// A fresh agent (tag, jobs) whose frames go to out; kept in AGENTS while it may have commands.
fn new_agent(out: Arc<frame::Out>) -> Arc<exec::Agent> {
    let own = std::process::id() as i32;
    let parent = std::os::unix::process::parent_id() as i32;
    let agent = Arc::new(exec::Agent {
        out,
        jobs: Mutex::new(HashMap::new()),
        ptys: Mutex::new(HashMap::new()),
        tag: random_tag(),
        base_env: exec::env_snapshot(),
        not_commands: vec![own, parent, 1],
    });
    let mut agents = AGENTS.lock().unwrap();
    agents.retain(|old| !old.jobs.lock().unwrap().is_empty()); // earlier connections with commands left
    agents.push(agent.clone());
    agent
}

/// Answer requests from reader until it ends (Ok) or breaks.
fn serve(agent: &Arc<exec::Agent>, reader: &mut impl Read) -> std::io::Result<()> {
    while let Some((raw, body)) = frame::read_frame(reader)? {
        let parsed = std::str::from_utf8(&raw).map_err(|e| e.to_string()).and_then(json::loads);
        match parsed {
            Ok(header) => handle(agent, header, body),
            // Not from our manager: nothing to answer to.
            Err(err) => eprintln!("agent: dropped a request with a bad header: {}", err),
        }
    }
    Ok(())
}

/// The manager on stdin/stdout: when it goes, so do the commands and the agent.
fn serve_stdio() -> ! {
    // The ready frame goes out before anything else can (and before a closed stdin can end the agent).
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(&ready_frame()).and_then(|_| stdout.flush()).is_err() {
        std::process::exit(0);
    }
    drop(stdout);
    let agent = new_agent(frame::Out::start(Box::new(std::io::stdout()), || stop()));
    if let Err(err) = serve(&agent, &mut std::io::stdin().lock()) {
        eprintln!("agent: reading requests failed: {}", err);
    }
    stop();
}

/// Managers one after another on a unix socket at path; see the top of this file.
fn serve_socket(path: &str) -> ! {
    sys::block_sigterm(); // before any thread starts: the signal thread below takes it
    let fail = |what: &str, err: std::io::Error| -> ! {
        eprintln!("agent: {} {}: {}", what, path, err);
        std::process::exit(1);
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if let Err(err) = std::fs::remove_file(path) {
                fail("cannot remove the stale socket", err);
            }
        }
        _ => {} // nothing there, or not a socket: bind says what is wrong
    }
    let listener = match sys::with_umask(0o177, || UnixListener::bind(path)) {
        Ok(listener) => listener,
        Err(err) => fail("cannot listen on", err),
    };
    let owned = path.to_string();
    std::thread::Builder::new()
        .name("sigterm".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            sys::wait_sigterm();
            let _ = std::fs::remove_file(&owned);
            stop();
        })
        .expect("signal thread");
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(stream) => stream,
            Err(err) => {
                eprintln!("agent: accept failed: {}", err);
                continue;
            }
        };
        if let Err(err) = serve_connection(stream) {
            eprintln!("agent: connection ended: {}", err);
        }
    }
    unreachable!("incoming() never ends");
}

/// A connection to one manager: a unix socket or (tcp.rs) a TCP stream.
trait Stream: Read + Write + Send + Sized + 'static {
    fn dup(&self) -> std::io::Result<Self>;
    /// Shut both directions down: blocked reads and writes on every dup fail at once.
    fn end(&self);
}

impl Stream for UnixStream {
    fn dup(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn end(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

/// One manager on the socket: ready frame, then its requests until it goes. Its commands outlive it.
fn serve_connection(mut stream: impl Stream) -> std::io::Result<()> {
    stream.write_all(&ready_frame())?;
    let breaker = stream.dup()?;
    // A broken write ends the connection: shut it down, and the read below ends too.
    let out = frame::Out::start(Box::new(stream.dup()?), move || breaker.end());
    let agent = new_agent(out);
    let served = serve(&agent, &mut stream);
    stream.end(); // a writer blocked on a full socket fails now
    agent.out.close(); // the running commands' frames are dropped from here on
    agent.kill_terminals(); // nobody can type into them or take their output any more
    served
}

/// Copy this binary to dest, executable by all; exit 0, or 1 saying why not.
fn install(dest: &str) -> ! {
    use std::os::unix::fs::PermissionsExt;
    let copied = std::fs::copy("/proc/self/exe", dest)
        .and_then(|_| std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755)));
    if let Err(err) = copied {
        eprintln!("agent: cannot install to {}: {}", dest, err);
        std::process::exit(1);
    }
    std::process::exit(0);
}

fn main() {
    // Fds inherited beyond stdio would leak into every command. (The Rust runtime already ignores SIGPIPE,
    // so a write to a gone manager is EPIPE, handled; commands get SIGPIPE's default back.)
    sys::cloexec_inherited();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => serve_stdio(),
        ["--listen", path] if !path.is_empty() => serve_socket(path),
        ["--listen-tcp", addr] if !addr.is_empty() => tcp::serve_tcp(addr),
        ["--install", dest] if !dest.is_empty() => install(dest),
        _ => {
            eprintln!("usage: orchard-agent [--listen SOCKET_PATH | --listen-tcp HOST:PORT | --install DEST]");
            std::process::exit(2);
        }
    }
}
