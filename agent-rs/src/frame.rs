//! Frames: u32 total length (big-endian), u32 header length, JSON header, raw body; total = 4 + header +
//! body. And the one writer of a connection (stdout, or a socket): frames queue here and a single thread
//! writes them whole, in order.

use crate::json::Value;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
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
}

/// Frames to the manager. send() never blocks; wait_for_room() is where command output waits while the
/// manager is behind (the command then blocks on its full pipe, not the agent's memory).
pub struct Out {
    queue: Mutex<Queue>,
    wake_writer: Condvar,
    room: Condvar,
}

impl Out {
    /// Starts the writer thread over sink; on_broken runs once when the sink is gone (the manager went away).
    /// The thread ends then, or once the queue is closed.
    pub fn start(sink: Box<dyn Write + Send>, on_broken: impl FnOnce() + Send + 'static) -> Arc<Out> {
        let out = Arc::new(Out {
            queue: Mutex::new(Queue { frames: VecDeque::new(), pending: 0, congested: false, closed: false }),
            wake_writer: Condvar::new(),
            room: Condvar::new(),
        });
        let writer = out.clone();
        std::thread::Builder::new()
            .name("writer".into())
            .stack_size(64 * 1024)
            .spawn(move || writer.run(sink, on_broken))
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

    /// Wait while the backlog is high (until it falls below OUT_LOW), unless `done` is set (a command that
    /// has ended drains regardless).
    pub fn wait_for_room(&self, done: &AtomicBool) {
        let mut queue = self.queue.lock().unwrap();
        while queue.congested && !done.load(Ordering::Relaxed) {
            queue = self.room.wait_timeout(queue, Duration::from_millis(50)).unwrap().0;
        }
    }

    fn run(&self, mut sink: Box<dyn Write + Send>, on_broken: impl FnOnce()) {
        loop {
            let mut batch = Vec::new();
            {
                let mut queue = self.queue.lock().unwrap();
                while queue.frames.is_empty() {
                    if queue.closed {
                        return;
                    }
                    queue = self.wake_writer.wait(queue).unwrap();
                }
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
            if failed || sink.flush().is_err() {
                on_broken();
                return;
            }
            let mut queue = self.queue.lock().unwrap();
            queue.pending -= written;
            if queue.congested && queue.pending < OUT_LOW {
                queue.congested = false;
                self.room.notify_all();
            }
        }
    }
}
