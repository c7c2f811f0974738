//! Unwinding deep records (`DeepStackEvent`: registers and raw stack bytes) in user space with the
//! call-frame information (`.eh_frame`) of the mapped libraries, through framehop. The kernel's
//! frame-pointer walk stops at the first library built without frame pointers, and the callers of
//! tensor and device allocations are all in such libraries (libtorch, libstdc++, the CUDA
//! libraries); the CFI walks through them to the program's own code.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    ops::{Deref, Range},
    sync::Arc,
};

use framehop::{
    ModuleSectionInfo, Unwinder,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSegment};
use rustc_hash::FxHashMap;

use tracer_common::{DEEP_HEAP_BYTES, DEEP_MIN_BYTES};

use crate::procfs::ProcMaps;

/// Bytes of one section of a mapped file (the file stays mapped while any module uses it).
#[derive(Clone)]
pub struct SectionBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl Deref for SectionBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// What unwinding needs from one file: its unwind sections and its loadable segments.
struct FileUnwindInfo {
    map: Arc<Mmap>,
    /// Section name → (address range as stated in the file, byte range in the file).
    sections: Vec<(&'static [u8], Range<u64>, Range<usize>)>,
    /// PT_LOAD segments as (file offset, address, file size).
    loads: Vec<(u64, u64, u64)>,
}

const SECTIONS: [&[u8]; 5] = [
    b".eh_frame",
    b".eh_frame_hdr",
    b".text",
    b".got",
    b".debug_frame",
];

impl FileUnwindInfo {
    fn read(path: &str) -> Option<Self> {
        let file = File::open(path).ok()?;
        // SAFETY: a read-only private mapping of a library; every offset is bounds-checked.
        let map = Arc::new(unsafe { Mmap::map(&file) }.ok()?);
        let elf = object::File::parse(&**map).ok()?;
        let sections = SECTIONS
            .iter()
            .filter_map(|name| {
                let s = elf.section_by_name_bytes(name)?;
                let (off, size) = s.file_range()?;
                let (off, size) = (usize::try_from(off).ok()?, usize::try_from(size).ok()?);
                Some((*name, s.address()..s.address() + s.size(), off..off + size))
            })
            .collect();
        let loads = elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        Some(Self {
            map,
            sections,
            loads,
        })
    }
}

/// The address a file's address 0 is loaded at, for its mapping of `file_offset` at `start`, from
/// its PT_LOAD segments as (file offset, address, file size). The mapping starts at the page
/// holding its segment's first byte, so a page may hold the end of one segment and the start of
/// the next (lld packs them so): the later segment is the one mapped there.
fn base_avma(loads: &[(u64, u64, u64)], start: u64, file_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let &(p_offset, p_vaddr, _) = loads
        .iter()
        .filter(|(off, _, size)| (off & !(PAGE - 1)..off + size.max(&1)).contains(&file_offset))
        .max_by_key(|(off, _, _)| *off)?;
    Some(
        start
            .wrapping_sub(file_offset)
            .wrapping_add(p_offset)
            .wrapping_sub(p_vaddr),
    )
}

/// One module's sections, as framehop asks for them.
struct Sections(Arc<FileUnwindInfo>);

impl ModuleSectionInfo<SectionBytes> for Sections {
    fn base_svma(&self) -> u64 {
        0 // ELF
    }

    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        let s = self.0.sections.iter().find(|(n, _, _)| *n == name)?;
        Some(s.1.clone())
    }

    fn section_data(&mut self, name: &[u8]) -> Option<SectionBytes> {
        let s = self.0.sections.iter().find(|(n, _, _)| *n == name)?;
        Some(SectionBytes {
            map: self.0.map.clone(),
            range: s.2.clone(),
        })
    }
}

/// A process's unwinder: its modules, added as its mappings are seen.
#[derive(Default)]
struct ProcUnwinder {
    unwinder: UnwinderX86_64<SectionBytes>,
    /// Start addresses of the mappings added.
    added: HashSet<u64>,
}

