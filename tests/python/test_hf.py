"""kvscout.hf (issue 48's first slice) on the CPU with the SmolLM2-135M GGUF that
scripts/fetch_model.sh places: with every row selected, greedy decoding through kvscout's
pipeline is token for token transformers' own sdpa, logits within 1e-4; what it cannot do yet is
refused by name. Skipped where torch, transformers, gguf, accelerate or the model are absent
(CI installs NumPy only so far)."""

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import kvscout.hf  # noqa: E402

MODEL_DIR = Path(os.environ.get("KVSCOUT_MODEL_DIR", Path.home() / ".cache" / "kvscout"))
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path(__file__).resolve().parents[1] / "data" / "pg19_firstbook.txt"


@pytest.fixture(scope="module")
def smollm2():
    if not (MODEL_DIR / GGUF).is_file():
        pytest.skip(f"{MODEL_DIR / GGUF} is absent (bash scripts/fetch_model.sh)")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(MODEL_DIR), gguf_file=GGUF, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR), gguf_file=GGUF)
    ids = tok(TEXT.read_text()[:4000], return_tensors="pt").input_ids[:, :300]
    return model, tok, ids


@torch.no_grad()
def test_every_row_selected_is_sdpa(smollm2):
    model, _, ids = smollm2
    model.set_attn_implementation("sdpa")
    ref = model.generate(ids, max_new_tokens=64, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    cache = kvscout.hf.attach(model, "kvscout_speculation_only", 1.0, calibration_ids=ids,
                              max_tokens=400)
    got = model.generate(ids, cache=cache, max_new_tokens=64, do_sample=False,
                         output_scores=True, return_dict_in_generate=True)
    assert torch.equal(got.sequences, ref.sequences)
    diff = max((a - b).abs().max().item() for a, b in zip(got.scores, ref.scores))
    assert diff <= 1e-4, diff
    # Attached, but run with transformers' own cache: every step is sdpa's, the pipeline idle.
    again = model.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(again, ref.sequences[:, :ids.shape[1] + 16])
    st = cache.stats()
    # 63 decode steps through the pipeline; every cached row of the speculated layers fetched.
    lens = sum(range(300, 363))
    assert st.rows[2:].tolist() == [lens * 3] * (len(st.rows) - 2)
    assert st.rows[:2].tolist() == [0, 0]  # below skip_layers: dense, nothing fetched


@torch.no_grad()
def test_refusals_name_what_is_not_supported(smollm2):
    model, tok, ids = smollm2
    cache = kvscout.hf.attach(model, "kvscout_default", 0.1, calibration_ids=ids, max_tokens=400)
    with pytest.raises(ValueError, match="the model's K is \\[2, 3, \\*, 64\\], the cache was "
                                         "attached for batch 1.*beam search"):
        model.generate(ids, cache=cache, max_new_tokens=4, num_beams=2, do_sample=False)
    cache = kvscout.hf.attach(model, "kvscout_default", 0.1, calibration_ids=ids, max_tokens=400)
    with pytest.raises(NotImplementedError, match="assisted decoding is not supported"):
        model.generate(ids, cache=cache, max_new_tokens=4, prompt_lookup_num_tokens=3,
                       do_sample=False)
    cache = kvscout.hf.attach(model, "kvscout_default", 0.1, calibration_ids=ids, max_tokens=310)
    with pytest.raises(ValueError, match="311 tokens exceed the cache's max_tokens 310"):
        model.generate(ids, cache=cache, max_new_tokens=20, do_sample=False)
    with pytest.raises(ValueError, match="attach\\(\\) needs calibration_ids"):
        kvscout.hf.attach(model, "kvscout_default", 0.1)
    model.set_attn_implementation("sdpa")


def test_hf_generate_example_runs(smollm2, capsys, monkeypatch):
    """examples/python/hf_generate.py end to end at 60 tokens: both perplexities, an answer and
    the bytes fetched are printed."""
    import runpy
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "python" / "hf_generate.py"
    monkeypatch.setattr(sys, "argv", ["hf_generate.py", "--model", str(MODEL_DIR), "--gguf",
                                      GGUF, "--tokens", "60",
                                      "--calibration", str(TEXT)])
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "passage perplexity over 59 tokens: dense" in out
    assert "answer (speculative):" in out and "of the rows a full fetch moves" in out
