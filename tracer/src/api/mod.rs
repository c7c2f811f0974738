//! The read-only HTTP API (axum) under /api/v1, /metrics for Prometheus, live updates over SSE.
//! It reads the session's latest report from a watch channel (the session loop publishes; nothing
//! here touches the ledger) and the history file for runs and snapshots. Errors are JSON
//! `{"error": "…"}` with a 4xx status, in words for the user, never internals.

pub mod assets;
pub mod dto;
#[cfg(test)]
mod tests;
pub mod views;

use std::{convert::Infallible, path::PathBuf, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::{StatusCode, header},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::get,
};
use serde::Deserialize;
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt as _, wrappers::WatchStream};

use crate::{analysis::Verdict, render, report::Report, store};

/// The latest publication of the session (None before the first).
pub type Live = watch::Receiver<Option<Arc<Published>>>;

/// What the session publishes for the API: a report and the sampled series of its stacks and
/// processes, built by the ledger's owner (the API never reads the ledger or the analysis).
pub struct Published {
    pub report: Report,
    /// Per stack id (as in the DTOs).
    pub stack_series: std::collections::HashMap<String, Vec<dto::PointDto>>,
    /// Per pid: heap-level and brk-heap series.
    pub process_series: std::collections::HashMap<u32, dto::ProcessSeries>,
    /// Outstanding bytes by kind since the session started.
    pub timeline: Vec<views::TimePoint>,
}

impl Published {
    /// Takes the series of `report`'s stacks and processes from `analysis`.
    pub fn new(
        report: Report,
        analysis: &crate::analysis::Analysis,
        timeline: &views::Timeline,
    ) -> Self {
        let points = |p: &[crate::analysis::series::Point]| p.iter().map(dto::point).collect();
        let stack_series = report
            .stacks
            .iter()
            .filter_map(|s| {
                let series = analysis.series(s.group.as_ref()?)?;
                Some((dto::stack_key(s), points(series)))
            })
            .collect();
        let process_series = report
            .processes
            .iter()
            .filter_map(|p| {
                let (heap, brk) = analysis.process_series(p.pid)?;
                Some((
                    p.pid,
                    dto::ProcessSeries {
                        heap: points(heap),
                        brk: points(brk),
                    },
                ))
            })
            .collect();
        Self {
            report,
            stack_series,
            process_series,
            timeline: timeline.points().to_vec(),
        }
    }
}

#[derive(Clone)]
pub struct ApiState {
    pub live: Live,
    /// The history file, for runs and stored snapshots (None: --no-store).
    pub store: Option<PathBuf>,
    /// When set, every request for data must carry it (`Authorization: Bearer TOKEN` or
    /// `?token=TOKEN`); the page's own files are served without it.
    pub token: Option<Arc<str>>,
    pub web: assets::Web,
}

