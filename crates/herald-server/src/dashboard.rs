//! The live dashboard at `GET /`: static assets compiled into the binary, so `herald serve` needs
//! no files and no build step beyond cargo. The page talks to herald like any other client: the
//! JavaScript SDK over `/ws` (served from `clients/js`, so the dashboard always uses the SDK
//! this repository ships) and JSON from [`crate::introspect`].

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

use crate::node::Node;

const JS: &str = "text/javascript; charset=utf-8";

/// Every asset under `/dashboard/`: name, content type, contents.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("dashboard/style.css"),
    ),
    ("app.js", JS, include_str!("dashboard/app.js")),
    ("api.js", JS, include_str!("dashboard/api.js")),
    ("chart.js", JS, include_str!("dashboard/chart.js")),
    ("format.js", JS, include_str!("dashboard/format.js")),
    ("overview.js", JS, include_str!("dashboard/overview.js")),
    ("cluster.js", JS, include_str!("dashboard/cluster.js")),
    ("topics.js", JS, include_str!("dashboard/topics.js")),
    ("live.js", JS, include_str!("dashboard/live.js")),
    ("images.js", JS, include_str!("dashboard/images.js")),
    ("fits.js", JS, include_str!("dashboard/fits.js")),
    ("latency.js", JS, include_str!("dashboard/latency.js")),
    (
        "herald-client.js",
        JS,
        include_str!("../../../clients/js/src/herald-client.js"),
    ),
    (
        "topic.js",
        JS,
        include_str!("../../../clients/js/src/topic.js"),
    ),
];

pub fn router() -> Router<Arc<Node>> {
    Router::new()
        .route(
            "/",
            get(|| async { Html(include_str!("dashboard/index.html")) }),
        )
        .route("/dashboard/{file}", get(asset))
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, ..)| *name == file) {
        Some((_, content_type, body)) => (
            // Revalidated on every load: a newer herald must not run an older dashboard.
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such dashboard asset\n").into_response(),
    }
}
