//! OpenAI-shaped API errors: `{"error": {"message", "type", "param", "code"}}` plus the
//! HTTP status and, for overload, a `Retry-After` hint.

use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// 400: the request is malformed or its values are out of range.
    InvalidRequest,
    /// 401: a missing or wrong API key.
    Unauthorized,
    /// 403: refused before anything else (a `Host` this server does not answer to).
    Forbidden,
    /// 404: unknown route.
    NotFound,
    /// 404: the request's `model` is not served here.
    ModelNotFound,
    /// 408: the request did not arrive in time.
    Timeout,
    /// 413: body larger than the configured limit.
    PayloadTooLarge,
    /// 415: a POST body that is not `application/json`.
    UnsupportedMediaType,
    /// 429: the admission queue is full.
    Overloaded { retry_after_s: u32 },
    /// 503: the server is loading or shutting down.
    Unavailable { retry_after_s: u32 },
    /// 500: a bug; the message says what failed.
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ApiErrorKind,
    pub message: String,
    pub param: Option<String>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
        }
    }

    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            kind: ApiErrorKind::InvalidRequest,
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn status(&self) -> u16 {
        match self.kind {
            ApiErrorKind::InvalidRequest => 400,
            ApiErrorKind::Unauthorized => 401,
            ApiErrorKind::Forbidden => 403,
            ApiErrorKind::NotFound | ApiErrorKind::ModelNotFound => 404,
            ApiErrorKind::Timeout => 408,
            ApiErrorKind::PayloadTooLarge => 413,
            ApiErrorKind::UnsupportedMediaType => 415,
            ApiErrorKind::Overloaded { .. } => 429,
            ApiErrorKind::Unavailable { .. } => 503,
            ApiErrorKind::Internal => 500,
        }
    }

    /// Seconds for the `Retry-After` header, where one applies.
    pub fn retry_after(&self) -> Option<u32> {
        match self.kind {
            ApiErrorKind::Overloaded { retry_after_s }
            | ApiErrorKind::Unavailable { retry_after_s } => Some(retry_after_s),
            _ => None,
        }
    }

    pub fn body_json(&self) -> String {
        let (ty, code) = match self.kind {
            ApiErrorKind::InvalidRequest => ("invalid_request_error", None),
            ApiErrorKind::Unauthorized => ("invalid_request_error", Some("invalid_api_key")),
            ApiErrorKind::Forbidden => ("invalid_request_error", Some("forbidden")),
            ApiErrorKind::NotFound => ("invalid_request_error", Some("not_found")),
            ApiErrorKind::ModelNotFound => ("invalid_request_error", Some("model_not_found")),
            ApiErrorKind::Timeout => ("invalid_request_error", Some("request_timeout")),
            ApiErrorKind::PayloadTooLarge => ("invalid_request_error", Some("payload_too_large")),
            ApiErrorKind::UnsupportedMediaType => {
                ("invalid_request_error", Some("unsupported_media_type"))
            }
            ApiErrorKind::Overloaded { .. } => ("server_overloaded", Some("rate_limit_exceeded")),
            ApiErrorKind::Unavailable { .. } => ("service_unavailable", None),
            ApiErrorKind::Internal => ("server_error", None),
        };
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                ty,
                param: self.param.as_deref(),
                code,
            },
        })
        .expect("plain struct serialises")
    }
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        use axum::http::{header, HeaderValue, StatusCode};
        let mut r = (
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body_json(),
        )
            .into_response();
        if let Some(s) = self.retry_after() {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openai_shape() {
        let e = ApiError::invalid_param(
            "max_tokens",
            "prompt (3000 tokens) + max_tokens (2000) exceeds the context of 4096",
        );
        assert_eq!(e.status(), 400);
        let v: serde_json::Value = serde_json::from_str(&e.body_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "max_tokens");
        assert!(v["error"]["message"].as_str().unwrap().contains("4096"));
        let o = ApiError::new(ApiErrorKind::Overloaded { retry_after_s: 1 }, "queue full");
        assert_eq!((o.status(), o.retry_after()), (429, Some(1)));
    }
}
