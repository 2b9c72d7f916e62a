//! Files the tests write: temporary directories removed on drop (also when the test panics),
//! and Kubernetes objects as one multi-document YAML text.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// A temporary directory, removed when dropped (also when the test panics).
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    /// A new empty directory `netwarden-test-<pid>-<n>-<tag>` in the system's temp dir.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("netwarden-test-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    /// Writes `name` atomically (temp file + rename), so a reader never sees half a file.
    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.path.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write temp file");
        std::fs::rename(&tmp, self.path.join(name)).expect("rename temp file");
    }

    /// Writes `name` in place, as an editor that truncates then writes would leave it midway.
    pub fn write_in_place(&self, name: &str, text: &str) {
        std::fs::write(self.path.join(name), text).expect("write file");
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.path.join(name)).expect("remove file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Documents as one multi-document YAML text, each document as JSON (which every YAML reader
/// takes as is, so that no label value such as `y` can be re-read as a boolean).
pub fn docs_text(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_json::to_string(d).expect("JSON"))
        .collect::<Vec<_>>()
        .join("\n---\n")
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dirs_clean_up() {
        let path = {
            let d = TempDir::new("t");
            d.write("a.yaml", "x");
            assert_eq!(std::fs::read_to_string(d.path.join("a.yaml")).unwrap(), "x");
            d.path.clone()
        };
        assert!(!path.exists());
    }
}
