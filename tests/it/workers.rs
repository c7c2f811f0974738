//! A training job's DataLoader workers, forked by the job as PyTorch's users run them: a leak of
//! a worker's is that worker's, named at its line, while the pages it fills are told apart from
//! it.

use serde_json::Value;
use tests::{fixture, report::frame_index};

use crate::{
    python::{line, script},
    pytorch::{check_torch_at, line_of},
};

/// A Dataset that keeps every sample its two workers decode (`worker_cache.py`): `check` fails
/// first on each worker's heap, at the line that keeps, each block exactly what numpy says a
/// sample's pixels hold (beside them, at times, the kept arrays' shapes and the list's array).
/// The workers' brk heaps grow faster still, at the next line (whose freed buffers move their
/// tops): pages under the heap, not a second leak at a wrong line.
#[test]
fn samples_kept_by_dataloader_workers_fail_the_check_at_the_keeping_line() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let path = script("worker_cache");
    let (o, r) = check_torch_at("worker-cache", &path, &[], &[], &["12"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{out}");
    let said: Value = out
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("{out}"));
    let pixel_bytes = said["pixel_bytes"].as_u64().unwrap();
    let (keeps, converts) = (
        line("worker_cache", "LEAK-SITE"),
        line("worker_cache", "# CONVERT"),
    );
    let root = r.root_pid();
    let python = r.processes().iter().filter(|p| {
        p["ppid"] == root
            && p["command"]
                .as_str()
                .is_some_and(|c| c.contains("worker_cache"))
    });
    let mut workers: Vec<u64> = python.map(|p| p["pid"].as_u64().unwrap()).collect();
    workers.sort_unstable();
    assert_eq!(workers.len(), 2, "{:?}", r.processes());
    let leaks: Vec<&str> = out
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("LEAK"))
        .collect();
    let mut named: Vec<u64> = leaks
        .iter()
        .take(2)
        .map(|leak| {
            assert!(leak.starts_with("LEAK heap"), "{out}");
            assert!(
                leak.ends_with(&format!("(worker_cache.py:{keeps})")),
                "{out}"
            );
            let pid = leak.split("pid ").nth(1).and_then(|p| p.split(':').next());
            pid.and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{out}"))
        })
        .collect();
    named.sort_unstable();
    assert_eq!(named, workers, "the first two leaks, one per worker: {out}");
    // The malloc family, engaged for each worker: libc listed for each, each of its functions
    // once as probed.
    let libraries = r.0["libraries"].as_array().unwrap().iter();
    let libc = libraries.filter(|l| l["roles"][0] == "libc" && l["timing"]["when"] == "engaged");
    let mut engaged: Vec<u64> = libc.map(|l| l["pid"].as_u64().unwrap()).collect();
    // (Listed again where it is traced again.)
    engaged.sort_unstable();
    engaged.dedup();
    // Each worker's; the main process's too in some runs (about one in eight), where its brk
    // heap's top rose under the backward pass beyond what its tensors explain: asked for as
    // such, and a cost, not a leak (the first two leaks are the workers').
    let (mine, others): (Vec<u64>, Vec<u64>) =
        engaged.iter().copied().partition(|p| workers.contains(p));
    assert_eq!(mine, workers, "{}", r.0["libraries"]);
    let main = r.processes().iter().find(|p| p["pid"] == root);
    let main_asked = main.and_then(|p| p["heap_asked"].as_str());
    for pid in others {
        assert_eq!(
            (pid, main_asked),
            (root, Some("beyond_tensors")),
            "{}",
            r.0["libraries"]
        );
    }
    let mut probed = std::collections::HashSet::new();
    for p in r.0["probes"].as_array().unwrap() {
        let at = (&p["function"], &p["library"], &p["offset"]);
        assert!(probed.insert(at), "listed twice: {p}");
    }
    let verdict = |s: &Value| {
        s["verdict"]["verdict"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    };
    let at = |pid: u64, kind: &str, line: u64| -> Vec<&Value> {
        let own = r
            .stacks()
            .iter()
            .filter(|s| s["pid"] == pid && s["kind"] == kind);
        own.filter(|s| line_of(s, "worker_cache") == Some(line))
            .collect()
    };
    for &w in &workers {
        let mut kept = at(w, "heap", keeps);
        kept.sort_by_key(|s| std::cmp::Reverse(s["bytes"].as_u64()));
        let (pixels, shapes) = kept.split_first().unwrap_or_else(|| panic!("{out}"));
        let (bytes, blocks) = (pixels["bytes"].as_u64(), pixels["blocks"].as_u64());
        let blocks = blocks
            .filter(|&b| b >= 50)
            .unwrap_or_else(|| panic!("{pixels}"));
        assert_eq!(bytes, Some(blocks * pixel_bytes), "{pixels}");
        assert_eq!(verdict(pixels), "leak", "{pixels}");
        for s in shapes {
            let blocks = s["blocks"].as_u64().unwrap_or_else(|| panic!("{s}"));
            if frame_index(s, "list_resize").is_some() {
                // The keeping list's own array, when it grew while the malloc family was
                // traced: one block of a pointer for each sample kept, at least those counted.
                let bytes = s["bytes"].as_u64().unwrap_or_else(|| panic!("{s}"));
                assert_eq!(blocks, 1, "{s}");
                assert!(
                    bytes % 8 == 0 && bytes / 8 >= pixels["blocks"].as_u64().unwrap(),
                    "{s}"
                );
                continue;
            }
            // A kept array's dims and strides, one block of 2 × 3 × 8 bytes: numpy takes it
            // from a cache of freed ones, and from malloc at this line only when it is empty.
            assert_eq!(s["bytes"].as_u64(), Some(blocks * 48), "{s}");
        }
        // Grown at the line whose freed buffers moved the heap's top (the next one, in every
        // run seen), or at the keeping line: under the heap either way, or, where the worker
        // was slow enough (a loaded machine) that its top took one step in the run, a filled
        // cache by its own series: never a leak of its own.
        let grown: Vec<(Option<u64>, String)> = r
            .stacks()
            .iter()
            .filter(|s| s["pid"] == w && s["kind"] == "brk" && s["inherited"] == false)
            .filter(|s| s["bytes"].as_u64() > Some(32 << 20))
            .map(|s| (line_of(s, "worker_cache"), verdict(s)))
            .collect();
        let lines = [Some(keeps), Some(converts)];
        assert!(
            !grown.is_empty()
                && grown
                    .iter()
                    .all(|(l, v)| lines.contains(l) && (v == "under_heap" || v == "bounded_cache")),
            "{grown:?}"
        );
    }
    let page_leaks = r
        .stacks()
        .iter()
        .filter(|s| (s["kind"] == "brk" || s["kind"] == "mmap") && verdict(s) == "leak");
    assert_eq!(page_leaks.count(), 0, "{out}");
    let own_leaks = r
        .stacks()
        .iter()
        .filter(|s| s["pid"] == root && verdict(s) == "leak");
    assert_eq!(
        own_leaks.count(),
        0,
        "the job's own process keeps nothing: {out}"
    );
}
