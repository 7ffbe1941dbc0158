#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets (tests/fuzz/corpus/<target>/): a few small
valid inputs per target in the framing its fuzz_<target>.cpp documents, and the tokenizer's
`hang_5000_specials`. Deterministic: rerunning it rewrites the same bytes.

    python3 tests/fuzz/make_seeds.py            # from the repository root

Inputs that once found a bug are written here too, named regress_* (what they found is said
where they are written).
"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- GGUF ---------------------------------------------------------------------------------------

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64 = range(13)
G_F32, G_F16, G_Q4_0, G_Q4_1, G_Q8_0, G_BF16 = 0, 1, 2, 3, 8, 30
SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
          T_F32: "<f", T_BOOL: "<B", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(t, v):
    """The bytes of a value of type t (after its type tag)."""
    if t == T_STRING:
        return gstr(v)
    if t == T_ARRAY:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gvalue(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(meta, tensors=(), version=3, alignment=32):
    """meta: [(key, type, value)]; tensors: [(name, dims, ggml type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta))
    for k, t, v in meta:
        out += gstr(k) + struct.pack("<I", t) + gvalue(t, v)
    offsets, running = [], 0
    for _, _, _, data in tensors:
        offsets.append(running)
        running = (running + len(data) + alignment - 1) // alignment * alignment
    for (name, dims, gt, _), off in zip(tensors, offsets):
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gt, off)
    if tensors:
        out += b"\0" * (-len(out) % alignment)
        start = len(out)
        for (_, _, _, data), off in zip(tensors, offsets):
            out += b"\0" * (start + off - len(out)) + data
    return out


def byte_alphabet():
    """GPT-2's byte -> character map (tokenizer.hpp's byte_to_unicode)."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(0x100 + n)
            n += 1
    return [chars[b] for b in range(256)]


ALPHABET = byte_alphabet()


