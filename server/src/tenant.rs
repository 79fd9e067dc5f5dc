//! Who a request belongs to, for cache isolation and API keys.
//!
//! A tenant is the API key a request authenticated with (when the server has keys) and
//! the request's `cache_salt` (vLLM's field). Each tenant's prompts hash into their own
//! prefix-cache chain (`runtime::kv::tenant_root`), so tenants never share cached blocks:
//! one cannot learn from a faster answer that another sent the same prompt. Requests with
//! neither share the default domain, as before.
//!
//! Keys are compared in constant time: the presented key is hashed and compared with
//! every configured key's hash without an early exit. Keys never appear in logs or
//! metrics; a tenant is shown by its label.

use std::path::Path;

use runtime::kv::{tenant_root, BlockHash};
use sha2::{Digest, Sha256};

/// The configured API keys: (label, sha256 of the key).
#[derive(Clone, Debug)]
pub struct ApiKeys {
    entries: Vec<(String, [u8; 32])>,
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// The label of the key that may flush every tenant's prefix cache and read /metrics.
pub const ADMIN: &str = "admin";

/// Whether `label` may name a key: 1 to 64 of `A-Z a-z 0-9 _ . -` (labels appear in
/// /metrics and in persisted files).
pub fn valid_label(label: &str) -> bool {
    (1..=64).contains(&label.len())
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A tenant label from an untrusted source (a persisted file) reduced to the safe
/// alphabet (`A-Z a-z 0-9 _ . - /`, at most 160 bytes): anything else becomes `_`.
pub fn safe_label(s: &str) -> String {
    s.chars()
        .take(160)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl ApiKeys {
    /// One key, labelled `default`.
    pub fn single(key: &str) -> Result<ApiKeys, String> {
        if key.trim().is_empty() {
            return Err("--api-key: the key is empty".into());
        }
        Ok(ApiKeys {
            entries: vec![("default".into(), digest(key.trim()))],
        })
    }

    /// A keys file: one key per line, `LABEL KEY` or just `KEY` (labelled `key-N`);
    /// blank lines and `#` comments are skipped. Labels use `A-Z a-z 0-9 _ . -`; the key
    /// labelled `admin` may flush every tenant's cache and read /metrics.
    pub fn from_file(path: &Path) -> Result<ApiKeys, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--api-keys {}: {e}", path.display()))?;
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (label, key) = match line.split_once(char::is_whitespace) {
                Some((l, k)) => (l.to_string(), k.trim()),
                None => (format!("key-{}", entries.len() + 1), line),
            };
            if !valid_label(&label) {
                return Err(format!(
                    "--api-keys {}:{}: a label must be 1 to 64 of A-Z a-z 0-9 _ . -",
                    path.display(),
                    i + 1
                ));
            }
            if entries.iter().any(|(l, _)| *l == label) {
                return Err(format!(
                    "--api-keys {}:{}: label '{label}' used twice",
                    path.display(),
                    i + 1
                ));
            }
            entries.push((label, digest(key)));
        }
        if entries.is_empty() {
            return Err(format!("--api-keys {}: no keys", path.display()));
        }
        Ok(ApiKeys { entries })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The label of the key `presented` matches, comparing against every key in constant
    /// time per key.
    pub fn check(&self, presented: &str) -> Option<&str> {
        let d = digest(presented);
        let mut found = None;
        for (label, k) in &self.entries {
            let diff = k.iter().zip(&d).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(label.as_str());
            }
        }
        found
    }
}

/// The key in an `Authorization: Bearer KEY` (or `x-api-key: KEY`) header value.
pub fn bearer(authorization: Option<&str>, x_api_key: Option<&str>) -> Option<String> {
    authorization
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| rest.trim().to_string())
        })
        .or_else(|| x_api_key.map(|k| k.trim().to_string()))
}

/// A request's cache-isolation domain.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Tenant {
    /// How metrics show it: `default`, the key's label, `salt-XXXXXXXX`, or
    /// `LABEL/salt-XXXXXXXX` (a salt is shown by a short hash, never as given).
    pub label: String,
    /// The root of its prefix-cache chains (None: the shared default domain).
    pub root: Option<BlockHash>,
}

