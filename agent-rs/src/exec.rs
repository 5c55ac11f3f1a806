//! exec and cancel: each command in its own session, its output as "out" frames (up to the cap; the rest
//! only counted), its stdin fed from the request's body, its timeout, and one "exit" frame once it ended
//! and its pipes drained (or DRAIN_AFTER_EXIT passed: background children may hold them open). A timeout,
//! a cancel or the end of the command kills its whole tree: its session, and every process whose
//! environment carries the exec's mark (those that left the session).

use crate::files::{field, Failure};
use crate::frame::Out;
use crate::json::{obj, s, Value};
use crate::sys;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsString};
use std::io::{self, Read, Write};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const EXEC_MARK: &str = "ORCHARD_EXEC";
const CHUNK: usize = 64 * 1024;
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
const POLL_MS: i32 = 50; // how often blocked helpers look at their stop flag
const THREAD_STACK: usize = 128 * 1024;

/// What every exec and terminal shares: the frame writer, the running jobs (and the terminals among them,
/// until their exit frame), the agent's tag and environment.
pub struct Agent {
    pub out: Arc<Out>,
    pub jobs: Mutex<HashMap<i64, Arc<Job>>>,
    pub ptys: Mutex<HashMap<i64, Arc<crate::pty::Terminal>>>,
    pub tag: String,
    pub base_env: Vec<(OsString, OsString)>,
    pub not_commands: Vec<i32>,
}

/// A running command (an exec's, or a terminal's program): what cancel and kill_all need.
pub struct Job {
    pid: i32,
    rid: i64,
    reasons: Mutex<Vec<Value>>,
}

impl Job {
    pub fn new(pid: i32, rid: i64) -> Arc<Job> {
        Arc::new(Job { pid, rid, reasons: Mutex::new(Vec::new()) })
    }
}

impl Agent {
    pub fn mark(&self, rid: i64) -> String {
        format!("{}-{}", self.tag, rid)
    }

    /// Kill the tree of job target (if it still runs), then call `answered` (which sends the cancel's reply):
    /// all with the jobs locked, so the target's exit frame (sent once it is out of jobs) comes after the reply.
    pub fn cancel(&self, target: i64, reason: Value, answered: impl FnOnce()) {
        let jobs = self.jobs.lock().unwrap();
        if let Some(job) = jobs.get(&target) {
            job.reasons.lock().unwrap().push(reason);
            self.kill_tree(job.pid, job.rid);
        }
        answered();
    }

    /// The manager is gone: so are the commands.
    pub fn kill_all(&self) {
        let jobs: Vec<Arc<Job>> = self.jobs.lock().unwrap().values().cloned().collect();
        for job in jobs {
            self.kill_tree(job.pid, job.rid);
        }
    }

    /// Kill every terminal's program: nobody can type into them or take their output any more (the
    /// connection that opened them is gone).
    pub fn kill_terminals(&self) {
        let rids: Vec<i64> = self.ptys.lock().unwrap().keys().cloned().collect();
        for rid in rids {
            self.cancel(rid, s("closed"), || {});
        }
    }

