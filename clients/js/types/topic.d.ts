/**
 * Whether `topic` (an exact topic) matches `pattern`: `*` is exactly one level, `>` as the last
 * level is one or more levels; `*` and `>` are wildcards only as a whole level.
 * @param {string} pattern
 * @param {string} topic
 * @returns {boolean}
 */
export function topicMatches(pattern: string, topic: string): boolean;