/// An error for the client: a status and a message.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl ApiError {
    fn bad(msg: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, msg.into())
    }

    fn not_found(msg: impl Into<String>) -> Self {
        Self(StatusCode::NOT_FOUND, msg.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad(r.body_text())
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

pub fn router(state: ApiState) -> Router {
    let token = state.token.clone();
    let web = state.web.clone();
    let data = routes(state);
    let data = match token {
        Some(t) => data.layer(axum::middleware::from_fn(move |req, next| {
            authorize(t.clone(), req, next)
        })),
        None => data,
    };
    Router::new()
        .merge(data)
        .fallback(move |uri: axum::http::Uri| assets::serve(web.clone(), uri))
        .layer(axum::middleware::from_fn(assets::harden))
}

/// Lets a request through when it carries the token.
async fn authorize(
    token: Arc<str>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let query = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")));
    let given = bearer.or(query).unwrap_or("");
    // Compared in constant time: the token guards the API on a network.
    let ok = given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if ok {
        next.run(req).await
    } else {
        ApiError(StatusCode::UNAUTHORIZED, "a valid token is required".into()).into_response()
    }
}

fn routes(state: ApiState) -> Router {
    Router::new()
        .route("/api/v1", get(index))
        .route("/api/v1/health", get(health))
        .route("/api/v1/processes", get(processes))
        .route("/api/v1/stacks", get(stacks))
        .route("/api/v1/stacks/{id}", get(stack))
        .route("/api/v1/stacks/{id}/series", get(stack_series))
        .route("/api/v1/processes/{pid}/series", get(process_series))
        .route("/api/v1/runs", get(runs))
        .route("/api/v1/runs/{run}/snapshots", get(snapshots))
        .route("/api/v1/timeline", get(timeline))
        .route("/api/v1/flamegraph", get(flamegraph))
        .route("/api/v1/runs/{run}/snapshots/{n}", get(snapshot))
        .route("/api/v1/diff", get(diff))
        .route("/api/v1/events", get(events))
        .route("/metrics", get(metrics))
        .route(
            "/api/{*rest}",
            get(|| async { ApiError::not_found("no such endpoint") }),
        )
        .with_state(state)
}

async fn index() -> &'static str {
    "leaktracer API (read-only): /api/v1/health /api/v1/processes /api/v1/processes/{pid}/series \
     /api/v1/stacks /api/v1/stacks/{id} /api/v1/stacks/{id}/series /api/v1/timeline /api/v1/flamegraph \
     /api/v1/runs /api/v1/runs/{run}/snapshots /api/v1/runs/{run}/snapshots/{n} \
     /api/v1/diff?old=…&new=… /api/v1/events (SSE) /metrics\n"
}

fn latest(state: &ApiState) -> Result<Arc<Published>, ApiError> {
    state
        .live
        .borrow()
        .clone()
        .ok_or_else(|| ApiError(StatusCode::SERVICE_UNAVAILABLE, "no report yet".into()))
}

async fn health(State(state): State<ApiState>) -> Json<dto::Health> {
    let r = state.live.borrow().clone();
    Json(dto::Health::of(r.as_deref().map(|p| &p.report)))
}

async fn processes(State(state): State<ApiState>) -> ApiResult<Vec<dto::ProcessDto>> {
    let p = latest(&state)?;
    Ok(Json(dto::processes(&p.report)))
}

#[derive(Debug, Deserialize)]
struct StackQuery {
    limit: Option<usize>,
    kind: Option<String>,
    verdict: Option<String>,
    pid: Option<u32>,
}

const MAX_LIMIT: usize = 10_000;

async fn stacks(
    State(state): State<ApiState>,
    q: Result<Query<StackQuery>, QueryRejection>,
) -> ApiResult<Vec<dto::StackDto>> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    check_kind(q.kind.as_deref())?;
    let names = || Verdict::ALL.iter().map(|v| v.name()).chain(["none"]);
    if let Some(v) = &q.verdict
        && !names().any(|n| n == v)
    {
        let names: Vec<&str> = names().collect();
        return Err(ApiError::bad(format!(
            "verdict is one of {}",
            names.join(", ")
        )));
    }
    let p = latest(&state)?;
    let out = p
        .report
        .stacks
        .iter()
        .map(dto::stack)
        .filter(|s| q.kind.as_deref().is_none_or(|k| s.kind == k))
        .filter(|s| {
            q.verdict
                .as_deref()
                .is_none_or(|v| s.verdict.unwrap_or("none") == v)
        })
        .filter(|s| q.pid.is_none_or(|p| s.pid == p))
        .take(limit)
        .collect();
    Ok(Json(out))
}

async fn stack(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<dto::StackDetail> {
    let p = latest(&state)?;
    p.report
        .stacks
        .iter()
        .find(|s| dto::stack_key(s) == id)
        .map(|s| Json(dto::detail(s)))
        .ok_or_else(|| ApiError::not_found("no such stack in the latest report"))
}

/// A series with what its x axis counts.
#[derive(Debug, serde::Serialize)]
struct SeriesDto<T> {
    /// "second" (since the session started) or "step".
    per: String,
    #[serde(flatten)]
    series: T,
}

#[derive(Debug, serde::Serialize)]
struct Points<'a> {
    points: &'a [dto::PointDto],
}

async fn stack_series(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let p = latest(&state)?;
    let points = p
        .stack_series
        .get(&id)
        .ok_or_else(|| ApiError::not_found("no series for that stack in the latest report"))?;
    Ok(Json(SeriesDto {
        per: p.report.verdicts_per.to_string(),
        series: Points { points },
    })
    .into_response())
}

async fn process_series(
    State(state): State<ApiState>,
    Path(pid): Path<u32>,
) -> Result<Response, ApiError> {
    let p = latest(&state)?;
    let series = p
        .process_series
        .get(&pid)
        .ok_or_else(|| ApiError::not_found("no such process in the latest report"))?;
    Ok(Json(SeriesDto {
        per: p.report.verdicts_per.to_string(),
        series,
    })
    .into_response())
}

