#!/usr/bin/env python3
"""Drives a running rserve with the real client libraries, `openai` and `anthropic`, as
agents and apps do: chat with tools (a two-turn tool loop, streamed tool-call deltas),
the Responses API (text, streaming events, a function call continued through
previous_response_id), and Anthropic's Messages API (text, streaming, tool use and
tool_result, count_tokens, errors). Every check asserts the shapes the libraries parse;
the first failure exits non-zero with its reason.

Usage: client_check.py --url http://127.0.0.1:PORT --key KEY --model NAME [--tools]
[--tool-checks] (--tools: the model's own template supports tools, so `auto` calls are
expected; without it calls are forced with `required` / `any`; --tool-checks: only the
checks that make tool calls).
"""

import argparse
import json
import sys

import anthropic
import openai

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = "What is the weather like in Paris right now?"
CHECKS = []
# Anthropic's library no longer takes sampling fields; a client sends them as extras.
T0 = {"temperature": 0}


def check(name, tools=False):
    """A check; `tools`: it exercises tool calls (what --tool-checks runs)."""

    def wrap(f):
        CHECKS.append((name, f, tools))
        return f

    return wrap


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


@check("openai chat: tool call, result, answer", tools=True)
def chat_tool_loop(oa, an, a):
    choice = "auto" if a.tools else "required"
    msgs = [{"role": "user", "content": ASK}]
    r = oa.chat.completions.create(
        model=a.model,
        messages=msgs,
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice=choice,
        temperature=0,
        max_tokens=64,
    )
    c = r.choices[0]
    expect(c.finish_reason == "tool_calls", f"finish_reason {c.finish_reason}: {r}")
    call = c.message.tool_calls[0]
    expect(call.function.name == "get_weather", f"call {call}")
    args = json.loads(call.function.arguments)
    expect(isinstance(args.get("city"), str), f"arguments {args}")
    msgs.append(c.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21}'})
    r2 = oa.chat.completions.create(
        model=a.model,
        messages=msgs,
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice="none",
        temperature=0,
        max_tokens=48,
    )
    expect(r2.choices[0].message.content, f"empty answer: {r2}")


@check("openai chat: streamed tool_calls deltas", tools=True)
def chat_tool_stream(oa, an, a):
    s = oa.chat.completions.create(
        model=a.model,
        messages=[{"role": "user", "content": ASK}],
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=64,
        stream=True,
    )
    calls, finish = {}, None
    for chunk in s:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for t in d.tool_calls or []:
            c = calls.setdefault(t.index, {"name": "", "arguments": ""})
            c["name"] += (t.function.name or "") if t.function else ""
            c["arguments"] += (t.function.arguments or "") if t.function else ""
        finish = chunk.choices[0].finish_reason or finish
    expect(finish == "tool_calls", f"finish {finish}")
    expect(calls and calls[0]["name"] == "get_weather", f"calls {calls}")
    json.loads(calls[0]["arguments"])


@check("openai responses: text, usage")
def responses_text(oa, an, a):
    r = oa.responses.create(
        model=a.model,
        instructions="Answer in one short sentence.",
        input="Name a primary color.",
        max_output_tokens=24,
        temperature=0,
    )
    expect(r.status in ("completed", "incomplete"), f"status {r.status}")
    expect(r.output_text.strip(), f"no text: {r}")
    expect(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")


@check("openai responses: streaming events")
def responses_stream(oa, an, a):
    kinds, text, last = [], "", None
    with oa.responses.stream(
        model=a.model, input="Count from 1 to 5.", max_output_tokens=24, temperature=0
    ) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                last = ev.response
    expect(kinds[0] == "response.created", f"first event {kinds[:3]}")
    expect("response.output_text.delta" in kinds, f"events {sorted(set(kinds))}")
    expect(kinds[-1] in ("response.completed", "response.incomplete"), f"last {kinds[-1]}")
    expect(text and last.output_text == text, f"{text!r} vs {last.output_text!r}")
    expect(last.usage.output_tokens > 0, f"usage {last.usage}")


@check("openai responses: function call, output, previous_response_id", tools=True)
def responses_tools(oa, an, a):
    tool = {"type": "function", **WEATHER}
    r = oa.responses.create(
        model=a.model,
        input=ASK,
        tools=[tool],
        tool_choice="auto" if a.tools else "required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    expect(calls and calls[0].name == "get_weather", f"output {r.output}")
    json.loads(calls[0].arguments)
    r2 = oa.responses.create(
        model=a.model,
        previous_response_id=r.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": '{"temperature_c": 21}',
            }
        ],
        tools=[tool],
        tool_choice="none",
        temperature=0,
        max_output_tokens=48,
    )
    expect(r2.output_text.strip(), f"no answer: {r2}")
    expect(r2.previous_response_id == r.id, f"previous_response_id {r2.previous_response_id}")
    # The same input alone is shorter than with the stored conversation before it.
    alone = oa.responses.create(
        model=a.model,
        input=[{"role": "user", "content": "21 C"}],
        tool_choice="none",
        tools=[tool],
        max_output_tokens=1,
        store=False,
    )
    expect(r2.usage.input_tokens > alone.usage.input_tokens + 10, "the conversation was continued")
    # Streamed arguments.
    deltas = []
    with oa.responses.stream(
        model=a.model,
        input=ASK,
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    ) as s:
        for ev in s:
            if ev.type == "response.function_call_arguments.delta":
                deltas.append(ev.delta)
    json.loads("".join(deltas))
    try:
        oa.responses.create(model=a.model, previous_response_id="resp_nope", input="x")
        raise AssertionError("an unknown previous_response_id was accepted")
    except openai.NotFoundError:
        pass