/// The last unwind of one thread's allocation site. Unwinding is a function of the registers and
/// of the stack words it reads: a record with the same registers and the same words at those
/// addresses has the same frames, found without unwinding (a loop that allocates at one site
/// sends the same stack over and over).
struct Memo {
    sp: u64,
    bp: u64,
    /// Modules of the process when it was made (a module added since may unwind further).
    modules: usize,
    /// The words read, as (offset from `sp`, value).
    reads: Vec<(u32, u64)>,
    frames: Vec<u64>,
    reach: Reach,
}

/// Memos kept at most; beyond, they are all dropped and made again.
const MAX_MEMOS: usize = 1 << 16;

/// Unwinders per process, and the unwind information of every file, read once.
pub struct Unwinders {
    files: HashMap<Arc<str>, Option<Arc<FileUnwindInfo>>>,
    procs: FxHashMap<u32, ProcUnwinder>,
    cache: CacheX86_64,
    /// Per (process, thread, ip).
    memos: FxHashMap<(u32, u32, u64), Memo>,
    /// The words the unwind in progress reads.
    reads: Vec<(u32, u64)>,
}

impl Default for Unwinders {
    fn default() -> Self {
        Self {
            files: HashMap::new(),
            procs: FxHashMap::default(),
            cache: CacheX86_64::new(),
            memos: FxHashMap::default(),
            reads: Vec::new(),
        }
    }
}

/// How far an unwind read into its stack copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// Bytes from the copy's start up to the farthest word read.
    pub read: usize,
    /// It needed a word past the copy's end: the stack is cut short there.
    pub beyond: bool,
}

impl Reach {
    /// The copy length to ask for next time at this site, after a copy of `len` bytes: what was
    /// read and a little more (another path to the same site may be a little deeper), or twice
    /// the copy when it was too short; within `min..=max`.
    pub fn next_copy(self, len: usize, min: usize, max: usize) -> usize {
        const MARGIN: usize = 256;
        let want = if self.beyond {
            2 * len
        } else {
            self.read + MARGIN
        };
        want.clamp(min, max)
    }
}

/// The copy lengths asked of the kernel per allocation site (tracer-common's `DeepHintKey`), as
/// last sent: a site's length only grows.
#[derive(Default)]
pub struct CopyHints {
    sent: FxHashMap<(u32, u64), u32>,
}

impl CopyHints {
    /// After a heap record of `tgid` at `ip` whose `len`-byte copy was unwound to `reach`: the
    /// length to send for the site when it is more than the one sent before.
    pub fn after(&mut self, tgid: u32, ip: u64, len: usize, reach: Reach) -> Option<u32> {
        let want = reach.next_copy(len, DEEP_MIN_BYTES, DEEP_HEAP_BYTES) as u32;
        let sent = self.sent.entry((tgid, ip)).or_insert(0);
        (want > *sent).then(|| {
            *sent = want;
            want
        })
    }

    /// A process's sites (exec: new code; exit).
    pub fn forget(&mut self, tgid: u32) {
        self.sent.retain(|(t, _), _| *t != tgid);
    }
}

/// Registers and stack bytes of a deep record, and its thread.
pub struct RawStack<'a> {
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub bytes: &'a [u8],
}

impl Unwinders {
    /// Unwinds `stack` of process `tgid` (its mappings `maps`) into `out`: the ip, then return
    /// addresses, at most `max` of them. Says how much of the copy it read, and whether it needed
    /// more than the copy holds.
    pub fn unwind(
        &mut self,
        tgid: u32,
        maps: &ProcMaps,
        stack: &RawStack<'_>,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Reach {
        let modules = self.add_modules(tgid, maps);
        let key = (tgid, stack.tid, stack.ip);
        if let Some(m) = self.memos.get(&key)
            && m.sp == stack.sp
            && m.bp == stack.bp
            && m.modules == modules
            && m.reads
                .iter()
                .all(|&(off, w)| word(stack.bytes, off as usize) == Some(w))
        {
            out.extend(m.frames.iter().take(max));
            return m.reach;
        }
        let start = out.len();
        let reach = self.unwind_afresh(tgid, stack, max, out);
        if self.memos.len() >= MAX_MEMOS {
            self.memos.clear();
        }
        // The memo replaced keeps its buffers: its reads become the next unwind's.
        let memo = self.memos.entry(key).or_insert_with(|| Memo {
            sp: 0,
            bp: 0,
            modules: 0,
            reads: Vec::new(),
            frames: Vec::new(),
            reach,
        });
        (memo.sp, memo.bp, memo.modules, memo.reach) = (stack.sp, stack.bp, modules, reach);
        std::mem::swap(&mut memo.reads, &mut self.reads);
        memo.frames.clear();
        memo.frames.extend_from_slice(&out[start..]);
        reach
    }

