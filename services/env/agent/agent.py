"""The in-sandbox agent: one long-lived process per sandbox that runs its commands, files and patches.

It speaks length-prefixed frames over a byte stream (stdin/stdout locally) so starting a command costs a
fork, not a new sandbox. Standard library only, Python >= 3.9: it runs on the image's own interpreter.

The protocol (every op, frame and error) is written down in agent-rs/PROTOCOL.md; the native agent there
speaks the same. Frame: u32 total length, u32 header length, JSON header, then raw body bytes (total = 4 +
header + body). Requests carry {"id": int, "op": str, ...}; every reply carries the same id. An exec replies
with a stream of events ("out" chunks, then "exit"); every other op replies once with "ok" or "error".

A "pty" op runs a program on a pseudo-terminal and replies like an exec ("out" chunks, no fd, then "exit").
Ops aimed at it by "target" id: "pty_input" (body: keystrokes), "pty_resize" (rows, cols), "pty_ack"
(consumed: output bytes taken so far; the agent stops reading the terminal while PTY_WINDOW bytes are
unacknowledged) and "cancel", which kills its process tree as for an exec. "info" reports the agent's own
pid, Python, loaded modules and memory (for tests and benchmarks).

Memory is the design constraint: a thousand idle sandboxes share one machine, and each agent's private
memory is mostly the Python modules it imports. So the agent runs its own small event loop (epoll, a timer
heap, callbacks; one thread) instead of asyncio (about 5 MB more per agent, plus ssl), starts programs with
os.posix_spawn instead of subprocess, and parses headers with json's C half instead of the json package
(which imports re and enum). Every module it does import is either built into the interpreter or small.
And since CPython keeps a -c program's syntax tree for as long as it runs, the interpreter the backend
starts with this source only compiles it and execs a fresh one that runs the compiled code (relaunch).
"""

import errno
import os
import select
import stat
import struct
import sys
import time

try:  # the C half of heapq, which heapq.py re-exports: the Python module adds 60 KiB per agent
    from _heapq import heapify, heappop, heappush
except ImportError:  # pragma: no cover - every CPython has it
    from heapq import heapify, heappop, heappush

try:  # signal.py wraps _signal in enums (it imports enum: ~0.9 MB); the agent needs three numbers
    import _signal as signals
except ImportError:  # pragma: no cover
    import signal as signals

HEAD = struct.Struct(">II")
CHUNK = 64 * 1024
READ_SIZE = 64 * 1024  # a pipe holds 64 KiB: reading more at once only allocates more
DRAIN_AFTER_EXIT_S = 0.2  # background children may hold the pipes open; don't wait on them for ever
EXEC_MARK = "ORCHARD_EXEC"  # set in every exec's environment, so processes that leave its session are found too
AGENT_TAG = os.urandom(6).hex()  # in every mark: an agent that sees other agents' processes never matches theirs
PTY_WINDOW = 1 << 20  # a terminal's output bytes in flight before the agent waits for the manager's ack
WINSIZE = struct.Struct("HHHH")
OUT_HIGH = 1 << 20  # frames waiting for the manager: above this, running commands' output is not read ...
OUT_LOW = 256 * 1024  # ... until the backlog is below this again (the commands block on their full pipes)
IOV_MAX = 256  # buffers per writev
# Python ignores these two, and an ignored signal stays ignored across exec: programs get the defaults back.
DEFAULT_SIGNALS = (signals.SIGPIPE, signals.SIGXFSZ)


def _unencodable(value):
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_codec():
    """(loads, dumps) for frame headers, as json.loads and json.dumps(separators=(",", ":")) would do them.

    The json package imports re and enum: about 1 MB of private memory in every agent, to parse small
    headers. Its C accelerator (_json, which the package itself calls) does all the work, so use it
    directly, after checking that it behaves; where it is missing or differs, the package is the fallback.
    """
    try:
        import _json

        class Options:  # the attributes the scanner reads from a json.JSONDecoder
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = float  # NaN, Infinity, -Infinity
            memo = None

        scan = _json.make_scanner(Options())
        encoder = _json.make_encoder(
            None, _unencodable, _json.encode_basestring_ascii, None, ":", ",", False, False, True
        )

        def loads(text):
            try:
                value, end = scan(text, 0)
            except StopIteration:
                raise ValueError(f"not a JSON document: {text[:60]!r}") from None
            if end != len(text):
                raise ValueError(f"extra data after a JSON document: {text[:60]!r}")
            return value

        def dumps(value):
            return "".join(encoder(value, 0))

        sample = {
            "id": 7,
            "s": 'a"\\\n\x00\u00e9\u2028\U0001f600',
            "f": 1e300,
            "l": [1.5, -2, None, True, False, [], {}],
        }
        if dumps({"a": [1, "b", None]}) != '{"a":[1,"b",null]}' or loads(dumps(sample)) != sample:
            raise ValueError("_json differs")
        return loads, dumps
    except Exception:  # pragma: no cover - an interpreter without a compatible _json
        import json

        def dumps(value):
            return json.dumps(value, separators=(",", ":"))

        return json.loads, dumps


