//! STOMP protocol versions and their negotiation: a client lists the versions it speaks in
//! `accept-version` on CONNECT (none listed means 1.0), and the server picks the highest one it
//! also speaks (specification, "Protocol Negotiation").

use std::fmt;

/// A STOMP version herald speaks. The version decides how header values are escaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V1_0,
    V1_1,
    V1_2,
}

/// The versions herald speaks, as an ERROR frame's `version` header lists them.
pub const SUPPORTED: &str = "1.0,1.1,1.2";

impl Version {
    /// As written in `accept-version` and CONNECTED's `version`: `1.2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }

    /// The WebSocket subprotocol naming this version: `v12.stomp`.
    pub fn subprotocol(self) -> &'static str {
        match self {
            Version::V1_0 => "v10.stomp",
            Version::V1_1 => "v11.stomp",
            Version::V1_2 => "v12.stomp",
        }
    }

    fn parse(s: &str) -> Option<Version> {
        match s.trim() {
            "1.0" => Some(Version::V1_0),
            "1.1" => Some(Version::V1_1),
            "1.2" => Some(Version::V1_2),
            _ => None,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// No version the client accepts is one herald speaks. The ERROR frame that says so carries
/// [`SUPPORTED`] in its `version` header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no supported protocol version in accept-version {offered:?}; herald supports {SUPPORTED}")]
pub struct UnsupportedVersion {
    pub offered: String,
}

/// The version to speak with a client whose CONNECT (or STOMP) frame has `accept_version`: the
/// highest one both sides speak. Absent means the client speaks only 1.0. Versions herald does
/// not know (`2.0`) are skipped, as the specification's negotiation implies.
pub fn negotiate(accept_version: Option<&str>) -> Result<Version, UnsupportedVersion> {
    let Some(offered) = accept_version else {
        return Ok(Version::V1_0);
    };
    offered
        .split(',')
        .filter_map(Version::parse)
        .max()
        .ok_or_else(|| UnsupportedVersion {
            offered: offered.chars().take(80).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_highest_common_version() {
        assert_eq!(negotiate(None), Ok(Version::V1_0));
        assert_eq!(negotiate(Some("1.0")), Ok(Version::V1_0));
        assert_eq!(negotiate(Some("1.1")), Ok(Version::V1_1));
        assert_eq!(negotiate(Some("1.2,1.1,1.0")), Ok(Version::V1_2));
        assert_eq!(negotiate(Some("1.0,1.1")), Ok(Version::V1_1));
        assert_eq!(negotiate(Some("1.1, 1.2")), Ok(Version::V1_2));
        assert_eq!(negotiate(Some("2.0,1.1")), Ok(Version::V1_1));
    }

    #[test]
    fn refuses_a_client_without_a_common_version() {
        let err = negotiate(Some("2.0,3")).unwrap_err();
        assert_eq!(err.offered, "2.0,3");
        assert!(err.to_string().contains("1.0,1.1,1.2"), "{err}");
        assert!(negotiate(Some("")).is_err());
    }

    #[test]
    fn names_the_websocket_subprotocols() {
        let names = [Version::V1_0, Version::V1_1, Version::V1_2].map(Version::subprotocol);
        assert_eq!(names, ["v10.stomp", "v11.stomp", "v12.stomp"]);
    }
}
