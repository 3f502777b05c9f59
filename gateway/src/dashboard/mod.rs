//! The dashboard at `GET /`: one static page embedded in the binary that fetches `/status`
//! every two seconds and renders the federation table.
//!
//! The page itself holds nothing secret and needs no key. When `/status` needs one, the page
//! asks for it (kept in the browser's local storage) or takes it from the address's fragment,
//! `/#key=<key>`, which browsers never send to the server.

use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::Response;

use crate::body::GatewayBody;

/// The page.
pub const PAGE: &str = include_str!("dashboard.html");

/// `GET /`.
pub fn page() -> Response<GatewayBody> {
    let mut response = Response::new(GatewayBody::full(PAGE));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    response
}
