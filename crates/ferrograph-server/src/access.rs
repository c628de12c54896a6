//! Who may call the API from a web page, and which paths API clients may name.
//!
//! A server on loopback without a token is still reachable from any web page the user opens:
//! a cross-site page can send simple requests to `http://127.0.0.1:8420`, and a DNS-rebinding
//! page can make its own name resolve to 127.0.0.1 and read the answers. [`fence`] refuses
//! both, before authentication:
//!
//! - `Host` must be an IP address, `localhost` (with any port), or a configured name: a
//!   rebinding page's requests carry the page's own name;
//! - a request that carries `Origin` must come from the server's own origin (the scheme and
//!   the `Host` it was sent to) or from a configured origin; configured origins get CORS
//!   headers ([`Access::cors`]), others `403 origin_not_allowed`;
//! - bodies must be JSON: [`crate::ApiJson`] answers `415` to anything else, so a page cannot
//!   use a form or a `text/plain` body, which browsers send without asking.
//!
//! Paths in a workflow's input (the fields its registry entry declares) are confined to the
//! roots in [`Access::roots`]; without roots, clients can name none.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferrograph::runtime::{InputPath, PathError, PathRoots};
use serde_json::Value;
use std::net::IpAddr;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The server's fence: accepted host names, origins and client paths.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Roots that client-named paths must lie in; `None` refuses every client-named path.
    pub roots: Option<PathRoots>,
    /// Host names accepted besides IP addresses and `localhost` (case-insensitive, without
    /// port).
    pub allowed_hosts: Vec<String>,
    /// Origins allowed to call cross-origin (`https://app.example:3000`); `*` allows any.
    pub allowed_origins: Vec<String>,
}

impl Access {
    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || self
                .allowed_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&name))
    }

    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let same = host.is_some_and(|h| {
            origin.eq_ignore_ascii_case(&format!("http://{h}"))
                || origin.eq_ignore_ascii_case(&format!("https://{h}"))
        });
        same || self
            .allowed_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    }

    /// The CORS layer: answers preflights and adds `Access-Control-Allow-Origin` for the
    /// configured origins only (none by default, so browsers keep cross-origin pages out).
    pub fn cors(&self) -> CorsLayer {
        let origins: Vec<HeaderValue> = self
            .allowed_origins
            .iter()
            .filter(|o| o.as_str() != "*")
            .filter_map(|o| HeaderValue::from_str(o).ok())
            .collect();
        let allow = if self.allowed_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(origins)
        };
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT])
    }

    /// Resolves the declared path fields of a client's `input` in place (see
    /// [`PathRoots::confine`]); refuses them all when the server has no roots.
    pub(crate) fn confine(&self, fields: &[InputPath], input: &mut Value) -> Result<(), ApiError> {
        match &self.roots {
            Some(roots) => roots.confine(fields, input).map_err(path_error),
            None => {
                let named = fields.iter().find(|f| {
                    input
                        .get(f.field)
                        .is_some_and(|v| !(v.is_null() || v.as_str() == Some("")))
                });
                match named {
                    Some(f) => Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "path_not_allowed",
                        format!(
                            "`{}`: this server accepts no paths from clients (start it with `--workspace DIR`)",
                            f.field
                        ),
                    )),
                    None => Ok(()),
                }
            }
        }
    }
}

fn path_error(e: PathError) -> ApiError {
    let (status, code) = match &e {
        PathError::NotAString { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        PathError::NotFound { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "path_not_found"),
        _ => (StatusCode::FORBIDDEN, "path_not_allowed"),
    };
    ApiError::new(status, code, e.to_string())
}

/// `host[:port]` → `host` (IPv6 literals keep their brackets).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.find(']') {
            Some(i) => &host[..i + 2],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Refuses requests whose `Host` is not ours and cross-origin requests from pages that are not
/// configured.
pub(crate) async fn fence(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let access = &state.inner.access;
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"));
    if let Some(h) = host {
        if !access.host_allowed(h) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!(
                    "Host `{h}` is not this server's (allow it with `--allow-host`); requests through other names are refused to keep DNS-rebinding pages out"
                ),
            )
            .into_response();
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("\u{fffd}");
        if !access.origin_allowed(origin, host) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!(
                    "requests from pages at `{origin}` are refused (allow the origin with `--allow-origin`)"
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let a = Access {
            allowed_hosts: vec!["ferro.lan".into()],
            ..Access::default()
        };
        for ok in [
            "127.0.0.1:8420",
            "localhost:8420",
            "LOCALHOST",
            "[::1]:8420",
            "10.0.0.5:80",
            "ferro.lan:8420",
            "FERRO.LAN",
        ] {
            assert!(a.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:8420",
            "localhost.evil.example",
            "127.0.0.1.nip.io:8420",
            "",
        ] {
            assert!(!a.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn origins() {
        let a = Access {
            allowed_origins: vec!["https://app.example".into()],
            ..Access::default()
        };
        assert!(a.origin_allowed("http://127.0.0.1:8420", Some("127.0.0.1:8420")));
        assert!(a.origin_allowed("https://app.example", Some("127.0.0.1:8420")));
        assert!(!a.origin_allowed("http://evil.example", Some("127.0.0.1:8420")));
        assert!(!a.origin_allowed("null", Some("127.0.0.1:8420")));
        assert!(!a.origin_allowed("http://127.0.0.1:9999", Some("127.0.0.1:8420")));
        let any = Access {
            allowed_origins: vec!["*".into()],
            ..Access::default()
        };
        assert!(any.origin_allowed("http://evil.example", None));
    }
}
