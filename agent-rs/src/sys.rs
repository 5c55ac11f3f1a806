//! The few libc calls std does not wrap (std links libc already: these are declarations, not crates).
//! Paths and calls are those of Rust 1.63, Debian 12's rustc: std::os::raw and std::os::unix::io, not
//! std::ffi's c_int (1.64) or std::os::fd (1.66).

use std::fs::File;
use std::io;
use std::os::raw::{c_char, c_int};
use std::os::unix::io::{FromRawFd, OwnedFd};

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

extern "C" {
    fn setsid() -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn poll(fds: *mut PollFd, nfds: u64, timeout: c_int) -> c_int;
    fn access(path: *const c_char, mode: c_int) -> c_int;
    fn syscall(number: i64, ...) -> i64;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn umask(mask: u32) -> u32;
    fn sigemptyset(set: *mut SigSet) -> c_int;
    fn sigaddset(set: *mut SigSet, sig: c_int) -> c_int;
    fn pthread_sigmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
    fn sigwait(set: *const SigSet, sig: *mut c_int) -> c_int;
}

/// glibc's sigset_t: 1024 bits.
#[repr(C)]
struct SigSet([u64; 16]);

const SIGTERM: c_int = 15;
const SIG_BLOCK: c_int = 0;

fn sigterm_set() -> SigSet {
    let mut set = SigSet([0; 16]);
    unsafe {
        sigemptyset(&mut set);
        sigaddset(&mut set, SIGTERM);
    }
    set
}

/// Block SIGTERM in this thread and the threads it starts later (call it before any), so that
/// wait_sigterm() takes it. Commands do not inherit the mask: std resets it in every child.
pub fn block_sigterm() {
    let set = sigterm_set();
    unsafe {
        pthread_sigmask(SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Return once a SIGTERM (blocked by block_sigterm) arrives.
pub fn wait_sigterm() {
    let set = sigterm_set();
    let mut sig: c_int = 0;
    while unsafe { sigwait(&set, &mut sig) } != 0 || sig != SIGTERM {}
}

/// Run f with the file mode creation mask set to mask (the process's: call it while no other thread
/// creates files).
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    let old = unsafe { umask(mask) };
    let result = f();
    unsafe {
        umask(old);
    }
    result
}

pub const SIGKILL: c_int = 9;
pub const POLLIN: i16 = 0x1;
pub const POLLOUT: i16 = 0x4;
const SYS_PIDFD_OPEN: i64 = 434;
const F_GETFD: c_int = 1;
const F_SETFD: c_int = 2;
const FD_CLOEXEC: c_int = 1;
const O_CLOEXEC: c_int = 0o2000000;
pub const O_NONBLOCK: i32 = 0o4000;

pub fn new_session() -> io::Result<()> {
    if unsafe { setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn sigkill(pid: i32) {
    unsafe {
        kill(pid, SIGKILL);
    }
}

/// Wait until fd is ready for `events` or timeout_ms passes (-1: no limit). Ok(true) when ready (or hung up).
pub fn wait_fd(fd: i32, events: i16, timeout_ms: i32) -> io::Result<bool> {
    let mut entry = PollFd { fd, events, revents: 0 };
    loop {
        let n = unsafe { poll(&mut entry, 1, timeout_ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(n > 0);
    }
}

pub fn executable(path: &str) -> bool {
    match std::ffi::CString::new(path) {
        Ok(c) => unsafe { access(c.as_ptr(), 1) == 0 },
        Err(_) => false,
    }
}

/// A pidfd for child pid (Linux 5.3+): readable once it has ended.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    let fd = unsafe { syscall(SYS_PIDFD_OPEN, pid as i64, 0i64) };
    if fd < 0 {
        return None;
    }
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A pipe as (reader, writer), both ends close-on-exec so no command inherits them (what std::io::pipe
/// does; that is Rust 1.87).
pub fn pipe() -> io::Result<(File, File)> {
    let mut fds: [c_int; 2] = [-1, -1];
    if unsafe { pipe2(fds.as_mut_ptr(), O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Make every inherited fd above stdio close-on-exec, so none leaks into the commands.
pub fn cloexec_inherited() {
    if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
        let fds: Vec<i32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2)
            .collect();
        for fd in fds {
            unsafe {
                let flags = fcntl(fd, F_GETFD);
                if flags >= 0 {
                    fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
                }
            }
        }
    }
}

/// strerror's text for errno, as Python's OSError.strerror has it.
pub fn strerror(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}
