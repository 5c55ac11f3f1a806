//! The few libc calls std does not wrap (std links libc already: these are declarations, not crates).
//! Paths and calls are those of Rust 1.63, Debian 12's rustc: std::os::raw and std::os::unix::io, not
//! std::ffi's c_int (1.64) or std::os::fd (1.66).

use std::fs::File;
use std::io;
use std::os::raw::{c_char, c_int};
use std::os::unix::io::{FromRawFd, OwnedFd};

#[repr(C)]
pub struct PollFd {
    pub fd: c_int,
    pub events: i16,
    pub revents: i16,
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
    fn ioctl(fd: c_int, request: u64, ...) -> c_int;
    fn eventfd(initval: u32, flags: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn malloc_trim(pad: usize) -> c_int;
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut EpollEvent) -> c_int;
    fn epoll_wait(epfd: c_int, events: *mut EpollEvent, max: c_int, timeout: c_int) -> c_int;
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
pub const POLLERR: i16 = 0x8;
pub const POLLHUP: i16 = 0x10;
const SYS_PIDFD_OPEN: i64 = 434;
const F_GETFD: c_int = 1;
const F_SETFD: c_int = 2;
const F_GETFL: c_int = 3;
const F_SETFL: c_int = 4;
const O_RDWR: c_int = 2;
const O_NOCTTY: c_int = 0o400;
const TIOCSWINSZ: u64 = 0x5414;
const TIOCSCTTY: u64 = 0x540e;
const TIOCGPTN: u64 = 0x8004_5430;
const TIOCSPTLCK: u64 = 0x4004_5431;
const TIOCGPTPEER: u64 = 0x5441;
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
    let mut entry = [PollFd { fd, events, revents: 0 }];
    Ok(wait_fds(&mut entry, timeout_ms)? > 0)
}

