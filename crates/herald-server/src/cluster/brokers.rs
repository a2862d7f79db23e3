//! The broker the configuration asks for. A new transport is named here and nowhere else
//! outside this folder.

use super::nats::NatsBroker;
use super::Broker;
use crate::config::Config;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The broker `config` describes, its metrics registered in `registry`; `None`: the node is
/// alone and its engine is the whole broker (in memory). Nothing is connected until
/// [`Broker::start`].
pub fn from_config(config: &Config, registry: &mut Registry) -> Option<Arc<dyn Broker>> {
    let nats = config.nats.clone()?;
    Some(Arc::new(NatsBroker::new(
        nats,
        &config.history,
        config.max_message_bytes,
        registry,
    )))
}
