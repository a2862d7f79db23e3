//! Durable history in NATS JetStream (`[nats] jetstream = true`; see docs/cluster.md).
//!
//! One stream captures every topic subject (`<prefix>.t.>`): the messages nodes already publish
//! on NATS are stored as they pass, so publishing costs nothing more and never waits for
//! JetStream. The stream keeps, per subject, as many messages as the largest `[[history]]` rule
//! and for as long as the longest one (one stream cannot have a limit per pattern, and streams
//! may not overlap); a node applies the topic's own rule when it restores what it read.
//!
//! A node reads the stream only for what its memory cannot answer ([`Engine::unanswered`]):
//! a topic's stored messages are read oldest first with "direct get next by subject" — herald's
//! `seq` is the origin's numbering, not the stream sequence, so a read by start sequence would
//! need a mapping; reading the subject's few retained messages (at most the per-subject limit)
//! is bounded and simple. A wildcard snapshot lists the stream's subjects under the pattern and
//! reads each one's last message.
//!
//! [`Engine::unanswered`]: herald_core::engine::Engine::unanswered

use super::carried::{body_limit, Reassembly};
use super::gate::Gate;
use super::TopicHistory;
use crate::config::NatsConfig;
use anyhow::Context as _;
use async_nats::jetstream::{self, message::StreamMessage, stream};
use async_nats::Client;
use futures_util::StreamExt;
use herald_core::engine::{HistoryRule, Recalled, Unanswered};
use herald_core::subject;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Messages read from one subject at most (far above any sensible per-subject limit).
const MAX_READ: usize = 100_000;
/// Subjects a wildcard snapshot reads at most.
const MAX_SUBJECTS: usize = 10_000;

/// The stream a node reads and (through its ordinary publishes) writes.
pub struct DurableHistory {
    config: stream::Config,
    topics: String,
    /// Set once the stream exists (and again after every reconnection).
    stream: parking_lot::Mutex<Option<stream::Stream<()>>>,
    /// Rings when NATS (re)connects: the stream is (re)declared, in case the server lost it.
    pub reconnected: Notify,
}

impl DurableHistory {
    pub fn new(nats: &NatsConfig, history: &[HistoryRule]) -> DurableHistory {
        let per_subject = history.iter().map(|r| r.max_messages).max().unwrap_or(0);
        let max_age = history
            .iter()
            .map(|r| r.max_age_secs)
            .max()
            .map_or(Duration::ZERO, |s| Duration::from_secs(s.max(1)));
        let config = stream::Config {
            name: stream_name(&nats.prefix),
            subjects: vec![format!("{}.t.>", nats.prefix)],
            max_messages_per_subject: per_subject.max(1) as i64,
            max_age,
            max_bytes: i64::try_from(nats.jetstream_max_bytes).unwrap_or(i64::MAX),
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::Old,
            allow_direct: true,
            ..Default::default()
        };
        DurableHistory {
            config,
            topics: format!("{}.t", nats.prefix),
            stream: parking_lot::Mutex::default(),
            reconnected: Notify::new(),
        }
    }

    pub fn available(&self) -> bool {
        self.stream.lock().is_some()
    }

