//! Permissions as topic patterns: what a token grants, and whether a request stays inside it.
//!
//! A grant is a list of patterns. Publishing to a topic is allowed when a granted pattern
//! matches it. Subscribing to a pattern is allowed only when *every* topic the pattern can match
//! is matched by one granted pattern: the request is refused, never silently narrowed, so a
//! client always knows what it will receive.
//!
//! "Every topic a pattern can match lies inside one granted pattern" is decided level by level
//! ([`covers`]), one granted pattern at a time. That is conservative: `a/>` is refused to a
//! holder of `a/*` and `a/*/>` even though together they cover it; such a client subscribes to
//! the two granted patterns instead. It never allows more than the grants.

use crate::topic;

/// Does `grant` match every topic that `pattern` matches? Both must be valid patterns (topics
/// are patterns without wildcards).
///
/// Level by level: a granted `>` covers whatever remains (at least one level, which `pattern`
/// must still have); a granted `*` covers one level that is a literal or `*`, never `>` (which
/// stands for several); a granted literal covers only the same literal.
pub fn covers(grant: &str, pattern: &str) -> bool {
    let mut g = grant.split('/').peekable();
    let mut p = pattern.split('/').peekable();
    loop {
        match (g.next(), p.next()) {
            (Some(">"), Some(_)) if g.peek().is_none() => return true,
            (Some("*"), Some(pl)) if !(pl == ">" && p.peek().is_none()) => {}
            (Some(gl), Some(pl)) if gl == pl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// What a connection may do: the patterns it may subscribe within and publish to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    pub subscribe: Vec<String>,
    pub publish: Vec<String>,
    /// Patterns within which a subscription may be `lossless`: one that makes publishers wait
    /// for its credit, a privilege apart from reading.
    pub lossless: Vec<String>,
}

impl Grants {
    /// Everything: what a connection holds when authentication is off.
    pub fn all() -> Grants {
        Grants {
            subscribe: vec![">".into()],
            publish: vec![">".into()],
            lossless: vec![">".into()],
        }
    }

    /// May the holder subscribe to `pattern` losslessly (hold its publishers)? Only if one
    /// lossless grant covers it entirely.
    pub fn may_hold(&self, pattern: &str) -> bool {
        self.lossless.iter().any(|g| covers(g, pattern))
    }

    /// May the holder subscribe to `pattern`? Only if one granted pattern covers it entirely.
    pub fn may_subscribe(&self, pattern: &str) -> bool {
        self.subscribe.iter().any(|g| covers(g, pattern))
    }

    /// May the holder publish to `topic`?
    pub fn may_publish(&self, topic: &str) -> bool {
        self.publish.iter().any(|g| topic::matches(g, topic))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples() {
        let yes = [
            ("quotes/fx/>", "quotes/fx/>"),
            ("quotes/fx/>", "quotes/fx/EURUSD"),
            ("quotes/fx/>", "quotes/fx/*"),
            ("quotes/fx/>", "quotes/fx/*/>"),
            ("quotes/*", "quotes/fx"),
            ("quotes/*", "quotes/*"),
            (">", ">"),
            (">", "*/>"),
            ("*/>", "a/*/b"),
        ];
        for (g, p) in yes {
            assert!(covers(g, p), "{g} should cover {p}");
        }
        let no = [
            ("quotes/fx/>", "quotes/>"),
            ("quotes/fx/>", "*/>"),
            ("quotes/fx/>", ">"),
            ("quotes/fx/>", "quotes/fx"),
            ("quotes/fx/>", "quotes/*/EURUSD"),
            ("quotes/fx/>", "orders/>"),
            ("quotes/*", "quotes/>"),
            ("quotes/*", "quotes/fx/EURUSD"),
            ("*/>", ">"),
            ("a", "*"),
        ];
        for (g, p) in no {
            assert!(!covers(g, p), "{g} should not cover {p}");
        }
    }

    /// Every pattern over levels {a, b, *, >} with up to 3 levels, and every topic over {a, b, c}
    /// with up to 4 levels: `c` appears in no pattern, so it stands for "any other literal", and
    /// 4 levels exceeds every pattern's length, so `>` is tested against a longer topic.
    /// Brute force: `grant` covers `pattern` iff no topic matches `pattern` but not `grant`.
    #[test]
    fn agrees_with_brute_force_over_a_small_universe() {
        fn sequences(alphabet: &[&str], max: usize) -> Vec<String> {
            let mut all: Vec<Vec<&str>> = vec![vec![]];
            let mut out = Vec::new();
            for _ in 0..max {
                let mut next = Vec::new();
                for prefix in &all {
                    for level in alphabet {
                        let mut s = prefix.clone();
                        s.push(level);
                        out.push(s.join("/"));
                        next.push(s);
                    }
                }
                all = next;
            }
            out
        }
        let patterns: Vec<String> = sequences(&["a", "b", "*", ">"], 3)
            .into_iter()
            .filter(|p| topic::validate_pattern(p).is_ok())
            .collect();
        let topics = sequences(&["a", "b", "c"], 4);
        let mut checked = 0;
        for g in &patterns {
            for p in &patterns {
                let brute = topics
                    .iter()
                    .all(|t| !topic::matches(p, t) || topic::matches(g, t));
                assert_eq!(covers(g, p), brute, "grant {g} pattern {p}");
                checked += 1;
            }
        }
        assert!(checked > 2000, "{checked}");
    }

    #[test]
    fn grants_refuse_rather_than_narrow() {
        let g = Grants {
            subscribe: vec!["quotes/fx/>".into(), "news/*".into()],
            publish: vec!["orders/desk1/>".into()],
            lossless: vec!["jobs/>".into()],
        };
        assert!(g.may_hold("jobs/a/>"));
        assert!(!g.may_hold("quotes/fx/EURUSD"));
        assert!(g.may_subscribe("quotes/fx/EURUSD"));
        assert!(g.may_subscribe("news/today"));
        assert!(!g.may_subscribe("news/>"));
        assert!(!g.may_subscribe(">"));
        assert!(g.may_publish("orders/desk1/1"));
        assert!(!g.may_publish("orders/desk2/1"));
        assert!(!g.may_publish("quotes/fx/EURUSD"));
        assert!(Grants::all().may_subscribe(">"));
        assert!(
            Grants::default()
                == Grants {
                    subscribe: vec![],
                    publish: vec![],
                    lossless: vec![]
                }
        );
    }
}
