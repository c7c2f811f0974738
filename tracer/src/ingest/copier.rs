//! The kernel's event ring emptied into user memory by a thread of its own. Decoding a record
//! (unwinding a copied stack, interning it, reading a new Python code object from the process)
//! costs more than the kernel side takes to write one, and a burst (libtorch's start-up under
//! `--heap full`, about a million allocator calls) outran the decoder: the ring filled and records
//! were lost. Copied out as they come, they wait in user memory instead, for as long as the
//! decoder needs; the kernel ring only has to hold what arrives between two copies.
//!
//! The thread waits on the ring for a wakeup (process events ask for one, and any record once a
//! quarter of the ring waits) or 10 ms, less when records come fast: they are read once they
//! have left the producing CPU's cache.

use std::{
    os::fd::{AsRawFd, RawFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use tokio::sync::mpsc;

use crate::probes::Ring;

/// How long the thread waits for a wakeup before looking at the ring anyway, when the records
/// come slowly: what a record waits at most before the ledger has it, and so how far behind a
/// sample the ledger may be. Records can go from none to 800 MB/s at once (an allocation-heavy
/// C++ program let go after its libraries loaded): 8 MB of a 32 MiB ring in this time, and the
/// kernel side wakes the thread once a quarter of it waits.
const POLL: Duration = Duration::from_millis(10);

/// Chunks kept for reuse once decoded: fresh memory costs a page fault per page while the ring
/// waits (a copy of a burst took 100 ms with it), and more than this many are rarely in use.
const SPARE_CHUNKS: usize = 16;

/// Records copied out of the ring, in order: each a little-endian u32 length, then its bytes.
#[derive(Default)]
pub struct Chunk(Vec<u8>);

impl Chunk {
    /// The records, in the order the kernel committed them.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = &self.0[..];
        std::iter::from_fn(move || {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let len = u32::from_le_bytes(*len) as usize;
            let (record, tail) = tail.split_at_checked(len)?;
            rest = tail;
            Some(record)
        })
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The copying thread and the chunks it sends.
pub struct Copier {
    shared: Arc<Shared>,
    chunks: mpsc::UnboundedReceiver<Chunk>,
    thread: Option<JoinHandle<()>>,
}

/// What the copying thread and the decoder's side both hold.
struct Shared {
    /// Locked while the thread copies and sends (see [`Copier::take_all`]).
    ring: Mutex<Ring>,
    /// Decoded chunks' memory, for the next copies.
    spare: Mutex<Vec<Vec<u8>>>,
    stop: AtomicBool,
    /// Bytes copied out and not yet taken by the decoder, and the most there were at once.
    waiting: AtomicU64,
    peak: AtomicU64,
}

impl Copier {
    pub fn spawn(ring: Ring) -> std::io::Result<Self> {
        let epoll = Epoll::new(ring.as_raw_fd())?;
        let shared = Arc::new(Shared {
            ring: Mutex::new(ring),
            spare: Mutex::default(),
            stop: AtomicBool::new(false),
            waiting: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        });
        let (tx, chunks) = mpsc::unbounded_channel();
        let worker = Worker {
            shared: shared.clone(),
            tx,
        };
        let thread = std::thread::Builder::new()
            .name("ring-copier".into())
            .spawn(move || worker.run(epoll))?;
        Ok(Self {
            shared,
            chunks,
            thread: Some(thread),
        })
    }

    /// The next chunk the thread copied.
    pub async fn next(&mut self) -> Option<Chunk> {
        let chunk = self.chunks.recv().await?;
        self.taken(&chunk);
        Some(chunk)
    }

    /// Every record committed so far, in order: the chunks the thread sent and not yet taken,
    /// then what is in the ring now.
    pub fn take_all(&mut self) -> Vec<Chunk> {
        let shared = self.shared.clone();
        let mut ring = shared.ring.lock().unwrap_or_else(|e| e.into_inner());
        // The thread sends under the lock: every chunk it copied is in the channel now.
        let mut all = Vec::new();
        while let Ok(chunk) = self.chunks.try_recv() {
            self.taken(&chunk);
            all.push(chunk);
        }
        let rest = copy(&mut ring, &shared.spare, |full| all.push(full));
        if !rest.is_empty() {
            all.push(rest);
        }
        all
    }

    /// Gives decoded chunks' memory back for the next copies.
    pub fn recycle(&self, chunks: Vec<Chunk>) {
        let mut spare = self.shared.spare.lock().unwrap_or_else(|e| e.into_inner());
        for Chunk(mut bytes) in chunks {
            if spare.len() < SPARE_CHUNKS && bytes.capacity() == CHUNK_BYTES {
                bytes.clear();
                spare.push(bytes);
            }
        }
    }

    /// The most bytes of records that waited in user memory at once.
    pub fn peak_waiting(&self) -> u64 {
        self.shared.peak.load(Ordering::Relaxed)
    }

    fn taken(&self, chunk: &Chunk) {
        let len = chunk.0.len() as u64;
        self.shared.waiting.fetch_sub(len, Ordering::Relaxed);
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Worker {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Chunk>,
}

impl Worker {
    fn run(self, epoll: Epoll) {
        let fixed = fixed_wait();
        let (mut wait, mut since) = (fixed.unwrap_or(POLL), std::time::Instant::now());
        let shared = self.shared.clone();
        while !shared.stop.load(Ordering::Relaxed) {
            match fixed {
                // A slow reader sleeps through the kernel's wakeups.
                Some(fixed) => std::thread::sleep(fixed),
                None => epoll.wait(wait),
            }
            let mut ring = shared.ring.lock().unwrap_or_else(|e| e.into_inner());
            let mut copied = 0;
            let last = copy(&mut ring, &shared.spare, |full| {
                copied += full.0.len();
                self.send(full)
            });
            copied += last.0.len();
            if !last.is_empty() {
                self.send(last);
            }
            wait = fixed.unwrap_or_else(|| next_wait(copied, since.elapsed(), ring.capacity()));
            since = std::time::Instant::now();
        }
    }

    /// Sends a chunk (under the ring's lock, so that the decoder taking all finds it there).
    fn send(&self, chunk: Chunk) {
        let len = chunk.0.len() as u64;
        let now = self.shared.waiting.fetch_add(len, Ordering::Relaxed) + len;
        self.shared.peak.fetch_max(now, Ordering::Relaxed);
        // A send fails only once the decoder is gone, and then nothing is read any more.
        let _ = self.tx.send(chunk);
    }
}

/// `LEAKTRACER_RING_POLL_MS=N` copies every N ms whatever the rate: a slow reader, so that the
/// tests of what a full ring loses can fill one.
fn fixed_wait() -> Option<Duration> {
    let ms = std::env::var("LEAKTRACER_RING_POLL_MS")
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// How long to wait before the next copy, after one of `copied` bytes, made `elapsed` after
/// the one before, from a ring of `capacity`: the time the records take to fill a quarter of the
/// ring at that rate, at most [`POLL`] (raw stacks of an allocation-heavy C++ program come at
/// 800 MB/s, which fills a 32 MiB ring in 40 ms).
fn next_wait(copied: usize, elapsed: Duration, capacity: usize) -> Duration {
    let quarter = capacity as f64 / 4.0;
    let rate = copied as f64 / elapsed.as_secs_f64().max(1e-6);
    Duration::from_secs_f64(quarter / rate.max(1.0)).min(POLL)
}

/// Records copied between two returns of their space to the kernel: while producers keep
/// writing, the copy goes on, and the space it read must go back as it goes.
const RECORDS_PER_PUBLISH: usize = 4096;

/// A chunk's bytes: one allocation, never grown (growing a large one copies it, while the
/// ring waits).
const CHUNK_BYTES: usize = 1 << 20;

/// Copies every committed record out of the ring, giving the space back as it goes, and hands
/// each full chunk to `send` (the last one, maybe empty, is returned). A chunk's memory is taken
/// only for a record: the copier looks at the ring a hundred times a second, mostly to find
/// nothing, and a chunk taken and dropped each time cost a megabyte's allocation, its pages
/// faulted in and given back (most of leaktracer's own CPU while a training loop's memory held).
fn copy(ring: &mut Ring, spare: &Mutex<Vec<Vec<u8>>>, mut send: impl FnMut(Chunk)) -> Chunk {
    let fresh = || {
        let reused = spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        reused.unwrap_or_else(|| Vec::with_capacity(CHUNK_BYTES))
    };
    let mut out = Vec::new();
    loop {
        let n = ring.read(RECORDS_PER_PUBLISH, |record| {
            if out.capacity() == 0 {
                out = fresh();
            } else if out.len() + 4 + record.len() > out.capacity() && !out.is_empty() {
                send(Chunk(std::mem::replace(&mut out, fresh())));
            }
            out.extend_from_slice(&(record.len() as u32).to_le_bytes());
            out.extend_from_slice(record);
        });
        ring.publish();
        if n < RECORDS_PER_PUBLISH {
            return Chunk(out);
        }
    }
}

/// An edge-triggered epoll instance watching the ring: it returns on the kernel's wakeups, not
/// whenever records are waiting (the ring's descriptor is readable as long as any are).
struct Epoll(RawFd);

impl Epoll {
    fn new(ring: RawFd) -> std::io::Result<Self> {
        // SAFETY: plain syscalls; the descriptor is owned by the value returned.
        unsafe {
            let fd = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let epoll = Self(fd);
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 0,
            };
            if libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, ring, &mut ev) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(epoll)
        }
    }

    fn wait(&self, timeout: Duration) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: one event into a local; a failure (EINTR) is a wait cut short.
        unsafe { libc::epoll_wait(self.0, &mut ev, 1, timeout.as_millis() as i32) };
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Chunk, POLL, next_wait};

    #[test]
    fn the_wait_shortens_as_records_come_faster() {
        let ring = 32 << 20;
        let ms = Duration::from_millis;
        assert_eq!(next_wait(1 << 20, ms(10), ring), POLL); // 100 MB/s: 80 ms to a quarter
        assert_eq!(next_wait(16 << 20, ms(10), ring), ms(5)); // a half in 10 ms
        assert_eq!(
            next_wait(32 << 20, ms(10), ring),
            Duration::from_micros(2500)
        );
        assert_eq!(next_wait(0, ms(10), ring), POLL);
    }

    #[test]
    fn a_chunk_gives_back_its_records_in_order() {
        let mut bytes = Vec::new();
        for r in [&b"abc"[..], b"", b"0123456789"] {
            bytes.extend_from_slice(&(r.len() as u32).to_le_bytes());
            bytes.extend_from_slice(r);
        }
        let chunk = Chunk(bytes);
        let got: Vec<&[u8]> = chunk.records().collect();
        assert_eq!(got, vec![&b"abc"[..], b"", b"0123456789"]);
    }
}
