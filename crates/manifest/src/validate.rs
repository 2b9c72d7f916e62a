//! Syntax checks for the strings that leave the loader: object names, label keys and values,
//! network names and Linux interface names.
//!
//! These checks are a security boundary, not just hygiene: object names and labels end up in
//! nft/iptables rule comments, log prefixes and netns paths, so everything that passes those
//! checks is plain ASCII from a small alphabet. Interface names are the exception: they are
//! what the kernel allows ([`ifname`]), since a pod's interface that netwarden refused to name
//! would be left uncovered; the renderers quote them with escaping or match them by index.
//! Each function returns `Err(reason)` with a human-readable, one-line reason.

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

/// A Linux interface name, accepted exactly when the kernel accepts it (`dev_valid_name` in
/// `net/core/dev.c`): 1 to 15 bytes, not `.` or `..`, and no `/`, `:`, NUL or white space as
/// the kernel's `isspace` sees it (space, `\t`, `\n`, `\v`, `\f`, `\r`, and the byte 0xA0,
/// which its Latin-1 table counts as a space; in UTF-8 it is a continuation byte of characters
/// such as `à`).
///
/// Any other byte is legal, quotes, `;`, `$`, `{` and control characters included, so these
/// names are never pasted into rule text: the renderers quote them with escaping or match the
/// interface by index. Names outside the kernel's rules cannot exist on a real interface, so
/// refusing them loses nothing.
pub fn ifname(s: &str) -> Result<(), String> {
    let shown = || s.escape_debug().to_string();
    if s.is_empty() {
        return Err("interface name must not be empty".into());
    }
    if s.len() > IFNAME_MAX {
        return Err(format!(
            "interface name \"{}\" is longer than {IFNAME_MAX} bytes",
            shown()
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("interface name {s:?} is reserved"));
    }
    let forbidden = |b: u8| {
        matches!(
            b,
            b'/' | b':' | 0 | b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0xa0
        )
    };
    if s.bytes().any(forbidden) {
        return Err(format!(
            "interface name \"{}\" contains '/', ':', a NUL byte or white space, which Linux \
             does not allow",
            shown()
        ));
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
    // The common case, every name of a cluster: printable ASCII that `escape_debug` leaves as
    // it is, copied without going through the formatter (this labels every object read).
    if s.len() <= MAX
        && s.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && !matches!(b, b'\\' | b'"' | b'\''))
    {
        return s.to_string();
    }
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
    fn shortened_text_is_escaped_as_escape_debug_escapes_it() {
        // The ASCII fast path must agree with the formatter on every printable byte and on
        // those it escapes.
        let every_ascii: String = (0u8..=127).map(char::from).collect();
        for s in [
            "app",
            "ns0/pod-17",
            "a\\b",
            "say \"hi\"",
            "it's",
            "tab\there",
            "\u{7f}",
            "é",
            "a\u{301}",
            &every_ascii[..60],
            &every_ascii[60..],
        ] {
            assert_eq!(shorten(s), s.escape_debug().to_string(), "{s:?}");
        }
        let long = "x".repeat(81);
        assert_eq!(shorten(&long), format!("{}...", "x".repeat(80)));
    }

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
    fn ifnames_are_what_the_kernel_accepts() {
        for ok in [
            "eth0",
            "net1",
            "vlan.100",
            "a_b-c",
            "123456789012345",
            "a\"b;+",
            "x\\y*",
            "$(id)",
            "eth0{}",
            "a'b",
            "#c",
            "\u{1}\u{7f}",
            "é",
            "...",
            "-",
        ] {
            assert_eq!(ifname(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            "",
            "1234567890123456",
            "ééééééé_é",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "a\nb",
            "a\u{b}b",
            "a\u{c}b",
            "a\rb",
            "a\0b",
            // U+00E0 is C3 A0 in UTF-8: the kernel's isspace counts 0xA0 as a space.
            "à",
            "\u{a0}",
        ] {
            let err = ifname(bad).expect_err(bad);
            assert!(!err.contains('\n') && !err.contains('\0'), "{err}");
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
