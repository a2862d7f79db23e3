//! `herald sub --save-dir DIR [--exec CMD]`: each message becomes a file, and optionally a
//! command runs on it — what VBDS's client offered with `--dir` and `--action`, so an analysis
//! script can consume a camera stream without writing a client.

use anyhow::Context;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes `payload` to `dir` as `<topic with / as _>-<seq>.<ext>` and returns the path. The file
/// is written under a temporary name and renamed, so a reader watching the directory never sees
/// a partial image.
pub fn save(dir: &Path, header: &Value, payload: &[u8], binary: bool) -> anyhow::Result<PathBuf> {
    let topic = header["topic"]
        .as_str()
        .unwrap_or("message")
        .replace('/', "_");
    let seq = header["seq"].as_u64().unwrap_or(0);
    let ext = extension(header["ct"].as_str(), binary);
    let path = dir.join(format!("{topic}-{seq}.{ext}"));
    let partial = dir.join(format!(".{topic}-{seq}.{ext}.part"));
    std::fs::write(&partial, payload)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, &path)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), path.display()))?;
    Ok(path)
}

/// A file extension for a content type: the well-known ones by name, otherwise a short
/// alphanumeric subtype, otherwise `txt` (text) or `bin`.
fn extension(content_type: Option<&str>, binary: bool) -> String {
    let fallback = if binary { "bin" } else { "txt" };
    let Some(ct) = content_type else {
        return fallback.into();
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let known = match essence.as_str() {
        "image/fits" | "application/fits" => Some("fits"),
        "image/jpeg" => Some("jpg"),
        "image/png" => Some("png"),
        "application/json" => Some("json"),
        "text/plain" => Some("txt"),
        "text/csv" => Some("csv"),
        "application/octet-stream" => Some("bin"),
        _ => None,
    };
    if let Some(ext) = known {
        return ext.into();
    }
    let subtype = essence.rsplit('/').next().unwrap_or("");
    let subtype = subtype.strip_prefix("x-").unwrap_or(subtype);
    if !subtype.is_empty()
        && subtype.len() <= 8
        && subtype.chars().all(|c| c.is_ascii_alphanumeric())
    {
        subtype.into()
    } else {
        fallback.into()
    }
}

/// Runs `command` (a shell command line) with the file's path as its last argument, and
/// `HERALD_TOPIC` / `HERALD_SEQ` in its environment; waits for it, so a slow command makes this
/// subscriber slow (and its slow-consumer policy applies). A failing command is reported, not
/// fatal.
pub fn exec(command: &str, path: &Path, header: &Value) -> anyhow::Result<()> {
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("{command} \"$1\""))
        .arg("herald")
        .arg(path)
        .env("HERALD_TOPIC", header["topic"].as_str().unwrap_or_default())
        .env("HERALD_SEQ", header["seq"].to_string())
        .status()
        .with_context(|| format!("cannot run `{command}`"))?;
    if !status.success() {
        eprintln!(
            "herald: `{command}` exited with {status} for {}",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::extension;

    #[test]
    fn extensions_come_from_the_content_type() {
        assert_eq!(extension(Some("image/fits"), true), "fits");
        assert_eq!(extension(Some("image/jpeg; q=1"), true), "jpg");
        assert_eq!(extension(Some("image/x-raw16"), true), "raw16");
        assert_eq!(extension(Some("application/vnd.weird+thing"), true), "bin");
        assert_eq!(extension(None, false), "txt");
        assert_eq!(extension(None, true), "bin");
    }
}