impl Tenant {
    /// The tenant of a request authenticated as `key_label` (None: no keys configured)
    /// with `cache_salt`. A salt is shown by a hash keyed with `label_key` (the server's
    /// secret), so a short salt cannot be found from its label by trying guesses.
    pub fn of(key_label: Option<&str>, cache_salt: Option<&str>, label_key: &[u8; 32]) -> Tenant {
        let salt_tag = cache_salt.map(|s| {
            let d = crate::persist::Mac::new(label_key).tag(s.as_bytes());
            format!("salt-{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3])
        });
        let label = match (key_label, &salt_tag) {
            (Some(k), Some(s)) => format!("{k}/{s}"),
            (Some(k), None) => k.to_string(),
            (None, Some(s)) => s.clone(),
            (None, None) => "default".to_string(),
        };
        // The chain id covers the key label and the salt itself (not its short tag).
        let id = match (key_label, cache_salt) {
            (None, None) => Vec::new(),
            (k, s) => format!("key:{}\0salt:{}", k.unwrap_or(""), s.unwrap_or("")).into_bytes(),
        };
        Tenant {
            label,
            root: tenant_root(&id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_labels() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("keys");
        std::fs::write(&f, "# tenants\nalice sk-aaa\n\nbob sk-bbb\nsk-ccc\n").unwrap();
        let k = ApiKeys::from_file(&f).unwrap();
        assert_eq!(k.len(), 3);
        assert_eq!(k.check("sk-aaa"), Some("alice"));
        assert_eq!(k.check("sk-ccc"), Some("key-3"));
        assert_eq!(k.check("sk-aa"), None);
        assert_eq!(k.check(""), None);
        std::fs::write(&f, "a k1\na k2\n").unwrap();
        assert!(ApiKeys::from_file(&f).unwrap_err().contains("used twice"));
        std::fs::write(&f, "a\"b k1\n").unwrap();
        assert!(ApiKeys::from_file(&f).unwrap_err().contains("label"));
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(ApiKeys::from_file(&f).unwrap_err().contains("no keys"));
        assert!(ApiKeys::single(" ").is_err());
        assert_eq!(ApiKeys::single("s").unwrap().check("s"), Some("default"));
    }

    #[test]
    fn labels_are_safe() {
        assert!(valid_label("team-a.1_x"));
        assert!(!valid_label("a\"b") && !valid_label("") && !valid_label("a b"));
        assert_eq!(
            safe_label("x\"} 1\nrserve_forged 1"),
            "x___1_rserve_forged_1"
        );
        assert_eq!(safe_label("alice/salt-0a1b"), "alice/salt-0a1b");
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer(Some("Bearer sk-1"), None).as_deref(), Some("sk-1"));
        assert_eq!(bearer(Some("bearer  sk-1 "), None).as_deref(), Some("sk-1"));
        assert_eq!(bearer(Some("Basic xyz"), None), None);
        assert_eq!(bearer(None, Some("sk-2")).as_deref(), Some("sk-2"));
        assert_eq!(bearer(None, None), None);
    }

    #[test]
    fn tenants_separate_by_key_and_salt() {
        let k = [3u8; 32];
        let d = Tenant::of(None, None, &k);
        assert_eq!((d.label.as_str(), d.root), ("default", None));
        let a = Tenant::of(Some("alice"), None, &k);
        let a2 = Tenant::of(Some("alice"), None, &k);
        let b = Tenant::of(Some("bob"), None, &k);
        let s = Tenant::of(None, Some("secret"), &k);
        let as_ = Tenant::of(Some("alice"), Some("secret"), &k);
        // The salt's label depends on the server's key: not guessable offline.
        let other = Tenant::of(None, Some("secret"), &[4u8; 32]);
        assert_ne!(s.label, other.label);
        assert_eq!(s.root, other.root);
        assert_eq!(a, a2);
        assert_ne!(a.root, b.root);
        assert_ne!(s.root, as_.root);
        assert_ne!(a.root, None);
        assert!(s.label.starts_with("salt-") && !s.label.contains("secret"));
        assert!(as_.label.starts_with("alice/salt-"));
    }
}