    /// Live pids of one exec's tree: its session sid, and every process carrying its mark.
    fn members(&self, sid: i32, rid: i64) -> Vec<i32> {
        let needle = format!("{}={}", EXEC_MARK, self.mark(rid)).into_bytes();
        let mut found = Vec::new();
        // match, not let-else (Rust 1.65): Debian 12's rustc is 1.63.
        let entries = match std::fs::read_dir("/proc") {
            Ok(entries) => entries,
            Err(_) => return found,
        };
        for entry in entries.flatten() {
            let pid = match entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
                Some(pid) => pid,
                None => continue,
            };
            if self.not_commands.contains(&pid) {
                continue;
            }
            let stat = match std::fs::read(format!("/proc/{}/stat", pid)) {
                Ok(stat) => stat,
                Err(_) => continue,
            };
            let close = match stat.iter().rposition(|&b| b == b')') {
                Some(close) => close,
                None => continue,
            };
            let fields: Vec<&[u8]> = stat[close + 1..].split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty()).collect();
            if fields.len() < 4 || fields[0] == b"Z" {
                continue; // state ppid pgrp session ...; a zombie is dead already
            }
            if std::str::from_utf8(fields[3]).ok().and_then(|f| f.parse::<i32>().ok()) == Some(sid) {
                found.push(pid);
                continue;
            }
            if let Ok(environ) = std::fs::read(format!("/proc/{}/environ", pid)) {
                if environ.split(|&b| b == 0).any(|var| var == needle.as_slice()) {
                    found.push(pid);
                }
            }
        }
        found
    }

    /// SIGKILL the exec's whole tree until nothing of it is left.
    pub fn kill_tree(&self, pid: i32, rid: i64) {
        for _ in 0..20 {
            let members = self.members(pid, rid);
            if members.is_empty() {
                return;
            }
            for member in members {
                sys::sigkill(member);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new().name(name.into()).stack_size(THREAD_STACK).spawn(f).expect("thread")
}

/// Handle an exec request: replies with its own events. The command starts here, so that the next request (a
/// cancel) finds it; its thread does the rest.
pub fn start(agent: &Arc<Agent>, rid: i64, header: &Value, body: Vec<u8>) {
    let started = match spawn(agent, rid, header, !body.is_empty()) {
        Ok(started) => started,
        Err(StartError::Cannot(message)) => {
            let frame = obj(vec![
                ("id", Value::Int(rid)),
                ("ev", s("exit")),
                ("code", Value::Int(127)),
                ("error", s(&format!("cannot start: {}", message))),
                ("totals", Value::Arr(vec![Value::Int(0), Value::Int(0)])),
                ("reason", Value::Null),
            ]);
            agent.out.send(&frame, b"");
            return;
        }
        Err(StartError::Request(failure)) => {
            agent.out.send(&failure.reply(&Value::Int(rid)), b"");
            return;
        }
    };
    let job = Job::new(started.pid, rid);
    agent.jobs.lock().unwrap().insert(rid, job.clone());
    let (agent, header) = (agent.clone(), header.clone());
    spawn_thread("exec", move || run(&agent, &job, &header, started, body));
}

fn exit_frame(rid: i64, code: i64, totals: [u64; 2], reason: Value, error: Value) -> Value {
    obj(vec![
        ("id", Value::Int(rid)),
        ("ev", s("exit")),
        ("code", Value::Int(code)),
        ("totals", Value::Arr(vec![Value::Int(totals[0] as i64), Value::Int(totals[1] as i64)])),
        ("reason", reason),
        ("error", error),
    ])
}

pub enum StartError {
    Cannot(String),   // the program cannot start: exit 127, saying why
    Request(Failure), // a malformed request: an error frame
}

fn os_message(err: &io::Error, name: &str) -> String {
    match err.raw_os_error() {
        Some(errno) => format!("{}: {}", sys::strerror(errno), name),
        None => err.to_string(),
    }
}

/// The file exec runs for name: name itself when it has a slash, else the first executable regular file
/// of that name on the command's own PATH.
fn find_program(name: &str, path_var: Option<&OsString>) -> Result<String, String> {
    if name.contains('/') {
        return Ok(name.to_string());
    }
    let path_var = path_var.map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|| "/bin:/usr/bin".into());
    let mut denied: Option<String> = None;
    for folder in path_var.split(':') {
        let path = if folder.is_empty() || folder.ends_with('/') { format!("{}{}", folder, name) } else { format!("{}/{}", folder, name) };
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(_) => continue,
        };
        if meta.is_file() && sys::executable(&path) {
            return Ok(path);
        }
        denied.get_or_insert(path);
    }
    match denied {
        Some(path) => Err(format!("{}: {}", sys::strerror(13), path)),
        None => Err(format!("{}: {}", sys::strerror(2), name)),
    }
}