loads, dumps = _json_codec()


def encode(header, body=b""):
    """One frame, ready to write."""
    raw = dumps(header).encode()
    return HEAD.pack(4 + len(raw) + len(body), len(raw)) + raw + body


async def read_frame(reader):
    """The next (header, body) from an asyncio.StreamReader, or None at end of stream. The manager's side:
    asyncio.IncompleteReadError is an EOFError, so this module never imports asyncio (the agent runs it)."""
    try:
        prefix = await reader.readexactly(HEAD.size)
    except EOFError:
        return None
    total, head_len = HEAD.unpack(prefix)
    data = await reader.readexactly(total - 4)
    return loads(data[:head_len].decode()), data[head_len:]


# --- the event loop --------------------------------------------------------------------------------------


class Timer:
    """A callback due at a monotonic time; cancel() before then and it never runs."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when, callback):
        self.when = when
        self.callback = callback
        self.cancelled = False

    def __lt__(self, other):
        return self.when < other.when


class Loop:
    """A single-threaded event loop: epoll for file descriptors, a heap for timers.

    Callbacks take no arguments, run one at a time and must not block. They must also tolerate a spurious
    call: one callback may close an fd whose number is reused at once, and the poll's stale event for the
    old fd then reaches the new one's callback (reads and writes are non-blocking; waits use WNOHANG)."""

    def __init__(self):
        self.epoll = select.epoll()
        self.handlers = {}  # fd -> [on readable, on writable]; either may be None
        self.timers = []  # heap of Timer
        self.cancelled = 0  # cancelled timers still in the heap
        self.stopped = False

    def _watch(self, fd, slot, callback):
        handler = self.handlers.get(fd)
        if handler is None:
            if callback is None:
                return
            handler = self.handlers[fd] = [None, None]
            handler[slot] = callback
            self.epoll.register(fd, select.EPOLLIN if slot == 0 else select.EPOLLOUT)
            return
        handler[slot] = callback
        mask = (select.EPOLLIN if handler[0] else 0) | (select.EPOLLOUT if handler[1] else 0)
        if mask:
            self.epoll.modify(fd, mask)
        else:
            del self.handlers[fd]
            self.epoll.unregister(fd)

    def add_reader(self, fd, callback):
        self._watch(fd, 0, callback)

    def remove_reader(self, fd):
        self._watch(fd, 0, None)

    def add_writer(self, fd, callback):
        self._watch(fd, 1, callback)

    def remove_writer(self, fd):
        self._watch(fd, 1, None)

    def forget(self, fd):
        """Stop watching fd at all: call it before closing fd."""
        if self.handlers.pop(fd, None) is not None:
            self.epoll.unregister(fd)

    def call_later(self, delay, callback):
        timer = Timer(time.monotonic() + delay, callback)
        heappush(self.timers, timer)
        return timer

    def cancel(self, timer):
        if timer is not None and not timer.cancelled:
            timer.cancelled = True
            timer.callback = None
            self.cancelled += 1
            if self.cancelled > 64 and self.cancelled > len(self.timers) // 2:
                # Commands that end long before their timeout would otherwise leave their timers here.
                self.timers = [t for t in self.timers if not t.cancelled]
                heapify(self.timers)
                self.cancelled = 0

    def run(self):
        """Run callbacks until stop()."""
        readable = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
        writable = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
        while not self.stopped:
            timeout = -1
            if self.timers:
                timeout = max(0.0, self.timers[0].when - time.monotonic())
            for fd, mask in self.epoll.poll(timeout):
                handler = self.handlers.get(fd)
                if handler is not None and mask & readable and handler[0] is not None:
                    self._call(handler[0])
                    handler = self.handlers.get(fd)  # the reader may have closed it
                if handler is not None and mask & writable and handler[1] is not None:
                    self._call(handler[1])
            now = time.monotonic()
            while self.timers and self.timers[0].when <= now:
                timer = heappop(self.timers)
                if timer.cancelled:
                    self.cancelled -= 1
                else:
                    self._call(timer.callback)

    def stop(self):
        self.stopped = True

    @staticmethod
    def _call(callback):
        try:
            callback()
        except Exception:  # a bug in one callback must not take the sandbox's agent down: log it (agent.log)
            sys.excepthook(*sys.exc_info())