/// poll(2) over several fds (their revents set); how many are ready, 0 when timeout_ms passed first.
pub fn wait_fds(fds: &mut [PollFd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        let n = unsafe { poll(fds.as_mut_ptr(), fds.len() as u64, timeout_ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(n as usize);
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

fn check(result: c_int) -> io::Result<c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// A new pseudo-terminal as (master, slave), both close-on-exec and neither the agent's controlling terminal:
/// /dev/ptmx, unlocked, and its peer opened through the master (TIOCGPTPEER, Linux 4.13+: no path lookup), else
/// by its /dev/pts name. What glibc's openpty does, without libutil (not in every static libc).
pub fn openpty() -> io::Result<(File, File)> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let open = |path: &str| std::fs::OpenOptions::new().read(true).write(true).custom_flags(O_NOCTTY).open(path);
    let master = open("/dev/ptmx")?;
    let fd = master.as_raw_fd();
    let unlock: c_int = 0;
    check(unsafe { ioctl(fd, TIOCSPTLCK, &unlock as *const c_int) })?;
    let peer = unsafe { ioctl(fd, TIOCGPTPEER, (O_RDWR | O_NOCTTY | O_CLOEXEC) as u64) };
    if peer >= 0 {
        return Ok((master, unsafe { File::from_raw_fd(peer) }));
    }
    let mut number: u32 = 0;
    check(unsafe { ioctl(fd, TIOCGPTN, &mut number as *mut u32) })?;
    let slave = open(&format!("/dev/pts/{}", number))?;
    Ok((master, slave))
}

#[repr(C)]
struct WinSize {
    rows: u16,
    cols: u16,
    x_pixels: u16,
    y_pixels: u16,
}

/// Set a terminal's size (the kernel sends SIGWINCH to its foreground process group).
pub fn set_window_size(fd: i32, rows: u16, cols: u16) -> io::Result<()> {
    let size = WinSize { rows, cols, x_pixels: 0, y_pixels: 0 };
    check(unsafe { ioctl(fd, TIOCSWINSZ, &size as *const WinSize) })?;
    Ok(())
}

/// In a new session's leader (a pre_exec hook): make the terminal on fd 0 its controlling terminal.
pub fn take_terminal() -> io::Result<()> {
    check(unsafe { ioctl(0, TIOCSCTTY, 0u64) })?;
    Ok(())
}

pub fn set_nonblocking(fd: i32) -> io::Result<()> {
    let flags = check(unsafe { fcntl(fd, F_GETFL) })?;
    check(unsafe { fcntl(fd, F_SETFL, flags | O_NONBLOCK) })?;
    Ok(())
}

/// A non-blocking, close-on-exec eventfd: a counter one thread bumps to wake another from poll.
pub fn event_fd() -> io::Result<File> {
    let fd = check(unsafe { eventfd(0, O_CLOEXEC | O_NONBLOCK) })?;
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// struct epoll_event: packed on x86_64.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct EpollEvent {
    events: u32,
    data: u64,
}

pub const EPOLLIN: u32 = 0x1;
const EPOLL_CTL_ADD: c_int = 1;
const EPOLL_CTL_DEL: c_int = 2;

/// An epoll instance. Unlike poll(2), a wait returns the ready fds in the order they became ready (the kernel's
/// ready list is first in, first out): what a command wrote to stderr between two writes to stdout is read so.
pub struct Epoll(File);

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        let fd = check(unsafe { epoll_create1(O_CLOEXEC) })?;
        Ok(Epoll(unsafe { File::from_raw_fd(fd) }))
    }

    /// Watch fd for `events`; waits report it by `token`.
    pub fn add(&self, fd: i32, events: u32, token: u64) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        let mut event = EpollEvent { events, data: token };
        check(unsafe { epoll_ctl(self.0.as_raw_fd(), EPOLL_CTL_ADD, fd, &mut event) })?;
        Ok(())
    }

    pub fn remove(&self, fd: i32) {
        use std::os::unix::io::AsRawFd;
        let mut event = EpollEvent { events: 0, data: 0 };
        unsafe {
            epoll_ctl(self.0.as_raw_fd(), EPOLL_CTL_DEL, fd, &mut event);
        }
    }

    /// The tokens of the fds that are ready, in the order they became so (none once timeout_ms passed).
    pub fn wait(&self, timeout_ms: i32) -> io::Result<Vec<u64>> {
        use std::os::unix::io::AsRawFd;
        let mut events = [EpollEvent { events: 0, data: 0 }; 8];
        loop {
            let n = unsafe { epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), events.len() as c_int, timeout_ms) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            return Ok(events[..n as usize].iter().map(|e| e.data).collect());
        }
    }
}

/// Give the memory freed by a finished command (its output buffers, in whichever thread's arena) back to the
/// system: an idle agent should be as small as a fresh one.
pub fn release_free_memory() {
    unsafe {
        malloc_trim(0);
    }
}

// posix_spawn: glibc's runs the child with CLONE_VM | CLONE_VFORK (no copy of the agent's page tables, no
// copy-on-write faults in its threads afterwards) and reports a failed exec's errno back. Opaque, over-sized and
// aligned stand-ins for glibc's posix_spawnattr_t (336 bytes on x86_64 and aarch64) and
// posix_spawn_file_actions_t (80 bytes).
#[repr(C, align(8))]
struct SpawnAttr([u8; 512]);
#[repr(C, align(8))]
struct FileActions([u8; 256]);

