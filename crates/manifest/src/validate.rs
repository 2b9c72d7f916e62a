//! Syntax checks for the strings that leave the loader: object names, label keys and values,
//! network names and Linux interface names.
//!
//! These checks are a security boundary, not just hygiene: names end up in nft/iptables rule
//! comments, log prefixes and netns paths, so everything that passes here is plain ASCII from a
//! small alphabet. Each function returns `Err(reason)` with a human-readable reason.

/// Longest Linux interface name (IFNAMSIZ - 1).
pub const IFNAME_MAX: usize = 15;

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// RFC 1123 label: 1-63 chars of `[a-z0-9-]`, starting and ending alphanumeric
/// (what Kubernetes requires of namespace names).
pub fn dns1123_label(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err("must not be empty".into());
    }
    if b.len() > 63 {
        return Err(format!("must be at most 63 characters (is {})", b.len()));
    }
    if !b.iter().all(|&c| is_lower_alnum(c) || c == b'-') {
        return Err(format!(
            "{:?} must consist of lower-case letters, digits and '-' (RFC 1123 label)",
            s
        ));
    }
    if !is_lower_alnum(b[0]) || !is_lower_alnum(b[b.len() - 1]) {
        return Err(format!("{s:?} must start and end with a letter or digit"));
    }
    Ok(())
}

/// RFC 1123 subdomain: at most 253 chars, dot-separated labels (what Kubernetes requires of most
/// object names).
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err(format!("must be at most 253 characters (is {})", s.len()));
    }
    let b = s.as_bytes();
    if !b
        .iter()
        .all(|&c| is_lower_alnum(c) || c == b'-' || c == b'.')
    {
        return Err(format!(
            "{s:?} must consist of lower-case letters, digits, '-' and '.' (RFC 1123 subdomain)"
        ));
    }
    if !is_lower_alnum(b[0]) || !is_lower_alnum(b[b.len() - 1]) {
        return Err(format!("{s:?} must start and end with a letter or digit"));
    }
    if s.split('.').any(|part| {
        part.is_empty()
            || !is_lower_alnum(part.as_bytes()[0])
            || !is_lower_alnum(part.as_bytes()[part.len() - 1])
    }) {
        return Err(format!(
            "{s:?}: every dot-separated part must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// The name part of a label key and a non-empty label value: at most 63 chars, alphanumeric at
/// both ends, `[-_.A-Za-z0-9]` inside.
fn qualified_name_part(s: &str, what: &str) -> Result<(), String> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if b.len() > 63 {
        return Err(format!(
            "{what} must be at most 63 characters (is {})",
            b.len()
        ));
    }
    if !b
        .iter()
        .all(|&c| is_alnum(c) || matches!(c, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "{what} {s:?} may contain only letters, digits, '-', '_' and '.'"
        ));
    }
    if !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return Err(format!(
            "{what} {s:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// A label (or annotation) key: `[prefix/]name`, prefix a DNS-1123 subdomain.
pub fn label_key(s: &str) -> Result<(), String> {
    match s.split_once('/') {
        Some((prefix, name)) => {
            dns1123_subdomain(prefix).map_err(|e| format!("label key prefix: {e}"))?;
            qualified_name_part(name, "label key name")
        }
        None => qualified_name_part(s, "label key"),
    }
}

/// A label value: empty, or like the name part of a key.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    qualified_name_part(s, "label value")
}

/// A Linux interface name as netwarden accepts it: 1..=15 chars of `[A-Za-z0-9_.-]`, not `.`
/// or `..`. The kernel allows more (anything but `/`, whitespace and NUL), but these names are
/// pasted into rule text, so the alphabet is kept small on purpose.
pub fn ifname(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("interface name must not be empty".into());
    }
    if s.len() > IFNAME_MAX {
        return Err(format!(
            "interface name {:?} is longer than {IFNAME_MAX} characters",
            s.escape_debug().to_string()
        ));
    }
    if !s
        .bytes()
        .all(|c| is_alnum(c) || matches!(c, b'_' | b'.' | b'-'))
    {
        return Err(format!(
            "interface name {:?} may contain only letters, digits, '_', '.' and '-'",
            s.escape_debug().to_string()
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("interface name {s:?} is reserved"));
    }
    Ok(())
}

/// A named port (IANA_SVC_NAME): 1-15 chars of `[a-z0-9-]`, at least one letter, no leading,
/// trailing or doubled `-`.
pub fn port_name(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err("port name must not be empty".into());
    }
    if b.len() > 15 {
        return Err(format!("port name {s:?} is longer than 15 characters"));
    }
    if !b.iter().all(|&c| is_lower_alnum(c) || c == b'-') {
        return Err(format!(
            "port name {s:?} may contain only lower-case letters, digits and '-'"
        ));
    }
    if !b.iter().any(|c| c.is_ascii_lowercase()) {
        return Err(format!(
            "port name {s:?} must contain a letter (write a numeric port as a number, not a string)"
        ));
    }
    if b[0] == b'-' || b[b.len() - 1] == b'-' || s.contains("--") {
        return Err(format!(
            "port name {s:?} must not start or end with '-' or contain \"--\""
        ));
    }
    Ok(())
}

/// A network namespace path from an annotation or a DanmEp: absolute, printable, no whitespace.
/// It is opened by the agent (never passed to a shell), but it still appears in logs.
pub fn netns_path(s: &str) -> Result<(), String> {
    if !s.starts_with('/') {
        return Err(format!(
            "netns path {:?} must be absolute",
            s.escape_debug().to_string()
        ));
    }
    if s.len() > 4096 {
        return Err("netns path is too long".into());
    }
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "netns path {:?} must not contain whitespace or control characters",
            s.escape_debug().to_string()
        ));
    }
    Ok(())
}

/// Shortens user input quoted in a reason so that one huge value cannot flood the output.
pub fn shorten(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.escape_debug().to_string()
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{}...", head.escape_debug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["app", "a", "app.kubernetes.io/name", "x_y.z-1", "k8s.io/A"] {
            assert_eq!(label_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a b",
            "/a",
            "a/",
            "Foo.io/a",
            "a/b/c",
            &"x".repeat(64),
        ] {
            assert!(label_key(bad).is_err(), "{bad:?}");
        }
        for ok in ["", "v1", "a.b_c-d", &"x".repeat(63)] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-", "a b", "a\"", "é", &"x".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names() {
        assert!(dns1123_label("kube-system").is_ok());
        assert!(dns1123_label("a.b").is_err());
        assert!(dns1123_label("A").is_err());
        assert!(dns1123_subdomain("a.b-c.d").is_ok());
        assert!(dns1123_subdomain("a..b").is_err());
        assert!(dns1123_subdomain("a.-b").is_err());
        assert!(dns1123_subdomain("x;drop").is_err());
        assert!(dns1123_subdomain(&"a".repeat(254)).is_err());
    }

    #[test]
    fn ifnames() {
        for ok in ["eth0", "net1", "vlan.100", "a_b-c", "123456789012345"] {
            assert_eq!(ifname(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "1234567890123456",
            "a/b",
            "a b",
            "a\"b",
            "a;b",
            ".",
            "..",
            "ä",
        ] {
            assert!(ifname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn port_names() {
        assert!(port_name("http").is_ok());
        assert!(port_name("http-alt2").is_ok());
        assert!(port_name("80").is_err());
        assert!(port_name("-http").is_err());
        assert!(port_name("a--b").is_err());
        assert!(port_name("HTTP").is_err());
        assert!(port_name("abcdefghijklmnop").is_err());
    }
}
