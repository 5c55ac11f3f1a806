//! Orchard's in-sandbox agent as one static binary: the protocol of services/env/agent/agent.py (frames of
//! u32 total length, u32 header length, JSON header, raw body, over stdin/stdout), for images with no
//! Python. Standard library only. Ops: ping, exec, cancel, write, read, list, stat, info; pty ops answer
//! an error for now.
//!
//! Threads instead of the Python agent's event loop: the main thread reads requests and answers the
//! bounded ones (files) itself; each exec has a thread (plus one per pipe); one writer thread owns stdout,
//! fed by a queue, so frames stay whole and each request's frames stay in order.

mod exec;
mod files;
mod frame;
mod json;
mod sys;

use files::{field, Failure};
use json::{obj, s, Value};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

static AGENT: OnceLock<Arc<exec::Agent>> = OnceLock::new();

/// The manager is gone: so are the commands, and the agent.
fn stop() -> ! {
    if let Some(agent) = AGENT.get() {
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
            let Some((key, rest)) = line.split_once(':') else { continue };
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
                exec::start(agent.clone(), id, header.clone(), body.clone());
                return Ok(Value::Null);
            }
            "ping" => with_id(vec![], &rid),
            "cancel" => {
                let target = field(&header, "target")?;
                if let Some(target) = target.as_i64() {
                    agent.cancel(target, header.get("reason").cloned().unwrap_or(s("cancelled")));
                }
                with_id(vec![], &rid)
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
            "pty" | "pty_input" | "pty_resize" | "pty_ack" => {
                return Err(Failure::Internal("pty is not supported by this agent yet".into()));
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

fn main() {
    // Fds inherited beyond stdio would leak into every command. (The Rust runtime already ignores SIGPIPE,
    // so a write to a gone manager is EPIPE, handled; commands get SIGPIPE's default back.)
    sys::cloexec_inherited();
    let own = std::process::id() as i32;
    // The ready frame goes out before anything else can (and before a closed stdin can end the agent).
    let ready = frame::encode(&obj(vec![("id", Value::Int(0)), ("ev", s("ready")), ("pid", Value::Int(own as i64))]), b"");
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        if stdout.write_all(&ready).and_then(|_| stdout.flush()).is_err() {
            std::process::exit(0);
        }
    }
    let out = frame::Out::start(|| stop());
    let parent = std::os::unix::process::parent_id() as i32;
    let agent = Arc::new(exec::Agent {
        out: out.clone(),
        jobs: Mutex::new(HashMap::new()),
        tag: random_tag(),
        base_env: exec::env_snapshot(),
        not_commands: vec![own, parent, 1],
    });
    let _ = AGENT.set(agent.clone());
    let mut stdin = std::io::stdin().lock();
    loop {
        match frame::read_frame(&mut stdin) {
            Ok(Some((raw, body))) => {
                let parsed = std::str::from_utf8(&raw).map_err(|e| e.to_string()).and_then(json::loads);
                match parsed {
                    Ok(header) => handle(&agent, header, body),
                    // Not from our manager: nothing to answer to.
                    Err(err) => eprintln!("agent: dropped a request with a bad header: {}", err),
                }
            }
            Ok(None) => stop(),
            Err(err) => {
                eprintln!("agent: reading requests failed: {}", err);
                stop();
            }
        }
    }
}
