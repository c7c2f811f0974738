//! Load benchmarks, figures printed and never asserted:
//! - `bench --storm`: threads allocating and freeing as fast as they can under leaktracer: the
//!   event rate it keeps up with, what it lost past that (counted by reason), and whether the
//!   ledger is still right for what it saw.
//! - `bench --rss`: the tracer's memory with 1M allocations outstanding across 10k stacks.
//!
//! Their workloads run in this binary (hidden commands), traced by a session in this process.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use crate::{
    config::{Config, RunMode, Target},
    error::Error,
    report::Report,
    session,
};

/// The storm's workload: `threads` threads doing malloc(64)+free pairs for `seconds`; returns the
/// pairs made.
pub fn storm_workload(threads: usize, seconds: f64) -> u64 {
    let stop = AtomicBool::new(false);
    let pairs = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        storm_pair();
                    }
                    n += 256;
                }
                pairs.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    pairs.load(Ordering::Relaxed)
}

#[inline(never)]
fn storm_pair() {
    // SAFETY: plain libc allocation and release; black_box keeps the pair from being elided.
    unsafe {
        let p = std::hint::black_box(libc::malloc(64));
        libc::free(p);
    }
}

/// One traced run of a workload of this binary: the final report, the seconds it took and what
/// the workload wrote to its result file.
fn traced(workload: &[&str], heap: &str, ring_mb: u32) -> Result<(Report, f64, String), Error> {
    let out = std::env::temp_dir().join(format!("leaktracer-stress-{}.txt", std::process::id()));
    let report =
        std::env::temp_dir().join(format!("leaktracer-stress-{}.json", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("own executable: {e}"))?;
    let mut argv = vec![exe.display().to_string()];
    argv.extend(workload.iter().map(|s| s.to_string()));
    argv.push(out.display().to_string());
    let ring = ring_mb.to_string();
    let flags = [
        "--top",
        "5",
        "--json",
        "-o",
        report.to_str().expect("utf-8 temp path"),
        "--no-store",
        "--heap",
        heap,
        "--ring-mb",
        &ring,
    ];
    let config = Config::from_flags(&flags, RunMode::Run)?;
    let start = Instant::now();
    session::run(Target::Launch(argv), config)?;
    let secs = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&report).map_err(|e| anyhow::anyhow!("report: {e}"))?;
    let last = text.lines().last().unwrap_or_default();
    let r: Report = serde_json::from_str(last).map_err(|e| anyhow::anyhow!("report: {e}"))?;
    let result = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&report);
    Ok((r, secs, result.trim().to_string()))
}

