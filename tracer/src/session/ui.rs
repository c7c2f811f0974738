//! The explorer's socket, bound before the traced command starts so that a bad address stops the
//! session first.

use crate::{api::assets::Web, config::UiConfig, error::Error};

/// The bound socket, the token requests must carry (required off loopback) and where the page
/// comes from.
pub(super) struct Ui {
    pub listener: std::net::TcpListener,
    pub token: Option<String>,
    pub web: Web,
}

/// Binds the explorer's address and prints its URL. Off loopback a token is required: the one
/// given (--ui-token) or a new random one, printed in the URL.
pub(super) fn listen(ui: &UiConfig) -> Result<Ui, Error> {
    let token = match &ui.token {
        Some(t) => Some(t.clone()),
        None if ui.addr.ip().is_loopback() => None,
        None => Some(crate::api::new_token().map_err(|e| anyhow::anyhow!("--ui: {e}"))?),
    };
    let listener = std::net::TcpListener::bind(ui.addr)
        .map_err(|e| anyhow::anyhow!("--ui: cannot listen on {}: {e}", ui.addr))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| anyhow::anyhow!("--ui: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| anyhow::anyhow!("--ui: {e}"))?;
    let query = token
        .as_deref()
        .map(|t| format!("?token={t}"))
        .unwrap_or_default();
    crate::say!("leaktracer: explorer at http://{bound}/{query} (API under /api/v1)");
    Ok(Ui {
        listener,
        token,
        web: ui.web.clone(),
    })
}
