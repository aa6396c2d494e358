"""The official `openai` Python client against a running `cortiq serve` (crates/cli/tests/serve.rs
starts the server and runs this file with the venv scripts/test made).

usage: openai_client.py BASE_URL API_KEY MODEL_ID [--chat]
Exits non-zero with a message on the first failed check; prints one line per check passed.
"""
import sys

import openai

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
chat_ok = "--chat" in sys.argv[4:]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


# models.list
models = client.models.list()
ids = [m.id for m in models.data]
check(ids == [model], f"models.list gives [{model!r}] (got {ids})")

# completions, whole and streamed, temperature 0
prompt = "The quick brown fox jumps over the lazy dog. Once upon a time"
whole = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
text = whole.choices[0].text
check(whole.object == "text_completion" and len(whole.choices) == 1, "completions: one choice")
check(whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0, f"completions usage {whole.usage}")
check(whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens, "usage adds up")
chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True))
streamed = "".join(c.choices[0].text for c in chunks if c.choices)
check(streamed == text, f"completions streamed == whole ({streamed!r} vs {text!r})")
check(len({c.id for c in chunks}) == 1, "completions stream: one id on every chunk")
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finishes == [whole.choices[0].finish_reason], f"completions stream: exactly one finish_reason ({finishes})")
check(all(c.usage is None for c in chunks), "completions stream without include_usage: no usage")

# include_usage: the last chunk has empty choices and the usage
chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                        stream_options={"include_usage": True}))
check(chunks[-1].choices == [] and chunks[-1].usage is not None, "include_usage: a final usage chunk with no choices")
check(chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, "include_usage: same counts as whole")
check(all(c.usage is None for c in chunks[:-1]), "include_usage: usage only on the last chunk")

# a stop string that spans tokens: cut exactly before it, finish_reason stop
if len(text) >= 12:
    k = len(text) // 2
    stop = text[k - 3:k + 3]
    cut = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    check(cut.choices[0].text == text[:text.index(stop)], f"stop {stop!r}: text cut before it ({cut.choices[0].text!r})")
    check(cut.choices[0].finish_reason == "stop", "stop string: finish_reason stop")
    parts = list(client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True))
    check("".join(c.choices[0].text for c in parts if c.choices) == text[:text.index(stop)], "stop string streamed: same cut")

# logprobs (completions form): tokens concatenate to the text, logprobs <= 0
lp = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
c0 = lp.choices[0]
check("".join(c0.logprobs.tokens) == c0.text, "completions logprobs: tokens concatenate to the text")
check(all(x <= 0 for x in c0.logprobs.token_logprobs), "completions logprobs <= 0")
check(all(len(t) <= 3 for t in c0.logprobs.top_logprobs), "completions top_logprobs: at most 3 each")
check(all(abs(max(t.values()) - x) < 1e-4 for t, x in zip(c0.logprobs.top_logprobs, c0.logprobs.token_logprobs)),
      "temperature 0: the chosen token is the most likely")

# n > 1 with a seed: distinct indices, reproducible
a = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, n=3, seed=7)
b = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, n=3, seed=7)
check(sorted(c.index for c in a.choices) == [0, 1, 2], "n=3: three choices indexed 0..2")
check([c.text for c in a.choices] == [c.text for c in b.choices], "same seed: same choices")

# errors through the client's exception types
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    check(False, "unknown model raises")
except openai.NotFoundError as e:
    check(e.status_code == 404 and e.body.get("code") == "model_not_found", "unknown model: 404 model_not_found")
try:
    client.completions.create(model=model, prompt="hello " * 5000, max_tokens=1)
    check(False, "context overflow raises")
except openai.BadRequestError as e:
    check(e.body.get("code") == "context_length_exceeded", "prompt past the context: 400 context_length_exceeded")
try:
    client.completions.create(model=model, prompt="x", max_tokens=1, temperature=7)
    check(False, "temperature 7 raises")
except openai.BadRequestError as e:
    check(e.body.get("param") == "temperature", "temperature out of range: 400 naming the param")
bad = openai.OpenAI(base_url=base, api_key="wrong-key", max_retries=0)
try:
    bad.models.list()
    check(False, "a wrong key raises")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "wrong api key: 401")

