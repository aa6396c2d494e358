"""Tool calling through the official `openai` Python client against a running `cortiq serve` on a
real chat model (crates/cli/tests/serve.rs starts it; Qwen2.5-Coder-0.5B-Instruct).

Checks: a call non-streamed (finish_reason tool_calls, arguments that json.loads), the same call
streamed and rebuilt from the deltas (equal to the non-streamed one), a tool result sent back
for a second turn whose cached_tokens covers the first turn's prompt,
tool_choice "required" on a question that needs no tool (still a call, arguments valid),
a named function, "none" (no call), parallel_tool_calls false, the stateless Responses API
(whole, streamed events, a function_call_output turn), and 400s naming the field.

usage: openai_tools.py BASE_URL API_KEY MODEL_ID
"""
import json
import sys

import openai

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


tools = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the current local time in a time zone",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Paris"}},
            "required": ["timezone"]}}},
]
ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
common = dict(model=model, tools=tools, temperature=0, max_tokens=128)

# 1. non-streamed
r = client.chat.completions.create(messages=ask, **common)
c = r.choices[0]
calls = c.message.tool_calls or []
check(c.finish_reason == "tool_calls", f"finish_reason tool_calls (got {c.finish_reason}, content {c.message.content!r})")
check(len(calls) >= 1 and calls[0].function.name == "get_weather", f"a get_weather call ({calls})")
args = json.loads(calls[0].function.arguments)
check(isinstance(args, dict) and "paris" in str(args.get("city", "")).lower(), f"arguments json.loads to the city ({args})")
check(calls[0].id.startswith("call_") and calls[0].type == "function", f"call id and type ({calls[0].id})")
check(not c.message.content, f"no markup or text in content ({c.message.content!r})")
first_prompt = r.usage.prompt_tokens

# 2. streamed, rebuilt from the deltas
chunks = list(client.chat.completions.create(messages=ask, stream=True, **common))
rebuilt = {}
finish = None
content = ""
for ch in chunks:
    if not ch.choices:
        continue
    d = ch.choices[0].delta
    content += d.content or ""
    for tc in d.tool_calls or []:
        slot = rebuilt.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
        if tc.id:
            slot["id"] = tc.id
        if tc.function and tc.function.name:
            slot["name"] = tc.function.name
        if tc.function and tc.function.arguments:
            slot["arguments"] += tc.function.arguments
    finish = ch.choices[0].finish_reason or finish
check(finish == "tool_calls", f"streamed finish_reason tool_calls ({finish})")
check(content == "", f"streamed: no content deltas ({content!r})")
got = [(rebuilt[i]["name"], json.loads(rebuilt[i]["arguments"])) for i in sorted(rebuilt)]
want = [(t.function.name, json.loads(t.function.arguments)) for t in calls]
check(got == want, f"streamed calls == non-streamed ({got} vs {want})")
check(all(rebuilt[i]["id"] and rebuilt[i]["id"].startswith("call_") for i in rebuilt), "streamed calls carry ids")

# 3. the tool's result, second turn
turn2 = ask + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": t.id, "type": "function", "function": {"name": t.function.name, "arguments": t.function.arguments}}
        for t in calls]},
] + [{"role": "tool", "tool_call_id": t.id, "content": json.dumps({"temperature_c": 18, "sky": "sunny"})} for t in calls]
r2 = client.chat.completions.create(messages=turn2, **common)
c2 = r2.choices[0]
cached = r2.usage.prompt_tokens_details.cached_tokens
# What the 0.5B model answers here is its own affair (at temperature 0 it repeats the call);
# the server's part: the call and its result rendered into the prompt, the first turn's prompt
# taken from the cache, and an answer that parses.
check(r2.usage.prompt_tokens > first_prompt + 20, f"second turn renders the call and its result ({r2.usage.prompt_tokens} > {first_prompt} + 20)")
# The cache restores a prompt it has seen up to its last 2 tokens (the same first turn sent
# twice: 177 of 179 cached), so "covers" is first_prompt - 2.
check(cached >= first_prompt - 2, f"second turn cached_tokens {cached} covers the first prompt ({first_prompt})")
check(c2.finish_reason in ("stop", "tool_calls", "length"), f"second turn answered ({c2.finish_reason})")
for t in c2.message.tool_calls or []:
    json.loads(t.function.arguments)
check("<tool_call>" not in (c2.message.content or ""), "second turn: no markup in content")

