//! The router without a socket (tower's oneshot), on reports from synthetic ledgers and a real
//! history file.

use std::sync::Arc;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tower::ServiceExt as _;

use super::*;
use crate::report::synthetic::{ledger_with, report_of};

fn state_with(published: Option<Published>, store: Option<PathBuf>) -> ApiState {
    let (_tx, live) = watch::channel(published.map(Arc::new));
    ApiState {
        live,
        store,
        token: None,
        web: Default::default(),
    }
}

fn timeline_of(report: &crate::report::Report) -> super::views::Timeline {
    let mut t = super::views::Timeline::default();
    t.record(report);
    t
}

fn live_state() -> ApiState {
    let (ledger, analysis) = ledger_with(5, 6);
    let report = report_of(&ledger, &analysis, 5);
    let timeline = timeline_of(&report);
    state_with(Some(Published::new(report, &analysis, &timeline)), None)
}

async fn get(state: ApiState, uri: &str) -> (StatusCode, String) {
    let res = router(state)
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 24)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn get_json(state: ApiState, uri: &str) -> (StatusCode, serde_json::Value) {
    let (status, body) = get(state, uri).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")),
    )
}

#[tokio::test]
async fn health_says_when_no_report_is_published_yet() {
    let (status, v) = get_json(state_with(None, None), "/api/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["live"], false);
    let (status, v) = get_json(state_with(None, None), "/api/v1/stacks").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["error"], "no report yet");
}