class Writer:
    """Frames to the manager, in order, without ever blocking the loop: what the pipe does not take at once
    waits here and goes when the pipe has room again."""

    def __init__(self, loop, fd, on_broken):
        self.loop = loop
        self.fd = fd
        self.on_broken = on_broken  # called once when the manager's end is gone
        self.queue = []  # buffers not yet written, in order; the first one may be partly written
        self.offset = 0  # bytes of queue[0] already written
        self.pending = 0  # bytes waiting in all
        self.drained = []  # callbacks for when pending falls below OUT_LOW
        self.broken = False

    @property
    def congested(self):
        return self.pending >= OUT_HIGH

    def send(self, header, body=b""):
        self.frame(dumps(header).encode(), body)

    def frame(self, raw_header, body=b""):
        """One frame of an already encoded header; the body is queued as it is, not copied."""
        prefix = HEAD.pack(4 + len(raw_header) + len(body), len(raw_header)) + raw_header
        if self.broken:
            return
        idle = not self.queue
        self.queue.append(prefix)
        self.pending += len(prefix)
        if body:
            self.queue.append(body)
            self.pending += len(body)
        if idle:  # nothing waits for the pipe: try now (most frames go out here, in one writev)
            self.flush()

    def when_drained(self, callback):
        self.drained.append(callback)

    def flush(self):
        queue = self.queue
        while queue:
            batch = queue[:IOV_MAX]
            if self.offset:
                batch[0] = memoryview(batch[0])[self.offset :]
            try:
                written = os.writev(self.fd, batch)
            except BlockingIOError:
                break
            except OSError:  # EPIPE (Python ignores SIGPIPE): the manager is gone
                self.broken = True
                queue.clear()
                self.pending = 0
                self.loop.forget(self.fd)
                self.on_broken()
                return
            self.pending -= written
            written += self.offset
            done = 0
            while done < len(queue) and written >= len(queue[done]):
                written -= len(queue[done])
                done += 1
            del queue[:done]
            self.offset = written
        if queue:
            self.loop.add_writer(self.fd, self.flush)
        else:
            self.loop.remove_writer(self.fd)
        if self.drained and self.pending < OUT_LOW:
            callbacks, self.drained = self.drained, []
            for callback in callbacks:
                callback()


# --- process trees ---------------------------------------------------------------------------------------