/// What a command (an exec's or a terminal's) runs: checked, and ready for a Command.
pub struct Launch {
    argv: Vec<String>,
    env: BTreeMap<OsString, OsString>,
    cwd: Option<String>,
    program: String,
}

impl Launch {
    /// The command in its own session (so its whole tree can be found, and killed, by session id); stdio and
    /// any further pre_exec hooks are the caller's.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.arg0(&self.argv[0]).args(&self.argv[1..]).env_clear().envs(&self.env);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        unsafe {
            command.pre_exec(sys::new_session);
        }
        command
    }

    pub fn spawn(&self, command: &mut Command) -> Result<std::process::Child, StartError> {
        command.spawn().map_err(|err| StartError::Cannot(os_message(&err, &self.program)))
    }
}

/// Check a request's argv, env (over the agent's own and `defaults`) and cwd, and find its program.
pub fn prepare(agent: &Agent, rid: i64, header: &Value, defaults: &[(&str, &str)]) -> Result<Launch, StartError> {
    let argv: Vec<String> = match field(header, "argv").map_err(StartError::Request)? {
        Value::Arr(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| StartError::Request(Failure::Internal("TypeError: argv must be strings".into())))?,
        _ => return Err(StartError::Request(Failure::Internal("TypeError: argv must be a list".into()))),
    };
    if argv.is_empty() {
        return Err(StartError::Cannot("argv is empty".into()));
    }
    let mut env: BTreeMap<OsString, OsString> = agent.base_env.iter().cloned().collect();
    for (key, value) in defaults {
        env.insert(key.into(), value.into());
    }
    if let Some(Value::Obj(items)) = header.get("env") {
        for (key, value) in items {
            let value = match value {
                Value::Str(text) => text.clone(),
                _ => return Err(StartError::Request(Failure::Internal("TypeError: env values must be strings".into()))),
            };
            if key.contains('\0') || value.contains('\0') {
                return Err(StartError::Cannot("embedded null byte".into()));
            }
            if key.is_empty() || key.contains('=') {
                return Err(StartError::Cannot("illegal environment variable name".into()));
            }
            env.insert(key.into(), value.into());
        }
    }
    env.insert(EXEC_MARK.into(), agent.mark(rid).into());
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(StartError::Cannot("embedded null byte".into()));
    }
    let cwd = header.get("cwd").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_string);
    if let Some(cwd) = &cwd {
        if cwd.contains('\0') {
            return Err(StartError::Cannot("embedded null byte".into()));
        }
        match std::fs::metadata(cwd) {
            Err(err) => return Err(StartError::Cannot(os_message(&err, cwd))),
            Ok(meta) if !meta.is_dir() => return Err(StartError::Cannot(format!("{}: {}", sys::strerror(20), cwd))),
            Ok(_) => {}
        }
    }
    let program = find_program(&argv[0], env.get(std::ffi::OsStr::new("PATH"))).map_err(StartError::Cannot)?;
    Ok(Launch { argv, env, cwd, program })
}

/// A started command: its pid and our ends of its pipes (Files from sys::pipe: std::io::pipe is newer than
/// Debian's rustc).
struct Started {
    pid: i32,
    out_r: File,
    err_r: File,
    stdin_w: Option<File>,
}

fn c_string(text: &[u8]) -> Result<CString, StartError> {
    CString::new(text).map_err(|_| StartError::Cannot("embedded null byte".into()))
}

