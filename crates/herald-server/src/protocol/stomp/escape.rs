//! Header escaping (specification, "Value Encoding"). STOMP 1.2 writes CR, LF, `:` and `\` in a
//! header name or value as `\r`, `\n`, `\c` and `\\`; 1.1 has the same escapes but `\r`; 1.0 has
//! none. CONNECT, STOMP and CONNECTED frames are never escaped, so that a client and a server
//! can read them before they agree on a version. Any other `\` sequence is a fatal error.

use super::version::Version;
use bytes::BufMut;

/// A `\` sequence the frame's version does not define.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndefinedEscape(pub String);

/// `raw` as the header text it stands for in `version`.
pub fn unescape(raw: &str, version: Version) -> Result<String, UndefinedEscape> {
    if version == Version::V1_0 || !raw.contains('\\') {
        return Ok(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next() {
            Some('n') => '\n',
            Some('c') => ':',
            Some('\\') => '\\',
            Some('r') if version == Version::V1_2 => '\r',
            other => {
                let seq = other.map_or_else(|| "\\".to_owned(), |c| format!("\\{c}"));
                return Err(UndefinedEscape(seq));
            }
        });
    }
    Ok(out)
}

/// Writes `text` as a header name or value of a frame in `version`, escaped if the version has
/// escapes. Where it has none for a character that would end the line (CR and LF in 1.0, CR in
/// an unescaped frame), a space stands for it: herald's topics and ids never hold one, and a
/// frame boundary must never come from a value.
pub fn write(out: &mut impl BufMut, text: &str, version: Option<Version>) {
    let escapes = match version {
        Some(Version::V1_2) => b"\r\n:\\".as_slice(),
        Some(Version::V1_1) => b"\n:\\",
        Some(Version::V1_0) | None => b"",
    };
    // Values seldom hold a character to escape: what lies between two is copied whole, not
    // a byte at a time (every MESSAGE writes its destination and epoch through here).
    let mut rest = text.as_bytes();
    while let Some(at) = rest
        .iter()
        .position(|b| matches!(b, b'\r' | b'\n' | b':' | b'\\'))
    {
        out.put_slice(&rest[..at]);
        match rest[at] {
            b if escapes.contains(&b) => out.put_slice(match b {
                b'\r' => b"\\r",
                b'\n' => b"\\n",
                b':' => b"\\c",
                _ => b"\\\\",
            }),
            b'\r' | b'\n' => out.put_u8(b' '),
            b => out.put_u8(b),
        }
        rest = &rest[at + 1..];
    }
    out.put_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(text: &str, version: Option<Version>) -> String {
        let mut out = Vec::new();
        write(&mut out, text, version);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escapes_per_version() {
        let text = "a:b\nc\\d\re";
        assert_eq!(written(text, Some(Version::V1_2)), "a\\cb\\nc\\\\d\\re");
        // 1.1 has no `\r`; a lone CR inside a line does not end it there (lines end in LF).
        assert_eq!(written(text, Some(Version::V1_1)), "a\\cb\\nc\\\\d e");
        assert_eq!(written(text, Some(Version::V1_0)), "a:b c\\d e");
        assert_eq!(written(text, None), "a:b c\\d e");
        assert_eq!(
            written("plain ünïcode", Some(Version::V1_2)),
            "plain ünïcode"
        );
    }

    #[test]
    fn unescape_inverts_write() {
        for text in ["", "a:b\nc\\d\re", "\\\\", "::", "\n\n", "é:\\"] {
            let v = Version::V1_2;
            assert_eq!(unescape(&written(text, Some(v)), v).unwrap(), text);
        }
        let v = Version::V1_1;
        assert_eq!(
            unescape(&written("a:b\n\\", Some(v)), v).unwrap(),
            "a:b\n\\"
        );
    }

    #[test]
    fn undefined_escapes_are_errors() {
        assert_eq!(
            unescape("a\\tb", Version::V1_2),
            Err(UndefinedEscape("\\t".into()))
        );
        assert_eq!(
            unescape("a\\", Version::V1_2),
            Err(UndefinedEscape("\\".into()))
        );
        assert_eq!(
            unescape("\\r", Version::V1_1),
            Err(UndefinedEscape("\\r".into()))
        );
        assert_eq!(
            unescape("\\é", Version::V1_2),
            Err(UndefinedEscape("\\é".into()))
        );
        // 1.0 has no escapes: a backslash is itself.
        assert_eq!(unescape("a\\tb", Version::V1_0).unwrap(), "a\\tb");
    }
}
