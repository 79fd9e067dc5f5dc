//! The chat templates of the architectures we run, rendered by `runtime::chat` and by
//! llama.cpp's own renderer (`common/chat`, what `llama-server --jinja` runs): the prompts
//! must be byte-identical, for conversations with and without a system turn, earlier
//! assistant turns (with reasoning), `enable_thinking` on and off, and with and without
//! the generation prompt.
//!
//! The templates are the ones llama.cpp's source package ships (`models/templates`, the
//! templates the models' own files carry): `tools/llamacpp_templates.sh` extracts them and
//! prints the directory, which `RLLAMA_CHAT_TEMPLATES` names. Without it the test says so
//! and passes, unless `RLLAMA_CHAT_TEMPLATES_REQUIRED=1` (CI sets both).

use llamacpp_ref::chat::{render, Msg, RenderOptions};
use runtime::chat::{ChatMessage, ChatTemplate, RenderArgs};

/// (file, bos, eos): the template files and the special tokens their models declare.
const TEMPLATES: &[(&str, &str, &str)] = &[
    ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"),
    ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
    (
        "microsoft-Phi-3.5-mini-instruct.jinja",
        "<s>",
        "<|endoftext|>",
    ),
    ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "", "<|im_end|>"),
    (
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    (
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>"),
    ("Qwen-QwQ-32B.jinja", "", "<|im_end|>"),
    (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
    ),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
];

fn dir() -> Option<std::path::PathBuf> {
    let required = std::env::var("RLLAMA_CHAT_TEMPLATES_REQUIRED").is_ok_and(|v| v == "1");
    match std::env::var_os("RLLAMA_CHAT_TEMPLATES") {
        Some(d) => Some(d.into()),
        None if required => panic!(
            "RLLAMA_CHAT_TEMPLATES_REQUIRED=1 but RLLAMA_CHAT_TEMPLATES is not set \
             (tools/llamacpp_templates.sh prints the directory)"
        ),
        None => {
            eprintln!(
                "SKIPPED: chat templates vs llama.cpp: set RLLAMA_CHAT_TEMPLATES to the \
                 directory tools/llamacpp_templates.sh prints"
            );
            None
        }
    }
}

type Conv = Vec<(&'static str, &'static str, Option<&'static str>)>;

fn conversations() -> Vec<(&'static str, Conv)> {
    vec![
        ("one user turn", vec![("user", "Hello there!", None)]),
        (
            "system and user",
            vec![
                ("system", "You are a terse assistant.", None),
                ("user", "What is 2+2?", None),
            ],
        ),
        (
            "multi-turn",
            vec![
                ("system", "You are a terse assistant.", None),
                ("user", "What is 2+2?", None),
                ("assistant", "4", None),
                ("user", "And 3+3?\nAnswer in words.", None),
            ],
        ),
        (
            "earlier reasoning",
            vec![
                ("user", "What is 2+2?", None),
                ("assistant", "4", Some("Two plus two is four.")),
                ("user", "Thanks. Now 5*5?", None),
            ],
        ),
        (
            "last turn assistant",
            vec![
                ("user", "Say hi.", None),
                ("assistant", "Hi!", Some("A greeting.")),
            ],
        ),
    ]
}

/// Renders every conversation with `source` on both sides; returns (renders, mismatches).
fn compare(name: &str, source: &str, bos: &str, eos: &str) -> (usize, Vec<String>) {
    let now = std::time::SystemTime::now();
    let now_unix = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let ours = ChatTemplate::Jinja {
        source: source.to_string(),
        bos_token: bos.into(),
        eos_token: eos.into(),
    };
    let (mut checked, mut failures) = (0, Vec::new());
    for (what, conv) in conversations() {
        for add_generation_prompt in [true, false] {
            for enable_thinking in [true, false] {
                let msgs: Vec<Msg> = conv
                    .iter()
                    .map(|&(role, content, reasoning)| Msg {
                        role,
                        content,
                        reasoning,
                    })
                    .collect();
                let opts = RenderOptions {
                    add_generation_prompt,
                    enable_thinking,
                    now_unix,
                };
                let theirs = render(source, bos, eos, &msgs, opts);
                let messages: Vec<ChatMessage> = conv
                    .iter()
                    .map(|&(role, content, reasoning)| {
                        let mut m = ChatMessage::new(role, content);
                        m.reasoning_content = reasoning.map(str::to_string);
                        m
                    })
                    .collect();
                let args = RenderArgs {
                    add_generation_prompt,
                    enable_thinking,
                    now,
                    ..RenderArgs::default()
                };
                let mine = ours.render_with(&messages, &args);
                match (&mine, &theirs) {
                    (Ok(a), Ok(b)) if a == b => {}
                    // Both refuse (a template that rejects the conversation).
                    (Err(_), Err(_)) => {}
                    _ => failures.push(format!(
                        "{name}, {what}, generation prompt {add_generation_prompt}, thinking \
                         {enable_thinking}:\n--- ours\n{mine:?}\n--- llama.cpp\n{theirs:?}"
                    )),
                }
                checked += 1;
            }
        }
    }
    (checked, failures)
}

/// One comparison over one template: (name, source, bos, eos) -> (renders, mismatches).
type Compare = fn(&str, &str, &str, &str) -> (usize, Vec<String>);

/// `cmp` over every template file of llama.cpp's package (`None`: not given, skipped).
fn over_template_files(cmp: Compare) -> Option<(usize, Vec<String>)> {
    let dir = dir()?;
    let (mut checked, mut failures) = (0, Vec::new());
    for &(file, bos, eos) in TEMPLATES {
        let path = dir.join(file);
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (n, f) = cmp(file, &source, bos, eos);
        checked += n;
        failures.extend(f);
    }
    Some((checked, failures))
}

/// `cmp` over the templates inside the real models' files (smollm2 and qwen2.5-coder;
/// gemma3-270m's has none), with their own BOS and EOS texts (`None`: models skipped).
fn over_model_templates(cmp: Compare) -> Option<(usize, Vec<String>)> {
    let (mut checked, mut failures) = (0, Vec::new());
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        let path = runtime::registry::test_model(name)?;
        let f = runtime::GgufFile::open(&path).unwrap();
        let ChatTemplate::Jinja {
            source,
            bos_token,
            eos_token,
        } = ChatTemplate::from_gguf(&f)
        else {
            // (gemma3-270m's file has none: our built-in Gemma format serves it.)
            eprintln!("{name}: no template in the file");
            continue;
        };
        let (n, fl) = cmp(name, &source, &bos_token, &eos_token);
        checked += n;
        failures.extend(fl);
    }
    Some((checked, failures))
}

fn report(what: &str, (checked, failures): (usize, Vec<String>)) {
    eprintln!(
        "{what}: {} of {checked} renders identical to llama.cpp's",
        checked - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn templates_render_as_llamacpp_renders_them() {
    if let Some(r) = over_template_files(compare) {
        report("chat templates", r);
    }
}

#[test]
fn real_model_templates_render_as_llamacpp_renders_them() {
    if let Some(r) = over_model_templates(compare) {
        report("real models' chat templates", r);
    }
}

/// The call syntax we read from each template file (templates without tool support:
/// Generic, their text never read as calls).
#[test]
fn tool_syntaxes_of_the_template_files() {
    use runtime::tools::ToolSyntax;
    let Some(dir) = dir() else { return };
    let want = |file: &str| match file {
        f if f.starts_with("openai-gpt-oss") => ToolSyntax::Harmony,
        f if f.starts_with("Qwen-") || f.starts_with("HuggingFaceTB-SmolLM3") => ToolSyntax::Hermes,
        f if f.starts_with("meta-llama-Llama-3") => ToolSyntax::Llama3,
        f if f.starts_with("mistralai-") => ToolSyntax::Mistral,
        _ => ToolSyntax::Generic,
    };
    let mut seen = Vec::new();
    for &(file, bos, eos) in TEMPLATES {
        let t = ChatTemplate::Jinja {
            source: std::fs::read_to_string(dir.join(file)).unwrap(),
            bos_token: bos.into(),
            eos_token: eos.into(),
        };
        seen.push(format!("{file}: {:?}", t.tool_syntax()));
        if t.caps().is_some_and(|c| c.tools) {
            assert_eq!(t.tool_syntax(), want(file), "{file}");
        }
    }
    eprintln!("{}", seen.join("\n"));
}

/// Conversations with tools, in OpenAI's shape: the tools alone, one call and its result,
/// two parallel calls answered and followed up.
fn tool_conversations() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    let call = |id: &str, name: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    vec![
        (
            "tools offered",
            json!([
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What's the weather in Paris?"},
            ]),
        ),
        (
            "one call and its result",
            json!([
                {"role": "user", "content": "What's the weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    call("call_1", "get_weather", r#"{"city": "Paris", "unit": "celsius"}"#)]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21.5}"},
            ]),
        ),
        (
            "parallel calls",
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris and news on Rust?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    call("call_a", "get_weather", r#"{"city":"Paris"}"#),
                    call("call_b", "search", r#"{"query": "Rust", "limit": 3}"#)]},
                {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_b", "content": "Rust 2.0 ships"},
                {"role": "assistant", "content": "Sunny; Rust 2.0 ships."},
                {"role": "user", "content": "Thanks! Ünïcödé?"},
            ]),
        ),
    ]
}

fn tools_json() -> serde_json::Value {
    serde_json::json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "search",
            "description": "Searches the news. Ünïcödé & <tags>.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "default": 5, "minimum": 0.5}},
                "required": ["query"]}}},
    ])
}