/// Start the command with posix_spawn (a vfork: the agent's memory is not copied), in its own session.
fn spawn(agent: &Agent, rid: i64, header: &Value, has_stdin: bool) -> Result<Started, StartError> {
    let launch = prepare(agent, rid, header, &[])?;
    let program = c_string(launch.program.as_bytes())?;
    let argv = launch.argv.iter().map(|a| c_string(a.as_bytes())).collect::<Result<Vec<_>, _>>()?;
    let env = launch
        .env
        .iter()
        .map(|(k, v)| c_string(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = launch.cwd.as_deref().map(|c| c_string(c.as_bytes())).transpose()?;
    let pipe_err = |e: io::Error| StartError::Request(Failure::os(&e, "pipe").without_name());
    let (out_r, out_w) = sys::pipe().map_err(pipe_err)?;
    let (err_r, err_w) = sys::pipe().map_err(pipe_err)?;
    let (stdin_r, stdin_w) = if has_stdin {
        let (r, w) = sys::pipe().map_err(pipe_err)?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let pid = sys::spawn(
        &program,
        &argv,
        &env,
        cwd.as_deref(),
        stdin_r.as_ref().map(|r| r.as_raw_fd()),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
    )
    .map_err(|err| StartError::Cannot(os_message(&err, &launch.program)))?;
    // out_w, err_w and stdin_r close here: the command holds the only write ends, so its end of file is ours.
    Ok(Started { pid, out_r, err_r, stdin_w })
}

/// One thread per command: it waits on the command's pidfd and reads both its pipes in one epoll, so the exit
/// frame goes out as soon as the command ended and its pipes reached end of file (or DRAIN_AFTER_EXIT passed).
fn run(agent: &Arc<Agent>, job: &Job, header: &Value, started: Started, body: Vec<u8>) {
    let cap = header.get("max_output").and_then(Value::as_i64).unwrap_or(1 << 20).max(0) as u64;
    let Started { pid, out_r, err_r, stdin_w } = started;
    let rid = job.rid;
    let stop = Arc::new(AtomicBool::new(false)); // stop feeding stdin
    if let Some(stdin_w) = stdin_w {
        let stop = stop.clone();
        spawn_thread("stdin", move || feed(stdin_w, body, &stop));
    }
    let timeout = header.get("timeout").and_then(Value::as_f64).filter(|t| *t > 0.0);
    let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.min(1e9)));
    let (code, totals) = watch(agent, job, [out_r, err_r], cap, deadline);
    stop.store(true, Ordering::Relaxed);
    agent.kill_tree(pid, rid); // leftovers of a finished command die with it
    agent.jobs.lock().unwrap().remove(&rid);
    let reason = job.reasons.lock().unwrap().first().cloned().unwrap_or(Value::Null);
    agent.out.send_now(&exit_frame(rid, code, totals, reason, Value::Null), b"");
}

const PIDFD: u64 = 2; // the epoll token of the command's pidfd (0 and 1: its stdout and stderr)

fn millis_until(at: Instant) -> i32 {
    at.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128 - 1) as i32 + 1
}