def exec_members(sid, mark):
    """Live pids of one exec's whole process tree: its session sid, and every process that left the session
    (setsid, daemons) but still carries the exec's mark in its environment."""
    needle = f"{EXEC_MARK}={AGENT_TAG}-{mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in NOT_COMMANDS:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":  # fields after "comm)": state ppid pgrp session ...; a zombie is dead already
                continue
            if int(fields[3]) == sid:
                found.append(int(entry))
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_tree(pid, mark):
    """SIGKILL the exec's whole process tree until nothing of it is left."""
    for _ in range(20):
        members = exec_members(pid, mark)
        if not members:
            return
        for member in members:
            try:
                os.kill(member, signals.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


# The agent and its ancestors (the sandbox's init) are never part of a command: skip them when scanning.
NOT_COMMANDS = {str(os.getpid()), str(os.getppid()), "1"}
BASE_ENV = dict(os.environ)


def find_program(name, env):
    """The file exec runs for name: name itself when it has a slash, else the first executable file of that
    name on the command's own PATH, as subprocess does (posix_spawnp would search the agent's PATH)."""
    if "/" in name:
        return name
    denied = None
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK):
            return path
        denied = denied or path
    if denied:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), denied)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def spawn(argv, cwd, env, home, stdio=None, terminal=None):
    """Start argv in its own new session (so its whole tree can be found and killed) in cwd with env, and
    return its pid. Its fds 0-2 are stdio (three fds of the agent), or the terminal at path `terminal`:
    opened by the new session's leader, it becomes the session's controlling terminal.

    os.posix_spawn rather than subprocess: subprocess and its imports cost ~1 MB in every agent, and
    posix_spawn is libc's vfork + exec, the cheapest start there is. It has no working-directory option,
    so the agent enters cwd for the call and returns to `home` (an fd) after: with one thread nothing else
    sees it. Every fd the agent opens is close-on-exec (Python's default), so none leaks into the program.
    """
    if not argv:
        raise ValueError("argv is empty")
    if terminal is not None:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, terminal, os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1),
            (os.POSIX_SPAWN_DUP2, 0, 2),
        ]
    else:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)]
    if cwd:
        os.chdir(cwd)  # FileNotFoundError etc. name cwd, as subprocess's do
    try:
        return os.posix_spawn(
            find_program(argv[0], env), argv, env, file_actions=actions, setsid=True, setsigdef=DEFAULT_SIGNALS
        )
    finally:
        if cwd:
            os.fchdir(home)