/// Our messages from OpenAI JSON (as rserve's request parser builds them).
fn our_messages(v: &serde_json::Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut c =
                ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap());
            for t in m["tool_calls"].as_array().into_iter().flatten() {
                c.tool_calls.push(runtime::chat::ToolCallMsg {
                    id: t["id"].as_str().unwrap().into(),
                    name: t["function"]["name"].as_str().unwrap().into(),
                    arguments: t["function"]["arguments"].as_str().unwrap().into(),
                });
            }
            c.tool_call_id = m["tool_call_id"].as_str().map(str::to_string);
            c
        })
        .collect()
}

fn compare_tools(name: &str, source: &str, bos: &str, eos: &str) -> (usize, Vec<String>) {
    eprintln!(
        "{name}: {:?}",
        runtime::chat::template_caps(source, bos, eos)
    );
    let now = std::time::SystemTime::now();
    let now_unix = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let ours = ChatTemplate::Jinja {
        source: source.to_string(),
        bos_token: bos.into(),
        eos_token: eos.into(),
    };
    let tools = tools_json();
    let (mut checked, mut failures) = (0, Vec::new());
    for (what, conv) in tool_conversations() {
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: true,
            now_unix,
        };
        let theirs = llamacpp_ref::chat::render_oai(source, bos, eos, &conv, &tools, opts);
        let args = RenderArgs {
            now,
            tools: tools.as_array().unwrap().clone(),
            ..RenderArgs::default()
        };
        let mine = ours.render_with(&our_messages(&conv), &args);
        match (&mine, &theirs) {
            (Ok(a), Ok(b)) if a == b => {
                // Where the template reads tools, the prompt names them.
                if ours.caps().is_some_and(|c| c.tools) {
                    assert!(
                        a.contains("get_weather"),
                        "{name}, {what}: no tools in\n{a}"
                    );
                }
            }
            (Err(_), Err(_)) => eprintln!("{name}, {what}: both refuse"),
            _ => failures.push(format!(
                "{name}, {what}:\n--- ours\n{mine:?}\n--- llama.cpp\n{theirs:?}"
            )),
        }
        checked += 1;
    }
    (checked, failures)
}

/// Tools and tool turns render as llama-server renders them (its `tools`, the calls'
/// arguments as objects where the template reads them so, `tojson` as its engine writes it).
#[test]
fn tool_conversations_render_as_llamacpp_renders_them() {
    let Some((mut checked, mut failures)) = over_template_files(compare_tools) else {
        return;
    };
    if let Some((n, f)) = over_model_templates(compare_tools) {
        checked += n;
        failures.extend(f);
    }
    report("chat templates with tools", (checked, failures));
}
