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
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
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
    let job = Job::new(started.child.id() as i32, rid);
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

/// The pipes are Files from sys::pipe (std::io::pipe is newer than Debian's rustc).
struct Started {
    child: std::process::Child,
    out_r: File,
    err_r: File,
    stdin_w: Option<File>,
}

fn spawn(agent: &Agent, rid: i64, header: &Value, has_stdin: bool) -> Result<Started, StartError> {
    let launch = prepare(agent, rid, header, &[])?;
    let pipe_err = |e: io::Error| StartError::Request(Failure::os(&e, "pipe").without_name());
    let (out_r, out_w) = sys::pipe().map_err(pipe_err)?;
    let (err_r, err_w) = sys::pipe().map_err(pipe_err)?;
    let (stdin, stdin_w) = if has_stdin {
        let (r, w) = sys::pipe().map_err(pipe_err)?;
        (Stdio::from(r), Some(w))
    } else {
        (Stdio::null(), None)
    };
    let mut command = launch.command();
    command.stdin(stdin).stdout(out_w).stderr(err_w);
    let child = launch.spawn(&mut command)?;
    drop(command); // our copies of its ends of the pipes: its end of file is ours
    Ok(Started { child, out_r, err_r, stdin_w })
}

fn run(agent: &Arc<Agent>, job: &Job, header: &Value, started: Started, body: Vec<u8>) {
    let cap = header.get("max_output").and_then(Value::as_i64).unwrap_or(1 << 20).max(0) as u64;
    let Started { mut child, out_r, err_r, stdin_w } = started;
    let (pid, rid) = (job.pid, job.rid);

    let exited = Arc::new(AtomicBool::new(false)); // output then drains regardless of the manager's pace
    let stop = Arc::new(AtomicBool::new(false)); // stop reading and writing the pipes
    let (done_tx, done_rx) = mpsc::channel::<[u64; 2]>();
    let reader = {
        let (out, exited, stop) = (agent.out.clone(), exited.clone(), stop.clone());
        spawn_thread("reader", move || {
            let _ = done_tx.send(forward([out_r, err_r], rid, cap, &out, &exited, &stop));
        })
    };
    if let Some(stdin_w) = stdin_w {
        let stop = stop.clone();
        spawn_thread("stdin", move || feed(stdin_w, body, &stop));
    }

    let timeout = header.get("timeout").and_then(Value::as_f64).filter(|t| *t > 0.0);
    let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.min(1e9)));
    let status = wait_child(agent, job, &mut child, deadline);
    exited.store(true, Ordering::Relaxed);

    // Its pipes at end of file, or DRAIN_AFTER_EXIT passed (background children may hold them open).
    let drained = done_rx.recv_timeout(DRAIN_AFTER_EXIT).ok();
    stop.store(true, Ordering::Relaxed);
    agent.kill_tree(pid, rid); // leftovers of a finished command die with it
    agent.jobs.lock().unwrap().remove(&rid);
    let _ = reader.join();
    let totals = drained.or_else(|| done_rx.try_recv().ok()).unwrap_or([0, 0]);
    let code = match status {
        Some(status) => status.code().map(i64::from).or(status.signal().map(|n| 128 + n as i64)).unwrap_or(255),
        None => 255,
    };
    let reason = job.reasons.lock().unwrap().first().cloned().unwrap_or(Value::Null);
    agent.out.send(&exit_frame(rid, code, totals, reason, Value::Null), b"");
}

/// Wait for the command to end, killing its tree at the deadline.
fn wait_child(agent: &Agent, job: &Job, child: &mut std::process::Child, deadline: Option<Instant>)
    -> Option<std::process::ExitStatus> {
    let pidfd = sys::pidfd_open(job.pid);
    let mut timed_out = false;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        let wait_ms = match (deadline, timed_out) {
            (Some(deadline), false) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    timed_out = true;
                    job.reasons.lock().unwrap().push(s("timeout"));
                    agent.kill_tree(job.pid, job.rid);
                    continue;
                }
                left.as_millis().min(i32::MAX as u128) as i32 + 1
            }
            _ => -1,
        };
        match &pidfd {
            Some(fd) => {
                if sys::wait_fd(fd.as_raw_fd(), sys::POLLIN, wait_ms).is_err() {
                    return child.wait().ok();
                }
            }
            None => std::thread::sleep(Duration::from_millis(if wait_ms < 0 { 10 } else { wait_ms.min(10) as u64 })),
        }
    }
}

/// Send what the command writes to its stdout and stderr (up to the cap on each; the rest is only counted), in
/// the order the pipes became readable; the two totals, once both pipes are at end of file (or `stop`).
fn forward(pipes: [File; 2], rid: i64, cap: u64, out: &Out, exited: &AtomicBool, stop: &AtomicBool) -> [u64; 2] {
    let heads: Vec<String> = [1, 2]
        .iter()
        .map(|fd| obj(vec![("id", Value::Int(rid)), ("ev", s("out")), ("fd", Value::Int(*fd))]).dumps())
        .collect();
    let mut totals = [0u64; 2];
    let epoll = match sys::Epoll::new() {
        Ok(epoll) => epoll,
        Err(_) => return totals,
    };
    let mut open = [false; 2];
    for (i, pipe) in pipes.iter().enumerate() {
        open[i] = epoll.add(pipe.as_raw_fd(), sys::EPOLLIN, i as u64).is_ok();
    }
    let mut buf = vec![0u8; CHUNK];
    while open[0] || open[1] {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let ready = match epoll.wait(POLL_MS) {
            Ok(ready) => ready,
            Err(_) => break,
        };
        for token in ready {
            let i = token as usize;
            if !open[i] || stop.load(Ordering::Relaxed) {
                continue;
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
                out.push(frame);
                // The manager is behind: leave the output in the pipes (the command waits on them).
                out.wait_for_room(exited);
            }
        }
    }
    totals
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

