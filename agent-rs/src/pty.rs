//! pty and the ops aimed at a terminal (pty_input, pty_resize, pty_ack; cancel as for an exec): a program on a
//! pseudo-terminal in its own session, the terminal its controlling tty. See PROTOCOL.md.
//!
//! The request thread opens the terminal, starts the program and says "started" (so the next request, its
//! input, finds it); then one thread per terminal polls the master (output while fewer than PTY_WINDOW bytes
//! are unacknowledged, queued keystrokes while it takes them), the program's pidfd and an eventfd that acks
//! and input bump. Once the program has ended its tree is killed, the terminal drains (until end of file, or
//! DRAIN_AFTER_EXIT: what is left is at most the terminal's buffer), input still queued is answered, and the
//! exit frame goes.

use crate::exec::{self, Agent, Job, StartError};
use crate::files::{int_field, Failure};
use crate::json::{obj, s, Value};
use crate::sys;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A terminal's output bytes in flight before the agent waits for the manager's pty_ack.
pub const PTY_WINDOW: u64 = 1 << 20;
const CHUNK: usize = 64 * 1024;
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
const THREAD_STACK: usize = 128 * 1024;

pub struct Terminal {
    master: File,
    wake: File,
    state: Mutex<State>,
}

struct State {
    acked: u64,
    /// (pty_input request id, keystrokes, how many are written), in order.
    inputs: VecDeque<(Value, Vec<u8>, usize)>,
    /// The exit frame is going: input answers at once, resizes do nothing.
    closed: bool,
}

fn ok(rid: &Value) -> Value {
    obj(vec![("id", rid.clone()), ("ev", s("ok"))])
}

impl Terminal {
    fn wake(&self) {
        let _ = (&self.wake).write(&1u64.to_ne_bytes());
    }

    /// pty_ack: the manager has taken `consumed` output bytes in all.
    pub fn ack(&self, consumed: i64) {
        let mut state = self.state.lock().unwrap();
        state.acked = state.acked.max(consumed.max(0) as u64);
        drop(state);
        self.wake();
    }

    /// pty_input: queue keystrokes; request rid is answered once they are written (or the program has ended).
    pub fn type_input(&self, rid: Value, data: Vec<u8>, agent: &Agent) {
        let mut state = self.state.lock().unwrap();
        if state.closed || data.is_empty() {
            agent.out.send(&ok(&rid), b"");
            return;
        }
        state.inputs.push_back((rid, data, 0));
        drop(state);
        self.wake();
    }

    /// pty_resize: the kernel sends the program SIGWINCH.
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        if self.state.lock().unwrap().closed {
            return Ok(());
        }
        sys::set_window_size(self.master.as_raw_fd(), rows, cols)
    }

    /// Write queued keystrokes while the terminal takes them (never blocks: the master is non-blocking).
    fn write_input(&self, agent: &Agent) {
        let mut state = self.state.lock().unwrap();
        while let Some(front) = state.inputs.front_mut() {
            match (&self.master).write(&front.1[front.2..]) {
                Ok(n) => front.2 += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => front.2 = front.1.len(), // EIO: the program closed its terminal; the input goes nowhere
            }
            if front.2 >= front.1.len() {
                let (rid, _, _) = state.inputs.pop_front().unwrap();
                agent.out.send(&ok(&rid), b"");
            }
        }
    }
}

fn size_field(header: &Value, key: &str) -> Result<u16, Failure> {
    let value = int_field(header, key)?;
    if !(0..=0xffff).contains(&value) {
        return Err(Failure::Internal(format!("ValueError: {} must be between 0 and 65535", key)));
    }
    Ok(value as u16)
}

/// The rows and cols of a pty or pty_resize request.
pub fn window(header: &Value) -> Result<(u16, u16), Failure> {
    Ok((size_field(header, "rows")?, size_field(header, "cols")?))
}

/// A string as Python's repr() writes it (the "cannot start" line names the program so).
fn py_repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    let mut out = String::new();
    out.push(quote);
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Handle a pty request: Err for a malformed one (or no terminal to be had); else it replies with its own
/// frames: "started" then output, or the reason it cannot start; then "exit".
pub fn start(agent: &Arc<Agent>, rid: i64, header: &Value) -> Result<(), Failure> {
    let launch = match exec::prepare(agent, rid, header, &[("TERM", "xterm-256color")]) {
        Err(StartError::Request(failure)) => return Err(failure),
        other => other,
    };
    let (master, slave) = sys::openpty().map_err(|e| Failure::os(&e, "").without_name())?;
    let (rows, cols) = window(header)?;
    let started = launch.and_then(|launch| {
        sys::set_window_size(master.as_raw_fd(), rows, cols)
            .map_err(|e| StartError::Cannot(sys::strerror(e.raw_os_error().unwrap_or(0))))?;
        let stdio = || slave.try_clone().map(Stdio::from).map_err(|e| StartError::Cannot(e.to_string()));
        let mut command = launch.command();
        command.stdin(stdio()?).stdout(stdio()?).stderr(stdio()?);
        unsafe {
            command.pre_exec(sys::take_terminal); // after the session: its leader takes the terminal
        }
        launch.spawn(&mut command)
    });
    drop(slave); // the program holds it now: the master reads EIO once every holder has closed it
    let child = match started {
        Ok(child) => child,
        Err(StartError::Cannot(message)) => {
            let argv0 = header.get("argv").and_then(|a| match a {
                Value::Arr(items) => items.first().and_then(Value::as_str),
                _ => None,
            });
            let line = format!("cannot start {}: {}\r\n", py_repr(argv0.unwrap_or("")), message);
            agent.out.send(&obj(vec![("id", Value::Int(rid)), ("ev", s("out"))]), line.as_bytes());
            agent.out.send(&obj(vec![("id", Value::Int(rid)), ("ev", s("exit")), ("code", Value::Int(127))]), b"");
            return Ok(());
        }
        Err(StartError::Request(failure)) => return Err(failure),
    };
    let pid = child.id() as i32;
    let wake = sys::event_fd().and_then(|wake| sys::set_nonblocking(master.as_raw_fd()).map(|_| wake));
    let wake = match wake {
        Ok(wake) => wake,
        Err(err) => {
            agent.kill_tree(pid, rid);
            return Err(Failure::os(&err, "").without_name());
        }
    };
    let term = Arc::new(Terminal {
        master,
        wake,
        state: Mutex::new(State { acked: 0, inputs: VecDeque::new(), closed: false }),
    });
    agent.out.send(&obj(vec![("id", Value::Int(rid)), ("ev", s("started")), ("pid", Value::Int(pid as i64))]), b"");
    agent.jobs.lock().unwrap().insert(rid, Job::new(pid, rid));
    agent.ptys.lock().unwrap().insert(rid, term.clone());
    let agent = agent.clone();
    std::thread::Builder::new()
        .name("pty".into())
        .stack_size(THREAD_STACK)
        .spawn(move || run(&agent, rid, &term, child))
        .expect("thread");
    Ok(())
}

