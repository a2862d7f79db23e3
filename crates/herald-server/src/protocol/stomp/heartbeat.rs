//! Heart-beat negotiation (specification, "Heart-beating"): each side says how often it can
//! send (`cx`, `sx`) and how often it wants to receive (`cy`, `sy`), in milliseconds, 0 meaning
//! "not at all". Each direction then runs at the larger of what its sender offers and its
//! receiver wants, or not at all when either says 0.

use std::time::Duration;

/// The intervals a connection keeps after negotiation; `None` is no heart-beating that way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartBeats {
    /// How often herald must send something (a frame or an EOL) to the client.
    pub server_sends: Option<Duration>,
    /// How often the client must send something; a silent client is taken for dead after some
    /// multiple of this (the caller's choice: the specification leaves the margin open).
    pub client_sends: Option<Duration>,
}

/// A `heart-beat` header that is not two comma-separated numbers of milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid heart-beat header {0:?}; expected two numbers of milliseconds, e.g. \"10000,10000\""
)]
pub struct InvalidHeartBeat(pub String);

/// Parses `cx,cy` as a `heart-beat` header writes it.
fn parse(header: &str) -> Option<(u64, u64)> {
    let (x, y) = header.split_once(',')?;
    let number = |s: &str| {
        let s = s.trim();
        // `u64::from_str` accepts a leading `+`; the header's grammar does not.
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    Some((number(x)?, number(y)?))
}

/// The intervals for a client whose CONNECT has `client` (`cx,cy`; absent is `0,0`) when
/// herald offers `server` = `(sx, sy)` in milliseconds (the value of CONNECTED's `heart-beat`).
pub fn negotiate(client: Option<&str>, server: (u64, u64)) -> Result<HeartBeats, InvalidHeartBeat> {
    let (cx, cy) = match client {
        None => (0, 0),
        Some(h) => parse(h).ok_or_else(|| InvalidHeartBeat(h.chars().take(80).collect()))?,
    };
    let (sx, sy) = server;
    let interval = |sends: u64, wants: u64| {
        (sends != 0 && wants != 0).then(|| Duration::from_millis(sends.max(wants)))
    };
    Ok(HeartBeats {
        server_sends: interval(sx, cy),
        client_sends: interval(cx, sy),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    #[test]
    fn each_direction_runs_at_the_slower_of_both_wishes() {
        let hb = negotiate(Some("4000,1000"), (10_000, 2_000)).unwrap();
        assert_eq!(hb.client_sends, ms(4000));
        assert_eq!(hb.server_sends, ms(10_000));
        let hb = negotiate(Some("1000,0"), (0, 5000)).unwrap();
        assert_eq!(hb.client_sends, ms(5000));
        assert_eq!(hb.server_sends, None);
    }

    #[test]
    fn zero_on_either_side_turns_a_direction_off() {
        let off = HeartBeats {
            server_sends: None,
            client_sends: None,
        };
        assert_eq!(negotiate(None, (1000, 1000)).unwrap(), off);
        assert_eq!(negotiate(Some("0,0"), (1000, 1000)).unwrap(), off);
        assert_eq!(negotiate(Some("1000,1000"), (0, 0)).unwrap(), off);
        assert_eq!(
            negotiate(Some(" 10 , 20 "), (0, 30)).unwrap().client_sends,
            ms(30)
        );
    }

    #[test]
    fn refuses_what_is_not_two_numbers() {
        for bad in [
            "",
            "1000",
            "a,b",
            "1000,",
            ",1000",
            "-1,5",
            "+1,5",
            "1,2,3",
            "99999999999999999999,1",
        ] {
            let err = negotiate(Some(bad), (0, 0)).unwrap_err();
            assert_eq!(err.0, bad);
        }
    }
}