def seeds_gguf():
    every_type = [
        ("general.architecture", T_STRING, "llama"),
        ("general.name", T_STRING, "fuzz seed"),
        ("u8", T_U8, 200), ("i8", T_I8, -5), ("u16", T_U16, 60000), ("i16", T_I16, -30000),
        ("u32", T_U32, 4000000000), ("i32", T_I32, -2000000000), ("f32", T_F32, 1.5),
        ("bool", T_BOOL, 1), ("u64", T_U64, 2**63), ("i64", T_I64, -(2**62)), ("f64", T_F64, -0.25),
        ("llama.block_count", T_U32, 2),
        ("arr.i32", T_ARRAY, (T_I32, [1, -2, 3])),
        ("arr.f32", T_ARRAY, (T_F32, [0.5, -1.0])),
        ("arr.string", T_ARRAY, (T_STRING, ["a", "", "ccc"])),
        ("arr.nested", T_ARRAY, (T_ARRAY, [(T_U8, [1, 2]), (T_STRING, ["x"])])),
        ("arr.empty", T_ARRAY, (T_U64, [])),
    ]
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    f16 = struct.pack("<4H", 0x3C00, 0xC000, 0x3800, 0x7BFF)
    bf16 = struct.pack("<4H", 0x3F80, 0xC000, 0x3F00, 0x7F80)
    q4_0 = struct.pack("<H", 0x3C00) + bytes(range(16))
    q4_1 = struct.pack("<HH", 0x3C00, 0xBC00) + bytes(range(16, 32))
    q8_0 = struct.pack("<H", 0x3800) + bytes((i * 7) & 0xFF for i in range(32))
    tensors = [
        ("t.f32", [2, 2], G_F32, f32), ("t.f16", [4], G_F16, f16), ("t.bf16", [2, 2, 1], G_BF16, bf16),
        ("t.q4_0", [32], G_Q4_0, q4_0), ("t.q4_1", [32, 1], G_Q4_1, q4_1), ("t.q8_0", [32], G_Q8_0, q8_0),
        ("t.empty", [0, 4], G_F32, b""),
    ]
    write("gguf", "every_type_v3", gguf(every_type, tensors))
    write("gguf", "align64_v2",
          gguf([("general.alignment", T_U32, 64), ("x", T_STRING, "y")], tensors[:2], version=2, alignment=64))
    write("gguf", "empty_v3", gguf([]))
    toks = ALPHABET + ["Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>"]
    types = [1] * 256 + [1, 1, 1, 3, 3]
    tok_meta = [
        ("tokenizer.ggml.model", T_STRING, "gpt2"),
        ("tokenizer.ggml.pre", T_STRING, "smollm"),
        ("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, toks)),
        ("tokenizer.ggml.token_type", T_ARRAY, (T_I32, types)),
        ("tokenizer.ggml.merges", T_ARRAY, (T_STRING, ["Ġ t", "h e", "Ġt he"])),
        ("tokenizer.ggml.bos_token_id", T_U32, 259),
        ("tokenizer.ggml.eos_token_id", T_I32, 260),
    ]
    write("gguf", "tokenizer_v3", gguf(tok_meta, [("token_embd.weight", [4, 2], G_F32, f32 * 2)]))


# ---- tokenizer framing (fuzz_tokenizer.cpp) -----------------------------------------------------

F_SMOLLM, F_BOS, F_BASE, F_GGUF, F_JOINED, F_DEDUPE, F_LONG = 1, 2, 4, 8, 16, 32, 64


def tok_input(flags, tokens, merges, bos, eos, text, repeat=1):
    """tokens: [(type, bytes)]; merges: [(left string, right string)] resolved to indices the way
    the target builds its vocabulary; repeat counts only with F_LONG."""
    vocab = []
    if flags & F_BASE:
        vocab += [c.encode() for c in ALPHABET]
    out = struct.pack("<BH", flags, len(tokens))
    for t, s in tokens:
        s = s.encode() if isinstance(s, str) else s
        out += struct.pack("<BB", t, len(s)) + s
        if not (flags & F_DEDUPE and s in vocab):
            vocab.append(s)
    out += struct.pack("<H", len(merges))
    for l, r in merges:
        l, r = l.encode(), r.encode()
        out += struct.pack("<HH", vocab.index(l), vocab.index(r))
        if flags & F_JOINED and l + r not in vocab:
            vocab.append(l + r)
    text = text.encode() if isinstance(text, str) else text
    return out + struct.pack("<hhI", bos, eos, repeat) + text


def seeds_tokenizer():
    specials = [(3, "<|im_start|>"), (3, "<|im_end|>"), (4, "<tool>")]
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at"),
              ("i", "n"), ("Ġ", "in"), ("Ċ", "Ċ")]
    text = "<|im_start|>user\nHello there, the 42 cats in the hat!<|im_end|>\n\n<tool> don't"
    write("tokenizer", "smollm_specials_gguf",
          tok_input(F_SMOLLM | F_BASE | F_GGUF | F_JOINED | F_DEDUPE | F_BOS, specials, merges,
                    256, 257, text))
    write("tokenizer", "gpt2_unicode",
          tok_input(F_BASE | F_JOINED | F_DEDUPE, specials, merges, -1, -1,
                    "naïve café — 日本語 😀 it's 3.14159\t\r\n  x\xff".encode("utf-8", "surrogateescape")))
    # No byte alphabet: most bytes have no token and are left out.
    small = [(1, "a"), (1, "b"), (1, "ab"), (1, "Ġ"), (3, "<s>"), (1, "c")]
    write("tokenizer", "partial_bytes",
          tok_input(F_DEDUPE, small, [("a", "b")], 4, -1, "ab abc <s>xyz ba" * 3))
    # The known hang (tools/model/tokenizer.hpp, encode's special-token scan): 5000 control tokens
    # sharing their first bytes, over 1 MiB of text that starts one at every other byte.
    many = [(3, "<|%d|>" % i) for i in range(5000)]
    write("tokenizer", "hang_5000_specials", tok_input(F_LONG, many, [], -1, -1, "<|", repeat=1 << 19))
    # Regression: merges of merges with their joined tokens added double a token each time; 40 of
    # them asked for 2^41 bytes (libFuzzer out-of-memory). The target skips merges over 1 KiB.
    doubling = struct.pack("<BH", F_JOINED, 1) + struct.pack("<BB", 1, 2) + b"ab"
    doubling += struct.pack("<H", 40) + b"".join(struct.pack("<HH", i, i) for i in range(40))
    write("tokenizer", "regress_oom_merge_doubling",
          doubling + struct.pack("<hhI", -1, -1, 0) + b"ab" * 64)


# ---- prompt files -------------------------------------------------------------------------------

def seeds_prompt_jsonl():
    with open(os.path.join(ROOT, "tests", "data", "passkey_example.jsonl"), "rb") as f:
        lines = f.read().splitlines(keepends=True)
    write("prompt_jsonl", "passkey_example_first", lines[0])
    write("prompt_jsonl", "escapes",
          b'{"input": "caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t", "target": " ok"}\n'
          b'\n'
          b'  {"id": -1.5e+3, "tags": [true, false, null, {"a": []}], "input": "x", "target": "y"}  \r\n')
    write("prompt_jsonl", "minimal", b'{"input":"a","target":"b"}')