/// The terminal's life after "started": see the top of this file.
fn run(agent: &Agent, rid: i64, term: &Terminal, mut child: Child) {
    let pid = child.id() as i32;
    let pidfd = sys::pidfd_open(pid);
    let head = obj(vec![("id", Value::Int(rid)), ("ev", s("out"))]).dumps();
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut eof = false; // every process holding the terminal has closed it
    let mut status = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        let (window_open, want_write) = {
            let state = term.state.lock().unwrap();
            // Once the program has ended, what is left is at most the terminal's buffer: take it all.
            (status.is_some() || sent - state.acked < PTY_WINDOW, !state.inputs.is_empty())
        };
        let master_events = if !eof && window_open { sys::POLLIN } else { 0 } | if want_write { sys::POLLOUT } else { 0 };
        let mut fds = vec![sys::PollFd { fd: term.wake.as_raw_fd(), events: sys::POLLIN, revents: 0 }];
        if master_events != 0 {
            fds.push(sys::PollFd { fd: term.master.as_raw_fd(), events: master_events, revents: 0 });
        }
        if let (Some(fd), None) = (&pidfd, &status) {
            fds.push(sys::PollFd { fd: fd.as_raw_fd(), events: sys::POLLIN, revents: 0 });
        }
        let timeout_ms = match (drain_until, &pidfd) {
            (Some(until), _) => until.saturating_duration_since(Instant::now()).as_millis() as i32 + 1,
            (None, None) => 10, // no pidfd (Linux < 5.3): look for the program's end now and then
            (None, Some(_)) => -1,
        };
        if sys::wait_fds(&mut fds, timeout_ms).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut drained = [0u8; 8];
        let _ = (&term.wake).read(&mut drained);
        let ready = fds.iter().find(|f| f.fd == term.master.as_raw_fd()).map_or(0, |f| f.revents);
        let gone = sys::POLLHUP | sys::POLLERR;
        if master_events & sys::POLLIN != 0 && ready & (sys::POLLIN | gone) != 0 {
            match (&term.master).read(&mut buf) {
                Ok(0) => eof = true,
                Ok(n) => {
                    sent += n as u64;
                    let mut frame = Vec::with_capacity(8 + head.len() + n);
                    frame.extend_from_slice(&((4 + head.len() + n) as u32).to_be_bytes());
                    frame.extend_from_slice(&(head.len() as u32).to_be_bytes());
                    frame.extend_from_slice(head.as_bytes());
                    frame.extend_from_slice(&buf[..n]);
                    agent.out.push(frame);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => eof = true, // EIO: every process holding the terminal has closed it
            }
        }
        if master_events & sys::POLLOUT != 0 && ready & (sys::POLLOUT | gone) != 0 {
            term.write_input(agent);
        }
        if status.is_none() {
            if let Ok(Some(ended)) = child.try_wait() {
                status = Some(ended);
                agent.kill_tree(pid, rid); // its session goes with it, then the terminal drains
                drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
            }
        }
        if let Some(until) = drain_until {
            if eof || Instant::now() >= until {
                break;
            }
        }
    }
    {
        let mut state = term.state.lock().unwrap();
        state.closed = true;
        for (input, _, _) in state.inputs.drain(..) {
            agent.out.send(&ok(&input), b""); // input still waiting for room goes nowhere now
        }
    }
    agent.ptys.lock().unwrap().remove(&rid);
    agent.jobs.lock().unwrap().remove(&rid);
    let status = status.expect("ended");
    let mut exit = vec![("id", Value::Int(rid)), ("ev", s("exit"))];
    match (status.code(), status.signal()) {
        (Some(code), _) => exit.push(("code", Value::Int(code as i64))),
        (None, Some(signal)) => {
            exit.push(("code", Value::Int(128 + signal as i64)));
            exit.push(("signal", Value::Int(signal as i64))); // the signal that killed it
        }
        (None, None) => exit.push(("code", Value::Int(255))),
    }
    agent.out.send(&obj(exit), b"");
    sys::release_free_memory();
}