#[tokio::test]
async fn stacks_are_listed_filtered_and_detailed() {
    let (status, v) = get_json(live_state(), "/api/v1/stacks?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["kind"], "heap");
    assert_eq!(
        list[0]["bytes"],
        6 * 64,
        "one 64-byte block per sample round"
    );
    // 64 bytes more per sample is under the noise floor (a page): steady.
    assert_eq!(list[0]["verdict"], "steady");
    let (_, v) = get_json(live_state(), "/api/v1/stacks?kind=device").await;
    assert_eq!(v.as_array().unwrap().len(), 0);
    let (_, v) = get_json(live_state(), "/api/v1/stacks?verdict=leak").await;
    assert_eq!(v.as_array().unwrap().len(), 0);
    let (_, v) = get_json(live_state(), "/api/v1/stacks?verdict=steady&pid=1").await;
    assert_eq!(v.as_array().unwrap().len(), 5);
    // Every verdict a report can give is a filter (the explanations too), none of them here.
    for verdict in ["under_tensors", "under_heap", "under_objects", "imported"] {
        let url = format!("/api/v1/stacks?verdict={verdict}");
        let (status, v) = get_json(live_state(), &url).await;
        assert_eq!(
            (status, v.as_array().map(Vec::len)),
            (StatusCode::OK, Some(0))
        );
    }

    let id = list[1]["id"].as_str().unwrap().to_string();
    let (status, d) = get_json(live_state(), &format!("/api/v1/stacks/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(d["id"], id.as_str());
    assert_eq!(d["frames"].as_array().unwrap().len(), 3);
    assert_eq!(d["windows"].as_array().unwrap().len(), 4);
    let (status, e) = get_json(live_state(), "/api/v1/stacks/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(e["error"], "no such stack in the latest report");
}

#[tokio::test]
async fn malformed_parameters_are_400_with_a_message() {
    for (uri, needle) in [
        (
            "/api/v1/stacks?limit=0",
            "limit must be between 1 and 10000",
        ),
        ("/api/v1/stacks?limit=many", "limit"),
        ("/api/v1/stacks?kind=%3Cscript%3E", "unknown kind"),
        ("/api/v1/stacks?verdict=maybe", "verdict is one of"),
        ("/api/v1/diff?old=/etc/passwd&new=run:1", "stored snapshots"),
        ("/api/v1/diff?old=run:1", "new"),
    ] {
        let (status, v) = get_json(live_state(), uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        let msg = v["error"].as_str().unwrap();
        assert!(msg.contains(needle), "{uri}: {msg}");
    }
    let (status, v) = get_json(live_state(), "/api/v2/anything").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"], "no such endpoint");
}

#[tokio::test]
async fn processes_and_metrics_come_from_the_latest_report() {
    let (_, v) = get_json(live_state(), "/api/v1/processes").await;
    assert_eq!(v[0]["pid"], 1);
    assert_eq!(v[0]["command"], "bench");
    assert_eq!(v[0]["bytes"]["heap"], 5 * 6 * 64);
    let res = router(live_state())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "text/plain; version=0.0.4"
    );
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains(
        "leaktracer_outstanding_bytes{pid=\"1\",command=\"bench\",kind=\"heap\"} 1920\n"
    ));
}

#[tokio::test]
async fn runs_and_snapshots_come_from_the_history() {
    let (status, v) = get_json(live_state(), "/api/v1/runs").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"], "no history is kept (--no-store)");

    let dir = std::env::temp_dir().join(format!("leaktracer-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("h.db");
    let mut db = crate::store::Store::open(&path).unwrap();
    let run = db
        .begin_run(&crate::store::NewRun {
            mode: "run",
            command: "<img src=x onerror=alert(1)>".into(),
            root_pid: 9,
        })
        .unwrap();
    let (ledger, analysis) = ledger_with(3, 5);
    let mut r = report_of(&ledger, &analysis, 3);
    db.add_snapshot(run, crate::store::Reason::Periodic, &mut r)
        .unwrap();
    db.add_snapshot(run, crate::store::Reason::Exit, &mut r)
        .unwrap();
    drop(db);
    let state = || state_with(None, Some(path.clone()));
    let (_, v) = get_json(state(), "/api/v1/runs").await;
    assert_eq!(
        v[0]["command"], "<img src=x onerror=alert(1)>",
        "text, as it was"
    );
    assert_eq!(v[0]["snapshots"], 2);
    let (status, v) = get_json(state(), &format!("/api/v1/runs/{run}/snapshots")).await;
    assert_eq!(status, StatusCode::OK);
    let rows: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["seq"].as_i64(),
                s["reason"].as_str(),
                s["stacks"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (Some(0), Some("periodic"), Some(3)),
            (Some(1), Some("exit"), Some(3))
        ]
    );
    let (status, v) = get_json(state(), "/api/v1/runs/99/snapshots").await;
    assert_eq!(
        (status, v["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("no run 99"))
    );
    let (status, v) = get_json(state(), &format!("/api/v1/runs/{run}/snapshots/-1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (v["seq"].as_i64(), v["reason"].as_str()),
        (Some(1), Some("exit"))
    );
    assert_eq!(v["stacks"].as_array().unwrap().len(), 3);
    let (status, v) = get_json(state(), &format!("/api/v1/runs/{run}/snapshots/7")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("no snapshot 7"));
    let (status, v) = get_json(
        state(),
        &format!("/api/v1/diff?old=run:{run}:0&new=run:{run}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(v.as_array().unwrap().iter().all(|d| d["change"] == "same"));
}

#[tokio::test]
async fn live_updates_arrive_over_sse() {
    let (tx, live) = watch::channel(None);
    let state = ApiState {
        live,
        store: None,
        token: None,
        web: Default::default(),
    };
    let res = router(state)
        .oneshot(Request::get("/api/v1/events").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = res.into_body().into_data_stream();
    let (ledger, analysis) = ledger_with(2, 5);
    let report = report_of(&ledger, &analysis, 2);
    let timeline = timeline_of(&report);
    let published = Published::new(report, &analysis, &timeline);
    tx.send(Some(Arc::new(published))).unwrap();
    let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
        .await
        .expect("an update within 5 s")
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&chunk);
    assert!(text.starts_with("event: update\ndata: {"), "{text}");
    assert!(text.contains("\"totals\":{\"heap\":640}"), "{text}");
    assert!(text.contains("\"leaks\":0"), "{text}");
}

#[tokio::test]
async fn with_a_token_every_request_must_carry_it() {
    let state = || ApiState {
        token: Some("s3cret-token".into()),
        ..live_state()
    };
    let (status, v) = get_json(state(), "/api/v1/health").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"], "a valid token is required");
    let (status, _) = get(state(), "/metrics?token=wrong-token!").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = get(state(), "/api/v1/stacks?limit=1&token=s3cret-token").await;
    assert_eq!(status, StatusCode::OK);
    let res = router(state())
        .oneshot(
            Request::get("/api/v1/health")
                .header(header::AUTHORIZATION, "Bearer s3cret-token")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let t = new_token().unwrap();
    assert_eq!(t.len(), 32);
    assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(t, new_token().unwrap());
}

#[tokio::test]
async fn stacks_and_processes_have_their_sampled_series() {
    let (_, list) = get_json(live_state(), "/api/v1/stacks?limit=1").await;
    let id = list[0]["id"].as_str().unwrap().to_string();
    let (status, v) = get_json(live_state(), &format!("/api/v1/stacks/{id}/series")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["per"], "second");
    let points = v["points"].as_array().unwrap();
    // Six samples, one more 64-byte block each.
    assert_eq!(points.len(), 6);
    let last: Vec<u64> = points.iter().map(|p| p["last"].as_u64().unwrap()).collect();
    assert_eq!(last, [64, 128, 192, 256, 320, 384]);
    assert_eq!(points[2]["t0"], 2.0);
    let (status, v) = get_json(live_state(), "/api/v1/processes/1/series").await;
    assert_eq!(status, StatusCode::OK);
    let heap: Vec<u64> = v["heap"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["last"].as_u64().unwrap())
        .collect();
    assert_eq!(heap, [320, 640, 960, 1280, 1600, 1920], "five stacks");
    assert_eq!(v["brk"].as_array().unwrap().len(), 6);
    let (status, _) = get_json(live_state(), "/api/v1/processes/99/series").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get_json(live_state(), "/api/v1/stacks/nope/series").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn timeline_and_flamegraph_come_from_the_publication() {
    // 4 stacks of 3 frames, 5 blocks of 64 bytes each.
    let (ledger, analysis) = ledger_with(4, 5);
    let report = report_of(&ledger, &analysis, 4);
    let mut timeline = views::Timeline::default();
    timeline.record(&report);
    timeline.record(&report);
    let state = || {
        state_with(
            Some(Published::new(report.clone(), &analysis, &timeline)),
            None,
        )
    };
    let (status, v) = get_json(state(), "/api/v1/timeline").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["t"].as_array().unwrap().len(), 2);
    assert_eq!(v["kinds"]["heap"], serde_json::json!([1280, 1280]));
    assert!(
        v["kinds"].get("device").is_none(),
        "kinds that held nothing are left out"
    );

    let (status, all) = get_json(state(), "/api/v1/flamegraph").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (all["name"].as_str(), all["value"].as_u64()),
        (Some("all"), Some(1280))
    );
    let kinds: Vec<_> = all["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(kinds, ["heap"], "split by kind first");
    let (_, heap) = get_json(state(), "/api/v1/flamegraph?kind=heap").await;
    let roots = heap["children"].as_array().unwrap();
    assert_eq!(roots.len(), 4, "one chain per stack (no frame is shared)");
    for chain in roots {
        assert_eq!(chain["value"], 320);
        let mid = &chain["children"][0];
        assert_eq!(mid["value"], 320);
        let leaf = &mid["children"][0];
        assert_eq!(
            leaf["children"].as_array().unwrap().len(),
            0,
            "3 frames deep"
        );
    }
    let (_, none) = get_json(state(), "/api/v1/flamegraph?kind=heap&pid=2").await;
    assert_eq!(none["value"], 0);
    let (status, v) = get_json(state(), "/api/v1/flamegraph?kind=bogus").await;
    assert_eq!(
        (status, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("unknown kind"))
    );
}

#[test]
fn a_long_timeline_keeps_its_whole_span_at_a_coarser_grain() {
    let (ledger, analysis) = ledger_with(1, 1);
    let mut report = report_of(&ledger, &analysis, 1);
    report.final_report = false;
    let mut t = views::Timeline::default();
    for i in 0..5000 {
        report.elapsed_s = f64::from(i);
        t.record(&report);
    }
    let points = t.points();
    assert!(
        points.len() <= 1800 && points.len() >= 900,
        "{}",
        points.len()
    );
    assert_eq!(points[0].t, 0.0);
    assert!(points.last().unwrap().t >= 4990.0);
    assert!(points.windows(2).all(|w| w[1].t > w[0].t));
}

#[tokio::test]
async fn the_page_is_served_with_a_strict_policy_and_without_the_token() {
    let state = || ApiState {
        token: Some("s3cret-token-0123".into()),
        ..live_state()
    };
    let res = router(state())
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let csp = res.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert_eq!(res.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(res.headers()[header::REFERRER_POLICY], "no-referrer");
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&body);
    if assets::embedded() {
        assert!(
            body.contains(r#"<script type="module" src="app.js">"#),
            "{body}"
        );
        let (status, js) = get(state(), "/app.js").await;
        assert_eq!(status, StatusCode::OK);
        assert!(js.contains("EventSource"));
    } else {
        assert!(body.contains("was not built"), "{body}");
    }
    // The data still needs the token.
    let (status, _) = get(state(), "/api/v1/health").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, v) = get_json(state(), "/api/v1/nothing?token=s3cret-token-0123").await;
    assert_eq!(
        (status, v["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("no such endpoint"))
    );

    // --web-dir: files from disk, nothing outside the directory.
    let dir = std::env::temp_dir().join(format!("leaktracer-web-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("index.html"), "from disk").unwrap();
    std::fs::write(dir.join("sub/x.css"), "p{}").unwrap();
    std::fs::write(dir.parent().unwrap().join("leaktracer-secret"), "secret").unwrap();
    let web = assets::Web::dir(&dir).unwrap();
    let state = || ApiState {
        web: web.clone(),
        ..live_state()
    };
    assert_eq!(
        get(state(), "/").await,
        (StatusCode::OK, "from disk".into())
    );
    assert_eq!(
        get(state(), "/sub/x.css").await,
        (StatusCode::OK, "p{}".into())
    );
    let (status, _) = get(state(), "/../leaktracer-secret").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        assets::Web::dir(&dir.join("sub"))
            .unwrap_err()
            .to_string()
            .contains("no index.html")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn health_says_what_the_heap_figures_are_and_what_the_probes_cost() {
    let (status, v) = get_json(live_state(), "/api/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["heap"], serde_json::json!([]), "exact: nothing to say");
    assert_eq!(v["probe_cost"], serde_json::json!([]));
    let (ledger, analysis) = ledger_with(5, 6);
    let mut report = report_of(&ledger, &analysis, 5);
    report.heap = crate::model::HeapTracing {
        mode: crate::model::HeapMode::Sampled,
        sample_bytes: Some(524_288),
        after: Some(crate::model::HeapAfter::Steps(3)),
        tensors: crate::model::TensorsMode::All,
    };
    report.probe_cost = vec![crate::probes::cost::ProgramCost {
        program: "alloc_return".into(),
        calls: 1000,
        ns: 600_000,
    }];
    let timeline = timeline_of(&report);
    let state = state_with(Some(Published::new(report, &analysis, &timeline)), None);
    let (_, v) = get_json(state, "/api/v1/health").await;
    assert_eq!(
        v["heap"],
        serde_json::json!([
            "heap: sampled, one point every 524288 bytes on average: heap bytes are estimates",
            "heap: probed from step 3 on (--heap-after): blocks allocated before are not seen"
        ])
    );
    assert_eq!(
        v["probe_cost"],
        serde_json::json!([{"program": "alloc_return", "calls": 1000, "ns": 600_000}])
    );
}

#[tokio::test]
async fn health_counts_the_stacks_the_report_leaves_out_with_their_bytes() {
    let (ledger, analysis) = ledger_with(8, 6);
    let mut report = report_of(&ledger, &analysis, 3);
    report.final_report = false;
    let (listed, unlisted) = (report.stacks.len(), report.unlisted);
    let timeline = timeline_of(&report);
    let state = state_with(Some(Published::new(report, &analysis, &timeline)), None);
    let (_, v) = get_json(state, "/api/v1/health").await;
    assert_eq!(v["stacks_listed"], listed);
    assert_eq!(v["unlisted"]["stacks"], unlisted.stacks);
    assert_eq!(
        listed as u64 + unlisted.stacks,
        8,
        "every stack, listed or not"
    );
    assert!(unlisted.stacks > 0);
    assert_eq!(
        v["unlisted"]["totals"]["heap"]["bytes"],
        unlisted.totals.heap.bytes
    );
    assert!(unlisted.totals.heap.bytes > 0);
}
