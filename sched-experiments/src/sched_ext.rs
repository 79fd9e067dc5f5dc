//! Reading `/sys/kernel/sched_ext`: whether a BPF scheduler is enabled and which one.

use std::fs;
use std::path::{Path, PathBuf};

/// What the kernel reports about sched_ext at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedExtState {
    /// The kernel has no sched_ext support (no sysfs directory).
    Unsupported,
    /// sched_ext exists but no BPF scheduler is attached: the default scheduler runs.
    Disabled,
    /// A BPF scheduler is attached; `ops` is its name (e.g. `rusty_1.0.0`).
    Enabled { ops: String },
    /// Transitional or unknown state string, kept verbatim.
    Other(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("expected scheduler {expected:?} to be active {when} the measured window, but the kernel reports {found:?}")]
    NotActive {
        expected: String,
        when: &'static str,
        found: SchedExtState,
    },
}

/// Reads the state under `root` (normally `/sys/kernel/sched_ext`).
pub fn read_state(root: &Path) -> Result<SchedExtState, SchedError> {
    if !root.is_dir() {
        return Ok(SchedExtState::Unsupported);
    }
    let read = |name: &str| {
        let path = root.join(name);
        fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|source| SchedError::Read { path, source })
    };
    Ok(match read("state")?.as_str() {
        "enabled" => SchedExtState::Enabled {
            ops: read("root/ops")?,
        },
        "disabled" => SchedExtState::Disabled,
        other => SchedExtState::Other(other.to_string()),
    })
}

/// Checks that `expected` (a sched_ext ops name prefix, or `default` for no BPF scheduler)
/// matches `state`; `when` says "before" or "after" for the error message.
pub fn verify(expected: &str, state: &SchedExtState, when: &'static str) -> Result<(), SchedError> {
    let ok = match state {
        SchedExtState::Enabled { ops } => expected != "default" && ops.starts_with(expected),
        SchedExtState::Disabled | SchedExtState::Unsupported => expected == "default",
        SchedExtState::Other(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(SchedError::NotActive {
            expected: expected.to_string(),
            when,
            found: state.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(state: &str, ops: Option<&str>) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        fs::write(d.0.join("state"), format!("{state}\n")).unwrap();
        if let Some(ops) = ops {
            fs::create_dir_all(d.0.join("root")).unwrap();
            fs::write(d.0.join("root/ops"), format!("{ops}\n")).unwrap();
        }
        d
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "schedext-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn reads_enabled_disabled_and_missing() {
        let d = fake("enabled", Some("rusty_1.0.7"));
        let s = read_state(&d.0).unwrap();
        assert_eq!(
            s,
            SchedExtState::Enabled {
                ops: "rusty_1.0.7".into()
            }
        );
        assert!(verify("rusty", &s, "before").is_ok());
        assert!(verify("lavd", &s, "before").is_err());
        assert!(verify("default", &s, "before").is_err());

        let d = fake("disabled", None);
        let s = read_state(&d.0).unwrap();
        assert_eq!(s, SchedExtState::Disabled);
        assert!(verify("default", &s, "after").is_ok());
        let e = verify("rusty", &s, "after").unwrap_err().to_string();
        assert!(e.contains("after") && e.contains("Disabled"), "{e}");

        assert_eq!(
            read_state(Path::new("/nonexistent/sched_ext")).unwrap(),
            SchedExtState::Unsupported
        );
    }
}