def exit_code(pid, signals=None):
    """The exit code of child pid if it has ended (128 + n when signal n killed it), else None; the signal's
    number is put in `signals` (a list) when one killed it."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    if code < 0 and signals is not None:
        signals.append(-code)
    return 128 - code if code < 0 else code


def os_message(err):
    return f"{err.strerror or err}: {err.filename}" if err.filename else str(err.strerror or err)


def close_quietly(fd):
    try:
        os.close(fd)
    except OSError:
        pass


# --- commands and terminals ------------------------------------------------------------------------------


class Exec:
    """One command: its stdout and stderr forwarded as "out" frames (up to the output cap; the rest is only
    counted), its stdin fed from the request's body, its timeout, and one "exit" frame once it has ended
    and its pipes have drained (or DRAIN_AFTER_EXIT_S passed: background children may hold them open)."""

    def __init__(self, agent, rid, header, stdin):
        self.agent = agent
        self.loop = agent.loop
        self.rid = rid
        self.header = header
        self.stdin = memoryview(stdin)
        self.stdin_fd = None  # our end of its stdin pipe, while input is left to write
        self.cap = int(header.get("max_output", 1 << 20))
        self.totals = [0, 0]
        self.reasons = []  # why it was killed (cancel, timeout); the first one is reported
        self.pipes = {}  # our end of its stdout/stderr pipe -> 1 or 2, while open
        self.heads = {fd: dumps({"id": rid, "ev": "out", "fd": fd}).encode() for fd in (1, 2)}
        self.paused = []  # pipes not read while the manager catches up (Writer.congested)
        self.pid = self.pidfd = self.code = self.timer = None
        self.finished = False

    def start(self):
        header = self.header
        env = dict(BASE_ENV)
        env.update(header.get("env") or {})
        env[EXEC_MARK] = f"{AGENT_TAG}-{self.rid}"
        ours, theirs = [], []
        try:
            if self.stdin:
                stdin_r, self.stdin_fd = os.pipe()
                theirs.append(stdin_r)
                ours.append(self.stdin_fd)
            else:
                stdin_r = self.agent.devnull
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            ours += [out_r, err_r]
            theirs += [out_w, err_w]
            try:
                self.pid = spawn(
                    header["argv"], header.get("cwd") or None, env, self.agent.home, stdio=(stdin_r, out_w, err_w)
                )
            except (OSError, ValueError) as err:  # ValueError: a NUL byte, or '=' in a variable's name
                for fd in ours:
                    os.close(fd)
                message = os_message(err) if isinstance(err, OSError) else str(err)
                self.agent.out.send(
                    {
                        "id": self.rid,
                        "ev": "exit",
                        "code": 127,
                        "error": f"cannot start: {message}",
                        "totals": [0, 0],
                        "reason": None,
                    }
                )
                return
            self.pidfd = os.pidfd_open(self.pid)
        except BaseException:
            for fd in ours:
                close_quietly(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)  # the command holds them now: its end of file is ours
        self.agent.jobs[self.rid] = self
        self.loop.add_reader(self.pidfd, self.on_exit)
        for fd, stream in ((out_r, 1), (err_r, 2)):
            os.set_blocking(fd, False)
            self.pipes[fd] = stream
            self.loop.add_reader(fd, self._reader(fd))
        if self.stdin_fd is not None:
            os.set_blocking(self.stdin_fd, False)
            self.feed()
        timeout = header.get("timeout")
        if timeout:
            self.timer = self.loop.call_later(timeout, lambda: self.cancel("timeout"))

    def _reader(self, fd):
        return lambda: self.forward(fd)

    def forward(self, fd):
        """Reader callback: send what the command wrote (up to the cap; the rest is only counted)."""
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if not data:
            self.close_pipe(fd)
            if self.code is not None and not self.pipes:
                self.finish()
            return
        stream = self.pipes[fd]
        sent = self.totals[stream - 1]
        self.totals[stream - 1] += len(data)
        if sent < self.cap:
            self.agent.out.frame(self.heads[stream], data[: self.cap - sent])
            if self.code is None and self.agent.out.congested:
                # The manager is behind: leave the output in the pipe (the command waits on it) rather
                # than in this process's memory. Once the command has ended, its pipes drain regardless.
                self.loop.remove_reader(fd)
                self.paused.append(fd)
                if len(self.paused) == 1:
                    self.agent.out.when_drained(self.resume)

    def resume(self):
        for fd in self.paused:
            if fd in self.pipes:
                self.loop.add_reader(fd, self._reader(fd))
        self.paused = []

    def close_pipe(self, fd):
        del self.pipes[fd]
        self.loop.forget(fd)
        os.close(fd)

    def feed(self):
        """Write the command's stdin as its pipe takes it, then close it."""
        try:
            self.stdin = self.stdin[os.write(self.stdin_fd, self.stdin) :]
        except BlockingIOError:
            pass
        except OSError:  # EPIPE: the command did not read all its input, which is its business
            self.stdin = self.stdin[:0]
        if self.stdin:
            self.loop.add_writer(self.stdin_fd, self.feed)
        else:
            self.close_stdin()

    def close_stdin(self):
        if self.stdin_fd is not None:
            self.loop.forget(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def cancel(self, reason):
        self.reasons.append(reason)
        kill_tree(self.pid, self.rid)

    def on_exit(self):
        """pidfd callback: the command ended; finish once its pipes are drained, or after a short grace."""
        signals = []
        code = exit_code(self.pid, signals)
        if code is None:
            return
        self.code = code
        self.signal = signals[0] if signals else None
        self.loop.forget(self.pidfd)
        os.close(self.pidfd)
        self.loop.cancel(self.timer)
        self.resume()
        if self.pipes:
            self.timer = self.loop.call_later(DRAIN_AFTER_EXIT_S, self.finish)
        else:
            self.finish()

    def finish(self):
        if self.finished:
            return
        self.finished = True
        self.loop.cancel(self.timer)
        for fd in list(self.pipes):
            self.close_pipe(fd)
        kill_tree(self.pid, self.rid)  # leftovers of a finished command die with it
        self.close_stdin()
        del self.agent.jobs[self.rid]
        self.agent.out.send(
            {
                "id": self.rid,
                "ev": "exit",
                "code": self.code,
                "totals": self.totals,
                "reason": self.reasons[0] if self.reasons else None,
                "error": None,
            }
        )


class Terminal:
    """A program on a pseudo-terminal in its own session: its output as "out" frames while fewer than
    PTY_WINDOW bytes are unacknowledged, keystrokes written in order (each pty_input is answered once
    written), and one "exit" frame once it has ended and the terminal has drained."""

    def __init__(self, agent, rid, header):
        self.agent = agent
        self.loop = agent.loop
        self.rid = rid
        self.header = header
        self.head = dumps({"id": rid, "ev": "out"}).encode()
        self.master = self.pid = self.pidfd = self.timer = self.code = self.signal = None
        self.sent = 0
        self.acked = 0
        self.reading = False
        self.eof = False  # the terminal read end of file: every process holding it has closed it
        self.closed = False
        self.inputs = []  # [pty_input request id, keystrokes not yet written], in order

    def start(self):
        header = self.header
        env = dict(BASE_ENV, TERM="xterm-256color")
        env.update(header.get("env") or {})
        env[EXEC_MARK] = f"{AGENT_TAG}-{self.rid}"
        argv = header["argv"]
        master, slave = os.openpty()
        try:
            set_size(master, header["rows"], header["cols"])
            self.pid = spawn(argv, header.get("cwd") or None, env, self.agent.home, terminal=os.ttyname(slave))
            self.pidfd = os.pidfd_open(self.pid)
        except (OSError, ValueError) as err:
            os.close(master)
            message = os_message(err) if isinstance(err, OSError) else str(err)
            out = self.agent.out
            out.frame(self.head, f"cannot start {argv[0] if argv else ''!r}: {message}\r\n".encode())
            out.send({"id": self.rid, "ev": "exit", "code": 127})
            return
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the program holds it now; the master reads EIO once every holder closed it
        self.master = master
        os.set_blocking(master, False)
        self.agent.out.send({"id": self.rid, "ev": "started", "pid": self.pid})
        self.agent.jobs[self.rid] = self
        self.agent.ptys[self.rid] = self
        self.loop.add_reader(self.pidfd, self.on_exit)
        self.read_more()

    def read_more(self):
        """Read the terminal while the manager has acknowledged enough of its output."""
        if self.closed or self.eof or self.reading or self.sent - self.acked >= PTY_WINDOW:
            return
        self.reading = True
        self.loop.add_reader(self.master, self.output)

    def stop_reading(self):
        self.reading = False
        self.loop.remove_reader(self.master)

    def ack(self, consumed):
        self.acked = max(self.acked, consumed)
        self.read_more()

    def resize(self, rows, cols):
        if not self.closed:
            set_size(self.master, rows, cols)  # the kernel sends SIGWINCH

    def output(self):
        """Reader callback: send what the program wrote to its terminal."""
        try:
            data = os.read(self.master, CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process holding the terminal has closed it
            data = b""
        if not data:
            self.stop_reading()
            self.eof = True
            if self.code is not None:
                self.finish()
            return
        self.sent += len(data)
        self.agent.out.frame(self.head, data)
        if self.sent - self.acked >= PTY_WINDOW:
            self.stop_reading()  # the program blocks on its terminal until the manager catches up

    def type(self, rid, data):
        """Queue keystrokes; request rid is answered once they are written (or the session has ended)."""
        self.inputs.append([rid, memoryview(data)])
        if len(self.inputs) == 1:
            self.write_input()

    def write_input(self):
        """Writer callback: type the queued keystrokes in order, waiting while the terminal is full."""
        while self.inputs:
            entry = self.inputs[0]
            try:
                entry[1] = entry[1][os.write(self.master, entry[1]) :]
            except BlockingIOError:
                self.loop.add_writer(self.master, self.write_input)
                return
            except OSError:  # EIO: the program closed its terminal and is ending; the input goes nowhere
                entry[1] = entry[1][:0]
            if not entry[1]:
                self.inputs.pop(0)
                self.agent.out.send({"id": entry[0], "ev": "ok"})
        self.loop.remove_writer(self.master)

    def cancel(self, reason):
        kill_tree(self.pid, self.rid)

    def on_exit(self):
        """pidfd callback: the program ended; its session goes too, then the terminal drains."""
        signals = []
        code = exit_code(self.pid, signals)
        if code is None:
            return
        self.code = code
        self.signal = signals[0] if signals else None
        self.loop.forget(self.pidfd)
        os.close(self.pidfd)
        kill_tree(self.pid, self.rid)
        self.acked = self.sent  # what is left is at most the terminal's buffer: take it all
        self.read_more()
        if self.eof:
            self.finish()
        else:
            self.timer = self.loop.call_later(DRAIN_AFTER_EXIT_S, self.finish)

    def finish(self):
        if self.closed:
            return
        self.closed = True
        self.loop.cancel(self.timer)
        self.loop.forget(self.master)
        os.close(self.master)
        del self.agent.jobs[self.rid], self.agent.ptys[self.rid]
        for rid, _ in self.inputs:  # input still waiting for room goes nowhere now
            self.agent.out.send({"id": rid, "ev": "ok"})
        self.inputs = []
        exit_ = {"id": self.rid, "ev": "exit", "code": self.code}
        if self.signal:
            exit_["signal"] = self.signal  # the signal that killed it (code is 128 + it)
        self.agent.out.send(exit_)


def set_size(fd, rows, cols):
    # fcntl and termios only load when a sandbox opens a terminal.
    import fcntl
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, WINSIZE.pack(rows, cols, 0, 0))


# --- files -----------------------------------------------------------------------------------------------
# These run on the loop: each is bounded (the manager moves files in chunks of at most 1 MiB, and files are
# opened non-blocking, so a FIFO or a device cannot hang the agent). Listing is one directory's entries.


def file_info(path):
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }


