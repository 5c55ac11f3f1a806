//! Frames: u32 total length (big-endian), u32 header length, JSON header, raw body; total = 4 + header +
//! body. And the one writer of a connection (stdout, or a socket): frames queue here and a single thread
//! writes them whole, in order (send_now writes from the sender's thread when nothing is queued or being written).

use crate::json::Value;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Bytes waiting for the manager: above OUT_HIGH, running commands' output stays in their pipes ...
pub const OUT_HIGH: usize = 1 << 20;
/// ... until the backlog is below OUT_LOW again.
pub const OUT_LOW: usize = 256 * 1024;

pub fn encode(header: &Value, body: &[u8]) -> Vec<u8> {
    let raw = header.dumps();
    let mut frame = Vec::with_capacity(8 + raw.len() + body.len());
    frame.extend_from_slice(&((4 + raw.len() + body.len()) as u32).to_be_bytes());
    frame.extend_from_slice(&(raw.len() as u32).to_be_bytes());
    frame.extend_from_slice(raw.as_bytes());
    frame.extend_from_slice(body);
    frame
}

/// The next (raw header, body), or None at a clean end of stream.
pub fn read_frame(reader: &mut impl Read) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut prefix = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match reader.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let total = u32::from_be_bytes(prefix[..4].try_into().unwrap()) as usize;
    let head_len = u32::from_be_bytes(prefix[4..].try_into().unwrap()) as usize;
    if total < 4 || head_len > total - 4 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad frame lengths"));
    }
    let mut data = vec![0u8; total - 4];
    reader.read_exact(&mut data)?;
    let body = data.split_off(head_len);
    Ok(Some((data, body)))
}

struct Queue {
    frames: VecDeque<Vec<u8>>,
    pending: usize,
    congested: bool,
    closed: bool,
    writing: bool, // a thread is writing to the sink (the writer, or a sender through send_now)
    broken: bool,  // a send_now found the sink gone: the writer calls on_broken
}

/// Frames to the manager. send() never blocks; congested() and wait_room() are where command output waits while the
/// manager is behind (the command then blocks on its full pipe, not the agent's memory).
pub struct Out {
    queue: Mutex<Queue>,
    sink: Mutex<Box<dyn Write + Send>>,
    wake_writer: Condvar,
    room: Condvar,
}

impl Out {
    /// Starts the writer thread over sink; on_broken runs once when the sink is gone (the manager went away).
    /// The thread ends then, or once the queue is closed.
    pub fn start(sink: Box<dyn Write + Send>, on_broken: impl FnOnce() + Send + 'static) -> Arc<Out> {
        let out = Arc::new(Out {
            queue: Mutex::new(Queue {
                frames: VecDeque::new(),
                pending: 0,
                congested: false,
                closed: false,
                writing: false,
                broken: false,
            }),
            sink: Mutex::new(sink),
            wake_writer: Condvar::new(),
            room: Condvar::new(),
        });
        let writer = out.clone();
        std::thread::Builder::new()
            .name("writer".into())
            .stack_size(64 * 1024)
            .spawn(move || writer.run(on_broken))
            .expect("writer thread");
        out
    }

    pub fn send(&self, header: &Value, body: &[u8]) {
        self.push(encode(header, body));
    }

    pub fn push(&self, frame: Vec<u8>) {
        let mut queue = self.queue.lock().unwrap();
        if queue.closed {
            return;
        }
        queue.pending += frame.len();
        if queue.pending >= OUT_HIGH {
            queue.congested = true;
        }
        queue.frames.push_back(frame);
        self.wake_writer.notify_one();
    }

    /// Send a frame, written by this thread itself when nothing else is queued or being written (the hand-off to
    /// the writer thread is a wake-up that costs a command's exit frame a scheduler round trip on a busy
    /// machine); queued as send() does otherwise. It may block while the manager is not reading.
    pub fn send_now(&self, header: &Value, body: &[u8]) {
        let frame = encode(header, body);
        {
            let mut queue = self.queue.lock().unwrap();
            if queue.closed {
                return;
            }
            if !queue.frames.is_empty() || queue.writing {
                queue.pending += frame.len();
                queue.frames.push_back(frame);
                self.wake_writer.notify_one();
                return;
            }
            queue.writing = true;
        }
        let written = {
            let mut sink = self.sink.lock().unwrap();
            sink.write_all(&frame).and_then(|_| sink.flush())
        };
        let mut queue = self.queue.lock().unwrap();
        queue.writing = false;
        queue.broken |= written.is_err();
        if queue.broken || !queue.frames.is_empty() {
            self.wake_writer.notify_one();
        }
    }

    /// Send nothing more (the agent is ending, or the connection is gone): frames not yet written are
    /// dropped, so are later ones, and the writer thread ends.
    pub fn close(&self) {
        let mut queue = self.queue.lock().unwrap();
        queue.closed = true;
        queue.frames.clear();
        queue.congested = false;
        self.room.notify_all();
        self.wake_writer.notify_all();
    }

    /// Whether the backlog is high: running commands' output should stay in their pipes for now.
    pub fn congested(&self) -> bool {
        self.queue.lock().unwrap().congested
    }

    /// Wait up to `limit` for the backlog to fall (below OUT_LOW); whether it has.
    pub fn wait_room(&self, limit: Duration) -> bool {
        let queue = self.queue.lock().unwrap();
        let (queue, _) = self.room.wait_timeout_while(queue, limit, |q| q.congested).unwrap();
        !queue.congested
    }

    fn run(&self, on_broken: impl FnOnce()) {
        loop {
            let mut batch = Vec::new();
            {
                let mut queue = self.queue.lock().unwrap();
                while queue.frames.is_empty() || queue.writing {
                    if queue.broken {
                        drop(queue);
                        on_broken();
                        return;
                    }
                    if queue.closed {
                        return;
                    }
                    queue = self.wake_writer.wait(queue).unwrap();
                }
                queue.writing = true;
                let mut size = 0;
                while size < 256 * 1024 {
                    match queue.frames.pop_front() {
                        Some(frame) => {
                            size += frame.len();
                            batch.push(frame);
                        }
                        None => break,
                    }
                }
            }
            let mut sink = self.sink.lock().unwrap();
            let mut slices: Vec<io::IoSlice> = batch.iter().map(|f| io::IoSlice::new(f)).collect();
            // slices[first..] are left to write; slices[first] starts at batch[first][offset..].
            let (mut first, mut offset) = (0, 0);
            let written: usize = batch.iter().map(|f| f.len()).sum();
            let mut failed = false;
            while first < slices.len() {
                match sink.write_vectored(&slices[first..]) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => {
                        // IoSlice::advance_slices by hand: it is Rust 1.81, Debian 12's rustc is 1.63.
                        offset += n;
                        while first < slices.len() && offset >= batch[first].len() {
                            offset -= batch[first].len();
                            first += 1;
                        }
                        if first < slices.len() {
                            slices[first] = io::IoSlice::new(&batch[first][offset..]);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        failed = true; // EPIPE (the runtime ignores SIGPIPE): the manager is gone
                        break;
                    }
                }
            }
            let failed = failed || sink.flush().is_err();
            drop(sink);
            let mut queue = self.queue.lock().unwrap();
            queue.writing = false;
            if failed {
                drop(queue);
                on_broken();
                return;
            }
            queue.pending -= written;
            if queue.congested && queue.pending < OUT_LOW {
                queue.congested = false;
                self.room.notify_all();
            }
        }
    }
}
