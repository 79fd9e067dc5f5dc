//! llama.cpp's chat-template rendering (`common/chat`, what `llama-server --jinja` runs):
//! the oracle for `runtime::chat`.

use std::ffi::{c_char, c_int, c_longlong, CStr, CString};

extern "C" {
    fn rref_chat_render(
        tmpl: *const c_char,
        bos: *const c_char,
        eos: *const c_char,
        messages_json: *const c_char,
        add_generation_prompt: c_int,
        enable_thinking: c_int,
        now_unix: c_longlong,
        out: *mut *mut c_char,
    ) -> c_int;
    fn rref_chat_render_oai(
        tmpl: *const c_char,
        bos: *const c_char,
        eos: *const c_char,
        messages_json: *const c_char,
        tools_json: *const c_char,
        add_generation_prompt: c_int,
        enable_thinking: c_int,
        now_unix: c_longlong,
        out: *mut *mut c_char,
    ) -> c_int;
    fn rref_chat_free(p: *mut c_char);
}

/// The prompt llama.cpp renders from `template` for a conversation in OpenAI's JSON shape
/// (`messages`, with `tool_calls` and `tool` turns) and OpenAI `tools`, as llama-server
/// renders a chat request with tools (tool_choice auto), or its error.
pub fn render_oai(
    template: &str,
    bos: &str,
    eos: &str,
    messages: &serde_json::Value,
    tools: &serde_json::Value,
    opts: RenderOptions,
) -> Result<String, String> {
    let c = |s: &str| CString::new(s).map_err(|_| format!("NUL byte in {s:?}"));
    let (t, b, e) = (c(template)?, c(bos)?, c(eos)?);
    let (m, tl) = (c(&messages.to_string())?, c(&tools.to_string())?);
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: as in `render`.
    let rc = unsafe {
        rref_chat_render_oai(
            t.as_ptr(),
            b.as_ptr(),
            e.as_ptr(),
            m.as_ptr(),
            tl.as_ptr(),
            c_int::from(opts.add_generation_prompt),
            c_int::from(opts.enable_thinking),
            opts.now_unix,
            &mut out,
        )
    };
    take_output(rc, out)
}

/// The shim's answer: its text (freed here), as the prompt or the error.
fn take_output(rc: c_int, out: *mut c_char) -> Result<String, String> {
    if out.is_null() {
        return Err("llama.cpp's renderer returned nothing".into());
    }
    // SAFETY: non-null and NUL-terminated by the shim.
    let text = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: allocated by the shim, freed once.
    unsafe { rref_chat_free(out) };
    match rc {
        0 => Ok(text),
        _ => Err(text),
    }
}

/// One message: role, content and, for an assistant turn, its reasoning.
#[derive(Clone, Debug)]
pub struct Msg<'a> {
    pub role: &'a str,
    pub content: &'a str,
    pub reasoning: Option<&'a str>,
}

/// What the request asks of the template.
#[derive(Clone, Copy, Debug)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    pub enable_thinking: bool,
    /// The clock of templates that print today's date (seconds since the epoch).
    pub now_unix: i64,
}

/// The prompt llama.cpp renders from `template` for `messages`, or its error.
pub fn render(
    template: &str,
    bos: &str,
    eos: &str,
    messages: &[Msg<'_>],
    opts: RenderOptions,
) -> Result<String, String> {
    let json = serde_json::Value::Array(
        messages
            .iter()
            .map(|m| {
                let mut o = serde_json::Map::new();
                o.insert("role".into(), m.role.into());
                o.insert("content".into(), m.content.into());
                if let Some(r) = m.reasoning {
                    o.insert("reasoning_content".into(), r.into());
                }
                serde_json::Value::Object(o)
            })
            .collect(),
    )
    .to_string();
    let c = |s: &str| CString::new(s).map_err(|_| format!("NUL byte in {s:?}"));
    let (t, b, e, j) = (c(template)?, c(bos)?, c(eos)?, c(&json)?);
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string; `out` receives a malloc'd one
    // (or stays null when allocation failed), freed below with the shim's own free.
    let rc = unsafe {
        rref_chat_render(
            t.as_ptr(),
            b.as_ptr(),
            e.as_ptr(),
            j.as_ptr(),
            c_int::from(opts.add_generation_prompt),
            c_int::from(opts.enable_thinking),
            opts.now_unix,
            &mut out,
        )
    };
    take_output(rc, out)
}