def list_dir(path):
    names = sorted(os.listdir(path))  # FileNotFoundError, NotADirectoryError: the manager maps them
    return {"files": [file_info(os.path.join(path, name)) for name in names]}


def write_part(header, body):
    """Append one chunk of an upload to a temp file; the last chunk renames it into place, abort removes it."""
    path = header["path"]
    temp = f"{path}.orchard-upload-{header['upload']}"
    if header.get("abort"):
        try:
            os.unlink(temp)
        except OSError:
            pass
        return {"size": 0}
    if header["offset"] == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    else:
        flags = os.O_WRONLY | os.O_APPEND
    fd = os.open(temp, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size != header["offset"] + len(body):
        os.unlink(temp)
        raise ValueError(
            f"upload of {path} lost its place (have {size} bytes, expected "
            f"{header['offset'] + len(body)}); start it again"
        )
    if header.get("last"):
        try:
            os.chmod(temp, header.get("mode") or 0o644)
            os.replace(temp, path)
        except OSError as err:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise OSError(err.errno, err.strerror, path) from None
    return {"size": size}


def read_part(header):
    """Up to length bytes of a file from offset, with its size, mode and mtime."""
    path = header["path"]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):  # /dev/zero would stream forever, a FIFO block a reader
            raise OSError(errno.ENODEV, "not a regular file", path)
        pieces = []
        offset, left = header["offset"], header["length"]
        while left > 0:
            try:
                piece = os.pread(fd, left, offset)
            except BlockingIOError:  # a device with nothing to read now: what there is, is the answer
                break
            if not piece:
                break
            pieces.append(piece)
            offset += len(piece)
            left -= len(piece)
    finally:
        os.close(fd)
    return {"size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime}, b"".join(pieces)


def process_info():
    """The agent's pid, Python, loaded modules and memory (KiB, from /proc/self/smaps_rollup)."""
    memory = {}
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                if key in (b"Rss", b"Pss", b"Private_Dirty", b"Private_Clean"):
                    memory[key.decode().lower() + "_kib"] = int(rest.split()[0])
    except OSError:  # kernels before 4.14
        pass
    return dict(memory, pid=os.getpid(), python=sys.version.split()[0], modules=sorted(sys.modules))


# --- the agent -------------------------------------------------------------------------------------------


class Agent:
    """Reads requests from stdin, answers on stdout, and runs the commands and terminals they ask for."""

    def __init__(self, stdin=0, stdout=1):
        self.loop = Loop()
        self.stdin = stdin
        self.out = Writer(self.loop, stdout, self.stop)
        self.inbox = bytearray()  # bytes of requests not yet complete
        self.jobs = {}  # request id -> Exec or Terminal, while its process runs
        self.ptys = {}  # request id -> Terminal, until its exit frame
        # Where the agent returns after starting a program in another directory (see spawn).
        self.home = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)  # stdin of commands given none

    def serve(self):
        os.set_blocking(self.stdin, False)
        os.set_blocking(self.out.fd, False)
        self.loop.add_reader(self.stdin, self.receive)
        self.out.send({"id": 0, "ev": "ready", "pid": os.getpid()})
        self.loop.run()

    def stop(self):
        """The manager is gone: so are the commands."""
        for rid, job in list(self.jobs.items()):
            kill_tree(job.pid, rid)
        self.loop.stop()

    def receive(self):
        """stdin callback: take what arrived and handle each complete request in order."""
        try:
            data = os.read(self.stdin, READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            self.stop()
            return
        inbox = self.inbox
        inbox += data
        while len(inbox) >= HEAD.size:
            total, head_len = HEAD.unpack_from(inbox)
            end = 4 + total
            if len(inbox) < end:
                break
            with memoryview(inbox) as view:
                raw = bytes(view[HEAD.size : HEAD.size + head_len])
                body = bytes(view[HEAD.size + head_len : end])
            del inbox[:end]
            try:
                header = loads(raw.decode())
            except ValueError as err:  # not from our manager: nothing to answer to
                print(f"agent: dropped a request with a bad header: {err}", file=sys.stderr)
                continue
            self.handle(header, body)

    def handle(self, header, body):
        rid = header.get("id", -1)
        op = header.get("op")
        try:
            if op == "exec":
                Exec(self, rid, header, body).start()  # replies with its own events
                return
            if op == "pty":
                Terminal(self, rid, header).start()
                return
            reply = {}
            if op == "cancel":
                job = self.jobs.get(header["target"])
                if job is not None:
                    job.cancel(header.get("reason", "cancelled"))
            elif op == "pty_input":
                term = self.ptys.get(header["target"])
                if term is not None:
                    term.type(rid, body)  # answered once typed
                    return
            elif op == "pty_resize":
                term = self.ptys.get(header["target"])
                if term is not None:
                    term.resize(header["rows"], header["cols"])
            elif op == "pty_ack":
                term = self.ptys.get(header["target"])
                if term is not None:
                    term.ack(header["consumed"])
            elif op == "write":
                reply = write_part(header, body)
            elif op == "read":
                reply, data = read_part(header)
                self.out.send(dict(reply, id=rid, ev="ok"), data)
                return
            elif op == "list":
                reply = list_dir(header["path"])
            elif op == "stat":
                reply = {"info": file_info(header["path"])}
            elif op == "info":
                reply = process_info()
            elif op != "ping":
                raise ValueError(f"unknown op {op!r}")
        except OSError as err:
            self.out.send({"id": rid, "ev": "error", "kind": "os", "errno": err.errno, "message": os_message(err)})
            return
        except Exception as err:  # reported to the manager, which maps it; the agent must survive
            self.out.send({"id": rid, "ev": "error", "kind": "internal", "message": f"{type(err).__name__}: {err}"})
            return
        self.out.send(dict(reply, id=rid, ev="ok"))


def main():
    # A write to a closed pipe must be an error the agent handles (EPIPE), not its death: keep Python's SIG_IGN.
    signals.signal(signals.SIGPIPE, signals.SIG_IGN)
    # Fds inherited beyond stdio would leak into every command (posix_spawn closes only close-on-exec ones).
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.set_inheritable(int(name), False)
            except OSError:
                pass  # the listing's own fd, closed by now
    Agent().serve()


# The second interpreter's whole program: read the agent's compiled code from the fd in argv, and run it.
RELAUNCH_BOOT = (
    "import marshal,os,sys;fd=int(sys.argv[1]);code=marshal.loads(os.pread(fd,os.fstat(fd).st_size,0));"
    "os.close(fd);exec(code,{'__name__':'__main__','__builtins__':__builtins__,'RELAUNCHED':True})"
)


def relaunch(code):
    """Replace this process with a fresh interpreter that runs the agent from code (this module, compiled).

    CPython keeps a -c program's syntax tree in memory for as long as the program runs: for this file about
    3 MB, more than the whole agent needs otherwise. So the interpreter started with the source only
    compiles it, and hands the code (marshal, through a memfd) to a second one that never parses it. The
    pid, fds and environment stay; it costs one more interpreter start (~8 ms). Returns only when that is
    not possible, and the agent then runs in this process.
    """
    import marshal

    fd = None
    try:
        fd = os.memfd_create("orchard-agent", 0)  # not close-on-exec: the next interpreter reads it
        data = marshal.dumps(code)
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, "short write")
        # Exactly this interpreter, which marshal's format requires; by its own name where that is the same
        # file (ps in the sandbox then shows python3, not exe).
        path = "/proc/self/exe"
        if sys.executable and os.path.samestat(os.stat(sys.executable), os.stat(path)):
            path = sys.executable
        os.execv(path, [sys.executable or "python3", "-I", "-S", "-c", RELAUNCH_BOOT, str(fd)])
    except (AttributeError, OSError, ValueError) as err:
        print(f"agent: running without relaunch: {err}", file=sys.stderr)
        if fd is not None:
            os.close(fd)


if __name__ == "__main__":
    if not globals().get("RELAUNCHED"):
        relaunch(sys._getframe().f_code)
    main()