@check("anthropic messages: text, usage, stop_sequences")
def messages_text(oa, an, a):
    m = an.messages.create(
        model=a.model,
        max_tokens=32,
        system="You are terse.",
        messages=[{"role": "user", "content": "Count from 1 to 9, separated by spaces."}],
        extra_body=T0,
    )
    expect(m.type == "message" and m.role == "assistant", f"{m}")
    expect(m.content[0].type == "text" and m.content[0].text, f"content {m.content}")
    expect(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    expect(m.usage.input_tokens > 0 and m.usage.output_tokens > 0, f"usage {m.usage}")
    # A stop sequence the answer reaches: the text before it, the sequence named.
    words = m.content[0].text.split()
    expect(len(words) >= 3, f"a short answer: {m.content[0].text!r}")
    stop = words[len(words) // 2]
    if stop:
        m2 = an.messages.create(
            model=a.model,
            max_tokens=32,
            system="You are terse.",
            messages=[{"role": "user", "content": "Count from 1 to 9, separated by spaces."}],
            extra_body=T0,
            stop_sequences=[stop],
        )
        expect(m2.stop_reason == "stop_sequence" and m2.stop_sequence == stop, f"{m2}")
        expect(stop not in m2.content[0].text, f"the stop sequence was sent: {m2}")


@check("anthropic messages: streaming")
def messages_stream(oa, an, a):
    kinds = []
    with an.messages.stream(
        model=a.model,
        max_tokens=24,
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body=T0,
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    with an.messages.stream(
        model=a.model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    ) as s:
        kinds = [ev.type for ev in s]
    expect(text and final.content[0].text == text, f"{text!r} vs {final.content}")
    expect(final.usage.output_tokens > 0, f"usage {final.usage}")
    expect(kinds[0] == "message_start" and kinds[-1] == "message_stop", f"events {kinds}")


@check("anthropic messages: tool_use, tool_result, answer", tools=True)
def messages_tools(oa, an, a):
    tool = {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "input_schema": WEATHER["parameters"],
    }
    msgs = [{"role": "user", "content": ASK}]
    m = an.messages.create(
        model=a.model,
        max_tokens=64,
        messages=msgs,
        tools=[tool],
        tool_choice={"type": "auto" if a.tools else "any"},
        extra_body=T0,
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    expect(m.stop_reason == "tool_use" and uses, f"{m}")
    expect(uses[0].name == "get_weather" and isinstance(uses[0].input, dict), f"{uses}")
    msgs.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
    msgs.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 degrees C"}
            ],
        }
    )
    m2 = an.messages.create(
        model=a.model,
        max_tokens=48,
        messages=msgs,
        tools=[tool],
        tool_choice={"type": "none"},
        extra_body=T0,
    )
    expect(m2.content and m2.content[0].type == "text" and m2.content[0].text, f"{m2}")
    # Streamed: the input arrives as input_json_delta and is gathered by the library.
    with an.messages.stream(
        model=a.model,
        max_tokens=64,
        messages=[{"role": "user", "content": ASK}],
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=T0,
    ) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    expect(uses and isinstance(uses[0].input.get("city"), str), f"{final}")


@check("anthropic messages: structured output (output_config.format)")
def messages_structured(oa, an, a):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    m = an.messages.create(
        model=a.model,
        max_tokens=48,
        messages=[{"role": "user", "content": "Describe the weather in Paris as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=T0,
    )
    v = json.loads(m.content[0].text)
    expect(set(v) == {"city", "sunny"} and isinstance(v["sunny"], bool), f"{v}")


@check("anthropic count_tokens and errors")
def messages_count_and_errors(oa, an, a):
    short = an.messages.count_tokens(model=a.model, messages=[{"role": "user", "content": "Hi"}])
    long = an.messages.count_tokens(
        model=a.model,
        system="You are a helpful assistant.",
        messages=[{"role": "user", "content": "Hi " * 50}],
    )
    expect(0 < short.input_tokens < long.input_tokens, f"{short} {long}")
    try:
        an.messages.create(
            model=a.model,
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )
        raise AssertionError("an image block was accepted")
    except anthropic.BadRequestError as e:
        expect(e.body["error"]["type"] == "invalid_request_error", f"{e.body}")
    try:
        an.messages.create(
            model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError:
        pass
    bad = anthropic.Anthropic(base_url=a.url, api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model=a.model, max_tokens=8, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        expect(e.body["error"]["type"] == "authentication_error", f"{e.body}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tools", action="store_true")
    p.add_argument("--only", help="run the checks whose name contains this")
    p.add_argument(
        "--tool-checks",
        action="store_true",
        help="run only the checks that make tool calls (the rest do not depend on the model)",
    )
    a = p.parse_args()
    oa = openai.OpenAI(base_url=a.url + "/v1", api_key=a.key, max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=a.url, api_key=a.key, max_retries=0, timeout=300)
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, model {a.model}")
    failed = ran = 0
    for name, f, tools in CHECKS:
        if (a.only and a.only not in name) or (a.tool_checks and not tools):
            continue
        ran += 1
        try:
            f(oa, an, a)
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported by name
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{ran - failed}/{ran} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
