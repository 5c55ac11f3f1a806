"""Training jobs: a durable record per job, a bounded queue, one worker process (tree) per running job, and the
events it reports fanned out to watchers.

Choices [I]:
- A job's record is `<jobs dir>/<id>/job.json`, rewritten (atomically) on every change; at start-up every job
  found there is listed again. Jobs that were QUEUED wait again; jobs that were RUNNING are resumed from their
  latest checkpoint — a worker left over from the previous service process is killed first (its process group),
  so exactly one process ever writes a job's checkpoints.
- A worker that exits without reporting an end (killed, out of memory, a segfault) is restarted from its latest
  checkpoint up to `max_restarts` times; then the job fails, quoting the end of the worker's log.
- Cancel: a queued job ends at once; a running one gets SIGTERM (the worker stops between steps and reports it),
  then SIGKILL after `cancel_grace_s`. Checkpoints written so far are kept.
- On service shutdown running workers are killed; their jobs stay RUNNING on disk and resume at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from orchard.checkpoints import latest_checkpoint, read_manifest
from orchard.errors import NotFound
from orchard.prototime import timestamp
from orchard.services.trainer.settings import TrainerSettings
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import distributed
from orchard.trainers.job import EVENTS_FILE, JOB_FILE, RUNTIME_FILE

log = logging.getLogger("orchard.trainer")

WORKER_MODULE = "orchard.trainers.worker"
PID_FILE, LOG_FILE = "worker.pid", "worker.log"
TERMINAL = {pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED}
END_EVENTS = {"succeeded": pb.JOB_STATE_SUCCEEDED, "failed": pb.JOB_STATE_FAILED, "cancelled": pb.JOB_STATE_CANCELLED}
WATCHER_QUEUE = 1024
"""Events a slow watcher may fall behind by before its stream is ended (it can reconnect)."""


def checkpoint_pb(
    job_id: str, record_step: int, path: str, version: str, metrics: dict[str, float], is_final: bool, created: float
) -> pb.Checkpoint:
    return pb.Checkpoint(
        name=f"jobs/{job_id}/checkpoints/{version}",
        job_id=job_id,
        version=version,
        step=record_step,
        path=path,
        metrics=metrics,
        is_final=is_final,
        create_time=timestamp(created),
    )


@dataclass
class Entry:
    """One job and what the service holds for it while it runs."""

    job: pb.Job
    dir: Path
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set and replaced on every change (WaitJob waits on it)."""
    watchers: list[asyncio.Queue[pb.StreamJobEventsResponse | None]] = field(default_factory=list)
    process: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    events_offset: int = 0

    @property
    def done(self) -> bool:
        return self.job.state in TERMINAL