    /// Adds the modules of `tgid`'s mappings not added yet; returns how many it has.
    fn add_modules(&mut self, tgid: u32, maps: &ProcMaps) -> usize {
        let proc = self.procs.entry(tgid).or_default();
        for (start, end, offset, path) in maps.mappings() {
            if !proc.added.insert(start) {
                continue;
            }
            let info = self
                .files
                .entry(path.clone())
                .or_insert_with(|| FileUnwindInfo::read(path).map(Arc::new));
            let Some(info) = info.clone() else {
                continue;
            };
            let Some(base) = base_avma(&info.loads, start, offset) else {
                continue;
            };
            let module = framehop::Module::new(path.to_string(), start..end, base, Sections(info));
            proc.unwinder.add_module(module);
        }
        proc.added.len()
    }

    /// Unwinds with framehop, noting every word read in `self.reads`.
    fn unwind_afresh(
        &mut self,
        tgid: u32,
        stack: &RawStack<'_>,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Reach {
        let Some(proc) = self.procs.get(&tgid) else {
            return Reach::default();
        };
        let mut reach = Reach::default();
        let reads = &mut self.reads;
        reads.clear();
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(stack.sp).ok_or(())?).map_err(|_| ())?;
            let Some(w) = word(stack.bytes, off) else {
                reach.beyond = reach.beyond || off < 1 << 20; // a stack address, not garbage
                return Err(());
            };
            reach.read = reach.read.max(off + 8);
            reads.push((off as u32, w));
            Ok(w)
        };
        let regs = UnwindRegsX86_64::new(stack.ip, stack.sp, stack.bp);
        let mut frames = proc
            .unwinder
            .iter_frames(stack.ip, regs, &mut self.cache, &mut read);
        while out.len() < max {
            match frames.next() {
                Ok(Some(f)) => out.push(f.address()),
                _ => break,
            }
        }
        reach
    }

    /// Drops a process's unwinder (exec: new code; exit).
    pub fn forget(&mut self, tgid: u32) {
        self.procs.remove(&tgid);
        self.memos.retain(|(t, _, _), _| *t != tgid);
    }
}

/// The little-endian word at byte `off` of `bytes`, if the copy holds it.
fn word(bytes: &[u8], off: usize) -> Option<u64> {
    let b = bytes.get(off..off.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::base_avma;

    #[test]
    fn load_bias_of_gnu_ld_and_lld_layouts() {
        // GNU ld: every segment's address equals its file offset.
        let gnu = [(0, 0, 0xf54d98), (0xf55000, 0xf55000, 0x10b42d0d)];
        assert_eq!(
            base_avma(&gnu, 0x7f00_00f5_5000, 0xf55000),
            Some(0x7f00_0000_0000)
        );
        // lld: the text segment starts inside the page where the read-only one ends, one page
        // higher in memory than in the file; the mapping of that page belongs to the text.
        let lld = [(0, 0, 0x5ac0c), (0x5ac10, 0x5bc10, 0x58d20)];
        // Loaded at 0x5555_5550_0000, the text page lies 0x5a000 + 0x1000 above it.
        assert_eq!(
            base_avma(&lld, 0x5555_5555_b000, 0x5a000),
            Some(0x5555_5550_0000)
        );
        assert_eq!(
            base_avma(&lld, 0x1000, 0x99_0000),
            None,
            "offset in no segment"
        );
    }
}
