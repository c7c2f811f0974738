//! `run --ui`: the explorer API served while a leaking fixture runs, read over a real socket.

use std::time::{Duration, Instant};

use tests::fixture::{self, http_get};

#[test]
fn the_api_serves_the_leak_while_the_command_runs() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build("patterns");
    let mut cmd = fixture::leaktracer_cmd();
    cmd.args([
        "run",
        "--ui=127.0.0.1:0",
        "--no-store",
        "--sample",
        "0.1",
        "-o",
        "/dev/null",
        "--",
    ])
    .arg(&bin)
    .args(["40", "150"]);
    let (mut tracer, url, _rest) = fixture::spawn_explorer(cmd);
    let site = format!(
        "activations (patterns.c:{})",
        crate::line_of("patterns", "return touch(malloc(n), n)")
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let leak = loop {
        let (status, body) = http_get(&url, "/api/v1/stacks?kind=heap&verdict=leak");
        // Until the session publishes its first report (as its loop starts): 503, said so.
        if status == "HTTP/1.1 503 Service Unavailable" {
            assert_eq!(body, r#"{"error":"no report yet"}"#);
        } else {
            assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let stacks = v.as_array().unwrap();
            if let Some(s) = stacks.iter().find(|s| s["site"] == site.as_str()) {
                break s.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leak at {site} in time: {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(leak["slope"].as_f64().unwrap() > 0.0, "{leak}");
    // Health: how full the tables are, while the one fixture process runs (ingest counts them
    // once a second: polled until the stacks seen so far are in).
    let fill = |name: &str| {
        let (_, health) = http_get(&url, "/api/v1/health");
        let health: serde_json::Value = serde_json::from_str(&health).unwrap();
        health["map_fill"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {health}"))
            .clone()
    };
    let traced = fill("traced processes");
    assert_eq!(
        (traced["used"].as_u64(), traced["capacity"].as_u64()),
        (Some(1), Some(16384))
    );
    loop {
        let stacks = fill("distinct stacks");
        if stacks["used"].as_u64().unwrap() >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{stacks}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(fill("sampled blocks")["used"], 0); // --heap full: nothing is sampled
    let (status, detail) = http_get(
        &url,
        &format!("/api/v1/stacks/{}", leak["id"].as_str().unwrap()),
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    let detail: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(detail["frames"][0]["function"], "activations");
    // Its sampled series rises: the floor leak under the spikes.
    let (status, series) = http_get(
        &url,
        &format!("/api/v1/stacks/{}/series", leak["id"].as_str().unwrap()),
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    let series: serde_json::Value = serde_json::from_str(&series).unwrap();
    assert_eq!(series["per"], "second");
    let points = series["points"].as_array().unwrap();
    assert!(points.len() >= 4, "{series}");
    let min = |p: &serde_json::Value| p["min"].as_u64().unwrap();
    assert!(min(points.last().unwrap()) > min(&points[0]), "{series}");
    let (_, metrics) = http_get(&url, "/metrics");
    assert!(
        metrics.contains("leaktracer_stack_outstanding_bytes{"),
        "{metrics}"
    );
    let (status, body) = http_get(&url, "/api/v1/stacks?limit=0");
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
    assert!(body.contains("limit must be between 1 and 10000"));
    assert_eq!(tracer.wait().unwrap().code(), Some(0));
}

#[test]
fn bad_ui_arguments_stop_before_the_command_runs() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let marker = fixture::target_dir().join("ui-must-not-exist");
    let _ = std::fs::remove_file(&marker);
    for (args, msg) in [
        (
            &["--ui=nonsense"][..],
            "is not an address like 127.0.0.1:7878",
        ),
        (
            &["--ui=0.0.0.0:0", "--ui-token", "short"][..],
            "at least 16 printable characters",
        ),
    ] {
        let o = fixture::leaktracer_cmd()
            .arg("run")
            .args(args)
            .args(["--no-store", "--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
        assert!(!marker.exists(), "the command ran");
    }
}