/// `bench --storm`: 1, 2 and 4 threads for `seconds` each, `--heap full` and `sampled`.
pub fn storm(seconds: f64) -> Result<i32, Error> {
    crate::probes::detach_in_foreground();
    crate::tell!(
        "allocation storm: threads doing malloc(64)+free for {seconds} s each, {} CPUs",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    crate::tell!(
        "  {:<8} {:>7} {:>14} {:>14} {:>12} {:>10}  ledger",
        "heap",
        "threads",
        "probe hits/s",
        "records/s",
        "lost",
        "untraced/s"
    );
    for heap in ["full", "sampled"] {
        for threads in [1usize, 2, 4] {
            let t0 = Instant::now();
            let untraced =
                storm_workload(threads, seconds.min(2.0)) as f64 / t0.elapsed().as_secs_f64();
            let (r, _, made) = traced(
                &["bench-storm", &threads.to_string(), &seconds.to_string()],
                heap,
                crate::cli::DEFAULT_RING_MB,
            )?;
            let pairs: f64 = made.parse().unwrap_or(0.0);
            let l = &r.losses;
            let lost = l.ringbuf_full + l.pending_full + l.stack_errors + l.sampled_full;
            // Every pair was freed: what the ledger still holds at the storm's site is what
            // losses left unmatched (0 when nothing was lost).
            let held: u64 = r
                .stacks
                .iter()
                .filter(|s| {
                    s.frames.iter().any(|f| {
                        f.function
                            .as_deref()
                            .is_some_and(|n| n.contains("storm_pair"))
                    })
                })
                .map(|s| s.bytes)
                .sum();
            crate::tell!(
                "  {:<8} {:>7} {:>14.0} {:>14.0} {:>12} {:>10.0}  {} bytes held at storm_pair{}",
                heap,
                threads,
                // Each pair is three probe hits: malloc's entry and return, free's entry.
                3.0 * pairs / seconds,
                r.events as f64 / seconds,
                lost,
                2.0 * untraced,
                held,
                if lost == 0 && held == 0 {
                    " (exact)"
                } else {
                    ""
                },
            );
        }
    }
    program_times(seconds)?;
    Ok(0)
}

/// The heap programs whose time per call [`program_times`] prints: a pair runs each once.
const PAIR_PROGRAMS: [&str; 3] = ["malloc_enter", "alloc_return", "free_enter"];

/// One more 1-thread storm per mode with the kernel's program statistics on (they add two clock
/// reads per run, so the table's rates are taken without them): each heap program's time per
/// call, measured by the kernel around the program.
fn program_times(seconds: f64) -> Result<(), Error> {
    let _on = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => fd,
        Err(e) => {
            crate::tell!("  kernel time per program: statistics unavailable ({e})");
            return Ok(());
        }
    };
    crate::tell!("  kernel time per call, 1 thread (BPF run-time statistics):");
    for heap in ["full", "sampled"] {
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let sampler = {
            let done = done.clone();
            std::thread::spawn(move || {
                // The programs go one by one when the run ends: keep the last reading that
                // had all of them.
                let mut last = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let now = read_program_times();
                    if now.len() >= last.len() {
                        last = now;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                last
            })
        };
        let run = traced(
            &["bench-storm", "1", &seconds.to_string()],
            heap,
            crate::cli::DEFAULT_RING_MB,
        );
        done.store(true, Ordering::Relaxed);
        let times = sampler.join().unwrap_or_default();
        run?;
        let cells: Vec<String> = times
            .iter()
            .map(|(name, ns)| format!("{name} {ns:.0} ns"))
            .collect();
        let pair: f64 = times.iter().map(|(_, ns)| ns).sum();
        crate::tell!("  {heap:<8} {}; a pair: {pair:.0} ns", cells.join(", "));
    }
    Ok(())
}

/// (program, ns per call) of [`PAIR_PROGRAMS`] as loaded now; the busiest of each name (another
/// tracer's copy would have run less).
fn read_program_times() -> Vec<(&'static str, f64)> {
    let mut best: [Option<(u64, f64)>; 3] = [None; 3];
    for info in aya::programs::loaded_programs().flatten() {
        let Some(i) = PAIR_PROGRAMS
            .iter()
            .position(|n| info.name_as_str() == Some(n))
        else {
            continue;
        };
        let runs = info.run_count();
        if runs > 0 && best[i].is_none_or(|(r, _)| runs > r) {
            best[i] = Some((runs, info.run_time().as_nanos() as f64 / runs as f64));
        }
    }
    PAIR_PROGRAMS
        .iter()
        .zip(best)
        .filter_map(|(name, b)| b.map(|(_, ns)| (*name, ns)))
        .collect()
}

/// The RSS workload: `blocks` malloc(64) blocks kept, spread evenly over 10,000 call stacks (100
/// middle functions × 100 leaf functions).
pub fn hold_workload(blocks: u64) -> u64 {
    let mut kept: Vec<usize> = Vec::with_capacity(blocks as usize);
    let per = blocks / 10_000;
    for mid in MIDS {
        for l in 0..100 {
            mid(l, per, &mut kept);
        }
    }
    kept.len() as u64
}

type Leaf = fn(u64, &mut Vec<usize>);
type Mid = fn(usize, u64, &mut Vec<usize>);

#[inline(never)]
fn leaf<const L: usize>(n: u64, kept: &mut Vec<usize>) {
    for _ in 0..n {
        // SAFETY: a plain allocation, kept (never freed: the workload exits holding it).
        kept.push(unsafe { std::hint::black_box(libc::malloc(64)) } as usize);
    }
    std::hint::black_box(L);
}

#[inline(never)]
fn mid<const M: usize>(l: usize, n: u64, kept: &mut Vec<usize>) {
    LEAVES[l](n, kept);
    std::hint::black_box(M);
}

macro_rules! table {
    ($f:ident, $t:ty, $($n:literal)*) => { [$($f::<$n> as $t),*] };
}

macro_rules! hundred {
    ($f:ident, $t:ty) => {
        table!($f, $t,
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
            32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
            61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89
            90 91 92 93 94 95 96 97 98 99)
    };
}

static LEAVES: [Leaf; 100] = hundred!(leaf, Leaf);
static MIDS: [Mid; 100] = hundred!(mid, Mid);

/// `bench --rss`: the tracer's peak memory while 1M allocations across 10k stacks are
/// outstanding, with the default event ring (32 MiB), a 16 MiB and a 64 MiB one. Each run is its own
/// process (`bench-rss-one`), so each peak is its own.
pub fn rss_bench(blocks: u64) -> Result<i32, Error> {
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("own executable: {e}"))?;
    crate::tell!(
        "tracer memory with {blocks} allocations outstanding (malloc(64) across 10,000 stacks):"
    );
    crate::tell!(
        "  {:>8} {:>14} {:>9} {:>13} {:>13} {:>10}",
        "ring MiB",
        "blocks held",
        "stacks",
        "peak RSS MiB",
        "anon MiB",
        "ring+files"
    );
    for ring in [crate::cli::DEFAULT_RING_MB, 16, 64] {
        let status = std::process::Command::new(&exe)
            .args(["bench", "--rss-one", &blocks.to_string(), &ring.to_string()])
            .status()
            .map_err(|e| anyhow::anyhow!("{}: {e}", exe.display()))?;
        if !status.success() {
            return Err(anyhow::anyhow!("the run with a {ring} MiB ring failed").into());
        }
    }
    crate::tell!("  goal: 150 MB (143.1 MiB) peak RSS");
    Ok(0)
}