fn store(state: &ApiState) -> Result<crate::store::Store, ApiError> {
    let path = state
        .store
        .as_ref()
        .ok_or_else(|| ApiError::not_found("no history is kept (--no-store)"))?;
    crate::store::Store::open_read(path).map_err(|_| ApiError::not_found("no history yet"))
}

async fn runs(State(state): State<ApiState>) -> ApiResult<Vec<crate::store::RunRow>> {
    let db = store(&state)?;
    db.runs().map(Json).map_err(|_| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "history unreadable".into(),
        )
    })
}

async fn snapshots(
    State(state): State<ApiState>,
    Path(run): Path<i64>,
) -> ApiResult<Vec<crate::store::SnapshotRow>> {
    let db = store(&state)?;
    db.snapshot_list(run)
        .map_err(|_| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "history unreadable".into(),
            )
        })?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no run {run}")))
}

async fn timeline(State(state): State<ApiState>) -> ApiResult<views::TimelineDto> {
    let p = latest(&state)?;
    Ok(Json(views::timeline(&p.timeline)))
}

#[derive(Debug, Deserialize)]
struct FlameQuery {
    kind: Option<String>,
    pid: Option<u32>,
}

async fn flamegraph(
    State(state): State<ApiState>,
    q: Result<Query<FlameQuery>, QueryRejection>,
) -> ApiResult<views::FlameNode> {
    let Query(q) = q?;
    check_kind(q.kind.as_deref())?;
    let p = latest(&state)?;
    Ok(Json(views::flamegraph(&p.report, q.kind.as_deref(), q.pid)))
}

fn check_kind(kind: Option<&str>) -> Result<(), ApiError> {
    match kind {
        Some(k) if !crate::model::Kind::ALL.iter().any(|x| x.name() == k) => {
            Err(ApiError::bad("unknown kind"))
        }
        _ => Ok(()),
    }
}

#[derive(Debug, serde::Serialize)]
struct SnapshotDto {
    run: i64,
    seq: i64,
    reason: String,
    taken_unix: f64,
    processes: Vec<dto::ProcessDto>,
    stacks: Vec<dto::StackDto>,
}

async fn snapshot(
    State(state): State<ApiState>,
    Path((run, n)): Path<(i64, i64)>,
) -> ApiResult<SnapshotDto> {
    let db = store(&state)?;
    let s = db
        .snapshot(run, n)
        .map_err(|e| ApiError::not_found(e.to_string()))?;
    Ok(Json(SnapshotDto {
        run: s.run,
        seq: s.seq,
        reason: s.reason,
        taken_unix: s.taken_unix,
        processes: dto::processes(&s.report),
        stacks: s.report.stacks.iter().map(dto::stack).collect(),
    }))
}

#[derive(Debug, Deserialize)]
struct DiffQuery {
    old: String,
    new: String,
}

async fn diff(
    State(state): State<ApiState>,
    q: Result<Query<DiffQuery>, QueryRejection>,
) -> ApiResult<Vec<store::diff::StackDelta>> {
    let Query(q) = q?;
    // Only stored snapshots: a file path from the network is not opened.
    for spec in [&q.old, &q.new] {
        if !spec.starts_with("run:") {
            return Err(ApiError::bad(
                "old and new are stored snapshots: run:ID or run:ID:N",
            ));
        }
    }
    let path = state
        .store
        .clone()
        .ok_or_else(|| ApiError::not_found("no history is kept (--no-store)"))?;
    let (old, new) = (
        store::diff::load(&q.old, &path).map_err(|e| ApiError::not_found(e.to_string()))?,
        store::diff::load(&q.new, &path).map_err(|e| ApiError::not_found(e.to_string()))?,
    );
    Ok(Json(store::diff::diff(&old, &new)))
}

async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let p = latest(&state)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render::prometheus::exposition(&p.report),
    )
        .into_response())
}

async fn events(
    State(state): State<ApiState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = WatchStream::new(state.live).filter_map(|r| {
        let r = r?;
        let data = serde_json::to_string(&dto::update(&r.report)).ok()?;
        Some(Ok(Event::default().event("update").data(data)))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// A new random token (32 hex digits, from the kernel's random source) for a non-loopback
/// address.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    // SAFETY: getrandom fills the buffer it is given.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(std::io::Error::other(format!(
            "no random token: getrandom: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Serves the API on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: ApiState) {
    if let Err(e) = axum::serve(listener, router(state)).await {
        tracing::warn!("explorer server stopped: {e}");
    }
}