    /// Declares the stream now and after every reconnection (retrying while JetStream is not
    /// there); `available` says whether it is.
    pub async fn keep_declared(self: Arc<Self>, client: Client, available: impl Fn(bool)) {
        let js = jetstream::new(client);
        loop {
            let reconnected = self.reconnected.notified();
            let declared = tokio::time::timeout(TIMEOUT, async {
                js.create_or_update_stream(self.config.clone()).await?;
                Ok::<_, anyhow::Error>(js.get_stream_no_info(&self.config.name).await?)
            })
            .await;
            let ok = match declared {
                Ok(Ok(stream)) => {
                    *self.stream.lock() = Some(stream);
                    true
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, stream = %self.config.name, "JetStream unavailable: durable history off until it is");
                    false
                }
                Err(_) => {
                    tracing::warn!(stream = %self.config.name, "JetStream did not answer: durable history off until it does");
                    false
                }
            };
            if !ok {
                *self.stream.lock() = None;
            }
            available(ok);
            if ok {
                reconnected.await;
            } else {
                let _ = tokio::time::timeout(RETRY, reconnected).await;
            }
        }
    }

    /// Reads what `unanswered` names of a subscription to `pattern`: each `since` topic's
    /// history, and for a snapshot the last message of every stored topic the pattern
    /// matches (or of the one topic it names). Fails when JetStream is unavailable or does not
    /// answer within [`TIMEOUT`]; then the caller answers from memory, gaps and all. What the
    /// stream holds passes `gate` like live messages: anyone who may publish on the NATS
    /// account may have stored something there.
    pub async fn recall(
        &self,
        pattern: &str,
        unanswered: &Unanswered,
        max_message_bytes: usize,
        gate: &Gate,
    ) -> anyhow::Result<Vec<TopicHistory>> {
        let stream = self
            .stream
            .lock()
            .clone()
            .context("JetStream is unavailable")?;
        let read = async {
            let mut found = Vec::new();
            for topic in &unanswered.since {
                found.extend(
                    self.read_topic(&stream, topic, max_message_bytes, gate)
                        .await?,
                );
            }
            if unanswered.snapshot {
                for topic in self.stored_topics(&stream, pattern).await? {
                    if unanswered.since.contains(&topic) {
                        continue;
                    }
                    let last = self
                        .read_last(&stream, &topic, max_message_bytes, gate)
                        .await?;
                    found.extend(last);
                }
            }
            Ok(found)
        };
        tokio::time::timeout(TIMEOUT, read)
            .await
            .context("JetStream did not answer in time")?
    }

    /// The topics the stream holds messages of that `pattern` matches.
    async fn stored_topics(
        &self,
        stream: &stream::Stream<()>,
        pattern: &str,
    ) -> anyhow::Result<Vec<String>> {
        if !herald_core::topic::is_pattern(pattern) {
            return Ok(vec![pattern.to_owned()]);
        }
        let mut subjects = stream
            .info_with_subjects(subject::to_subject(&self.topics, pattern))
            .await?;
        let mut topics = Vec::new();
        while let Some(entry) = subjects.next().await {
            let (subject, _) = entry?;
            if let Some(topic) = subject::to_topic(&self.topics, &subject) {
                topics.push(topic);
            }
            if topics.len() >= MAX_SUBJECTS {
                tracing::warn!(%pattern, "snapshot from JetStream cut at {MAX_SUBJECTS} topics");
                break;
            }
        }
        topics.sort();
        Ok(topics)
    }

    /// `topic`'s last whole message: its subject's last stored message, unless that is a chunk
    /// or a position announcement (then the subject is read in full).
    async fn read_last(
        &self,
        stream: &stream::Stream<()>,
        topic: &str,
        max_message_bytes: usize,
        gate: &Gate,
    ) -> anyhow::Result<Option<TopicHistory>> {
        let subject = subject::to_subject(&self.topics, topic);
        let Some(last) = found(stream.direct_get_last_for_subject(&subject).await)? else {
            return Ok(None);
        };
        let whole = gate
            .open(&subject, Some(&last.headers), &last.payload)
            .filter(|c| c.chunk.is_none() && !c.mark)
            .and_then(
                |c| match c.recalled(topic.to_owned(), last.payload.clone(), at_us(&last)) {
                    Ok(recalled) => Some((c.epoch, recalled)),
                    Err(reason) => {
                        gate.reject(reason, &subject);
                        None
                    }
                },
            );
        let Some((epoch, recalled)) = whole else {
            let all = self
                .read_topic(stream, topic, max_message_bytes, gate)
                .await?;
            return Ok(all.map(|(t, epoch, mut messages)| {
                let last = messages.split_off(messages.len().saturating_sub(1));
                (t, epoch, last)
            }));
        };
        Ok(Some((topic.to_owned(), epoch, vec![recalled])))
    }

    /// Every stored whole message of `topic` in its newest epoch, oldest first.
    async fn read_topic(
        &self,
        stream: &stream::Stream<()>,
        topic: &str,
        max_message_bytes: usize,
        gate: &Gate,
    ) -> anyhow::Result<Option<TopicHistory>> {
        let subject = subject::to_subject(&self.topics, topic);
        let mut reassembly = Reassembly::default();
        let mut whole: Vec<(String, Recalled)> = Vec::new();
        let mut next = None;
        for _ in 0..MAX_READ {
            let Some(m) = found(stream.direct_get_next_for_subject(&subject, next).await)? else {
                break;
            };
            let message = StreamMessage::try_from(m.message)?;
            next = Some(message.sequence + 1);
            let Some(carried) = gate.open(&subject, Some(&message.headers), &message.payload)
            else {
                continue;
            };
            if carried.mark {
                continue;
            }
            let payload = match carried.chunk {
                None => message.payload.clone(),
                Some(chunk) => {
                    let added = reassembly.add(
                        &carried.origin,
                        &subject,
                        carried.seq,
                        chunk,
                        &message.payload,
                        body_limit(max_message_bytes),
                    );
                    if let Some(reason) = added.rejected {
                        gate.reject(reason, &subject);
                    }
                    match added.whole {
                        Some(payload) => payload,
                        None => continue,
                    }
                }
            };
            match carried.recalled(topic.to_owned(), payload, at_us(&message)) {
                Ok(recalled) => whole.push((carried.epoch.clone(), recalled)),
                Err(reason) => gate.reject(reason, &subject),
            }
        }
        let Some(epoch) = whole.last().map(|(e, _)| e.clone()) else {
            return Ok(None);
        };
        let mut messages: Vec<Recalled> = whole
            .into_iter()
            .filter(|(e, _)| *e == epoch)
            .map(|(_, m)| m)
            .collect();
        messages.sort_by_key(|m| m.seq);
        Ok(Some((topic.to_owned(), epoch, messages)))
    }
}

/// How long one recall (or declaring the stream) may take before herald answers without it.
pub const TIMEOUT: Duration = Duration::from_secs(3);
/// How often an unavailable JetStream is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// A stream name from the subject prefix (stream names may not hold `.`, `*`, `>`, `/`, `\` or
/// blanks): `herald` → `herald`, `prod.herald` → `prod_herald`.
fn stream_name(prefix: &str) -> String {
    prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// When the stream stored the message, µs since the UNIX epoch.
fn at_us(m: &StreamMessage) -> u64 {
    u64::try_from(m.time.unix_timestamp_nanos() / 1000).unwrap_or(0)
}

/// A direct get's answer, with "no such message" as `None` rather than an error.
fn found<T>(got: Result<T, stream::DirectGetError>) -> anyhow::Result<Option<T>> {
    match got {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}
