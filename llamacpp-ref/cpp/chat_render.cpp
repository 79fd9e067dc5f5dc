// llama.cpp's own chat-template rendering (common/chat: the Jinja engine `--jinja` runs),
// behind a C function, so that our renderer is checked against it.
#include "chat.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

static char * rref_dup(const std::string & s) {
    char * p = static_cast<char *>(std::malloc(s.size() + 1));
    if (p) {
        std::memcpy(p, s.data(), s.size());
        p[s.size()] = '\0';
    }
    return p;
}

// llama-server's rendering of one chat request: `fill` sets the conversation (and tools) of
// the inputs, the rest is shared. Returns 0 and the prompt in `*out`, or 1 and the error.
template <typename Fill>
static int rref_render(const char * tmpl, const char * bos, const char * eos, Fill fill,
                       int add_generation_prompt, int enable_thinking, long long now_unix,
                       char ** out) {
    try {
        auto tmpls = common_chat_templates_init(nullptr, tmpl, bos, eos);
        common_chat_templates_inputs in;
        fill(in);
        in.add_generation_prompt = add_generation_prompt != 0;
        in.use_jinja = true;
        in.enable_thinking = enable_thinking != 0;
        in.now = std::chrono::system_clock::time_point(std::chrono::seconds(now_unix));
        if (enable_thinking == 0) {
            in.chat_template_kwargs["enable_thinking"] = "false";
        }
        auto params = common_chat_templates_apply(tmpls.get(), in);
        *out = rref_dup(params.prompt);
        return 0;
    } catch (const std::exception & e) {
        *out = rref_dup(e.what());
        return 1;
    } catch (...) {
        *out = rref_dup("unknown C++ exception");
        return 1;
    }
}

// Renders `messages_json` (an array of {"role", "content", optional "reasoning_content"})
// with template `tmpl` as llama-server does for a chat request. `now_unix` fixes the
// clock of templates that print today's date. Returns 0 and the prompt in `*out`, or 1 and
// the error in `*out`; the caller frees `*out` with rref_chat_free.
extern "C" int rref_chat_render(const char * tmpl, const char * bos, const char * eos,
                                const char * messages_json, int add_generation_prompt,
                                int enable_thinking, long long now_unix, char ** out) {
    auto fill = [&](common_chat_templates_inputs & in) {
        for (const auto & m : nlohmann::ordered_json::parse(messages_json)) {
            common_chat_msg msg;
            msg.role = m.at("role").get<std::string>();
            msg.content = m.at("content").get<std::string>();
            if (m.contains("reasoning_content")) {
                msg.reasoning_content = m.at("reasoning_content").get<std::string>();
            }
            in.messages.push_back(msg);
        }
    };
    return rref_render(tmpl, bos, eos, fill, add_generation_prompt, enable_thinking, now_unix,
                       out);
}

// As rref_chat_render, for a conversation in OpenAI's shape (`tool_calls` on assistant
// turns, `tool` turns with `tool_call_id`) and a `tools` array, parsed by llama.cpp's own
// OpenAI-compatible readers as llama-server parses a chat request (tool_choice auto).
extern "C" int rref_chat_render_oai(const char * tmpl, const char * bos, const char * eos,
                                    const char * messages_json, const char * tools_json,
                                    int add_generation_prompt, int enable_thinking,
                                    long long now_unix, char ** out) {
    auto fill = [&](common_chat_templates_inputs & in) {
        in.messages = common_chat_msgs_parse_oaicompat(common_json::parse(messages_json));
        in.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools_json));
        in.parallel_tool_calls = true;
    };
    return rref_render(tmpl, bos, eos, fill, add_generation_prompt, enable_thinking, now_unix,
                       out);
}

extern "C" void rref_chat_free(char * p) { std::free(p); }
