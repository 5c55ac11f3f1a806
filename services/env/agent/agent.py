"""The in-sandbox agent: one long-lived process per sandbox that runs its commands, files and patches.

It speaks length-prefixed frames over a byte stream (stdin/stdout locally) so starting a command costs a
fork, not a new sandbox. Standard library only, Python >= 3.9: it runs on the image's own interpreter.

Frame: u32 total length, u32 header length, JSON header, then raw body bytes (total = 4 + header + body).
Requests carry {"id": int, "op": str, ...}; every reply carries the same id. An exec replies with a
stream of events ("out" chunks, then "exit"); every other op replies once with "ok" or "error".
"""

import asyncio
import contextlib
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import time

HEAD = struct.Struct(">II")
CHUNK = 64 * 1024
DRAIN_AFTER_EXIT_S = 0.2  # background children may hold the pipes open; don't wait on them for ever
EXEC_MARK = "ORCHARD_EXEC"  # set in every exec's environment, so processes that leave its session are found too


def encode(header, body=b""):
    """One frame, ready to write."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return HEAD.pack(4 + len(raw) + len(body), len(raw)) + raw + body


async def read_frame(reader):
    """The next (header, body) from reader, or None at end of stream."""
    try:
        prefix = await reader.readexactly(HEAD.size)
    except asyncio.IncompleteReadError:
        return None
    total, head_len = HEAD.unpack(prefix)
    data = await reader.readexactly(total - 4)
    return json.loads(data[:head_len]), data[head_len:]


def exec_members(sid, mark):
    """Live pids of one exec's whole process tree: its session sid, and every process that left the session
    (setsid, daemons) but still carries the exec's mark in its environment."""
    needle = f"{EXEC_MARK}={mark}".encode()
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
                os.kill(member, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


# The agent and its ancestors (the sandbox's init) are never part of a command: skip them when scanning.
NOT_COMMANDS = {str(os.getpid()), str(os.getppid()), "1"}
BASE_ENV = dict(os.environ)


class Agent:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.running = {}  # request id -> (process, reasons it was killed)
        self.tasks = set()

    async def send(self, header, body=b""):
        self.writer.write(encode(header, body))
        await self.writer.drain()

    async def serve(self):
        await self.send({"id": 0, "ev": "ready", "pid": os.getpid()})
        while True:
            frame = await read_frame(self.reader)
            if frame is None:
                break
            header, body = frame
            task = asyncio.ensure_future(self.handle(header, body))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        for rid, (proc, _) in list(self.running.items()):
            kill_tree(proc.pid, rid)

    async def handle(self, header, body):
        rid = header.get("id", -1)
        op = header.get("op")
        try:
            if op == "exec":
                await self.run_exec(rid, header, body)
                return
            if op == "cancel":
                self.cancel(header["target"], header.get("reason", "cancelled"))
                reply = {}
            elif op == "write":
                reply = await asyncio.get_running_loop().run_in_executor(None, write_part, header, body)
            elif op == "read":
                reply, body = await asyncio.get_running_loop().run_in_executor(None, read_part, header)
                await self.send(dict(reply, id=rid, ev="ok"), body)
                return
            elif op == "list":
                reply = await asyncio.get_running_loop().run_in_executor(None, list_dir, header["path"])
            elif op == "stat":
                reply = {"info": file_info(header["path"])}
            elif op == "ping":
                reply = {}
            else:
                raise ValueError(f"unknown op {op!r}")
        except OSError as err:
            await self.send({"id": rid, "ev": "error", "kind": "os", "errno": err.errno, "message": os_message(err)})
            return
        except Exception as err:  # reported to the manager, which maps it; the agent must survive
            await self.send({"id": rid, "ev": "error", "kind": "internal", "message": f"{type(err).__name__}: {err}"})
            return
        await self.send(dict(reply, id=rid, ev="ok"))

    def cancel(self, target, reason):
        entry = self.running.get(target)
        if entry is not None:
            proc, why = entry
            why.append(reason)
            kill_tree(proc.pid, target)

    async def run_exec(self, rid, header, stdin):
        env = dict(BASE_ENV)
        env.update(header.get("env") or {})
        env[EXEC_MARK] = str(rid)
        cap = int(header.get("max_output", 1 << 20))
        why = []
        try:
            # Popen + the loop's readers + a pidfd, not asyncio's subprocess machinery: a command is on the
            # hot path of every rollout step, and this is the shortest way from request to exit here.
            proc = subprocess.Popen(
                header["argv"], cwd=header.get("cwd") or None, env=env,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # its own session: the whole tree can be found and killed
            )
        except (OSError, ValueError, subprocess.SubprocessError) as err:  # ValueError: NUL byte or '='
            message = os_message(err) if isinstance(err, OSError) else str(err)
            await self.send({"id": rid, "ev": "exit", "code": 127, "error": f"cannot start: {message}",
                             "totals": [0, 0], "reason": None})
            return
        self.running[rid] = (proc, why)
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        pidfd = os.pidfd_open(proc.pid)
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        totals = [0, 0]
        drained = []
        for fd, pipe in ((1, proc.stdout), (2, proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            done = loop.create_future()
            drained.append(done)
            loop.add_reader(pipe.fileno(), self.forward, rid, fd, pipe.fileno(), cap, totals, done)
        feeder = loop.run_in_executor(None, feed, proc.stdin, stdin) if stdin else None
        timeout = header.get("timeout")
        timer = loop.call_later(timeout, self.cancel, rid, "timeout") if timeout else None
        await exited
        if timer is not None:
            timer.cancel()
        loop.remove_reader(pidfd)
        os.close(pidfd)
        code = proc.wait()
        if not all(done.done() for done in drained):
            # Background children may hold the pipes open: take what is there, but don't wait on them for ever.
            await asyncio.wait(drained, timeout=DRAIN_AFTER_EXIT_S)
        for pipe in (proc.stdout, proc.stderr):
            loop.remove_reader(pipe.fileno())
            pipe.close()
        kill_tree(proc.pid, rid)  # leftovers of a finished command die with it
        if feeder is not None:
            await feeder
        del self.running[rid]
        await self.send({"id": rid, "ev": "exit", "code": 128 - code if code < 0 else code,
                         "totals": totals, "reason": why[0] if why else None, "error": None})

    def forward(self, rid, fd, fileno, cap, totals, done):
        """Reader callback: send what the command wrote (up to the cap; the rest is only counted)."""
        try:
            data = os.read(fileno, CHUNK)
        except BlockingIOError:
            return
        if not data:
            asyncio.get_running_loop().remove_reader(fileno)
            done.set_result(None)
            return
        sent = totals[fd - 1]
        totals[fd - 1] += len(data)
        if sent < cap:
            self.writer.write(encode({"id": rid, "ev": "out", "fd": fd}, data[: cap - sent]))


def feed(pipe, data):
    """Write the command's stdin, then close it (in a worker thread: the pipe blocks when full)."""
    try:
        pipe.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command did not read all its input: that is its business
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def os_message(err):
    return f"{err.strerror or err}: {err.filename}" if err.filename else str(err.strerror or err)


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
    return {"name": os.path.basename(path.rstrip("/")) or "/", "path": path, "type": kind,
            "size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime}


def list_dir(path):
    names = sorted(os.listdir(path))  # FileNotFoundError, NotADirectoryError: the manager maps them
    return {"files": [file_info(os.path.join(path, name)) for name in names]}


def write_part(header, body):
    """Append one chunk of an upload to a temp file; the last chunk renames it into place, abort removes it."""
    path = header["path"]
    temp = f"{path}.orchard-upload-{header['upload']}"
    if header.get("abort"):
        with contextlib.suppress(OSError):
            os.unlink(temp)
        return {"size": 0}
    if header["offset"] == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    else:
        flags = os.O_WRONLY | os.O_APPEND
    fd = os.open(temp, flags, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size != header["offset"] + len(body):
        os.unlink(temp)
        raise ValueError(f"upload of {path} lost its place (have {size} bytes, expected "
                         f"{header['offset'] + len(body)}); start it again")
    if header.get("last"):
        try:
            os.chmod(temp, header.get("mode") or 0o644)
            os.replace(temp, path)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise OSError(err.errno, err.strerror, path) from None
    return {"size": size}


def read_part(header):
    path = header["path"]
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory", path)
        f.seek(header["offset"])
        data = f.read(header["length"])
    return {"size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime}, data


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    await Agent(reader, writer).serve()


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    asyncio.run(main())
