// Topic matching, the same grammar as herald-core's `topic.rs` (docs/protocol.md, "Topics and
// patterns"). The client needs it because a message frame names the topic, not the subscription:
// with overlapping patterns the client decides itself which handlers a message is for.

/**
 * Whether `topic` (an exact topic) matches `pattern`: `*` is exactly one level, `>` as the last
 * level is one or more levels; `*` and `>` are wildcards only as a whole level.
 * @param {string} pattern
 * @param {string} topic
 * @returns {boolean}
 */
export function topicMatches(pattern, topic) {
  const p = pattern.split("/");
  const t = topic.split("/");
  for (let i = 0; i < p.length; i++) {
    if (p[i] === ">" && i === p.length - 1) return t.length > i;
    if (i >= t.length) return false;
    if (p[i] !== "*" && p[i] !== t[i]) return false;
  }
  return p.length === t.length;
}
