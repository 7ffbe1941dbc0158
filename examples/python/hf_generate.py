"""kvscout inside Hugging Face transformers: the Python twin of the C++ demo (examples/01).

Loads SmolLM2-135M from the GGUF that scripts/fetch_model.sh places (or any local Llama-family
model directory), attaches kvscout (kvscout_default at 10 % by default, calibrated on the first
1,024 tokens of the GPL), then scores a passage token by token, dense (transformers' sdpa with its
own cache) and speculative (kvscout's cache and attention), answers a question about it, and
prints the bytes fetched per token against a full fetch.

    build/python-venv/bin/python examples/python/hf_generate.py [--tokens 400] [--budget 0.1]
        [--model DIR --gguf FILE.gguf] [--text FILE] [--calibration FILE]

As the C++ demo does, every token of the prompt is decoded one step at a time (the speculation
runs from the first token). transformers' GGUF tokenizer may split some text (digit runs)
differently from the C++ one, so the two demos' token counts can differ slightly.
"""

import argparse
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import kvscout.hf

ROOT = Path(__file__).resolve().parents[2]


@torch.no_grad()
def score(model, ids, scored_from, cache):
    """Teacher-forced, one token per forward: the perplexity of ids[scored_from + 1:]."""
    nll, n = 0.0, 0
    for i in range(ids.shape[1] - 1):
        logits = model(ids[:, i:i + 1], cache=cache, use_cache=True).logits[0, -1]
        if i + 1 > scored_from:
            nll -= torch.log_softmax(logits.double(), -1)[ids[0, i + 1]].item()
            n += 1
    return math.exp(nll / n), n


@torch.no_grad()
def answer(model, tok, cache, question_ids, max_new=24):
    logits = None
    for i in range(question_ids.shape[1]):
        logits = model(question_ids[:, i:i + 1], cache=cache, use_cache=True).logits[0, -1]
    out = []
    for _ in range(max_new):
        nxt = int(logits.argmax())
        if nxt == tok.eos_token_id or tok.decode([nxt]) == "<|im_end|>":
            break
        out.append(nxt)
        logits = model(torch.tensor([[nxt]]), cache=cache, use_cache=True).logits[0, -1]
    return tok.decode(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path.home() / ".cache" / "kvscout"))
    ap.add_argument("--gguf", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default=str(ROOT / "tests" / "data" / "pg19_firstbook.txt"))
    ap.add_argument("--calibration", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--preset", default="kvscout_default")
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--tokens", type=int, default=400)
    a = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    gguf = a.gguf or None
    model = AutoModelForCausalLM.from_pretrained(a.model, gguf_file=gguf,
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(a.model, gguf_file=gguf)
    print(f"model: {model.config.model_type}, {model.config.num_hidden_layers} layers "
          f"(loaded in {time.time() - t0:.1f} s)")
    cal = tok(Path(a.calibration).read_text(), return_tensors="pt").input_ids[:, :1024]
    passage = tok(Path(a.text).read_text(), return_tensors="pt").input_ids[:, :a.tokens]
    head = tok("<|im_start|>user\n", return_tensors="pt").input_ids
    question = tok("\n\nIn one sentence, what is this passage about?<|im_end|>\n"
                   "<|im_start|>assistant\n", return_tensors="pt").input_ids
    prompt = torch.cat([head, passage], dim=1)
    max_tokens = prompt.shape[1] + question.shape[1] + 32

    t0 = time.time()
    model.set_attn_implementation("sdpa")
    dense, n = score(model, prompt, head.shape[1], DynamicCache())
    t_dense = time.time() - t0
    t0 = time.time()
    cache = kvscout.hf.attach(model, a.preset, a.budget, calibration_ids=cal,
                              max_tokens=max_tokens)
    t_cal = time.time() - t0
    t0 = time.time()
    spec, _ = score(model, prompt, head.shape[1], cache)
    t_spec = time.time() - t0
    print(f"passage perplexity over {n} tokens: dense {dense:.3f}, speculative ({a.preset}, "
          f"{100 * a.budget:.0f} % of the cached rows per step) {spec:.3f} "
          f"({100 * (spec / dense - 1):+.2f} %)  [dense {t_dense:.0f} s, calibration "
          f"{t_cal:.0f} s, speculative {t_spec:.0f} s]")
    print("answer (speculative):", answer(model, tok, cache, question))
    st = cache.stats()
    steps = cache.layers[0].get_seq_length()
    full = sum(range(steps)) * model.config.num_key_value_heads  # rows a full fetch moves
    skip = cache._state.p.skip_layers
    fetched = st.rows[skip:].sum() / (len(st.rows) - skip)
    print(f"per speculated layer: {fetched / full:.3f} of the rows a full fetch moves "
          f"({st.bytes[skip:].sum() / steps / 1024:.0f} KiB per token over layers {skip}.."
          f"{len(st.rows) - 1}; layers below {skip} attend densely)")
    model.set_attn_implementation("sdpa")


if __name__ == "__main__":
    main()
