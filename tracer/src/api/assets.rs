//! The explorer page: its built files embedded in the binary (web/dist at build time), or read
//! from `--web-dir` for development. Served with a content security policy that allows only the
//! page's own scripts, so even a string that slipped into markup could not run.

use std::path::{Component, Path, PathBuf};

use axum::{
    body::Body,
    http::{HeaderValue, Uri, header},
    response::{IntoResponse, Response},
};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
}

/// Where the page's files come from.
#[derive(Clone, Debug, Default)]
pub enum Web {
    #[default]
    Embedded,
    Dir(PathBuf),
}

impl Web {
    /// `--web-dir DIR`: it must hold a built page.
    pub fn dir(dir: &Path) -> Result<Self, crate::error::Error> {
        if dir.join("index.html").is_file() {
            Ok(Self::Dir(dir.to_path_buf()))
        } else {
            Err(crate::error::Error::Usage(format!(
                "--web-dir {}: no index.html there (build the page with `npm run build` in web/)",
                dir.display()
            )))
        }
    }

    async fn read(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            Self::Embedded => embedded::ASSETS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| b.to_vec()),
            Self::Dir(dir) => {
                // Only plain names below the directory: no `..`, no absolute paths.
                let rel = Path::new(name);
                if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                    return None;
                }
                tokio::fs::read(dir.join(rel)).await.ok()
            }
        }
    }
}

/// The policy for every response: scripts and styles only from this server.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const NOT_BUILT: &str = "<!doctype html><meta charset=utf-8><title>leaktracer</title>\
    <p>The explorer page was not built into this binary (scripts/setup.sh builds web/ first). \
    The API is served under <a href=\"/api/v1/health\">/api/v1</a>.</p>";

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json" | "map") => "application/json",
        _ => "application/octet-stream",
    }
}

/// GET of anything outside /api and /metrics: a file of the page, `/` its index.
pub async fn serve(web: Web, uri: Uri) -> Response {
    let name = match uri.path().trim_start_matches('/') {
        "" => "index.html",
        n => n,
    };
    match web.read(name).await {
        Some(bytes) => {
            let mut r = Response::new(Body::from(bytes));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(name)),
            );
            r
        }
        None if name == "index.html" => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            NOT_BUILT,
        )
            .into_response(),
        None => super::ApiError::not_found("no such file").into_response(),
    }
}

/// Headers every response carries.
pub async fn harden(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The URL can carry the token: never send it elsewhere.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// For tests: whether the page is built into this binary.
pub fn embedded() -> bool {
    !embedded::ASSETS.is_empty()
}
