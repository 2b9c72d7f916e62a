//! Failures as the real server reports them: a `Status` object (`kind: Status`, `status:
//! Failure`, `reason`, `message`, `code`, `details`) with the matching HTTP code. kube-rs turns
//! these into `kube::Error::Api(ErrorResponse)` and its watcher decides on `code` (410 → relist),
//! so the reasons and codes are those of kube-apiserver.

use serde_json::{json, Value};

/// One failed request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` of the Status (name, group, kind of the object concerned; causes).
    pub details: Option<Value>,
    /// For an expired continue token: a token that continues at the current state, as the
    /// real server offers one in the Status's list metadata.
    pub continue_token: Option<String>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        ApiError {
            code,
            reason,
            message,
            details: None,
            continue_token: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `pods "web" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(404, "NotFound", format!("{what} \"{name}\" not found"))
            .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// A path nothing is served at (an unknown group, or a CRD that is not installed).
    pub fn no_such_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        )
        .with_details(json!({}))
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "AlreadyExists",
            format!("{what} \"{name}\" already exists"),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// An update that named a resourceVersion other than the stored one.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    pub fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// A field of the object or of the query is invalid (422, as the real server's validation).
    pub fn invalid(kind: &str, name: &str, message: String) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {message}"),
        )
        .with_details(json!({"name": name, "kind": kind}))
    }

    /// A resourceVersion older than the retained history (410 Gone, reason Expired).
    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// A continue token whose snapshot is older than the retained history.
    pub fn continue_expired(fresh_token: String) -> Self {
        let mut e = Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.".into(),
        );
        e.continue_token = Some(fresh_token);
        e
    }

    /// A resourceVersion newer than the server has (the real server waits a few seconds first).
    pub fn too_large(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }))
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method}"),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {content_type:?}"),
        )
    }

    /// What a watch ends with when etcd or the watch cache fails under it (kube-apiserver's
    /// `InternalError`, sent as an ERROR event).
    pub fn internal_error(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
    }

    pub fn unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request".into(),
        )
    }

    /// The `Status` object sent as the response body, or as the object of a watch ERROR event.
    pub fn to_status(&self) -> Value {
        let mut metadata = json!({});
        if let Some(token) = &self.continue_token {
            metadata["continue"] = json!(token);
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `pods` for the core group, `networkpolicies.networking.k8s.io` otherwise (the real server's
/// qualified resource in messages).
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_reason_code_and_details() {
        let s = ApiError::not_found("networking.k8s.io", "networkpolicies", "deny").to_status();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(
            s["message"],
            "networkpolicies.networking.k8s.io \"deny\" not found"
        );
        assert_eq!(s["details"]["name"], "deny");
        let s = ApiError::too_old(5, 9).to_status();
        assert_eq!(
            (s["code"].as_u64(), s["reason"].as_str()),
            (Some(410), Some("Expired"))
        );
        assert_eq!(s["message"], "too old resource version: 5 (9)");
        let s = ApiError::continue_expired("tok".into()).to_status();
        assert_eq!(s["metadata"]["continue"], "tok");
    }
}