# 4. tool_choice
hello = [{"role": "user", "content": "Say hello."}]
r = client.chat.completions.create(messages=hello, tool_choice="required", **common)
c = r.choices[0]
check(c.finish_reason == "tool_calls" and c.message.tool_calls, f"required: a call even for 'Say hello.' ({c.message})")
for t in c.message.tool_calls:
    a = json.loads(t.function.arguments)
    check(t.function.name in ("get_weather", "get_time") and isinstance(a, dict), f"required: a declared tool with object arguments ({t.function})")
r = client.chat.completions.create(messages=ask, tool_choice={"type": "function", "function": {"name": "get_time"}}, **common)
c = r.choices[0]
check([t.function.name for t in c.message.tool_calls or []] == ["get_time"], f"named: exactly get_time ({c.message})")
check("timezone" in json.loads(c.message.tool_calls[0].function.arguments), "named: its required argument present")
r = client.chat.completions.create(messages=ask, tool_choice="none", **common)
c = r.choices[0]
check(not c.message.tool_calls and c.finish_reason == "stop" and c.message.content, f"none: text, no call ({c.message})")
two = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
r = client.chat.completions.create(messages=two, tool_choice="required", parallel_tool_calls=False, **common)
check(len(r.choices[0].message.tool_calls or []) == 1, f"parallel_tool_calls false: one call ({r.choices[0].message.tool_calls})")

# 5. the Responses API, stateless: whole, streamed (event types and the final response), a
# function_call_output turn
rtools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
           "parameters": t["function"]["parameters"]} for t in tools]
resp = client.responses.create(model=model, input="What is the weather like in Paris today?", tools=rtools,
                               temperature=0, max_output_tokens=128)
fcs = [o for o in resp.output if o.type == "function_call"]
check(resp.status == "completed" and len(fcs) >= 1 and fcs[0].name == "get_weather", f"responses: a function_call ({resp.output})")
check("paris" in json.loads(fcs[0].arguments).get("city", "").lower(), f"responses: its arguments ({fcs[0].arguments})")
events = list(client.responses.create(model=model, input="What is the weather like in Paris today?", tools=rtools,
                                      temperature=0, max_output_tokens=128, stream=True))
types = [e.type for e in events]
check(types[0] == "response.created" and types[-1] == "response.completed", f"responses stream: created ... completed ({types})")
check("response.function_call_arguments.delta" in types and "response.output_item.done" in types, f"responses stream: call events ({types})")
check([e.sequence_number for e in events] == list(range(len(events))), "responses stream: sequence numbers in order")
final = events[-1].response
sf = [o for o in final.output if o.type == "function_call"]
check([(o.name, json.loads(o.arguments)) for o in sf] == [(o.name, json.loads(o.arguments)) for o in fcs],
      "responses stream: the final output == the whole response's")
turn2 = [{"role": "user", "content": "What is the weather like in Paris today?"}] + [
    {"type": "function_call", "call_id": o.call_id, "name": o.name, "arguments": o.arguments} for o in fcs] + [
    {"type": "function_call_output", "call_id": o.call_id, "output": "18 C, sunny"} for o in fcs]
r2 = client.responses.create(model=model, input=turn2, tools=rtools, temperature=0, max_output_tokens=64)
check(r2.status in ("completed", "incomplete") and r2.usage.input_tokens_details.cached_tokens >= resp.usage.input_tokens - 2,
      f"responses: a function_call_output turn from the cache ({r2.usage})")
text = client.responses.create(model=model, instructions="You are terse.", input="Name a primary color.", temperature=0,
                               max_output_tokens=16)
check(text.output_text and text.output[0].type == "message", f"responses: text output ({text.output_text!r})")
with client.responses.stream(model=model, instructions="You are terse.", input="Name a primary color.", temperature=0,
                             max_output_tokens=16) as st:
    deltas = "".join(e.delta for e in st if e.type == "response.output_text.delta")
    streamed = st.get_final_response() if text.status == "completed" else None
check(deltas == text.output_text, f"responses.stream: the text deltas == the whole output ({deltas!r})")
check(streamed is None or streamed.output_text == text.output_text, "responses.stream: get_final_response == whole")
try:
    client.responses.create(model=model, input="x", previous_response_id="resp_1")
    check(False, "previous_response_id is refused")
except openai.BadRequestError as e:
    check(e.body.get("param") == "previous_response_id", f"400 names previous_response_id ({e.body})")

# 6. bad tools: a 400 naming the field
try:
    client.chat.completions.create(messages=ask, model=model, tools=[{"type": "function", "function": {"description": "x"}}])
    check(False, "a tool without a name is refused")
except openai.BadRequestError as e:
    check(e.body.get("param") == "tools[0].function.name", f"400 names tools[0].function.name ({e.body})")

print("all checks passed")
