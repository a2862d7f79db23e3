//! How herald's HTTP routes refuse a request: a JSON body with a code and a message, the code
//! counted, and the admin check that guards the admin views. Every route set (publish,
//! `/metrics`, `/api/stats`, VBDS) refuses the same way.

use crate::auth::{Caller, Refused};
use crate::node::Node;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::request::ProtocolError;
use serde_json::json;

/// With auth on, admin endpoints need the admin API key (`Authorization: Bearer <key>`).
#[allow(clippy::result_large_err)]
pub fn require_admin(node: &Node, headers: &HeaderMap) -> Result<(), Response> {
    let Some(auth) = &node.auth else {
        return Ok(());
    };
    match auth.http_caller(headers) {
        Ok(Caller::Admin) => Ok(()),
        Ok(Caller::Token(_)) => Err(refuse(
            node,
            StatusCode::FORBIDDEN,
            "forbidden",
            "this endpoint needs the admin API key, not a client token".into(),
        )),
        Err(Refused(why)) => Err(refuse(node, StatusCode::UNAUTHORIZED, "unauthorized", why)),
    }
}

/// A refusal with `code`, counted among the node's request errors.
pub fn refuse(node: &Node, status: StatusCode, code: &'static str, why: String) -> Response {
    node.count_error(code);
    error(status, ProtocolError::new(code, why))
}

/// The JSON body of an error, with its status.
pub fn error(status: StatusCode, e: ProtocolError) -> Response {
    (status, Json(json!({"code": e.code, "message": e.message}))).into_response()
}