class JobManager:
    """Owns every job: creates, runs, cancels and reports them."""

    def __init__(self, settings: TrainerSettings) -> None:
        self.settings = settings
        self.jobs_dir = settings.jobs_dir.resolve()
        self.entries: dict[str, Entry] = {}
        self.request_ids: dict[str, str] = {}
        self._slots = asyncio.Semaphore(settings.max_running_jobs)
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the jobs on disk; queue the unfinished ones again (running ones resume from their checkpoint)."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        found = []
        for path in sorted(self.jobs_dir.glob(f"*/{JOB_FILE}")):
            try:
                job = json_format.Parse(path.read_text(), pb.Job())
            except (OSError, json_format.ParseError) as err:
                log.error("skipping unreadable job record %s: %s", path, err)
                continue
            entry = Entry(job, path.parent)
            self.entries[job.job_id] = entry
            if rid := job.labels.get("orchard.request-id"):
                self.request_ids[rid] = job.job_id
            found.append(entry)
        for entry in sorted(found, key=lambda e: e.job.create_time.ToNanoseconds()):
            if entry.done:
                continue
            _kill_leftover(entry.dir)
            if self._read_events(entry):  # it ended while the service was down; only the report was missing
                continue
            log.info(
                "job %s was %s when the service stopped; %s",
                entry.job.job_id,
                pb.JobState.Name(entry.job.state),
                "resuming it" if entry.job.state == pb.JOB_STATE_RUNNING else "queued again",
            )
            self._schedule(entry)

    async def stop(self) -> None:
        """Kill running workers (their jobs resume at the next start) and end every watcher stream."""
        self._stopping = True
        for entry in self.entries.values():
            if entry.process is not None and entry.process.returncode is None:
                _kill_group(entry.process.pid, signal.SIGKILL)
        tasks = [e.task for e in self.entries.values() if e.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for entry in self.entries.values():
            for q in entry.watchers:
                _offer(q, None)

    # -- requests -----------------------------------------------------------------------------------------------

    def create(self, job: pb.Job, request_id: str) -> pb.Job:
        """Store a validated job (QUEUED) and queue it; a repeated request_id returns the first job."""
        if request_id and request_id in self.request_ids:
            return self.get(self.request_ids[request_id])
        job_dir = self.jobs_dir / job.job_id
        job_dir.mkdir(parents=True, exist_ok=False)
        if request_id:
            job.labels["orchard.request-id"] = request_id
            self.request_ids[request_id] = job.job_id
        job.state = pb.JOB_STATE_QUEUED
        job.create_time.CopyFrom(timestamp(time.time()))
        entry = Entry(job, job_dir)
        self.entries[job.job_id] = entry
        s = self.settings
        runtime = {
            "inference_address": s.inference_address,
            "experience_address": s.experience_address,
            "env_address": s.env_address,
            "reward_address": s.reward_address,
            "nats_url": s.nats_url,
            "model_cache_dir": str(s.model_cache_dir or ""),
        }
        (job_dir / RUNTIME_FILE).write_text(json.dumps(runtime, indent=2))
        self._save(entry)
        self._schedule(entry)
        return job

    def entry(self, job_id: str) -> Entry:
        if job_id not in self.entries:
            raise NotFound(f"job {job_id!r} not found; ListJobs shows the jobs this service has", field="job_id")
        return self.entries[job_id]

    def get(self, job_id: str) -> pb.Job:
        return self.entry(job_id).job

    def exists(self, job_id: str) -> bool:
        return job_id in self.entries or (self.jobs_dir / job_id).exists()

    def all_jobs(self) -> list[pb.Job]:
        """Every job, newest first (by create time, then id)."""
        return sorted((e.job for e in self.entries.values()), key=lambda j: (-j.create_time.ToNanoseconds(), j.job_id))

    def checkpoints(self, job_id: str) -> list[pb.Checkpoint]:
        """The complete checkpoints on disk of one job (every job's when empty), newest job first, by step."""
        jobs = [self.get(job_id)] if job_id else self.all_jobs()
        out = []
        for job in jobs:
            root = Path(job.config.output_dir) / "checkpoints"
            records = [r for p in root.glob("step-*") if (r := read_manifest(p)) is not None] if root.is_dir() else []
            for r in sorted(records, key=lambda r: r.step):
                out.append(
                    checkpoint_pb(
                        job.job_id,
                        r.step,
                        str(r.path),
                        r.version,
                        r.metrics,
                        r.is_final,
                        (r.path / "manifest.json").stat().st_mtime,
                    )
                )
        return out

    async def cancel(self, job_id: str) -> pb.Job:
        entry = self.entry(job_id)
        if entry.done:
            return entry.job
        entry.cancel_requested = True
        if entry.process is None:  # still queued: it never started, so it ends here
            if entry.task is not None:
                entry.task.cancel()
            self._end(entry, pb.JOB_STATE_CANCELLED, "")
            return entry.job
        _kill_group(entry.process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await self.wait(job_id, self.settings.cancel_grace_s)
        if not entry.done and entry.process is not None and entry.process.returncode is None:
            log.warning("job %s did not stop within %.0fs of SIGTERM; killing it", job_id, self.settings.cancel_grace_s)
            _kill_group(entry.process.pid, signal.SIGKILL)
            await self.wait(job_id, self.settings.cancel_grace_s)
        return entry.job

    async def wait(self, job_id: str, timeout_s: float) -> pb.Job:
        """The job once it has ended; TimeoutError when it has not within timeout_s."""
        entry = self.entry(job_id)
        async with asyncio.timeout(timeout_s):
            while not entry.done:
                await entry.changed.wait()
        return entry.job

    async def watch(self, job_id: str) -> AsyncIterator[pb.StreamJobEventsResponse]:
        """The job now, then its progress, checkpoints and state changes until it ends."""
        entry = self.entry(job_id)
        queue: asyncio.Queue[pb.StreamJobEventsResponse | None] = asyncio.Queue(WATCHER_QUEUE)
        yield pb.StreamJobEventsResponse(event_time=timestamp(time.time()), job=entry.job)
        if entry.done:
            return
        entry.watchers.append(queue)
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            entry.watchers.remove(queue)

    # -- running ------------------------------------------------------------------------------------------------

    def _schedule(self, entry: Entry) -> None:
        entry.task = asyncio.get_running_loop().create_task(self._run(entry), name=f"job-{entry.job.job_id}")

    async def _run(self, entry: Entry) -> None:
        async with self._slots:
            if entry.done or self._stopping:
                return
            job = entry.job
            job.state = pb.JOB_STATE_RUNNING
            if not job.HasField("start_time"):
                job.start_time.CopyFrom(timestamp(time.time()))
            self._changed(entry, job_event=True)
            restarts = 0
            while True:
                ended = await self._attempt(entry)
                if ended or self._stopping:
                    return
                code = entry.process.returncode if entry.process else None
                why = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit {code}"
                if entry.cancel_requested:
                    self._end(entry, pb.JOB_STATE_CANCELLED, "")
                    return
                if restarts >= self.settings.max_restarts:
                    self._end(
                        entry,
                        pb.JOB_STATE_FAILED,
                        f"the job's process died ({why}) {restarts + 1} time(s); the end of its log "
                        f"({entry.dir / LOG_FILE}):\n{_log_tail(entry.dir / LOG_FILE)}",
                    )
                    return
                restarts += 1
                log.warning(
                    "job %s: worker died (%s); restart %d/%d from its latest checkpoint",
                    job.job_id,
                    why,
                    restarts,
                    self.settings.max_restarts,
                )

    async def _attempt(self, entry: Entry) -> bool:
        """Run the worker once; True when the job reported its end."""
        argv, env = self._command(entry.job)
        with open(entry.dir / LOG_FILE, "ab") as log_file:
            entry.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )  # its own process group: cancel and kill reach torchrun's ranks
        (entry.dir / PID_FILE).write_text(str(entry.process.pid))
        wait = asyncio.create_task(entry.process.wait())
        try:
            while not wait.done():
                await asyncio.wait([wait], timeout=self.settings.poll_interval_s)
                if self._read_events(entry):
                    await wait
                    return True
            return self._read_events(entry)
        finally:
            if not wait.done():  # the service is stopping: the worker goes with it and resumes next start
                _kill_group(entry.process.pid, signal.SIGKILL)
                with contextlib.suppress(BaseException):
                    await asyncio.shield(wait)
            with contextlib.suppress(FileNotFoundError):
                (entry.dir / PID_FILE).unlink()

    def _command(self, job: pb.Job) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        nproc = max(1, job.config.compute.cpu_processes)
        if nproc == 1:
            return [sys.executable, "-m", WORKER_MODULE, str(self.jobs_dir / job.job_id)], env
        return (
            distributed.torchrun_command(nproc, WORKER_MODULE, [str(self.jobs_dir / job.job_id)]),
            {**env, **distributed.torchrun_env()},
        )

    def _read_events(self, entry: Entry) -> bool:
        """Apply the worker's new event lines; True when one of them ended the job."""
        path = entry.dir / EVENTS_FILE
        if not path.exists():
            return False
        with path.open("rb") as f:
            f.seek(entry.events_offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written is read next time
        entry.events_offset += len(complete)
        for line in complete.decode().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                log.error("job %s: unreadable event line %r", entry.job.job_id, line[:200])
                continue
            if self._apply(entry, event):
                return True
        return False

    def _apply(self, entry: Entry, event: dict[str, Any]) -> bool:  # one decoded JSON event line
        job = entry.job
        kind = event.get("kind")
        now = timestamp(float(event.get("time", time.time())))
        if kind == "progress":
            job.progress.CopyFrom(
                pb.JobProgress(
                    step=int(event["step"]),
                    total_steps=int(event["total_steps"]),
                    epoch=float(event.get("epoch", 0.0)),
                    loss=float(event["loss"]),
                    metrics=event.get("metrics", {}),
                    update_time=now,
                )
            )
            self._changed(entry, response=pb.StreamJobEventsResponse(event_time=now, progress=job.progress))
        elif kind == "checkpoint":
            ckpt = checkpoint_pb(
                job.job_id,
                int(event["step"]),
                str(event["path"]),
                str(event["version"]),
                event.get("metrics", {}),
                bool(event.get("is_final")),
                float(event["time"]),
            )
            job.latest_checkpoint.CopyFrom(ckpt)
            self._changed(entry, response=pb.StreamJobEventsResponse(event_time=now, checkpoint=ckpt))
        elif kind in END_EVENTS:
            self._end(entry, END_EVENTS[str(kind)], str(event.get("error", "")))
            return True
        return False

    def _end(self, entry: Entry, state: int, error: str) -> None:
        job = entry.job
        job.state = state  # type: ignore[assignment]
        job.error = error
        job.end_time.CopyFrom(timestamp(time.time()))
        if state == pb.JOB_STATE_SUCCEEDED and not job.HasField("latest_checkpoint"):
            record = latest_checkpoint(Path(job.config.output_dir) / "checkpoints")
            if record is not None:
                job.latest_checkpoint.CopyFrom(
                    checkpoint_pb(
                        job.job_id,
                        record.step,
                        str(record.path),
                        record.version,
                        record.metrics,
                        record.is_final,
                        time.time(),
                    )
                )
        log.info("job %s %s%s", job.job_id, pb.JobState.Name(state), f": {error}" if error else "")
        self._changed(entry, job_event=True)
        for q in entry.watchers:
            _offer(q, None)

    def _changed(
        self, entry: Entry, *, job_event: bool = False, response: pb.StreamJobEventsResponse | None = None
    ) -> None:
        self._save(entry)
        if job_event:
            response = pb.StreamJobEventsResponse(event_time=timestamp(time.time()), job=entry.job)
        if response is not None:
            for q in list(entry.watchers):
                if not _offer(q, response):
                    entry.watchers.remove(q)
                    _offer(q, None, force=True)
        entry.changed.set()
        entry.changed = asyncio.Event()

    def _save(self, entry: Entry) -> None:
        tmp = entry.dir / f".{JOB_FILE}.tmp"
        tmp.write_text(json_format.MessageToJson(entry.job, indent=1))
        tmp.replace(entry.dir / JOB_FILE)


def _offer(
    q: asyncio.Queue[pb.StreamJobEventsResponse | None], item: pb.StreamJobEventsResponse | None, force: bool = False
) -> bool:
    """Put without blocking; a full queue (a watcher that stopped reading) is cut off: False."""
    try:
        q.put_nowait(item)
        return True
    except asyncio.QueueFull:
        if force:
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()
            q.put_nowait(item)
        return False


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _kill_leftover(job_dir: Path) -> None:
    """Kill the worker a previous service process left running for this job (its own process group)."""
    try:
        pid = int((job_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return
    cmdline = Path(f"/proc/{pid}/cmdline")
    with contextlib.suppress(OSError):
        if str(job_dir).encode() in cmdline.read_bytes():  # the pid is still that worker, not a reused one
            log.warning("killing the worker (pid %d) left over for %s", pid, job_dir.name)
            _kill_group(pid, signal.SIGKILL)
            for _ in range(50):
                if not cmdline.exists():
                    break
                time.sleep(0.05)


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