/// Forward what the command writes to its stdout and stderr (up to the cap on each; the rest is only counted),
/// in the order the pipes became readable, until it has ended and both pipes are at end of file (or
/// DRAIN_AFTER_EXIT passed since it ended: background children may hold them open); kill its tree at the
/// deadline. While the manager is behind, output stays in the pipes (the command blocks on them), until the
/// command ends: then its pipes drain regardless. Its exit code and the two totals.
fn watch(agent: &Agent, job: &Job, pipes: [File; 2], cap: u64, deadline: Option<Instant>) -> (i64, [u64; 2]) {
    let heads: Vec<String> = [1, 2]
        .iter()
        .map(|fd| obj(vec![("id", Value::Int(job.rid)), ("ev", s("out")), ("fd", Value::Int(*fd))]).dumps())
        .collect();
    let mut totals = [0u64; 2];
    let pidfd = sys::pidfd_open(job.pid);
    let epoll = match sys::Epoll::new() {
        Ok(epoll) => epoll,
        Err(_) => return (sys::reap(job.pid, true).unwrap_or(255), totals),
    };
    let mut open = [false; 2];
    for (i, pipe) in pipes.iter().enumerate() {
        open[i] = epoll.add(pipe.as_raw_fd(), sys::EPOLLIN, i as u64).is_ok();
    }
    // Without a pidfd (Linux < 5.3) the loop looks at the command every 10 ms.
    let pidfd_watched = pidfd.as_ref().map_or(false, |fd| epoll.add(fd.as_raw_fd(), sys::EPOLLIN, PIDFD).is_ok());
    let (mut code, mut drain_until, mut timed_out) = (None, None, false);
    let mut buf = vec![0u8; CHUNK];
    loop {
        if code.is_none() {
            code = sys::reap(job.pid, false);
            if code.is_some() {
                drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                if let (true, Some(fd)) = (pidfd_watched, &pidfd) {
                    epoll.remove(fd.as_raw_fd()); // readable from now on: it would wake every wait
                }
            }
        }
        if code.is_some() && !(open[0] || open[1]) {
            break;
        }
        let mut wait_ms = -1;
        match (code.is_some(), deadline) {
            (true, _) => {
                let until = drain_until.expect("set with code");
                if Instant::now() >= until {
                    break;
                }
                wait_ms = millis_until(until);
            }
            (false, Some(deadline)) if !timed_out => {
                if Instant::now() >= deadline {
                    timed_out = true;
                    job.reasons.lock().unwrap().push(s("timeout"));
                    agent.kill_tree(job.pid, job.rid);
                    continue;
                }
                wait_ms = millis_until(deadline);
            }
            _ => {}
        }
        if !pidfd_watched && code.is_none() {
            wait_ms = if wait_ms < 0 { 10 } else { wait_ms.min(10) };
        }
        if code.is_none() && agent.out.congested() {
            // The manager is behind: leave the output in the pipes, and look at the command now and then.
            let limit = if wait_ms < 0 { POLL_MS } else { wait_ms.min(POLL_MS) };
            agent.out.wait_room(Duration::from_millis(limit as u64));
            continue;
        }
        let ready = match epoll.wait(wait_ms) {
            Ok(ready) => ready,
            Err(_) => break,
        };
        for token in ready {
            let i = token as usize;
            if token == PIDFD || !open[i] {
                continue; // the command ended: the loop's top reaps it
            }
            let n = match (&pipes[i]).read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            if n == 0 {
                open[i] = false;
                epoll.remove(pipes[i].as_raw_fd());
                continue;
            }
            let sent = totals[i];
            totals[i] += n as u64;
            if sent < cap {
                let (head, take) = (&heads[i], ((cap - sent) as usize).min(n));
                let mut frame = Vec::with_capacity(8 + head.len() + take);
                frame.extend_from_slice(&((4 + head.len() + take) as u32).to_be_bytes());
                frame.extend_from_slice(&(head.len() as u32).to_be_bytes());
                frame.extend_from_slice(head.as_bytes());
                frame.extend_from_slice(&buf[..take]);
                agent.out.push(frame);
            }
        }
    }
    // Ended (or the epoll failed: then wait for it here).
    let code = code.or_else(|| sys::reap(job.pid, true)).unwrap_or(255);
    (code, totals)
}

/// Write the command's stdin as its pipe takes it, then close it. EPIPE (the command did not read it all)
/// is its business.
fn feed(pipe: File, body: Vec<u8>, stop: &AtomicBool) {
    let mut pipe = pipe;
    let mut rest: &[u8] = &body;
    while !rest.is_empty() && !stop.load(Ordering::Relaxed) {
        match sys::wait_fd(pipe.as_raw_fd(), sys::POLLOUT, POLL_MS) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(_) => return,
        }
        // Ready: a blocking write of at most one pipe buffer returns without waiting for the reader.
        let piece = &rest[..rest.len().min(4096)];
        match pipe.write(piece) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

pub fn env_snapshot() -> Vec<(OsString, OsString)> {
    std::env::vars_os().collect()
}

