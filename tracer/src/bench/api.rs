//! `leaktracer bench --api`: the explorer API on a large ledger (100k stacks, 1M outstanding
//! allocations): what publishing a report costs the session loop each second, and the latency of
//! requests on it (p50, p99), beside the same on 1k stacks.

use std::{sync::Arc, time::Instant};

use axum::{body::Body, http::Request};
use tokio::sync::watch;
use tower::ServiceExt as _;

use crate::{
    api::{ApiState, Published, router},
    error::Error,
    report::synthetic::{ledger_with, report_of},
};

/// Stacks a published report holds (as the session's).
const PUBLISHED: usize = 200;
const REQUESTS: usize = 2000;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// (p50, p99) in ms of `REQUESTS` GETs of `uri`.
async fn latency(state: &ApiState, uri: &str) -> (f64, f64) {
    let app = router(state.clone());
    let mut ms = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let res = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 0.5), percentile(&ms, 0.99))
}

pub fn run(serve: Option<&str>) -> Result<i32, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("tokio runtime: {e}"))?;
    let mut last = None;
    crate::tell!("explorer API, {REQUESTS} requests each, without a socket:");
    for (stacks, per_stack) in [(1_000u32, 10u32), (100_000, 10)] {
        let (ledger, analysis) = ledger_with(stacks, per_stack);
        // An hour of publications, one a second (not timed: the session records one at a time).
        let mut timeline = crate::api::views::Timeline::default();
        let mut past = report_of(&ledger, &analysis, 1);
        past.final_report = false;
        for i in 0..3600 {
            past.elapsed_s = f64::from(i);
            timeline.record(&past);
        }
        let t = Instant::now();
        let report = report_of(&ledger, &analysis, PUBLISHED);
        let published = Published::new(report, &analysis, &timeline);
        let publish_ms = t.elapsed().as_secs_f64() * 1e3;
        let (_tx, live) = watch::channel(Some(Arc::new(published)));
        let state = ApiState {
            live,
            store: None,
            token: None,
            web: Default::default(),
        };
        crate::tell!(
            "{stacks:>7} stacks, {:>9} allocations: publishing a report (top {PUBLISHED}) {publish_ms:.1} ms",
            u64::from(stacks) * u64::from(per_stack)
        );
        for uri in [
            "/api/v1/stacks?limit=100",
            "/api/v1/stacks?verdict=leak&limit=100",
            "/api/v1/processes",
            "/api/v1/timeline",
            "/api/v1/flamegraph",
            "/metrics",
        ] {
            let (p50, p99) = rt.block_on(latency(&state, uri));
            crate::tell!("    {uri:<40} p50 {p50:>7.3} ms   p99 {p99:>7.3} ms");
        }
        last = Some(state);
    }
    if let (Some(addr), Some(state)) = (serve, last) {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| Error::Usage(format!("--serve {addr}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| anyhow::anyhow!("{e}"))?;
        crate::say!("leaktracer: explorer at http://{bound}/ (the 100k-stack report; Ctrl-C ends)");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            tokio::select! {
                _ = crate::api::serve(listener, state) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            Ok::<_, std::io::Error>(())
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(0)
}
