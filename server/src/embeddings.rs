//! OpenAI's `POST /v1/embeddings`: each input is tokenized as llama-server does (the
//! model's BOS/EOS added as it asks) and runs through the engine's batch loop beside the
//! generation traffic as a prompt-only sequence whose hidden states (after the final
//! norm) are pooled as the file's `pooling_type` (or `--pooling`) says: mean, CLS or last
//! token, then L2-normalized. Vectors come back as floats or, with
//! `encoding_format: "base64"`, as the base64 of their little-endian f32 bytes.

use serde_json::{json, Value};

use runtime::model::Pooling;
use runtime::tokenizer::Tokenizer;

use crate::error::{ApiError, ApiErrorKind};

/// The most inputs one request may carry (fewer where the server's queue is shorter:
/// every input waits in it as a sequence of its own).
pub const MAX_INPUTS: usize = 256;

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// A validated embeddings request.
#[derive(Debug)]
pub struct EmbedRequest {
    pub model: Option<String>,
    pub inputs: Vec<Vec<u32>>,
    pub base64: bool,
}

/// Reads a request body against the model's tokenizer, context and pooling.
pub fn parse(
    body: &[u8],
    tok: &Tokenizer,
    n_ctx: usize,
    n_embd: usize,
    pooling: Pooling,
    queue_size: usize,
) -> Result<EmbedRequest, ApiError> {
    // More inputs than the queue holds could never all be accepted: a 400, not a 429
    // that no retry can get past.
    let max_inputs = MAX_INPUTS.min(queue_size.max(1));
    let v: Value = crate::api::parse_json(body)?;
    let Some(o) = v.as_object() else {
        return Err(ApiError::new(
            ApiErrorKind::InvalidRequest,
            "the request body must be a JSON object",
        ));
    };
    let model = match o.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err(bad("model", "model must be a string")),
    };
    if pooling == Pooling::None {
        return Err(bad(
            "model",
            "this model is not an embedding model (its file names no pooling type); start \
             rserve with --pooling mean|cls|last to pool its hidden states",
        ));
    }
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < tok.n_vocab())
                    .map(|t| t as u32)
            })
            .collect()
    };
    let text = |s: &str| tok.encode(s, true, true);
    let inputs: Vec<Vec<u32>> = match o.get("input") {
        Some(Value::String(s)) => vec![text(s)],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(bad("input", "input must not be empty"))
        }
        Some(Value::Array(a)) if a.len() > max_inputs => {
            return Err(bad(
                "input",
                format!(
                    "at most {max_inputs} inputs per request here (each waits in the \
                     server's queue of {queue_size}, --queue-size), got {}",
                    a.len()
                ),
            ))
        }
        Some(Value::Array(a)) => match &a[0] {
            Value::Number(_) => vec![ids(a).ok_or_else(|| {
                bad(
                    "input",
                    format!("token ids must be integers in [0, {})", tok.n_vocab()),
                )
            })?],
            _ => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => Ok(text(s)),
                    Value::Array(t) => ids(t).ok_or_else(|| {
                        bad(
                            &format!("input[{i}]"),
                            format!("token ids must be integers in [0, {})", tok.n_vocab()),
                        )
                    }),
                    _ => Err(bad(
                        &format!("input[{i}]"),
                        "each input must be a string or an array of token ids",
                    )),
                })
                .collect::<Result<_, _>>()?,
        },
        _ => {
            return Err(bad(
                "input",
                "input must be a string, an array of strings, or token ids",
            ))
        }
    };
    for (i, t) in inputs.iter().enumerate() {
        if t.is_empty() {
            return Err(bad(&format!("input[{i}]"), "an input is empty (0 tokens)"));
        }
        if t.len() > n_ctx {
            return Err(bad(
                &format!("input[{i}]"),
                format!(
                    "input {i} is {} tokens, above this model's context of {n_ctx}",
                    t.len()
                ),
            ));
        }
    }
    let base64 = match o.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(_) => {
            return Err(bad(
                "encoding_format",
                "encoding_format must be float or base64",
            ))
        }
    };
    match o.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(d) if d.as_u64() == Some(n_embd as u64) => {}
        Some(d) => {
            return Err(bad(
                "dimensions",
                format!("this model's embeddings have {n_embd} dimensions, not {d}"),
            ))
        }
    }
    Ok(EmbedRequest {
        model,
        inputs,
        base64,
    })
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                s.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The response: one entry per input, in order.
pub fn response(
    model: &str,
    vectors: &[Vec<f32>],
    base64_out: bool,
    prompt_tokens: usize,
) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let e = if base64_out {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    json!({
        "object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00, 0x01]), "//4AAQ==");
    }
}
