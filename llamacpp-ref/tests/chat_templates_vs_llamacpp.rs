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

#[test]
fn templates_render_as_llamacpp_renders_them() {
    let Some(dir) = dir() else {
        return;
    };
    let (mut checked, mut failures) = (0, Vec::new());
    for &(file, bos, eos) in TEMPLATES {
        let path = dir.join(file);
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (n, f) = compare(file, &source, bos, eos);
        checked += n;
        failures.extend(f);
    }
    eprintln!(
        "chat templates: {} of {checked} renders identical to llama.cpp's",
        checked - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The templates inside the real models' files (smollm2 and qwen2.5-coder; gemma3-270m's
/// has none), with their own BOS and EOS texts.
#[test]
fn real_model_templates_render_as_llamacpp_renders_them() {
    let (mut checked, mut failures) = (0, Vec::new());
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        let Some(path) = runtime::registry::test_model(name) else {
            return;
        };
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
        let (n, fl) = compare(name, &source, &bos_token, &eos_token);
        checked += n;
        failures.extend(fl);
    }
    eprintln!(
        "real models' chat templates: {} of {checked} renders identical to llama.cpp's",
        checked - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