# ---- layout metadata framing (fuzz_layout_metadata.cpp) ------------------------------------------

def layout_input(kind, flags, hdr, arrays, counts, rows, compact=False):
    """hdr: num_seqs, num_kv_heads, capacity, page_size, page_stride, max_blocks, num_pages,
    k_delta, v_delta, prefetch_rows; rows: per (s, h) the selected indices."""
    out = struct.pack("<BB", kind | (8 if compact else 0), flags) + struct.pack("<10i", *hdr)
    for a in arrays:
        out += struct.pack("<%di" % len(a), *a)
    cap = hdr[2]
    if compact:
        out += bytes(counts)
        for r in rows:
            prev = -1
            for t in r:
                out += bytes([t - prev])
                prev = t
    else:
        out += struct.pack("<%di" % len(counts), *counts)
        for r in rows:
            out += struct.pack("<%di" % cap, *(r + [-7] * (cap - len(r))))
    return out


def selection(lens, heads, cap):
    rows = []
    for s, n in enumerate(lens):
        for h in range(heads):
            pick = [t for t in range(n) if (t * 3 + s + h) % 4 != 1][:cap]
            rows.append(pick)
    return [len(r) for r in rows], rows


def seeds_layout():
    heads, cap = 2, 4
    # 0 / 1: paged, block table (runtime page size 4 / static 4): lengths 9 and 5, pages 0..5.
    lens = [9, 5]
    counts, rows = selection(lens, heads, cap)
    bt = [lens, [0, 2, 4, 1, 3, 5]]
    for kind in (0, 1):
        write("layout_metadata", "paged_block_table_%d" % kind,
              layout_input(kind, 0, [2, heads, cap, 4, 0, 3, 6, 0, 0, 2], bt, counts, rows))
    write("layout_metadata", "paged_block_table_compact_2threads",
          layout_input(0, 1 | (2 << 1), [2, heads, cap, 4, 0, 3, 6, 0, 0, 1], bt, counts, rows, compact=True))
    # Interleaved K / V: page stride two dense pages (4 tokens x 2 heads x 4 = 32 elements).
    write("layout_metadata", "paged_block_table_interleaved",
          layout_input(0, 8, [2, heads, cap, 4, 64, 3, 6, 0, 0, 8], bt, counts, rows))
    # 2: FlashInfer, runtime page size 4: 3 and 2 pages, last pages of 1 token: lengths 9 and 5.
    fi = [[0, 3, 5], [1, 1], [0, 2, 4, 1, 3]]
    write("layout_metadata", "paged_flashinfer_2",
          layout_input(2, 0, [2, heads, cap, 4, 0, 0, 5, 16, 0, 2], fi, counts, rows))
    # 3: FlashInfer, static page size 2: lengths 5 and 3.
    lens3 = [5, 3]
    c3, r3 = selection(lens3, heads, cap)
    write("layout_metadata", "paged_flashinfer_static2_3",
          layout_input(3, 2 << 1, [2, heads, cap, 0, 0, 0, 5, 0, 0, 2], fi, c3, r3))
    # 4 / 5: padded, capacity 10.
    for kind in (4, 5):
        write("layout_metadata", "contiguous_padded_%d" % kind,
              layout_input(kind, 0, [2, heads, cap, 10, 0, 0, 0, 0, 0, 2], [lens], counts, rows))
    # 6 / 7: ragged, 14 tokens.
    for kind in (6, 7):
        write("layout_metadata", "contiguous_ragged_%d" % kind,
              layout_input(kind, 1, [2, heads, cap, 14, 0, 0, 0, 0, 0, 2], [[0, 9, 14]], counts, rows,
                           compact=kind == 7))
    # Regressions. prefetch_rows = INT_MAX: the host gather's `i + dist` overflowed (UBSan).
    write("layout_metadata", "regress_prefetch_int_max",
          layout_input(0, 0, [2, heads, cap, 4, 0, 3, 6, 0, 0, 2**31 - 1], bt, counts, rows))
    # FlashInfer indptr = [0, 3, 1]: indices holds indptr[2] = 1 entry, and validate read sequence
    # 0's 3 page ids past it before it saw the decrease at sequence 1 (ASan).
    write("layout_metadata", "regress_flashinfer_indptr_dip",
          layout_input(2, 0, [2, heads, cap, 4, 0, 0, 5, 0, 0, 2], [[0, 3, 1], [1, 1], [0]],
                       counts, rows))


if __name__ == "__main__":
    seeds_gguf()
    seeds_tokenizer()
    seeds_prompt_jsonl()
    seeds_layout()
