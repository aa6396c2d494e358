#!/usr/bin/env python3
"""PyTorch eager float32 (CPU) timing of the polish training step, for the comparison of
issue 6 acceptance 4 with cortiq's `trainer_bench` example (crates/train/examples/).

The same step on the same geometry: a random-weight student shaped like SmolLM2-135M
(30 layers, d 576, 9 query / 3 kv heads of 64, SwiGLU FFN 1536, tied 49,152-token head,
RMSNorm eps 1e-5, RoPE NeoX theta 100000), every layer's attention the O(1) Nystrom operator
in matrix form (the contract of crates/train/src/nystrom.rs and tools/fixtures/gen_train.py,
vectorized over heads: window 64, 4 sinks, m = 64 landmarks over the prompt = first half,
ridge 1e-6, M detached), the loss 0.5*CE + 0.5*KL(teacher||student) over the second half
against random teacher logits; trainable: RMSNorm gains and FFN weights; one step =
forward + backward + clip_grad_norm_ + torch.optim.AdamW.step. No activation checkpointing
(eager autograd keeps every activation: faster than recomputing, at the memory cost reported).

Usage: python tools/bench/train_step_torch.py [T] [layers] [steps] [threads]
Prints per-step seconds, tokens/s (T per step) and peak RSS. Pinned environment:
tools/fixtures/requirements.txt (torch 2.15.0).
"""

import math
import resource
import sys
import time

import torch

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
LAYERS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
THREADS = int(sys.argv[4]) if len(sys.argv) > 4 else torch.get_num_threads()
D, NH, NKV, HD, FF, V = 576, 9, 3, 64, 1536, 49152
WIN, SINKS, LANDMARKS, RIDGE, EPS = 64, 4, 64, 1e-6, 1e-5


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rmsnorm(x, g):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * g


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def masks(t, tp):
    ti = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    causal = j <= ti
    near = causal & ((ti < tp) | (ti - j < WIN) | (j < SINKS))
    return near, causal & ~near


def nystrom(q, k, v, scale, tp, near, far):
    """q, k, v [nh, T, hd] (kv expanded); the operator of gen_train.py, all heads at once."""
    m = min(max(tp // 8, 4), LANDMARKS)
    assert tp % m == 0, "bench: equal segments only"
    nh, t, hd = q.shape
    qt = q[:, :tp].reshape(nh, m, tp // m, hd).mean(2)  # [nh, m, hd]
    kt = k[:, :tp].reshape(nh, m, tp // m, hd).mean(2)
    with torch.no_grad():
        x = (qt @ kt.transpose(1, 2)).double() * scale
        gm = x.amax(dim=(1, 2), keepdim=True)
        au = torch.exp(x - gm)  # shifted: M = e^-gm * Mhat
        gram = au.transpose(1, 2) @ au
        lam = RIDGE * gram.diagonal(dim1=1, dim2=2).sum(-1) / m
        eye = torch.eye(m, dtype=torch.float64)
        mhat = torch.linalg.solve(gram + lam[:, None, None] * eye, au.transpose(1, 2)).float()
        gm = gm.float()
    s = (q @ k.transpose(1, 2)) * scale  # [nh, T, T]
    c = s.masked_fill(~near, float("-inf")).amax(-1, keepdim=True).detach()
    u = (q @ kt.transpose(1, 2)) * scale  # [nh, T, m]
    umax = u.amax(-1, keepdim=True).detach()
    xe = (qt @ k.transpose(1, 2)) * scale  # [nh, m, T]
    cm = xe.amax(1, keepdim=True).detach()  # [nh, 1, T]
    w = torch.exp(u - umax) @ mhat  # [nh, T, m]
    a = (w @ torch.exp(xe - cm)) * torch.exp((umax - gm - c) + cm) * far  # [nh, T, T]
    keep = (a.sum(-1, keepdim=True) >= 0).detach()
    wt = torch.exp(s - c) * near + a * keep
    den = wt.sum(-1, keepdim=True).clamp_min(1e-30)
    return (wt @ v) / den


def main():
    torch.set_num_threads(THREADS)
    torch.manual_seed(1)
    tp = T // 2
    g = lambda *sh, s: (torch.rand(*sh) * 2 - 1) * s * 1.7  # noqa: E731 (the Rust bench's draw)
    embed = g(V, D, s=0.05)
    layers = []
    for _ in range(LAYERS):
        layers.append(dict(
            attn_norm=torch.ones(D), wq=g(NH * HD, D, s=0.04), wk=g(NKV * HD, D, s=0.04),
            wv=g(NKV * HD, D, s=0.04), wo=g(D, NH * HD, s=0.04), ffn_norm=torch.ones(D),
            gate=g(FF, D, s=0.04), up=g(FF, D, s=0.04), down=g(D, FF, s=0.025)))
    final_norm = torch.ones(D)
    trainable = [final_norm] + [l[n] for l in layers for n in ("attn_norm", "ffn_norm", "gate", "up", "down")]
    for p in trainable:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    inv = torch.tensor([100000.0 ** (-(2 * i) / HD) for i in range(HD // 2)])
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[None], torch.sin(ang)[None]
    near, far = masks(T, tp)
    tokens = torch.tensor([(i * 7919) % V for i in range(T + 1)])
    teacher = g(T - tp, V, s=2.0)
    scale = 1.0 / math.sqrt(HD)

    def step():
        x = embed[tokens[:-1]]
        for l in layers:
            h1 = rmsnorm(x, l["attn_norm"])
            q = rope((h1 @ l["wq"].T).view(T, NH, HD).transpose(0, 1), cos, sin)
            k = rope((h1 @ l["wk"].T).view(T, NKV, HD).transpose(0, 1), cos, sin)
            v = (h1 @ l["wv"].T).view(T, NKV, HD).transpose(0, 1)
            rep = NH // NKV
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            o = nystrom(q, k, v, scale, tp, near, far).transpose(0, 1).reshape(T, NH * HD)
            x = x + o @ l["wo"].T
            h2 = rmsnorm(x, l["ffn_norm"])
            x = x + (torch.nn.functional.silu(h2 @ l["gate"].T) * (h2 @ l["up"].T)) @ l["down"].T
        z = rmsnorm(x[tp:], final_norm) @ embed.T  # [T - tp, V]
        ls = torch.log_softmax(z, -1)
        lt = torch.log_softmax(teacher, -1)
        ce = -ls.gather(1, tokens[tp + 1:][:, None]).mean()
        kl = (lt.exp() * (lt - ls)).sum(-1).mean()
        loss = 0.5 * ce + 0.5 * kl
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        return float(loss.detach())

    print(f"torch {torch.__version__} eager float32, {torch.get_num_threads()} threads; "
          f"SmolLM2-135M geometry, {LAYERS} layers, T={T}, all Nystrom (W {WIN}, {SINKS} sinks, m {LANDMARKS})")
    times = []
    for i in range(STEPS):
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"step {i}: {dt:.2f} s, {T / dt:.0f} tokens/s, loss {loss:.4f}, peak RSS {peak_rss_mb():.0f} MB", flush=True)
    best = min(times[1:]) if len(times) > 1 else times[0]
    print(f"best step after the first: {best:.2f} s = {T / best:.1f} tokens/s; peak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
