//! The explorer page in a real browser: Debian's Chromium, driven by Playwright
//! (web/tests/explorer.mjs), against `leaktracer run --ui --keep-serving` tracing a leaking
//! program whose source path and command line carry HTML. The script checks the leak row, live
//! updates, the chart, the flamegraph, the stack detail, the diff, and that nothing executes.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tests::fixture;

/// A file name that is markup: rendered as HTML it would run a script.
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

fn web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../web")
}

/// patterns.c compiled inside a directory named [`HOSTILE`]: its DWARF file paths, its command
/// line and its module path all carry the markup.
fn hostile_fixture() -> PathBuf {
    let dir = fixture::target_dir().join("xss").join(HOSTILE);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("patterns.c");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/patterns.c"),
        &src,
    )
    .unwrap();
    let out = dir.join("patterns");
    let status = Command::new("gcc")
        .args(fixture::CFLAGS)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .current_dir(&dir)
        .status()
        .expect("gcc");
    assert!(status.success(), "compiling the hostile fixture");
    out
}

#[test]
fn the_page_shows_the_leak_live_in_chromium_and_renders_hostile_strings_as_text() {
    if !fixture::bpf_available() {
        return;
    }
    for (need, what) in [
        (Path::new("/usr/bin/chromium").to_path_buf(), "Chromium"),
        (
            web_dir().join("node_modules/playwright-core"),
            "playwright-core",
        ),
    ] {
        assert!(
            need.exists(),
            "{what} is missing ({}): run scripts/setup.sh",
            need.display()
        );
    }
    let _x = fixture::exclusive();
    let bin = hostile_fixture();
    let scratch = fixture::target_dir().join("explorer");
    let shots = scratch.join("screenshots");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&shots).unwrap();
    let store = scratch.join("history.db");
    let mut cmd = fixture::leaktracer_cmd();
    cmd.args(["run", "--ui=127.0.0.1:0", "--keep-serving", "--store"])
        .arg(&store)
        .args([
            "--snapshot",
            "1",
            "--sample",
            "0.2",
            "-o",
            "/dev/null",
            "--",
        ])
        .arg(&bin)
        // 100 rounds of 150 ms: long enough for the page to see it live.
        .args(["100", "150"]);
    let (tracer, url, rest) = fixture::spawn_explorer(cmd);
    let site = format!(
        "activations (patterns.c:{})",
        crate::line_of("patterns", "return touch(malloc(n), n)")
    );
    let expect = serde_json::json!({
        "function": "activations",
        "site": site,
        "hostile": HOSTILE,
    });
    let browser = Command::new("node")
        .arg("tests/explorer.mjs")
        .arg(&url)
        .arg(&shots)
        .arg(expect.to_string())
        .current_dir(web_dir())
        .output()
        .expect("node tests/explorer.mjs");
    // The run is over (the script waited for the final report): stop serving.
    let (status, tracer_log) = fixture::interrupt(tracer, rest);
    let out = String::from_utf8_lossy(&browser.stdout);
    let err = String::from_utf8_lossy(&browser.stderr);
    assert!(
        browser.status.success(),
        "the browser checks failed (screenshots in {}):\n{out}\n{err}\nleaktracer:\n{tracer_log}",
        shots.display()
    );
    assert!(out.contains("ok end: still nothing executed"), "{out}");
    assert_eq!(status.code(), Some(0), "{tracer_log}");
    assert!(
        tracer_log.contains("the explorer keeps serving its final report until Ctrl-C"),
        "{tracer_log}"
    );
    for shot in ["1-live.png", "2-detail.png", "3-ended-diff.png"] {
        let len = std::fs::metadata(shots.join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 10_000, "screenshot {shot}: {len} bytes");
    }
}