/// One row of [`rss_bench`], in a fresh process.
pub fn rss_one(blocks: u64, ring_mb: u32) -> Result<i32, Error> {
    crate::probes::detach_in_foreground();
    // The peak's make-up: anonymous memory (the ledger, the analysis) and mapped kernel buffers
    // (the event ring) with the binary, sampled every 50 ms while the run lasts.
    let done = AtomicBool::new(false);
    let (anon, mapped) = (AtomicU64::new(0), AtomicU64::new(0));
    let (r, _, _) = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                anon.fetch_max(
                    crate::procfs::own_status_bytes("RssAnon"),
                    Ordering::Relaxed,
                );
                mapped.fetch_max(
                    crate::procfs::own_status_bytes("RssFile")
                        + crate::procfs::own_status_bytes("RssShmem"),
                    Ordering::Relaxed,
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = traced(&["bench-hold", &blocks.to_string()], "full", ring_mb);
        done.store(true, Ordering::Relaxed);
        out
    })?;
    let stacks = r
        .map_fill
        .iter()
        .find(|f| f.name == "distinct stacks")
        .map_or(0, |f| f.peak.unwrap_or(f.used));
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    crate::tell!(
        "  {:>8} {:>14} {:>9} {:>13.1} {:>13.1} {:>10.1}",
        ring_mb,
        r.totals.heap.blocks,
        stacks,
        mib(crate::procfs::own_status_bytes("VmHWM")),
        mib(anon.load(Ordering::Relaxed)),
        mib(mapped.load(Ordering::Relaxed)),
    );
    Ok(0)
}
