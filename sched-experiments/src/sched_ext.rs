//! Reading `/sys/kernel/sched_ext`: whether a BPF scheduler is in charge, which one, and
//! how many times one has been enabled since boot (`enable_seq`, so a silent unload and
//! reload inside a window shows).

use std::fs;
use std::path::{Path, PathBuf};

/// What the kernel reports about sched_ext at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedExtState {
    /// The kernel has no sched_ext support (no sysfs directory).
    Unsupported,
    /// No BPF scheduler is attached: the fair class (EEVDF) runs everything.
    Disabled,
    /// A BPF scheduler is attached; `ops` is its name (e.g. `simple`,
    /// `rusty_1.1.4_x86_64_unknown_linux_gnu`).
    Enabled { ops: String },
    /// `enabling` or `disabling`: wait, do not judge.
    Transitional(String),
    /// Any other state string, kept verbatim.
    Other(String),
}

impl SchedExtState {
    /// The state as the kernel spells it (`unsupported` when there is no sched_ext).
    pub fn name(&self) -> &str {
        match self {
            SchedExtState::Unsupported => "unsupported",
            SchedExtState::Disabled => "disabled",
            SchedExtState::Enabled { .. } => "enabled",
            SchedExtState::Transitional(s) | SchedExtState::Other(s) => s,
        }
    }
}

/// One reading of the sched_ext sysfs files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScxSnapshot {
    pub state: SchedExtState,
    /// `enable_seq`: schedulers enabled since boot (absent on kernels without the file).
    pub enable_seq: Option<u64>,
}

impl ScxSnapshot {
    /// As JSON for the result file.
    pub fn to_json(&self) -> serde_json::Value {
        let ops = match &self.state {
            SchedExtState::Enabled { ops } => serde_json::json!(ops),
            _ => serde_json::Value::Null,
        };
        serde_json::json!({
            "state": self.state.name(),
            "ops": ops,
            "enable_seq": self.enable_seq,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads the state under `root` (normally `/sys/kernel/sched_ext`).
pub fn read_state(root: &Path) -> Result<SchedExtState, SchedError> {
    Ok(read(root)?.state)
}

/// Reads state, ops and `enable_seq` under `root`.
pub fn read(root: &Path) -> Result<ScxSnapshot, SchedError> {
    if !root.is_dir() {
        return Ok(ScxSnapshot {
            state: SchedExtState::Unsupported,
            enable_seq: None,
        });
    }
    let file = |name: &str| {
        let path = root.join(name);
        fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|source| SchedError::Read { path, source })
    };
    let state = match file("state")?.as_str() {
        "enabled" => SchedExtState::Enabled {
            // `root/ops` can vanish between the two reads while a scheduler unloads.
            ops: file("root/ops").unwrap_or_default(),
        },
        "disabled" => SchedExtState::Disabled,
        s @ ("enabling" | "disabling") => SchedExtState::Transitional(s.to_string()),
        other => SchedExtState::Other(other.to_string()),
    };
    let enable_seq = file("enable_seq").ok().and_then(|s| s.parse().ok());
    Ok(ScxSnapshot { state, enable_seq })
}

/// The `ops` name a scheduler binary registers: `scx_simple` → `simple`. Production
/// schedulers append their version and target (`rusty_1.1.4_x86_64_unknown_linux_gnu`),
/// which [`ops_matches`] allows.
pub fn ops_name_of(binary: &str) -> String {
    let base = Path::new(binary)
        .file_name()
        .map_or(binary.to_string(), |s| s.to_string_lossy().into_owned());
    base.strip_prefix("scx_").unwrap_or(&base).to_string()
}

/// Whether the kernel's `ops` string names scheduler `name`: equal, or `name` followed by
/// `_` and a version suffix.
pub fn ops_matches(ops: &str, name: &str) -> bool {
    ops == name
        || ops
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('_'))
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake `/sys/kernel/sched_ext` for tests.
    use std::fs;
    use std::path::Path;

    pub fn set(root: &Path, state: &str, ops: Option<&str>, seq: Option<u64>) {
        fs::create_dir_all(root.join("root")).unwrap();
        fs::write(root.join("state"), format!("{state}\n")).unwrap();
        match ops {
            Some(o) => fs::write(root.join("root/ops"), format!("{o}\n")).unwrap(),
            None => {
                let _ = fs::remove_file(root.join("root/ops"));
            }
        }
        if let Some(s) = seq {
            fs::write(root.join("enable_seq"), format!("{s}\n")).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_state() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fake::set(r, "enabled", Some("rusty_1.1.4_x86_64"), Some(7));
        let s = read(r).unwrap();
        assert_eq!(
            s.state,
            SchedExtState::Enabled {
                ops: "rusty_1.1.4_x86_64".into()
            }
        );
        assert_eq!(s.enable_seq, Some(7));
        assert_eq!(s.to_json()["ops"], "rusty_1.1.4_x86_64");
        fake::set(r, "disabled", None, Some(7));
        assert_eq!(read_state(r).unwrap(), SchedExtState::Disabled);
        fake::set(r, "enabling", None, None);
        assert_eq!(
            read_state(r).unwrap(),
            SchedExtState::Transitional("enabling".into())
        );
        assert_eq!(
            read_state(Path::new("/nonexistent/sched_ext")).unwrap(),
            SchedExtState::Unsupported
        );
    }

    #[test]
    fn ops_names() {
        assert_eq!(ops_name_of("scx_simple"), "simple");
        assert_eq!(ops_name_of("/usr/bin/scx_rusty"), "rusty");
        assert_eq!(ops_name_of("mysched"), "mysched");
        assert!(ops_matches("simple", "simple"));
        assert!(ops_matches("rusty_1.1.4_x86_64_unknown_linux_gnu", "rusty"));
        assert!(!ops_matches("rustyx", "rusty"));
        assert!(!ops_matches("qmap", "simple"));
    }
}
