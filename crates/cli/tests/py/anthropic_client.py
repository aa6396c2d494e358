"""The official `anthropic` Python client against a running `cortiq serve` (crates/cli/tests/serve.rs
starts it on Qwen2.5-Coder-0.5B-Instruct): messages.create, messages.stream(...).get_final_message(),
a tool loop with tool_use / tool_result, tool_choice any / tool, stop_sequences, count_tokens
equal to /tokenize's count of the rendered prompt, and Anthropic-shaped errors.

usage: anthropic_client.py BASE_URL API_KEY
"""
import json
import sys
import urllib.request

import anthropic

base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
MODEL = "claude-sonnet-4-5"  # agents name their own model; the server answers any
# anthropic 2.x dropped the sampling arguments; the server still reads them from the body.
T0 = {"temperature": 0}


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "x-api-key": key})
    return json.load(urllib.request.urlopen(req))


# messages.create, plain text
m = client.messages.create(model=MODEL, max_tokens=32, extra_body=T0, system="You are terse.",
                           messages=[{"role": "user", "content": "Name a primary color."}])
check(m.type == "message" and m.role == "assistant" and m.content and m.content[0].type == "text", f"a text block ({m.content})")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
check(m.usage.output_tokens > 0 and m.usage.input_tokens > 0, f"usage {m.usage}")
text = m.content[0].text

# streamed: the final message equals the whole one
with client.messages.stream(model=MODEL, max_tokens=32, extra_body=T0, system="You are terse.",
                            messages=[{"role": "user", "content": "Name a primary color."}]) as s:
    deltas = "".join(s.text_stream)
    final = s.get_final_message()
check(final.content[0].text == text and deltas == text, f"stream == create ({final.content[0].text!r} vs {text!r})")
check(final.stop_reason == m.stop_reason, "stream: same stop_reason")
check(final.usage.cache_read_input_tokens is not None and final.usage.cache_read_input_tokens > 0,
      f"the repeated prompt is read from the cache ({final.usage})")

# stop_sequences
if len(text) > 4:
    cut = text[2:4]
    m2 = client.messages.create(model=MODEL, max_tokens=32, extra_body=T0, system="You are terse.",
                                stop_sequences=[cut], messages=[{"role": "user", "content": "Name a primary color."}])
    check(m2.stop_reason == "stop_sequence" and m2.stop_sequence == cut, f"stop_sequence {cut!r} ({m2.stop_reason}, {m2.stop_sequence})")

# a tool loop
tools = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
m = client.messages.create(model=MODEL, max_tokens=128, extra_body=T0, tools=tools, messages=ask)
uses = [b for b in m.content if b.type == "tool_use"]
check(m.stop_reason == "tool_use" and len(uses) >= 1, f"tool_use ({m.content}, {m.stop_reason})")
check(uses[0].name == "get_weather" and "paris" in json.dumps(uses[0].input).lower() and uses[0].id.startswith("toolu_"),
      f"the call's input is an object ({uses[0]})")
with client.messages.stream(model=MODEL, max_tokens=128, extra_body=T0, tools=tools, messages=ask) as s:
    fm = s.get_final_message()
su = [b for b in fm.content if b.type == "tool_use"]
check([(b.name, b.input) for b in su] == [(b.name, b.input) for b in uses], f"streamed tool_use == whole ({su})")
turn2 = ask + [{"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 C, sunny"}]}]
m2 = client.messages.create(model=MODEL, max_tokens=64, extra_body=T0, tools=tools, messages=turn2)
check(m2.stop_reason in ("end_turn", "tool_use", "max_tokens"), f"second turn answered ({m2.stop_reason})")
check(m2.usage.cache_read_input_tokens >= m.usage.input_tokens + m.usage.cache_read_input_tokens - 2,
      f"second turn reads the first turn's prompt from the cache ({m2.usage} after {m.usage})")

# tool_choice any / tool
hello = [{"role": "user", "content": "Say hello."}]
m = client.messages.create(model=MODEL, max_tokens=64, extra_body=T0, tools=tools, tool_choice={"type": "any"}, messages=hello)
check(m.stop_reason == "tool_use" and any(b.type == "tool_use" for b in m.content), f"tool_choice any: a call ({m.content})")
m = client.messages.create(model=MODEL, max_tokens=64, extra_body=T0, tools=tools,
                           tool_choice={"type": "tool", "name": "get_weather"}, messages=hello)
check([b.name for b in m.content if b.type == "tool_use"] == ["get_weather"], "tool_choice tool: that tool")

# count_tokens == /tokenize's count of the prompt /apply-template renders
ct = client.messages.count_tokens(model=MODEL, system="You are terse.", tools=tools,
                                  messages=[{"role": "user", "content": "Name a primary color."}])
prompt = post("/apply-template", {"messages": [{"role": "system", "content": "You are terse."},
                                                {"role": "user", "content": "Name a primary color."}],
                                   "tools": [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                                               "parameters": t["input_schema"]}} for t in tools]})["prompt"]
n = len(post("/tokenize", {"content": prompt, "add_special": True})["tokens"])
check(ct.input_tokens == n, f"count_tokens {ct.input_tokens} == /tokenize {n}")

# errors in Anthropic's shape
try:
    client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "wizard", "content": "x"}])
    check(False, "a bad role is refused")
except anthropic.BadRequestError as e:
    check(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error"
          and "messages[0].role" in e.body["error"]["message"], f"400 in Anthropic's form ({e.body})")

print("all checks passed")