extern "C" {
    fn posix_spawn(
        pid: *mut c_int,
        path: *const c_char,
        actions: *const FileActions,
        attr: *const SpawnAttr,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int;
    fn posix_spawnattr_init(attr: *mut SpawnAttr) -> c_int;
    fn posix_spawnattr_destroy(attr: *mut SpawnAttr) -> c_int;
    fn posix_spawnattr_setflags(attr: *mut SpawnAttr, flags: i16) -> c_int;
    fn posix_spawnattr_setsigmask(attr: *mut SpawnAttr, set: *const SigSet) -> c_int;
    fn posix_spawnattr_setsigdefault(attr: *mut SpawnAttr, set: *const SigSet) -> c_int;
    fn posix_spawn_file_actions_init(actions: *mut FileActions) -> c_int;
    fn posix_spawn_file_actions_destroy(actions: *mut FileActions) -> c_int;
    fn posix_spawn_file_actions_adddup2(actions: *mut FileActions, fd: c_int, newfd: c_int) -> c_int;
    fn posix_spawn_file_actions_addopen(
        actions: *mut FileActions,
        fd: c_int,
        path: *const c_char,
        flags: c_int,
        mode: u32,
    ) -> c_int;
    fn posix_spawn_file_actions_addchdir_np(actions: *mut FileActions, path: *const c_char) -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
}

const POSIX_SPAWN_SETSIGDEF: i16 = 0x04;
const POSIX_SPAWN_SETSIGMASK: i16 = 0x08;
const POSIX_SPAWN_SETSID: i16 = 0x80; // glibc 2.26+
const SIGPIPE: c_int = 13;
const WNOHANG: c_int = 1;

fn spawn_check(code: c_int) -> io::Result<()> {
    if code != 0 {
        return Err(io::Error::from_raw_os_error(code));
    }
    Ok(())
}

/// Start program (argv[0] as its name) with exactly env, in cwd, in a new session, with an empty signal mask and
/// SIGPIPE at its default (what std's Command gives a child); its stdin from `stdin` (None: /dev/null), its stdout
/// and stderr on the given fds. The pid, or the errno of what failed (the exec's own included).
pub fn spawn(
    program: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    env: &[std::ffi::CString],
    cwd: Option<&std::ffi::CStr>,
    stdin: Option<i32>,
    stdout: i32,
    stderr: i32,
) -> io::Result<i32> {
    let argv_ptrs: Vec<*const c_char> = argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let env_ptrs: Vec<*const c_char> = env.iter().map(|e| e.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let mut attr = SpawnAttr([0; 512]);
    let mut actions = FileActions([0; 256]);
    unsafe {
        spawn_check(posix_spawnattr_init(&mut attr))?;
        if let Err(err) = spawn_check(posix_spawn_file_actions_init(&mut actions)) {
            posix_spawnattr_destroy(&mut attr);
            return Err(err);
        }
    }
    let result = (|| unsafe {
        let mut none = std::mem::zeroed::<SigSet>();
        sigemptyset(&mut none);
        let mut pipe = std::mem::zeroed::<SigSet>();
        sigemptyset(&mut pipe);
        sigaddset(&mut pipe, SIGPIPE);
        spawn_check(posix_spawnattr_setflags(&mut attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))?;
        spawn_check(posix_spawnattr_setsigmask(&mut attr, &none))?;
        spawn_check(posix_spawnattr_setsigdefault(&mut attr, &pipe))?;
        match stdin {
            Some(fd) => spawn_check(posix_spawn_file_actions_adddup2(&mut actions, fd, 0))?,
            None => spawn_check(posix_spawn_file_actions_addopen(&mut actions, 0, b"/dev/null\0".as_ptr() as *const c_char, 0, 0))?,
        }
        spawn_check(posix_spawn_file_actions_adddup2(&mut actions, stdout, 1))?;
        spawn_check(posix_spawn_file_actions_adddup2(&mut actions, stderr, 2))?;
        if let Some(cwd) = cwd {
            spawn_check(posix_spawn_file_actions_addchdir_np(&mut actions, cwd.as_ptr()))?;
        }
        let mut pid: c_int = 0;
        spawn_check(posix_spawn(&mut pid, program.as_ptr(), &actions, &attr, argv_ptrs.as_ptr(), env_ptrs.as_ptr()))?;
        Ok(pid)
    })();
    unsafe {
        posix_spawn_file_actions_destroy(&mut actions);
        posix_spawnattr_destroy(&mut attr);
    }
    result
}

/// A child's exit code (128 + n when signal n killed it) once it has ended: None while it runs (`block`: wait for
/// it), or when it is not a child of ours (255 then, as an unknown end).
pub fn reap(pid: i32, block: bool) -> Option<i64> {
    let mut status: c_int = 0;
    loop {
        let got = unsafe { waitpid(pid, &mut status, if block { 0 } else { WNOHANG }) };
        if got == 0 {
            return None;
        }
        if got < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Some(255);
        }
        let signal = status & 0x7f;
        return Some(if signal == 0 { i64::from((status >> 8) & 0xff) } else { 128 + i64::from(signal) });
    }
}