if chat_ok:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
    content = whole.choices[0].message.content
    check(whole.object == "chat.completion" and whole.choices[0].message.role == "assistant", "chat: an assistant message")
    chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", "chat stream: the first delta carries the role")
    check(all(c.choices[0].delta.role is None for c in chunks[1:]), "chat stream: only the first delta has a role")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == content, f"chat streamed == whole ({streamed!r} vs {content!r})")
    check(len({c.id for c in chunks}) == 1, "chat stream: one id")
    fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(fin == [whole.choices[0].finish_reason], f"chat stream: exactly one finish_reason ({fin})")
    lp = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    ents = lp.choices[0].logprobs.content
    check("".join(e.token for e in ents) == lp.choices[0].message.content, "chat logprobs: tokens concatenate to the content")
    check(all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in ents), "chat logprobs <= 0, two alternatives each")
    chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0, stream=True,
                                                 logprobs=True, stream_options={"include_usage": True}))
    toks = "".join(e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content)
    check(toks == lp.choices[0].message.content, "chat stream logprobs: tokens concatenate to the content")
    check(chunks[-1].usage is not None and chunks[-1].choices == [], "chat include_usage: final usage chunk")
    parts = [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colours."}]
    again = client.chat.completions.create(model=model, messages=[msgs[0], {"role": "user", "content": parts}], max_tokens=24, temperature=0)
    check(again.choices[0].message.content == content, "text-part content == the same string content")
    n2 = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0.9, n=2, seed=3)
    check(len(n2.choices) == 2, "chat n=2: two choices")

    # json_schema: the output parses and validates (checked here by hand: required keys, types,
    # enum, array bounds), at temperature 0 and sampled
    import json
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "colour": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "age", "colour", "tags"],
        "additionalProperties": False,
    }
    ask = [{"role": "user", "content": "Describe a person as JSON with name, age, colour and tags."}]
    for temp, seed in [(0, 0), (1.0, 11), (1.0, 12)]:
        r = client.chat.completions.create(model=model, messages=ask, max_tokens=200, temperature=temp, seed=seed,
                                           response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        doc = json.loads(r.choices[0].message.content)
        check(set(doc) == {"name", "age", "colour", "tags"}, f"json_schema: exactly the required keys ({doc})")
        check(isinstance(doc["name"], str) and len(doc["name"]) <= 20, "json_schema: name a short string")
        check(isinstance(doc["age"], int) and 0 <= doc["age"] <= 150, "json_schema: age an integer in range")
        check(doc["colour"] in ("red", "green", "blue"), "json_schema: colour from the enum")
        check(1 <= len(doc["tags"]) <= 3 and all(isinstance(t, str) and len(t) <= 10 for t in doc["tags"]), "json_schema: tags bounded")
        check(r.choices[0].finish_reason == "stop", "json_schema: finished by the grammar, not the length")
    q = [{"role": "user", "content": "What is 2+2? Answer as JSON like {\"answer\": 4}."}]
    r = client.chat.completions.create(model=model, messages=q, max_tokens=100, temperature=0, response_format={"type": "json_object"})
    check(r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict),
          f"json_object: the output is a JSON object ({r.choices[0].message.content!r})")

    # Speculative decoding per request (`speculative` through extra_body): the same text as
    # without, greedy and seeded, streamed and whole; usage reports the drafts kept and not.
    edit = [{"role": "user", "content": "Repeat this list exactly, one item per line: apple, banana, cherry, "
                                        "apple, banana, cherry, apple, banana, cherry."}]
    for temp, seed in [(0, 0), (0.8, 5)]:
        plain = client.chat.completions.create(model=model, messages=edit, max_tokens=64, temperature=temp, seed=seed)
        spec = client.chat.completions.create(model=model, messages=edit, max_tokens=64, temperature=temp, seed=seed,
                                              extra_body={"speculative": {"type": "ngram", "n_max": 8}})
        check(spec.choices[0].message.content == plain.choices[0].message.content,
              f"speculative == plain at temperature {temp} ({spec.choices[0].message.content!r} vs {plain.choices[0].message.content!r})")
        d = spec.usage.completion_tokens_details
        check(d is not None and d.accepted_prediction_tokens >= 0 and d.rejected_prediction_tokens >= 0,
              f"speculative usage: drafted tokens kept and rejected ({spec.usage})")
        check(plain.usage.completion_tokens_details is None, "plain usage: no prediction counts")
        chunks = list(client.chat.completions.create(model=model, messages=edit, max_tokens=64, temperature=temp, seed=seed,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body={"speculative": {"type": "ngram"}}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(streamed == plain.choices[0].message.content, f"speculative stream == plain at temperature {temp}")
        check(chunks[-1].usage.completion_tokens_details is not None, "speculative stream: usage with prediction counts")
    try:
        client.chat.completions.create(model=model, messages=edit, max_tokens=8, extra_body={"speculative": {"type": "magic"}})
        check(False, "a bad speculative type is refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "speculative.type", f"bad speculative type: 400 naming the field ({e.body})")
    for bad, param in [({"type": "draft"}, "speculative.type"), ({"type": "ngram", "n_max": 2, "n_min": 5}, "speculative.n_min"),
                       ({"n_max": 0}, "speculative.n_max"), ("ngram", "speculative")]:
        try:
            client.chat.completions.create(model=model, messages=edit, max_tokens=8, extra_body={"speculative": bad})
            check(False, f"speculative {bad} is refused")
        except openai.BadRequestError as e:
            check(e.body.get("param") == param, f"speculative {bad}: 400 naming {param} ({e.body})")

    # The prompt cache over a multi-turn chat: each turn resends the conversation; from the
    # second turn on, usage.prompt_tokens_details.cached_tokens counts the positions restored
    # (the previous turns' prompt and answer, prefilled again while the server idled), and the
    # answer equals the same request with the cache off (`cache_prompt: false`).
    import time
    conv = [{"role": "system", "content": "You are terse."}]
    for turn, ask_text in enumerate(["Name a colour.", "Name another.", "And a third?"]):
        conv.append({"role": "user", "content": ask_text})
        r = client.chat.completions.create(model=model, messages=conv, max_tokens=16, temperature=0.7, seed=turn)
        cold = client.chat.completions.create(model=model, messages=conv, max_tokens=16, temperature=0.7, seed=turn,
                                              extra_body={"cache_prompt": False})
        check(r.choices[0].message.content == cold.choices[0].message.content,
              f"turn {turn}: cached == uncached ({r.choices[0].message.content!r} vs {cold.choices[0].message.content!r})")
        d = r.usage.prompt_tokens_details
        check(d is not None and d.cached_tokens <= r.usage.prompt_tokens, f"turn {turn}: cached_tokens reported ({r.usage})")
        check(cold.usage.prompt_tokens_details.cached_tokens == 0, f"turn {turn}: cache_prompt false reuses nothing")
        if turn > 0:
            check(d.cached_tokens >= r.usage.prompt_tokens - 40,
                  f"turn {turn}: only the new tokens are computed ({d.cached_tokens} of {r.usage.prompt_tokens} cached)")
        print(f"turn {turn}: {r.usage.prompt_tokens} prompt tokens, {d.cached_tokens} cached")
        conv.append({"role": "assistant", "content": r.choices[0].message.content})
        time.sleep(0.3)  # the idle refill of prompt + answer

# embeddings: the client's default base64 and floats agree; unit length; a batch gives each
# input what it gives alone; dimensions truncate and renormalize
texts = ["The quick brown fox jumps over the lazy dog", "def add(a, b): return a + b", "A third input"]
emb = client.embeddings.create(model=model, input=texts)
vecs = [d.embedding for d in emb.data]
check(emb.object == "list" and [d.index for d in emb.data] == [0, 1, 2] and emb.usage.prompt_tokens > 0, f"embeddings: three rows ({emb.usage})")
check(all(abs(sum(v * v for v in e) - 1) < 1e-4 for e in vecs), "embeddings: unit length")
floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
check(all(max(abs(a - b) for a, b in zip(x.embedding, y)) == 0 for x, y in zip(floats.data, vecs)), "embeddings: base64 == float")
alone = client.embeddings.create(model=model, input=texts[1]).data[0].embedding
check(alone == vecs[1], "embeddings: an input alone == its row in a batch")
short = client.embeddings.create(model=model, input=texts[0], dimensions=32).data[0].embedding
norm = sum(v * v for v in vecs[0][:32]) ** 0.5
check(len(short) == 32 and max(abs(a - b / norm) for a, b in zip(short, vecs[0][:32])) < 1e-6, "embeddings: dimensions 32")
try:
    client.embeddings.create(model=model, input=[])
    check(False, "an empty input list was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400, f"embeddings: empty input refused ({e.status_code})")

print("all checks passed")
