//! The consumer side of the kernel's event ring (BPF_MAP_TYPE_RINGBUF), reading records in place
//! and publishing how far it has read once per batch.
//!
//! aya's `RingBuf` publishes the consumer position after every record. The kernel reads that
//! position on every reservation, so each store moves its cache line to the consumer's CPU and the
//! traced thread's next allocation takes the miss back: measured at ~700 ns per malloc+free pair
//! (two records) on this kind of machine, more than the programs themselves. Publishing per batch
//! (a few hundred KiB) costs the producer one miss per batch instead.
//!
//! Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position (the only page user space
//! writes); page 1 the producer position; the data pages follow. The kernel offers them twice in a
//! row, so that a record wrapping around the end reads as one slice; this maps them once (the
//! kernel maps every page at mmap time, so the second copy would count the whole ring twice in
//! RSS) and copies the rare wrapped record into a buffer instead. Each record starts with an 8-byte
//! header: its length with a busy bit (being written) and a discard bit, then the kernel's page
//! offset; records are 8-aligned, so a header never wraps.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use aya::maps::MapData;

const BUSY_BIT: u32 = 1 << 31;
const DISCARD_BIT: u32 = 1 << 30;
const HEADER: usize = 8;

/// A shared mapping of the ring's pages, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, prot: i32, offset: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh shared mapping of the map's descriptor; the kernel checks size and offset.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The event ring, read by one consumer.
pub struct Ring {
    map: MapData,
    consumer: Mapping,
    producer: Mapping,
    page: usize,
    mask: usize,
    /// Where reading continues; published to the kernel by [`Ring::publish`].
    pos: usize,
    /// A record that wraps around the end of the data pages, put back together.
    wrapped: Vec<u8>,
}

// SAFETY: the mappings are owned by this value and only read (and the consumer word written)
// through `&mut self`.
unsafe impl Send for Ring {}

impl Ring {
    pub fn new(map: MapData) -> std::io::Result<Self> {
        let size = map
            .info()
            .map_err(|e| std::io::Error::other(format!("ring buffer info: {e}")))?
            .max_entries() as usize;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        if !size.is_power_of_two() || size < page {
            return Err(std::io::Error::other(format!(
                "ring buffer of {size} bytes: not a power-of-two multiple of the page size"
            )));
        }
        let fd = map.fd().as_fd().as_raw_fd();
        let consumer = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd, page + size, libc::PROT_READ, page)?;
        // SAFETY: the consumer page starts with the kernel's consumer position.
        let pos = unsafe { consumer_pos(&consumer) }.load(Ordering::Acquire);
        Ok(Self {
            map,
            consumer,
            producer,
            page,
            mask: size - 1,
            pos,
            wrapped: Vec::new(),
        })
    }

    /// The bytes the ring holds.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Calls `f` with each committed record, at most `max` of them (discarded ones are skipped and
    /// not counted), and returns how many it passed. Stops early at a record still being written.
    /// What was read is released to the kernel only by [`Ring::publish`].
    pub fn read(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        // SAFETY: the producer page starts with the kernel's producer position.
        let end = unsafe { &*self.producer.ptr.cast::<AtomicUsize>() }.load(Ordering::Acquire);
        let mut n = 0;
        while self.pos != end && n < max {
            let off = self.page + (self.pos & self.mask);
            // SAFETY: `off` is inside the first copy of the data pages; the header is 8-aligned.
            let header =
                unsafe { &*self.producer.ptr.add(off).cast::<AtomicU32>() }.load(Ordering::Acquire);
            if header & BUSY_BIT != 0 {
                break;
            }
            let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize;
            if len > self.mask {
                break; // not a record: never written by the kernel
            }
            if header & DISCARD_BIT == 0 {
                f(self.record(off + HEADER, len));
                n += 1;
            }
            self.pos += (HEADER + len).next_multiple_of(8);
        }
        n
    }

    /// The `len` bytes at mapping offset `start` (inside the data pages), wrapping around their end.
    fn record(&mut self, start: usize, len: usize) -> &[u8] {
        let end = self.page + self.mask + 1;
        // SAFETY: `start <= end` and `len <= mask`; the parts lie inside the data pages, which the
        // kernel does not reuse before the consumer position passes the record.
        unsafe {
            if start + len <= end {
                return std::slice::from_raw_parts(self.producer.ptr.add(start), len);
            }
            let head = end - start;
            self.wrapped.clear();
            self.wrapped.extend_from_slice(std::slice::from_raw_parts(
                self.producer.ptr.add(start),
                head,
            ));
            self.wrapped.extend_from_slice(std::slice::from_raw_parts(
                self.producer.ptr.add(self.page),
                len - head,
            ));
        }
        &self.wrapped
    }

    /// Gives what was read back to the kernel (one store: the producer's next reservation takes
    /// one cache miss for it).
    pub fn publish(&mut self) {
        // SAFETY: as in `new`.
        unsafe { consumer_pos(&self.consumer) }.store(self.pos, Ordering::Release);
    }
}

/// The kernel's consumer position at the start of the consumer page.
///
/// # Safety
/// `m` must be the ring's consumer page.
unsafe fn consumer_pos(m: &Mapping) -> &AtomicUsize {
    // SAFETY: page-aligned, so aligned for a usize; lives as long as the mapping.
    unsafe { &*m.ptr.cast::<AtomicUsize>() }
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        self.map.fd().as_fd().as_raw_fd()
    }
}
