"""The official `ollama` Python client against a running `cortiq serve` (crates/cli/tests/serve.rs
starts it on Qwen2.5-Coder-0.5B-Instruct): chat and generate, whole and streamed (the stream
adds up to the whole answer), list / show / ps, options (num_predict, stop, seed), a `format`
schema whose answer validates, a tool call and its result sent back, and ollama-shaped errors.
Every response's fields are checked against ollama's docs/api.md: names, types, which are
always there.

usage: ollama_client.py BASE_URL API_KEY
"""
import datetime
import json
import sys
import urllib.request

import ollama

base, key = sys.argv[1], sys.argv[2]
client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
T0 = {"temperature": 0, "seed": 7}


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def http(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.headers.get("content-type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type"), e.read()


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def final_fields(obj, what):
    """docs/api.md's final object: done, done_reason, created_at and the counts in ns."""
    check(obj["done"] is True and obj["done_reason"] in ("stop", "length"), f"{what}: done, done_reason {obj.get('done_reason')}")
    check(isinstance(obj["created_at"], str) and obj["created_at"].endswith("Z")
          and datetime.datetime.fromisoformat(obj["created_at"][:26] + "+00:00") is not None, f"{what}: created_at {obj['created_at']}")
    for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"):
        check(is_int(obj.get(k)) and obj[k] >= 0, f"{what}: {k} = {obj.get(k)}")
    check(obj["eval_count"] > 0 and obj["prompt_eval_count"] > 0 and obj["total_duration"] >= obj["eval_duration"],
          f"{what}: counts and durations add up")


# /api/version
st, _, b = http("GET", "/api/version")
check(st == 200 and isinstance(json.loads(b)["version"], str), f"version {b!r}")

# list / show / ps
tags = client.list()
check(len(tags.models) == 1, f"one model listed ({tags.models})")
m = tags.models[0]
NAME = m.model
check(NAME.endswith(":latest") and m.size > 100_000_000 and isinstance(m.modified_at, datetime.datetime)
      and len(m.digest) == 64, f"list entry {NAME} {m.size} {m.modified_at} {m.digest}")
check(m.details.format == "gguf" and m.details.family == "qwen2" and m.details.families == ["qwen2"]
      and m.details.parameter_size.endswith("M") and m.details.quantization_level, f"details {m.details}")
st, _, b = http("GET", "/api/tags")
raw = json.loads(b)["models"][0]
check(set(raw) >= {"name", "model", "modified_at", "size", "digest", "details"}
      and set(raw["details"]) >= {"parent_model", "format", "family", "families", "parameter_size", "quantization_level"},
      f"/api/tags fields {sorted(raw)}")
short = NAME.removesuffix(":latest")
sh = client.show(short)
check("completion" in sh.capabilities and "tools" in sh.capabilities, f"capabilities {sh.capabilities}")
check(sh.template and "im_start" in sh.template, "show: the chat template")
check(sh.modelinfo["general.architecture"] == "qwen2" and sh.modelinfo["general.parameter_count"] > 100_000_000
      and sh.modelinfo["qwen2.context_length"] > 0, f"model_info {sh.modelinfo}")
ps = client.ps()
check(len(ps.models) == 1 and ps.models[0].model == NAME and isinstance(ps.models[0].expires_at, datetime.datetime)
      and ps.models[0].context_length > 0, f"ps {ps.models}")

# chat, whole and streamed
msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a primary color."}]
r = client.chat(model=NAME, messages=msgs, options=T0)
check(r.message.role == "assistant" and r.message.content, f"chat: {r.message.content!r}")
final_fields(r.model_dump(), "chat")
text = r.message.content
parts, last = [], None
for c in client.chat(model=short, messages=msgs, options=T0, stream=True):
    if not c.done:
        check(c.message.role == "assistant", "stream chunk: role")
    parts.append(c.message.content or "")
    last = c
check("".join(parts) == text, f"chat stream == whole ({''.join(parts)!r} vs {text!r})")
final_fields(last.model_dump(), "chat stream, last chunk")
st, ctype, b = http("POST", "/api/chat", {"model": NAME, "messages": msgs, "options": T0})
lines = [json.loads(line) for line in b.decode().splitlines() if line.strip()]
check(st == 200 and ctype.startswith("application/x-ndjson") and len(lines) > 2, f"NDJSON by default ({ctype}, {len(lines)} lines)")
check(all(set(x) >= {"model", "created_at", "message", "done"} for x in lines)
      and all(x["done"] is False for x in lines[:-1]) and lines[-1]["done"] is True, "every line: model, created_at, message, done")
check(lines[-1]["prompt_eval_count"] < r.prompt_eval_count or lines[-1]["prompt_eval_count"] == r.prompt_eval_count,
      "prompt_eval_count counts the tokens evaluated (a cached prefix is not)")

# options: num_predict cuts, stop ends
r = client.chat(model=NAME, messages=[{"role": "user", "content": "Count from 1 to 50, separated by spaces."}],
                options={**T0, "num_predict": 5})
check(r.eval_count == 5 and r.done_reason == "length", f"num_predict 5: {r.eval_count} tokens, {r.done_reason}")
r = client.chat(model=NAME, messages=[{"role": "user", "content": "Count from 1 to 20, separated by spaces."}],
                options={**T0, "stop": ["7"]})
check("7" not in r.message.content and r.done_reason == "stop" and "6" in r.message.content, f"stop '7': {r.message.content!r}")

# generate, whole and streamed
g = client.generate(model=NAME, prompt="Write one word: a fruit.", options=T0)
check(g.response and g.done, f"generate: {g.response!r}")
final_fields(g.model_dump(), "generate")
gs = "".join(c.response or "" for c in client.generate(model=NAME, prompt="Write one word: a fruit.", options=T0, stream=True))
check(gs == g.response, f"generate stream == whole ({gs!r} vs {g.response!r})")
graw = client.generate(model=NAME, prompt="def fibonacci(n):", raw=True, options={**T0, "num_predict": 16})
check(graw.response and graw.eval_count == 16, f"raw generate: {graw.response!r}")

# format: a JSON schema, the answer validates
schema = {"type": "object", "properties": {"color": {"type": "string"}, "hex": {"type": "string"}}, "required": ["color", "hex"]}
r = client.chat(model=NAME, messages=[{"role": "user", "content": "Give a color and its hex code."}], format=schema, options=T0)
v = json.loads(r.message.content)
check(isinstance(v, dict) and isinstance(v.get("color"), str) and isinstance(v.get("hex"), str), f"format schema: {v}")
r = client.generate(model=NAME, prompt="List two animals as a JSON object.", format="json", options=T0)
check(isinstance(json.loads(r.response), dict), f"format json: {r.response!r}")

# a tool call, then its result
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city's name
    """
    return "11 degrees Celsius and raining"


ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
r = client.chat(model=NAME, messages=ask, tools=[get_weather], options=T0)
calls = r.message.tool_calls or []
check(len(calls) >= 1 and calls[0].function.name == "get_weather" and isinstance(calls[0].function.arguments, dict)
      and "paris" in str(calls[0].function.arguments.get("city", "")).lower(), f"tool call: {calls}")
streamed = [c for ch in client.chat(model=NAME, messages=ask, tools=[get_weather], options=T0, stream=True)
            for c in (ch.message.tool_calls or [])]
check([c.function.model_dump() for c in streamed] == [c.function.model_dump() for c in calls], f"streamed tool calls {streamed}")
follow = ask + [r.message.model_dump(exclude_none=True),
                {"role": "tool", "content": get_weather(**calls[0].function.arguments), "tool_name": "get_weather"}]
# (a 0.5B model may call again rather than answer: the turn is checked for an answer of either kind)
r2 = client.chat(model=NAME, messages=follow, tools=[get_weather], options={**T0, "num_predict": 64})
check(r2.done and (r2.message.content or r2.message.tool_calls), f"second turn answered ({r2.message})")

# embed: a list of inputs, one row each, unit length; a single string gives a list of one row;
# the same vectors as /v1/embeddings; dimensions
e = client.embed(model=NAME, input=["Why is the sky blue?", "Why is the grass green?"])
check(len(e.embeddings) == 2 and len(e.embeddings[0]) == 896 and e.prompt_eval_count > 0, f"embed: 2 rows of {len(e.embeddings[0])}")
check(all(abs(sum(v * v for v in row) - 1) < 1e-4 for row in e.embeddings), "embed: unit length")
one = client.embed(model=NAME, input="Why is the sky blue?")
check(len(one.embeddings) == 1 and one.embeddings[0] == e.embeddings[0], "embed: a string == its row in a list")
st, _, b = http("POST", "/v1/embeddings", {"input": "Why is the sky blue?", "encoding_format": "float"})
check(st == 200 and json.loads(b)["data"][0]["embedding"] == one.embeddings[0], "embed == /v1/embeddings")
check(len(client.embed(model=NAME, input="x", dimensions=8).embeddings[0]) == 8, "embed: dimensions 8")
st, _, b = http("POST", "/api/embeddings", {"model": NAME, "prompt": "Why is the sky blue?"})
check(st == 200 and json.loads(b)["embedding"] == one.embeddings[0], "the older /api/embeddings")

# errors in ollama's form, also those answered before the route (authentication, a bad path)
st, _, b = http("GET", "/api/nothing-here")
check(st == 404 and isinstance(json.loads(b)["error"], str), f"unknown route: {st} {b!r}")
req = urllib.request.Request(base + "/api/tags")
try:
    urllib.request.urlopen(req)
    check(False, "no key accepted")
except urllib.error.HTTPError as e:
    check(e.code == 401 and isinstance(json.loads(e.read())["error"], str), f"no key: {e.code}")

try:
    client.chat(model="llama3:8b", messages=msgs)
    check(False, "an unknown model answered")
except ollama.ResponseError as e:
    check(e.status_code == 404 and "not found" in e.error, f"unknown model: {e.status_code} {e.error}")
st, _, b = http("POST", "/api/chat", {"model": NAME, "messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}]})
check(st == 400 and "images" in json.loads(b)["error"], f"images refused: {st} {b!r}")
st, _, b = http("POST", "/api/generate", {"prompt": "hi"})
check(st == 400 and json.loads(b)["error"].startswith("model"), f"no model: {st} {b!r}")
st, _, b = http("POST", "/api/chat", {"model": NAME, "messages": msgs, "options": {"num_predict": "many"}})
check(st == 400 and "num_predict" in json.loads(b)["error"], f"bad option: {st} {b!r}")
st, _, b = http("POST", "/api/chat", {"model": NAME, "messages": []})
lo = json.loads(b)
check(st == 200 and lo["done"] is True and lo["done_reason"] == "load", f"empty conversation loads: {lo}")

print("all checks passed")
