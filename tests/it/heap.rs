//! Heap-level probes: every malloc-family function, exact bytes and blocks per leaking function.

use tests::{
    fixture,
    report::{frame_fn, frame_index},
};

use crate::line_of;

#[test]
fn every_heap_allocator_is_accounted_per_call_site() {
    let Some(t) = fixture::trace_fixture("heap", &[], &[]) else {
        return;
    };
    assert_eq!(t.output.status.code(), Some(0), "exit status propagated");
    let r = t.last();
    let site = |f: &str| r.site("heap", 0, f);
    assert_eq!(site("leak_malloc"), (10_000, 10));
    assert_eq!(site("leak_calloc"), (5 * 91, 5));
    assert_eq!(
        site("grow"),
        (5000, 1),
        "grow → realloc chain: the last realloc owns the block"
    );
    assert_eq!(site("leak_realloc_shrink"), (100, 1));
    assert_eq!(site("leak_realloc_move"), (200_000, 1));
    assert_eq!(site("leak_realloc_null"), (777, 1));
    assert_eq!(site("leak_reallocarray"), (200, 1));
    assert_eq!(site("leak_posix_memalign"), (3 * 4096, 3));
    assert_eq!(site("leak_aligned_alloc"), (1024, 1));
    assert_eq!(site("leak_memalign"), (512, 1));
    assert_eq!(site("leak_valloc"), (3000, 1));
    assert_eq!(
        site("leak_pvalloc"),
        (8192, 1),
        "pvalloc rounds up to a page"
    );
    for control in [
        "control_malloc",
        "control_calloc",
        "control_realloc_zero",
        "failures",
    ] {
        assert_eq!(
            r.sum(|s| s["kind"] == "heap" && frame_fn(s, 0) == Some(control)),
            (0, 0),
            "{control}"
        );
    }
    // The leaking frame carries the exact source line of the call.
    let leak = r
        .stacks()
        .iter()
        .find(|s| frame_fn(s, 0) == Some("leak_malloc"))
        .unwrap();
    assert_eq!(
        leak["frames"][0]["line"],
        line_of("heap", "void leak_malloc(")
    );
    assert!(
        leak["frames"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("heap.c")
    );
    assert_eq!(frame_fn(leak, 1), Some("main"));
    // Nothing this fixture does is a mismatch: every free matched a block.
    assert_eq!(r.losses()["unmatched_frees"], 0);
    assert_eq!(r.losses()["ringbuf_full"], 0);
}

#[test]
fn eight_threads_allocating_at_once_are_exact() {
    let Some(t) = fixture::trace_fixture("threads", &[], &[]) else {
        return;
    };
    let r = t.last();
    assert_eq!(r.site("heap", 0, "thread_leak"), (8 * 100 * 256, 800));
    assert_eq!(r.site("heap", 0, "thread_control"), (0, 0));
    assert_eq!(r.losses()["ringbuf_full"], 0);
    assert_eq!(r.losses()["pending_full"], 0);
    // As each thread exits, glibc frees its cache of freed blocks through free's address: the
    // cache itself (made inside the allocator, never seen) at least. Those are the allocator's
    // own frees, not frees of blocks the tracer missed.
    assert_eq!(r.losses()["unmatched_frees"], 0);
    let at_exit = r.losses()["thread_exit_frees"].as_u64().unwrap();
    assert!(at_exit >= 8, "{}", r.losses());
}

/// A thread's heap entry is resident in its CPU's slot while it runs and goes home when it is
/// switched out: threads that move to another CPU between allocations find their entry whole
/// there. The entry holds the thread's last stack, against which a record names the frames it
/// shares: a stale one would put blocks under the wrong caller.
#[test]
fn threads_moving_between_cpus_keep_their_entries() {
    let Some(t) = fixture::trace_fixture("migrate", &[], &[]) else {
        return;
    };
    let r = t.last();
    assert_eq!(
        r.site("heap", 0, "leak_here"),
        (4 * 100 * (100 + 300), 4 * 200)
    );
    assert_eq!(r.site("heap", 1, "from_even"), (4 * 100 * 100, 4 * 100));
    assert_eq!(r.site("heap", 1, "from_odd"), (4 * 100 * 300, 4 * 100));
    assert_eq!(r.site("heap", 0, "from_even"), (0, 0));
    assert_eq!(r.site("heap", 0, "from_odd"), (0, 0));
    for lost in ["ringbuf_full", "pending_full", "return_without_entry"] {
        assert_eq!(r.losses()[lost], 0, "{lost}");
    }
}

/// Records that wrap around the end of the kernel's ring are read whole: ~4 MB of records through
/// a 1 MiB ring, paced so that nothing is lost, and every byte accounted.
#[test]
fn records_wrapping_around_a_small_ring_are_read_whole() {
    let Some(t) = fixture::trace_fixture("wrap", &["--ring-mb", "1"], &[]) else {
        return;
    };
    let r = t.last();
    assert_eq!(r.site("heap", 0, "wrap_leak"), (40 * 100 * 48, 4000));
    assert_eq!(r.site("heap", 0, "wrap_control"), (0, 0));
    assert_eq!(r.losses()["ringbuf_full"], 0);
    assert_eq!(r.losses()["undecodable"], 0);
    assert_eq!(r.losses()["unmatched_frees"], 0);
}

/// A thread's frees travel with its next allocation record; a thread that frees and then waits
/// sends them when it is switched out. Reports taken while it sleeps show its frees applied.
#[test]
fn frees_of_a_thread_that_then_waits_are_seen_while_it_waits() {
    let Some(t) = fixture::trace_fixture("free_then_wait", &["--interval", "0.25"], &[]) else {
        return;
    };
    let (last, earlier) = t.reports.split_last().expect("reports");
    let waiting: Vec<_> = earlier
        .iter()
        .filter(|r| r.site("heap", 0, "alloc_kept") == (2800, 4))
        .collect();
    assert!(
        waiting.len() >= 2,
        "{} of {} reports taken while it waits",
        waiting.len(),
        earlier.len()
    );
    for r in waiting {
        assert_eq!(r.site("heap", 0, "alloc_then_freed"), (0, 0));
    }
    assert_eq!(last.site("heap", 0, "alloc_then_freed"), (0, 0));
    assert_eq!(last.site("heap", 0, "alloc_kept"), (2800, 4));
    assert_eq!(last.losses()["unmatched_frees"], 0);
}

/// Traces fixture `name`, which must exit 0, with `--collapsed FILE`: the run and FILE's text.
fn trace_collapsed(name: &str) -> Option<(fixture::Traced, String)> {
    let file = fixture::target_dir().join(format!("{name}.collapsed"));
    let _ = std::fs::remove_file(&file);
    let t = fixture::trace_fixture(name, &["--collapsed", file.to_str().unwrap()], &[])?;
    assert_eq!(t.output.status.code(), Some(0));
    let text = std::fs::read_to_string(&file).expect("collapsed stacks written");
    Some((t, text))
}

/// `--collapsed FILE`: flamegraph input, kind first, frames outermost first, exact bytes.
#[test]
fn collapsed_stacks_carry_the_exact_bytes() {
    let Some((_, text)) = trace_collapsed("heap") else {
        return;
    };
    let line = |suffix: &str| {
        text.lines()
            .find(|l| l.starts_with("heap;") && l.ends_with(suffix))
            .unwrap_or_else(|| panic!("no heap line ending {suffix:?} in:\n{text}"))
    };
    line(";main;leak_malloc 10000");
    line(";main;leak_calloc 455");
    assert!(text.lines().all(|l| {
        l.rsplit_once(' ')
            .is_some_and(|(_, n)| n.parse::<u64>().is_ok())
    }));
}

/// Deep and sparse stacks are walked whole: 41 recursive frames of 700 bytes (past the copies a
/// walk makes: the rest frame by frame), and a 6000-byte frame, right after 2000 allocations from
/// a shallow stack shrank the thread's copies.
#[test]
fn deep_and_sparse_stacks_are_walked_whole() {
    let Some((t, text)) = trace_collapsed("deep") else {
        return;
    };
    let heap: Vec<&str> = text.lines().filter(|l| l.starts_with("heap;")).collect();
    let deep = format!(";main;{}leak_deep 999", "rec;".repeat(41));
    assert!(
        heap.iter().any(|l| l.ends_with(&deep)),
        "no line ending {deep:?} in:\n{text}"
    );
    for suffix in [
        ";main;big_frame;leak_past_big_frame 4444",
        ";main;leak_shallow 100",
    ] {
        assert!(
            heap.iter().any(|l| l.ends_with(suffix)),
            "no line ending {suffix:?} in:\n{text}"
        );
    }
    let r = t.last();
    assert_eq!(r.site("heap", 0, "leak_deep"), (999, 3));
    assert_eq!(r.site("heap", 0, "leak_past_big_frame"), (8888, 2));
    assert_eq!(r.site("heap", 0, "leak_shallow"), (200, 2));
    assert_eq!(r.losses()["unmatched_frees"], 0);
}

/// Heap records lost to a full ring never leave a made-up stack: a record sends only the frames
/// that differ from its thread's previous record, so a lost record must not be the base of the
/// next. Every stack of the burst is one of its two true shapes, whatever was lost.
#[test]
fn records_lost_to_a_full_ring_leave_no_made_up_stack() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    // A reader that copies the ring every 300 ms: the 1 MiB ring fills between two copies.
    let bin = fixture::build("overflow");
    let slow = [("LEAKTRACER_RING_POLL_MS", "300")];
    let t = fixture::trace_with_env(&["--ring-mb", "1"], &[bin.to_str().unwrap()], &slow)
        .expect("leaktracer run");
    assert_eq!(t.output.status.code(), Some(0));
    let r = t.last();
    let lost = r.losses()["ringbuf_full"].as_u64().unwrap();
    assert!(lost > 0, "the 1 MiB ring overflowed: {lost} records lost");
    assert_eq!(r.losses()["undecodable"], 0);
    assert_eq!(r.site("heap", 0, "leak_after"), (3 * 4321, 3));
    let functions = |s: &serde_json::Value| -> Vec<String> {
        s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let mut seen = 0;
    let burst = |s: &serde_json::Value| s["kind"] == "heap" && frame_index(s, "burst").is_some();
    for s in r.stacks().iter().filter(|s| burst(s)) {
        let f = functions(s);
        let want: Vec<&str> = match f[0].as_str() {
            "leaf_x" => [&["leaf_x"][..], &["rec"; 10], &["burst", "main"]].concat(),
            "leaf_y" => [&["leaf_y"][..], &["rec"; 20], &["burst", "main"]].concat(),
            _ => vec!["a leaf of burst"],
        };
        assert!(f.len() > want.len() && f[..want.len()] == want, "{f:?}");
        seen += 1;
    }
    assert!(seen > 0, "the burst's stacks are there");
    // Every block is kept: each one is either in the report or in the losses.
    let (_, blocks) = r.sum(burst);
    assert!(
        blocks <= 450_000 && blocks + lost >= 450_000,
        "{blocks} blocks seen, {lost} records lost"
    );
}

#[test]
fn sampled_heap_estimates_kept_bytes_and_matches_frees_of_recorded_blocks() {
    let Some(t) = fixture::trace_fixture("sampled", &["--heap", "sampled"], &[]) else {
        return;
    };
    let r = t.last();
    assert_eq!(r.0["heap"]["mode"], "sampled");
    assert_eq!(r.0["heap"]["sample_bytes"], 512 * 1024);
    // Far above the interval: recorded surely, and counted as itself.
    assert_eq!(r.site("heap", 0, "keep_big"), (16 << 20, 1));
    // 4000 × 64 KiB (250 MiB): about 470 recorded, each standing for 557,738 bytes. The
    // estimate's relative deviation is 4.3%; ±25% is almost 6 of them.
    let (bytes, blocks) = r.site("heap", 0, "keep_blocks");
    let want = 4000.0 * 65536.0;
    assert!(
        (bytes as f64 - want).abs() < 0.25 * want,
        "{bytes} bytes from {blocks} recorded blocks, want about {want}"
    );
    assert_eq!(
        bytes % 557_738,
        0,
        "each recorded block counts 557,738: {bytes}"
    );
    assert!((300..700).contains(&blocks), "{blocks}");
    // Every recorded block of churn() was freed, and only recorded blocks' frees were sent.
    assert_eq!(r.site("heap", 0, "churn"), (0, 0));
    assert_eq!(r.losses()["unmatched_frees"], 0);
    assert_eq!(r.losses()["sampled_full"], 0);
}

/// `--heap-after`: the heap functions go in after the delay, or at the step. The fixture's blocks
/// from before are not seen and its frees of them count as unmatched; the blocks after are exact.
/// With steps nothing waits but the tracer's hold of the thread entering step 3: the blocks right
/// after it are all seen.
#[test]
fn heap_probes_put_in_late_see_exactly_what_comes_after() {
    let Some(r) = trace_late(&["--heap-after", "0.3"], &[]) else {
        return;
    };
    assert_eq!(r.0["heap"]["after"]["seconds"], 0.3);
    let libc = r.library("libc.so.6");
    assert!(libc["timing"]["after_s"].as_f64().unwrap() >= 0.3, "{libc}");
    let Some(r) = trace_late(
        &["--step-symbol", "late_step", "--heap-after", "3"],
        &["steps"],
    ) else {
        return;
    };
    assert_eq!(r.0["heap"]["after"]["steps"], 3);
    assert_eq!(r.0["steps"], 3);
}

/// Traces fixture `late` with `extra`; without `args` the fixture waits on its stdin (the
/// tracer's) for a line, sent once the log says libc's probes are in. Checks what every trigger
/// must give.
fn trace_late(extra: &[&str], args: &[&str]) -> Option<tests::report::Report> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    if !fixture::bpf_available() {
        return None;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build("late");
    let out = fixture::target_dir().join("late.json");
    let mut tracer = fixture::leaktracer_cmd()
        .args(["-v", "run", "--json", "--top", "1000", "-o"])
        .arg(&out)
        .args(extra)
        .arg("--")
        .arg(&bin)
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(tracer.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = String::new();
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        log.push_str(&line);
        log.push('\n');
        if line.contains("heap probes in") && line.contains("libc.so") {
            break;
        }
    }
    // Whether or not the probes went in, the fixture is let go, so that the tracer ends.
    let _ = tracer.stdin.take().unwrap().write_all(b"go\n");
    let status = tracer.wait().unwrap();
    reader.join().unwrap();
    log.extend(rx.try_iter().map(|l| l + "\n"));
    assert!(log.contains("heap probes in"), "{log}");
    assert_eq!(status.code(), Some(0), "{log}");
    let text = std::fs::read_to_string(&out).unwrap();
    let r = tests::report::Report::parse(text.lines().last().unwrap()).unwrap();
    assert_eq!(r.site("heap", 0, "after"), (50 * 3000, 50));
    assert_eq!(r.site("heap", 0, "before"), (0, 0));
    assert_eq!(r.losses()["unmatched_frees"], 20);
    let libc = r.library("libc.so.6");
    assert_eq!(libc["timing"]["when"], "heap_after", "{libc}");
    Some(r)
}
