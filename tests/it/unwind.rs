//! Stacks of programs built the way users build them: `-O2`, inlined, with and without frame
//! pointers, C and C++ (tracer/src/probes/frames.rs decides how each executable's heap stacks are
//! taken; `--unwind`).

use tests::{fixture, report::frame_fn};

use crate::line_of;

/// A leaking stack: bytes, blocks, and its frames from the innermost as (function, line).
type Leak = (u64, u64, Vec<(String, u64)>);

/// The heap stacks of `inlined.c` built with `flags`, traced with `lt_flags`: for each leaking
/// helper, its bytes and blocks, and the stack's frames from the innermost as (function, line).
fn inlined_stacks(variant: &str, flags: &[&str], lt_flags: &[&str]) -> Vec<Leak> {
    let bin = fixture::build_variant(variant, "inlined", flags);
    let t = fixture::trace(lt_flags, &[bin.to_str().expect("utf-8 path"), "100"]).expect("run");
    assert_eq!(t.output.status.code(), Some(0));
    let r = t.last();
    ["new_buffer", "new_job"]
        .iter()
        .map(|innermost| {
            let s = r
                .stacks()
                .iter()
                .find(|s| s["kind"] == "heap" && frame_fn(s, 0) == Some(innermost))
                .unwrap_or_else(|| panic!("no heap stack from {innermost}: {:?}", r.stacks()));
            let frames = s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|f| {
                    (
                        f["function"].as_str().unwrap_or("?").to_string(),
                        f["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            (
                s["bytes"].as_u64().unwrap(),
                s["blocks"].as_u64().unwrap(),
                frames,
            )
        })
        .collect()
}

/// What `inlined.c`'s two leaks must show: bytes, blocks, and their first frames at their lines.
fn expected_inlined() -> Vec<Leak> {
    let at = |f: &str, needle: &str| (f.to_string(), line_of("inlined", needle));
    vec![
        (
            409_600,
            100,
            vec![
                at("new_buffer", "malloc(n)"),
                at("new_job", "new_buffer(n)"),
                at("run_jobs", "new_job(4096)"),
                at("main", "run_jobs(n)"),
            ],
        ),
        (
            1600,
            100,
            vec![
                at("new_job", "calloc(1"),
                at("run_jobs", "new_job(4096)"),
                at("main", "run_jobs(n)"),
            ],
        ),
    ]
}

/// The stacks' first frames (as many as expected), beside bytes and blocks.
fn heads(got: Vec<Leak>, want: &[Leak]) -> Vec<Leak> {
    got.into_iter()
        .zip(want)
        .map(|((b, n, frames), (_, _, w))| (b, n, frames.into_iter().take(w.len()).collect()))
        .collect()
}

/// Code the compiler inlined keeps its own frames. At -O2 both allocating helpers of `inlined.c`
/// live inside `run_jobs`; each stack still names them at their own lines, innermost first, with
/// exact bytes (frame pointers kept: the kernel's walk).
#[test]
fn inlined_functions_are_frames_of_their_own() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let want = expected_inlined();
    let got = inlined_stacks("inlined-O2", &["-O2"], &[]);
    assert_eq!(heads(got, &want), want);
}

/// The same program built as distributions and users build it, without frame pointers: the
/// stacks are copied and unwound with the call-frame information, to `main` and beyond, at the
/// same lines. The frame-pointer walk (`--unwind fp`) of the same binary loses `main`: the test
/// of what `auto` chose.
#[test]
fn stacks_without_frame_pointers_reach_main() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let want = expected_inlined();
    let flags = ["-O2", "-fomit-frame-pointer"];
    let got = inlined_stacks("inlined-O2-nofp", &flags, &[]);
    assert_eq!(heads(got, &want), want);
    let walked = inlined_stacks("inlined-O2-nofp", &flags, &["--unwind", "fp"]);
    for (_, _, frames) in walked {
        assert!(
            !frames.iter().any(|(f, _)| f == "main"),
            "the walk reached main without frame pointers: {frames:?}"
        );
    }
}

/// A C++ service built with plain `g++ -O2 -g` whose image cache is never evicted: the leak is
/// the pixels' `std::vector` of each cached image, named at the constructor's line, under
/// `render` and `main` at theirs, with exact bytes; `check` fails on it. The bounded cache passes.
#[test]
fn a_cplusplus_cache_leak_is_named_at_its_line() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build_cxx("thumbnailer-O2", "thumbnailer", &["-O2", "-g"]);
    let bin = bin.to_str().expect("utf-8 path");
    cache_leak_at_its_line(bin);
    let (o, r) = check_thumbnailer(bin, &["60", "bounded"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        r.stacks().iter().all(|s| s["verdict"]["verdict"] != "leak"),
        "{:?}",
        r.stacks()
    );
}

/// The same service built with frame pointers (`-fno-omit-frame-pointer`): libstdc++'s `operator
/// new` keeps none, so the walk alone goes from it to `render`'s caller and the constructor's
/// line is lost; the leaf words put it back, at the same lines and bytes.
#[test]
fn a_cplusplus_leak_built_with_frame_pointers_keeps_the_line_inside_operator_new() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let flags = ["-O2", "-g", "-fno-omit-frame-pointer"];
    let bin = fixture::build_cxx("thumbnailer-O2-fp", "thumbnailer", &flags);
    cache_leak_at_its_line(bin.to_str().expect("utf-8 path"));
}

fn check_thumbnailer(bin: &str, args: &[&str]) -> (std::process::Output, tests::report::Report) {
    crate::check::check_report("thumbnailer", &["--no-store"], &[&[bin], args].concat())
}

/// `check` of 60 renders of `bin` fails at the constructor's line with the 60 vectors' bytes, and
/// the stack goes on through `render` and `main` at their lines.
fn cache_leak_at_its_line(bin: &str) {
    let line = |needle: &str| line_of("thumbnailer.cpp", needle);
    let (o, r) = check_thumbnailer(bin, &["60"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{out}");
    let site = format!(
        "Image::Image(unsigned long) (thumbnailer.cpp:{})",
        line("pixels(n)")
    );
    assert!(out.contains("LEAK heap") && out.contains(&site), "{out}");
    let pixels = r
        .stacks()
        .iter()
        .find(|s| s["kind"] == "heap" && s["bytes"].as_u64() == Some(60 * 4096))
        .unwrap_or_else(|| panic!("no stack of 60 × 4096 bytes: {:?}", r.stacks()));
    assert_eq!(pixels["blocks"].as_u64(), Some(60));
    assert_eq!(pixels["verdict"]["verdict"], "leak");
    let frames: Vec<(&str, u64)> = pixels["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("?"),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let from = frames
        .iter()
        .position(|(f, _)| f.starts_with("Image::Image"))
        .unwrap_or_else(|| panic!("no constructor frame: {frames:?}"));
    assert_eq!(
        frames[from..from + 3],
        [
            ("Image::Image(unsigned long)", line("pixels(n)")),
            ("render", line("new Image(n)")),
            ("main", line("cache.push_back(render(4096))")),
        ]
    );
}
