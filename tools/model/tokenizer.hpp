#pragma once
// GPT-2 style byte-level BPE: the tokenizer that GGUF files with tokenizer.ggml.model = "gpt2"
// carry (SmolLM2, GPT-2, StarCoder, ...). Host-only; not part of the library (tools/ is for the
// accuracy harness and the demo). No GGUF dependency here: tokenizer_gguf.hpp builds one from a
// gguf_file.
//
//   kvscout::model::bpe_tokenizer tok(tokens, token_types, merges, /*bos=*/1, /*eos=*/2);
//   std::vector<std::int32_t> ids = tok.encode("<|im_start|>user\nHi<|im_end|>");
//   std::string text = tok.decode(ids);                  // the same bytes back
//
// Encoding, in order:
//   1. Special tokens. Control (type 3) and user-defined (type 4) tokens that occur literally in
//      the text become their own id (leftmost, then longest match), unless parse_special is off.
//   2. Pre-tokenization of the text between them (see pre_tokenizer below): the text is cut into
//      pieces; merges never cross a piece boundary.
//   3. Byte-level BPE per piece: every byte becomes the token spelled by its character in GPT-2's
//      byte alphabet (byte_to_unicode), then the adjacent pair with the lowest merge rank is
//      merged, repeatedly (leftmost first among equal ranks), until no listed pair is left.
// Decoding concatenates each token's bytes: the byte alphabet mapped back for normal tokens, the
// text as stored for control / user-defined tokens. decode(encode(s)) == s for every byte string
// whose bytes all have a single-byte token (has_byte_token: a normal token; one spelled like the
// byte but of control or user-defined type does not count), unless a merge's result is a control
// or user-defined token, which decodes to its stored text. A vocabulary may lack some: SmolLM2
// has no token for 21 bytes (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
// 0xF5-0xFF: control characters, and bytes that UTF-8 never uses or uses only for unassigned
// planes). Such bytes are left out of the encoding, as Hugging Face tokenizers and llama.cpp do.
//
// Unicode classes. The pre-tokenizer's \p{L}, \p{N} and \s come from a range table of the
// Unicode 17.0 general categories (L* = letter, N* = number; unassigned code points are "other")
// and the White_Space property (see unicode_class_ranges), so they agree with a Unicode regex
// engine of that version on every code point. Known deviations from the reference tokenizers:
// characters assigned after the Unicode version of their regex engine (Oniguruma in Hugging Face
// tokenizers, llama.cpp's own tables) are classed by 17.0 here; bytes that are not valid UTF-8
// (which the reference tokenizers cannot take at all) are one-byte code points of class "other",
// so they still round-trip.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvscout/core/error.hpp"

namespace kvscout::model {

/// Token types as GGUF stores them in tokenizer.ggml.token_type (llama.cpp's numbering).
enum class token_type : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

/// How text is cut into pieces before BPE.
///   gpt2:   GPT-2's pattern
///           's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
///   smollm: first every \p{N} code point is cut out as a piece of its own, then the gpt2 pattern
///           runs inside each remaining stretch (so " 42" is " ", "4", "2"). This is the rule of
///           llama.cpp's "smollm" / "starcoder" / "refact" / "codeshell" pre-tokenizers and of the
///           Hugging Face tokenizer.json they come from (Digits(individual_digits) + ByteLevel).
enum class pre_tokenizer { gpt2, smollm };

namespace detail::bpe {

/// The classes the pre-tokenizer pattern distinguishes.
enum class char_class : std::uint8_t { letter = 0, number = 1, space = 2, other = 3 };

// Sorted (first_code_point << 2) | class entries: each class holds from its first code point up
// to the next entry. Generated from Unicode 17.0 with the Python `regex` package (2026.5.9):
//   for cp in 0..0x10FFFF: cls = space if \s matches, letter if \p{L}, number if \p{N}, else
//     other (surrogates: other); emit (cp << 2) | cls whenever cls changes.
// \s is the White_Space property: U+0009-000D, 0020, 0085, 00A0, 1680, 2000-200A, 2028, 2029,
// 202F, 205F, 3000.
inline constexpr std::uint32_t unicode_class_ranges[] = {
    0x0000003, 0x0000026, 0x000003b, 0x0000082, 0x0000087, 0x00000c1, 0x00000eb, 0x0000104,
    0x000016f, 0x0000184, 0x00001ef, 0x0000216, 0x000021b, 0x0000282, 0x0000287, 0x00002a8,
    0x00002af, 0x00002c9, 0x00002d3, 0x00002d4, 0x00002db, 0x00002e5, 0x00002e8, 0x00002ef,
    0x00002f1, 0x00002ff, 0x0000300, 0x000035f, 0x0000360, 0x00003df, 0x00003e0, 0x0000b0b,
    0x0000b18, 0x0000b4b, 0x0000b80, 0x0000b97, 0x0000bb0, 0x0000bb7, 0x0000bb8, 0x0000bbf,
    0x0000dc0, 0x0000dd7, 0x0000dd8, 0x0000de3, 0x0000de8, 0x0000dfb, 0x0000dfc, 0x0000e03,
    0x0000e18, 0x0000e1f, 0x0000e20, 0x0000e2f, 0x0000e30, 0x0000e37, 0x0000e38, 0x0000e8b,
    0x0000e8c, 0x0000fdb, 0x0000fdc, 0x000120b, 0x0001228, 0x00014c3, 0x00014c4, 0x000155f,
    0x0001564, 0x000156b, 0x0001580, 0x0001627, 0x0001740, 0x00017af, 0x00017bc, 0x00017cf,
    0x0001880, 0x000192f, 0x0001981, 0x00019ab, 0x00019b8, 0x00019c3, 0x00019c4, 0x0001b53,
    0x0001b54, 0x0001b5b, 0x0001b94, 0x0001b9f, 0x0001bb8, 0x0001bc1, 0x0001be8, 0x0001bf7,
    0x0001bfc, 0x0001c03, 0x0001c40, 0x0001c47, 0x0001c48, 0x0001cc3, 0x0001d34, 0x0001e9b,
    0x0001ec4, 0x0001ecb, 0x0001f01, 0x0001f28, 0x0001faf, 0x0001fd0, 0x0001fdb, 0x0001fe8,
    0x0001fef, 0x0002000, 0x000205b, 0x0002068, 0x000206f, 0x0002090, 0x0002097, 0x00020a0,
    0x00020a7, 0x0002100, 0x0002167, 0x0002180, 0x00021af, 0x00021c0, 0x0002223, 0x0002224,
    0x0002243, 0x0002280, 0x000232b, 0x0002410, 0x00024eb, 0x00024f4, 0x00024fb, 0x0002540,
    0x0002547, 0x0002560, 0x000258b, 0x0002599, 0x00025c3, 0x00025c4, 0x0002607, 0x0002614,
    0x0002637, 0x000263c, 0x0002647, 0x000264c, 0x00026a7, 0x00026a8, 0x00026c7, 0x00026c8,
    0x00026cf, 0x00026d8, 0x00026eb, 0x00026f4, 0x00026fb, 0x0002738, 0x000273f, 0x0002770,
    0x000277b, 0x000277c, 0x000278b, 0x0002799, 0x00027c0, 0x00027cb, 0x00027d1, 0x00027eb,
    0x00027f0, 0x00027f7, 0x0002814, 0x000282f, 0x000283c, 0x0002847, 0x000284c, 0x00028a7,
    0x00028a8, 0x00028c7, 0x00028c8, 0x00028d3, 0x00028d4, 0x00028df, 0x00028e0, 0x00028eb,
    0x0002964, 0x0002977, 0x0002978, 0x000297f, 0x0002999, 0x00029c3, 0x00029c8, 0x00029d7,
    0x0002a14, 0x0002a3b, 0x0002a3c, 0x0002a4b, 0x0002a4c, 0x0002aa7, 0x0002aa8, 0x0002ac7,
    0x0002ac8, 0x0002ad3, 0x0002ad4, 0x0002aeb, 0x0002af4, 0x0002afb, 0x0002b40, 0x0002b47,
    0x0002b80, 0x0002b8b, 0x0002b99, 0x0002bc3, 0x0002be4, 0x0002beb, 0x0002c14, 0x0002c37,
    0x0002c3c, 0x0002c47, 0x0002c4c, 0x0002ca7, 0x0002ca8, 0x0002cc7, 0x0002cc8, 0x0002cd3,
    0x0002cd4, 0x0002ceb, 0x0002cf4, 0x0002cfb, 0x0002d70, 0x0002d7b, 0x0002d7c, 0x0002d8b,
    0x0002d99, 0x0002dc3, 0x0002dc4, 0x0002dc9, 0x0002de3, 0x0002e0c, 0x0002e13, 0x0002e14,
    0x0002e2f, 0x0002e38, 0x0002e47, 0x0002e48, 0x0002e5b, 0x0002e64, 0x0002e6f, 0x0002e70,
    0x0002e77, 0x0002e78, 0x0002e83, 0x0002e8c, 0x0002e97, 0x0002ea0, 0x0002eaf, 0x0002eb8,
    0x0002eeb, 0x0002f40, 0x0002f47, 0x0002f99, 0x0002fcf, 0x0003014, 0x0003037, 0x0003038,
    0x0003047, 0x0003048, 0x00030a7, 0x00030a8, 0x00030eb, 0x00030f4, 0x00030fb, 0x0003160,
    0x000316f, 0x0003170, 0x000317b, 0x0003180, 0x000318b, 0x0003199, 0x00031c3, 0x00031e1,
    0x00031ff, 0x0003200, 0x0003207, 0x0003214, 0x0003237, 0x0003238, 0x0003247, 0x0003248,
    0x00032a7, 0x00032a8, 0x00032d3, 0x00032d4, 0x00032eb, 0x00032f4, 0x00032fb, 0x0003370,
    0x000337f, 0x0003380, 0x000338b, 0x0003399, 0x00033c3, 0x00033c4, 0x00033cf, 0x0003410,
    0x0003437, 0x0003438, 0x0003447, 0x0003448, 0x00034ef, 0x00034f4, 0x00034fb, 0x0003538,
    0x000353f, 0x0003550, 0x000355f, 0x0003561, 0x000357c, 0x000358b, 0x0003599, 0x00035e7,
    0x00035e8, 0x0003603, 0x0003614, 0x000365f, 0x0003668, 0x00036cb, 0x00036cc, 0x00036f3,
    0x00036f4, 0x00036fb, 0x0003700, 0x000371f, 0x0003799, 0x00037c3, 0x0003804, 0x00038c7,
    0x00038c8, 0x00038d3, 0x0003900, 0x000391f, 0x0003941, 0x000396b, 0x0003a04, 0x0003a0f,
    0x0003a10, 0x0003a17, 0x0003a18, 0x0003a2f, 0x0003a30, 0x0003a93, 0x0003a94, 0x0003a9b,
    0x0003a9c, 0x0003ac7, 0x0003ac8, 0x0003ad3, 0x0003af4, 0x0003afb, 0x0003b00, 0x0003b17,
    0x0003b18, 0x0003b1f, 0x0003b41, 0x0003b6b, 0x0003b70, 0x0003b83, 0x0003c00, 0x0003c07,
    0x0003c81, 0x0003cd3, 0x0003d00, 0x0003d23, 0x0003d24, 0x0003db7, 0x0003e20, 0x0003e37,
    0x0004000, 0x00040af, 0x00040fc, 0x0004101, 0x000412b, 0x0004140, 0x000415b, 0x0004168,
    0x000417b, 0x0004184, 0x000418b, 0x0004194, 0x000419f, 0x00041b8, 0x00041c7, 0x00041d4,
    0x000420b, 0x0004238, 0x000423f, 0x0004241, 0x000426b, 0x0004280, 0x000431b, 0x000431c,
    0x0004323, 0x0004334, 0x000433b, 0x0004340, 0x00043ef, 0x00043f0, 0x0004927, 0x0004928,
    0x000493b, 0x0004940, 0x000495f, 0x0004960, 0x0004967, 0x0004968, 0x000497b, 0x0004980,
    0x0004a27, 0x0004a28, 0x0004a3b, 0x0004a40, 0x0004ac7, 0x0004ac8, 0x0004adb, 0x0004ae0,
    0x0004aff, 0x0004b00, 0x0004b07, 0x0004b08, 0x0004b1b, 0x0004b20, 0x0004b5f, 0x0004b60,
    0x0004c47, 0x0004c48, 0x0004c5b, 0x0004c60, 0x0004d6f, 0x0004da5, 0x0004df7, 0x0004e00,
    0x0004e43, 0x0004e80, 0x0004fdb, 0x0004fe0, 0x0004ffb, 0x0005004, 0x00059b7, 0x00059bc,
    0x0005a02, 0x0005a04, 0x0005a6f, 0x0005a80, 0x0005baf, 0x0005bb9, 0x0005bc4, 0x0005be7,
    0x0005c00, 0x0005c4b, 0x0005c7c, 0x0005ccb, 0x0005d00, 0x0005d4b, 0x0005d80, 0x0005db7,
    0x0005db8, 0x0005dc7, 0x0005e00, 0x0005ed3, 0x0005f5c, 0x0005f63, 0x0005f70, 0x0005f77,
    0x0005f81, 0x0005fab, 0x0005fc1, 0x0005feb, 0x0006041, 0x000606b, 0x0006080, 0x00061e7,
    0x0006200, 0x0006217, 0x000621c, 0x00062a7, 0x00062a8, 0x00062af, 0x00062c0, 0x00063db,
    0x0006400, 0x000647f, 0x0006519, 0x0006540, 0x00065bb, 0x00065c0, 0x00065d7, 0x0006600,
    0x00066b3, 0x00066c0, 0x000672b, 0x0006741, 0x000676f, 0x0006800, 0x000685f, 0x0006880,
    0x0006957, 0x0006a01, 0x0006a2b, 0x0006a41, 0x0006a6b, 0x0006a9c, 0x0006aa3, 0x0006c14,
    0x0006cd3, 0x0006d14, 0x0006d37, 0x0006d41, 0x0006d6b, 0x0006e0c, 0x0006e87, 0x0006eb8,
    0x0006ec1, 0x0006ee8, 0x0006f9b, 0x0007000, 0x0007093, 0x0007101, 0x000712b, 0x0007134,
    0x0007141, 0x0007168, 0x00071fb, 0x0007200, 0x000722f, 0x0007240, 0x00072ef, 0x00072f4,
    0x0007303, 0x00073a4, 0x00073b7, 0x00073b8, 0x00073d3, 0x00073d4, 0x00073df, 0x00073e8,
    0x00073ef, 0x0007400, 0x0007703, 0x0007800, 0x0007c5b, 0x0007c60, 0x0007c7b, 0x0007c80,
    0x0007d1b, 0x0007d20, 0x0007d3b, 0x0007d40, 0x0007d63, 0x0007d64, 0x0007d6b, 0x0007d6c,
    0x0007d73, 0x0007d74, 0x0007d7b, 0x0007d7c, 0x0007dfb, 0x0007e00, 0x0007ed7, 0x0007ed8,
    0x0007ef7, 0x0007ef8, 0x0007eff, 0x0007f08, 0x0007f17, 0x0007f18, 0x0007f37, 0x0007f40,
    0x0007f53, 0x0007f58, 0x0007f73, 0x0007f80, 0x0007fb7, 0x0007fc8, 0x0007fd7, 0x0007fd8,
    0x0007ff7, 0x0008002, 0x000802f, 0x00080a2, 0x00080ab, 0x00080be, 0x00080c3, 0x000817e,
    0x0008183, 0x00081c1, 0x00081c4, 0x00081cb, 0x00081d1, 0x00081eb, 0x00081fc, 0x0008201,
    0x000822b, 0x0008240, 0x0008277, 0x0008408, 0x000840f, 0x000841c, 0x0008423, 0x0008428,
    0x0008453, 0x0008454, 0x000845b, 0x0008464, 0x000847b, 0x0008490, 0x0008497, 0x0008498,
    0x000849f, 0x00084a0, 0x00084a7, 0x00084a8, 0x00084bb, 0x00084bc, 0x00084eb, 0x00084f0,
    0x0008503, 0x0008514, 0x000852b, 0x0008538, 0x000853f, 0x0008541, 0x000860c, 0x0008615,
    0x000862b, 0x0009181, 0x0009273, 0x00093a9, 0x0009403, 0x0009dd9, 0x0009e53, 0x000b000,
    0x000b397, 0x000b3ac, 0x000b3bf, 0x000b3c8, 0x000b3d3, 0x000b3f5, 0x000b3fb, 0x000b400,
    0x000b49b, 0x000b49c, 0x000b4a3, 0x000b4b4, 0x000b4bb, 0x000b4c0, 0x000b5a3, 0x000b5bc,
    0x000b5c3, 0x000b600, 0x000b65f, 0x000b680, 0x000b69f, 0x000b6a0, 0x000b6bf, 0x000b6c0,
    0x000b6df, 0x000b6e0, 0x000b6ff, 0x000b700, 0x000b71f, 0x000b720, 0x000b73f, 0x000b740,
    0x000b75f, 0x000b760, 0x000b77f, 0x000b8bc, 0x000b8c3, 0x000c002, 0x000c007, 0x000c014,
    0x000c01d, 0x000c023, 0x000c085, 0x000c0ab, 0x000c0c4, 0x000c0db, 0x000c0e1, 0x000c0ec,
    0x000c0f7, 0x000c104, 0x000c25f, 0x000c274, 0x000c283, 0x000c284, 0x000c3ef, 0x000c3f0,
    0x000c403, 0x000c414, 0x000c4c3, 0x000c4c4, 0x000c63f, 0x000c649, 0x000c65b, 0x000c680,
    0x000c703, 0x000c7c0, 0x000c803, 0x000c881, 0x000c8ab, 0x000c921, 0x000c943, 0x000c945,
    0x000c983, 0x000ca01, 0x000ca2b, 0x000cac5, 0x000cb03, 0x000d000, 0x0013703, 0x0013800,
    0x0029237, 0x0029340, 0x00293fb, 0x0029400, 0x0029837, 0x0029840, 0x0029881, 0x00298a8,
    0x00298b3, 0x0029900, 0x00299bf, 0x00299fc, 0x0029a7b, 0x0029a80, 0x0029b99, 0x0029bc3,
    0x0029c5c, 0x0029c83, 0x0029c88, 0x0029e27, 0x0029e2c, 0x0029f77, 0x0029fc4, 0x002a00b,
    0x002a00c, 0x002a01b, 0x002a01c, 0x002a02f, 0x002a030, 0x002a08f, 0x002a0c1, 0x002a0db,
    0x002a100, 0x002a1d3, 0x002a208, 0x002a2d3, 0x002a341, 0x002a36b, 0x002a3c8, 0x002a3e3,
    0x002a3ec, 0x002a3f3, 0x002a3f4, 0x002a3ff, 0x002a401, 0x002a428, 0x002a49b, 0x002a4c0,
    0x002a51f, 0x002a580, 0x002a5f7, 0x002a610, 0x002a6cf, 0x002a73c, 0x002a741, 0x002a76b,
    0x002a780, 0x002a797, 0x002a798, 0x002a7c1, 0x002a7e8, 0x002a7ff, 0x002a800, 0x002a8a7,
    0x002a900, 0x002a90f, 0x002a910, 0x002a933, 0x002a941, 0x002a96b, 0x002a980, 0x002a9df,
    0x002a9e8, 0x002a9ef, 0x002a9f8, 0x002aac3, 0x002aac4, 0x002aacb, 0x002aad4, 0x002aadf,
    0x002aae4, 0x002aafb, 0x002ab00, 0x002ab07, 0x002ab08, 0x002ab0f, 0x002ab6c, 0x002ab7b,
    0x002ab80, 0x002abaf, 0x002abc8, 0x002abd7, 0x002ac04, 0x002ac1f, 0x002ac24, 0x002ac3f,
    0x002ac44, 0x002ac5f, 0x002ac80, 0x002ac9f, 0x002aca0, 0x002acbf, 0x002acc0, 0x002ad6f,
    0x002ad70, 0x002adab, 0x002adc0, 0x002af8f, 0x002afc1, 0x002afeb, 0x002b000, 0x0035e93,
    0x0035ec0, 0x0035f1f, 0x0035f2c, 0x0035ff3, 0x003e400, 0x003e9bb, 0x003e9c0, 0x003eb6b,
    0x003ec00, 0x003ec1f, 0x003ec4c, 0x003ec63, 0x003ec74, 0x003ec7b, 0x003ec7c, 0x003eca7,
    0x003eca8, 0x003ecdf, 0x003ece0, 0x003ecf7, 0x003ecf8, 0x003ecff, 0x003ed00, 0x003ed0b,
    0x003ed0c, 0x003ed17, 0x003ed18, 0x003eecb, 0x003ef4c, 0x003f4fb, 0x003f540, 0x003f643,
    0x003f648, 0x003f723, 0x003f7c0, 0x003f7f3, 0x003f9c0, 0x003f9d7, 0x003f9d8, 0x003fbf7,
    0x003fc41, 0x003fc6b, 0x003fc84, 0x003fcef, 0x003fd04, 0x003fd6f, 0x003fd98, 0x003feff,
    0x003ff08, 0x003ff23, 0x003ff28, 0x003ff43, 0x003ff48, 0x003ff63, 0x003ff68, 0x003ff77,
    0x0040000, 0x0040033, 0x0040034, 0x004009f, 0x00400a0, 0x00400ef, 0x00400f0, 0x00400fb,
    0x00400fc, 0x004013b, 0x0040140, 0x004017b, 0x0040200, 0x00403ef, 0x004041d, 0x00404d3,
    0x0040501, 0x00405e7, 0x0040629, 0x0040633, 0x0040a00, 0x0040a77, 0x0040a80, 0x0040b47,
    0x0040b85, 0x0040bf3, 0x0040c00, 0x0040c81, 0x0040c93, 0x0040cb4, 0x0040d05, 0x0040d08,
    0x0040d29, 0x0040d2f, 0x0040d40, 0x0040ddb, 0x0040e00, 0x0040e7b, 0x0040e80, 0x0040f13,
    0x0040f20, 0x0040f43, 0x0040f45, 0x0040f5b, 0x0041000, 0x004127b, 0x0041281, 0x00412ab,
    0x00412c0, 0x0041353, 0x0041360, 0x00413f3, 0x0041400, 0x00414a3, 0x00414c0, 0x0041593,
    0x00415c0, 0x00415ef, 0x00415f0, 0x004162f, 0x0041630, 0x004164f, 0x0041650, 0x004165b,
    0x004165c, 0x004168b, 0x004168c, 0x00416cb, 0x00416cc, 0x00416eb, 0x00416ec, 0x00416f7,
    0x0041700, 0x00417d3, 0x0041800, 0x0041cdf, 0x0041d00, 0x0041d5b, 0x0041d80, 0x0041da3,
    0x0041e00, 0x0041e1b, 0x0041e1c, 0x0041ec7, 0x0041ec8, 0x0041eef, 0x0042000, 0x004201b,
    0x0042020, 0x0042027, 0x0042028, 0x00420db, 0x00420dc, 0x00420e7, 0x00420f0, 0x00420f7,
    0x00420fc, 0x004215b, 0x0042161, 0x0042180, 0x00421df, 0x00421e5, 0x0042200, 0x004227f,
    0x004229d, 0x00422c3, 0x0042380, 0x00423cf, 0x00423d0, 0x00423db, 0x00423ed, 0x0042400,
    0x0042459, 0x0042473, 0x0042480, 0x00424eb, 0x0042500, 0x004256b, 0x0042600, 0x00426e3,
    0x00426f1, 0x00426f8, 0x0042701, 0x0042743, 0x0042749, 0x0042800, 0x0042807, 0x0042840,
    0x0042853, 0x0042854, 0x0042863, 0x0042864, 0x00428db, 0x0042901, 0x0042927, 0x0042980,
    0x00429f5, 0x00429ff, 0x0042a00, 0x0042a75, 0x0042a83, 0x0042b00, 0x0042b23, 0x0042b24,
    0x0042b97, 0x0042bad, 0x0042bc3, 0x0042c00, 0x0042cdb, 0x0042d00, 0x0042d5b, 0x0042d61,
    0x0042d80, 0x0042dcf, 0x0042de1, 0x0042e00, 0x0042e4b, 0x0042ea5, 0x0042ec3, 0x0043000,
    0x0043127, 0x0043200, 0x00432cf, 0x0043300, 0x00433cf, 0x00433e9, 0x0043400, 0x0043493,
    0x00434c1, 0x00434eb, 0x0043501, 0x0043528, 0x004359b, 0x00435bc, 0x004361b, 0x0043981,
    0x00439ff, 0x0043a00, 0x0043aab, 0x0043ac0, 0x0043acb, 0x0043b08, 0x0043b23, 0x0043c00,
    0x0043c75, 0x0043c9c, 0x0043ca3, 0x0043cc0, 0x0043d1b, 0x0043d45, 0x0043d57, 0x0043dc0,
    0x0043e0b, 0x0043ec0, 0x0043f15, 0x0043f33, 0x0043f80, 0x0043fdf, 0x004400c, 0x00440e3,
    0x0044149, 0x00441c3, 0x00441c4, 0x00441cf, 0x00441d4, 0x00441db, 0x004420c, 0x00442c3,
    0x0044340, 0x00443a7, 0x00443c1, 0x00443eb, 0x004440c, 0x004449f, 0x00444d9, 0x0044503,
    0x0044510, 0x0044517, 0x004451c, 0x0044523, 0x0044540, 0x00445cf, 0x00445d8, 0x00445df,
    0x004460c, 0x00446cf, 0x0044704, 0x0044717, 0x0044741, 0x0044768, 0x004476f, 0x0044770,
    0x0044777, 0x0044785, 0x00447d7, 0x0044800, 0x004484b, 0x004484c, 0x00448b3, 0x00448fc,
    0x0044907, 0x0044a00, 0x0044a1f, 0x0044a20, 0x0044a27, 0x0044a28, 0x0044a3b, 0x0044a3c,
    0x0044a7b, 0x0044a7c, 0x0044aa7, 0x0044ac0, 0x0044b7f, 0x0044bc1, 0x0044beb, 0x0044c14,
    0x0044c37, 0x0044c3c, 0x0044c47, 0x0044c4c, 0x0044ca7, 0x0044ca8, 0x0044cc7, 0x0044cc8,
    0x0044cd3, 0x0044cd4, 0x0044ceb, 0x0044cf4, 0x0044cfb, 0x0044d40, 0x0044d47, 0x0044d74,
    0x0044d8b, 0x0044e00, 0x0044e2b, 0x0044e2c, 0x0044e33, 0x0044e38, 0x0044e3f, 0x0044e40,
    0x0044edb, 0x0044edc, 0x0044ee3, 0x0044f44, 0x0044f4b, 0x0044f4c, 0x0044f53, 0x0045000,
    0x00450d7, 0x004511c, 0x004512f, 0x0045141, 0x004516b, 0x004517c, 0x004518b, 0x0045200,
    0x00452c3, 0x0045310, 0x004531b, 0x004531c, 0x0045323, 0x0045341, 0x004536b, 0x0045600,
    0x00456bf, 0x0045760, 0x0045773, 0x0045800, 0x00458c3, 0x0045910, 0x0045917, 0x0045941,
    0x004596b, 0x0045a00, 0x0045aaf, 0x0045ae0, 0x0045ae7, 0x0045b01, 0x0045b2b, 0x0045b41,
    0x0045b93, 0x0045c00, 0x0045c6f, 0x0045cc1, 0x0045cf3, 0x0045d00, 0x0045d1f, 0x0046000,
    0x00460b3, 0x0046280, 0x0046381, 0x00463cf, 0x00463fc, 0x004641f, 0x0046424, 0x004642b,
    0x0046430, 0x0046453, 0x0046454, 0x004645f, 0x0046460, 0x00464c3, 0x00464fc, 0x0046503,
    0x0046504, 0x004650b, 0x0046541, 0x004656b, 0x0046680, 0x00466a3, 0x00466a8, 0x0046747,
    0x0046784, 0x004678b, 0x004678c, 0x0046793, 0x0046800, 0x0046807, 0x004682c, 0x00468cf,
    0x00468e8, 0x00468ef, 0x0046940, 0x0046947, 0x0046970, 0x0046a2b, 0x0046a74, 0x0046a7b,
    0x0046ac0, 0x0046be7, 0x0046f00, 0x0046f87, 0x0046fc1, 0x0046feb, 0x0047000, 0x0047027,
    0x0047028, 0x00470bf, 0x0047100, 0x0047107, 0x0047141, 0x00471b7, 0x00471c8, 0x0047243,
    0x0047400, 0x004741f, 0x0047420, 0x004742b, 0x004742c, 0x00474c7, 0x0047518, 0x004751f,
    0x0047541, 0x004756b, 0x0047580, 0x004759b, 0x004759c, 0x00475a7, 0x00475a8, 0x004762b,
    0x0047660, 0x0047667, 0x0047681, 0x00476ab, 0x00476c0, 0x0047773, 0x0047781, 0x00477ab,
    0x0047b80, 0x0047bcf, 0x0047c08, 0x0047c0f, 0x0047c10, 0x0047c47, 0x0047c48, 0x0047cd3,
    0x0047d41, 0x0047d6b, 0x0047ec0, 0x0047ec7, 0x0047f01, 0x0047f57, 0x0048000, 0x0048e6b,
    0x0049001, 0x00491bf, 0x0049200, 0x0049513, 0x004be40, 0x004bfc7, 0x004c000, 0x004d0c3,
    0x004d104, 0x004d11f, 0x004d180, 0x0050fef, 0x0051000, 0x005191f, 0x0058400, 0x005847b,
    0x00584c1, 0x00584eb, 0x005a000, 0x005a8e7, 0x005a900, 0x005a97f, 0x005a981, 0x005a9ab,
    0x005a9c0, 0x005aaff, 0x005ab01, 0x005ab2b, 0x005ab40, 0x005abbb, 0x005ac00, 0x005acc3,
    0x005ad00, 0x005ad13, 0x005ad41, 0x005ad6b, 0x005ad6d, 0x005ad8b, 0x005ad8c, 0x005ade3,
    0x005adf4, 0x005ae43, 0x005b500, 0x005b5b7, 0x005b5c1, 0x005b5eb, 0x005b900, 0x005ba01,
    0x005ba5f, 0x005ba80, 0x005bae7, 0x005baec, 0x005bb53, 0x005bc00, 0x005bd2f, 0x005bd40,
    0x005bd47, 0x005be4c, 0x005be83, 0x005bf80, 0x005bf8b, 0x005bf8c, 0x005bf93, 0x005bfc8,
    0x005bfd1, 0x005bfdf, 0x005c000, 0x006335b, 0x00633fc, 0x006347f, 0x0063600, 0x00637cf,
    0x006bfc0, 0x006bfd3, 0x006bfd4, 0x006bff3, 0x006bff4, 0x006bfff, 0x006c000, 0x006c48f,
    0x006c4c8, 0x006c4cf, 0x006c540, 0x006c54f, 0x006c554, 0x006c55b, 0x006c590, 0x006c5a3,
    0x006c5c0, 0x006cbf3, 0x006f000, 0x006f1af, 0x006f1c0, 0x006f1f7, 0x006f200, 0x006f227,
    0x006f240, 0x006f26b, 0x00733c1, 0x00733eb, 0x0074b01, 0x0074b53, 0x0074b81, 0x0074bd3,
    0x0074d81, 0x0074de7, 0x0075000, 0x0075157, 0x0075158, 0x0075277, 0x0075278, 0x0075283,
    0x0075288, 0x007528f, 0x0075294, 0x007529f, 0x00752a4, 0x00752b7, 0x00752b8, 0x00752eb,
    0x00752ec, 0x00752f3, 0x00752f4, 0x0075313, 0x0075314, 0x007541b, 0x007541c, 0x007542f,
    0x0075434, 0x0075457, 0x0075458, 0x0075477, 0x0075478, 0x00754eb, 0x00754ec, 0x00754ff,
    0x0075500, 0x0075517, 0x0075518, 0x007551f, 0x0075528, 0x0075547, 0x0075548, 0x0075a9b,
    0x0075aa0, 0x0075b07, 0x0075b08, 0x0075b6f, 0x0075b70, 0x0075bef, 0x0075bf0, 0x0075c57,
    0x0075c58, 0x0075cd7, 0x0075cd8, 0x0075d3f, 0x0075d40, 0x0075dbf, 0x0075dc0, 0x0075e27,
    0x0075e28, 0x0075ea7, 0x0075ea8, 0x0075f0f, 0x0075f10, 0x0075f33, 0x0075f39, 0x0076003,
    0x0077c00, 0x0077c7f, 0x0077c94, 0x0077caf, 0x00780c0, 0x00781bb, 0x0078400, 0x00784b7,
    0x00784dc, 0x00784fb, 0x0078501, 0x007852b, 0x0078538, 0x007853f, 0x0078a40, 0x0078abb,
    0x0078b00, 0x0078bb3, 0x0078bc1, 0x0078beb, 0x0079340, 0x00793b3, 0x00793c1, 0x00793eb,
    0x0079740, 0x00797bb, 0x00797c0, 0x00797c5, 0x00797ef, 0x0079b00, 0x0079b7f, 0x0079b80,
    0x0079b8f, 0x0079b90, 0x0079b9b, 0x0079b9c, 0x0079bbb, 0x0079bc0, 0x0079bd7, 0x0079bf8,
    0x0079c03, 0x0079f80, 0x0079f9f, 0x0079fa0, 0x0079fb3, 0x0079fb4, 0x0079fbf, 0x0079fc0,
    0x0079fff, 0x007a000, 0x007a317, 0x007a31d, 0x007a343, 0x007a400, 0x007a513, 0x007a52c,
    0x007a533, 0x007a541, 0x007a56b, 0x007b1c5, 0x007b2b3, 0x007b2b5, 0x007b2c3, 0x007b2c5,
    0x007b2d7, 0x007b405, 0x007b4bb, 0x007b4bd, 0x007b4fb, 0x007b800, 0x007b813, 0x007b814,
    0x007b883, 0x007b884, 0x007b88f, 0x007b890, 0x007b897, 0x007b89c, 0x007b8a3, 0x007b8a4,
    0x007b8cf, 0x007b8d0, 0x007b8e3, 0x007b8e4, 0x007b8eb, 0x007b8ec, 0x007b8f3, 0x007b908,
    0x007b90f, 0x007b91c, 0x007b923, 0x007b924, 0x007b92b, 0x007b92c, 0x007b933, 0x007b934,
    0x007b943, 0x007b944, 0x007b94f, 0x007b950, 0x007b957, 0x007b95c, 0x007b963, 0x007b964,
    0x007b96b, 0x007b96c, 0x007b973, 0x007b974, 0x007b97b, 0x007b97c, 0x007b983, 0x007b984,
    0x007b98f, 0x007b990, 0x007b997, 0x007b99c, 0x007b9af, 0x007b9b0, 0x007b9cf, 0x007b9d0,
    0x007b9e3, 0x007b9e4, 0x007b9f7, 0x007b9f8, 0x007b9ff, 0x007ba00, 0x007ba2b, 0x007ba2c,
    0x007ba73, 0x007ba84, 0x007ba93, 0x007ba94, 0x007baab, 0x007baac, 0x007baf3, 0x007c401,
    0x007c437, 0x007efc1, 0x007efeb, 0x0080000, 0x00a9b83, 0x00a9c00, 0x00ae07b, 0x00ae080,
    0x00b3abb, 0x00b3ac0, 0x00baf87, 0x00bafc0, 0x00bb97b, 0x00be000, 0x00be87b, 0x00c0000,
    0x00c4d2f, 0x00c4d40, 0x00cd1eb,
};

inline constexpr std::array<char_class, 128> ascii_classes = [] {
  std::array<char_class, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      t[c] = char_class::letter;
    } else if (c >= '0' && c <= '9') {
      t[c] = char_class::number;
    } else if (c == ' ' || (c >= 0x09 && c <= 0x0d)) {
      t[c] = char_class::space;
    } else {
      t[c] = char_class::other;
    }
  }
  return t;
}();

constexpr char_class classify(char32_t cp) noexcept {
  if (cp < 0x80) return ascii_classes[cp];
  if (cp > 0x10FFFF) return char_class::other;
  const std::uint32_t key = (static_cast<std::uint32_t>(cp) << 2) | 3u;
  const auto* it = std::upper_bound(std::begin(unicode_class_ranges),
                                    std::end(unicode_class_ranges), key);
  return static_cast<char_class>(*(it - 1) & 3u);  // entry 0 starts at U+0000
}

/// GPT-2's byte alphabet: printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
/// themselves; the other 68 bytes, in order, get U+0100, U+0101, ... (space -> U+0120 'Ġ',
/// '\n' -> U+010A 'Ċ'). So every byte has a visible, distinct character.
inline constexpr std::array<char32_t, 256> byte_to_unicode = [] {
  std::array<char32_t, 256> t{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return t;
}();

/// The inverse of byte_to_unicode: code point -> byte, -1 for code points outside the alphabet.
inline constexpr std::size_t byte_alphabet_end = 0x100 + 68;
inline constexpr std::array<std::int16_t, byte_alphabet_end> unicode_to_byte = [] {
  std::array<std::int16_t, byte_alphabet_end> t{};
  for (auto& x : t) x = -1;
  for (int b = 0; b < 256; ++b) t[byte_to_unicode[b]] = static_cast<std::int16_t>(b);
  return t;
}();

struct utf8_char {
  char32_t cp;
  std::uint32_t len;  // bytes; 1 for an invalid byte
  bool valid;
};

/// Decodes the code point at s[i] (i < s.size()). Overlong forms, surrogates, code points past
/// U+10FFFF and truncated sequences are invalid: their first byte is returned alone.
constexpr utf8_char decode_utf8(std::string_view s, std::size_t i) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  std::uint32_t len = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1Fu, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0Fu, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07u, min = 0x10000;
  } else {
    return {b0, 1, false};
  }
  if (s.size() - i < len) return {b0, 1, false};
  for (std::uint32_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {b0, 1, false};
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {b0, 1, false};
  return {cp, len, true};
}

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// A vocabulary entry for a message: quoted, at most 60 bytes, control bytes escaped.
inline std::string quoted(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string q = "'";
  const std::size_t n = std::min<std::size_t>(s.size(), 60);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      q += "\\x";
      q += hex[c >> 4];
      q += hex[c & 15];
    } else {
      q += static_cast<char>(c);
    }
  }
  if (s.size() > n) q += "...";
  q += '\'';
  return q;
}

/// One code point of the text being pre-tokenized.
struct cp_info {
  std::uint32_t offset;  // byte offset in the stretch
  char32_t cp;
  char_class cls;
};

/// Cuts cps[b, e) with the gpt2 pattern; emit(first, last) gets code point index ranges.
template <class Emit>
void split_gpt2(const std::vector<cp_info>& cps, std::size_t b, std::size_t e, Emit&& emit) {
  std::size_t i = b;
  while (i < e) {
    // 's 't 're 've 'm 'll 'd (ASCII lower case only, as in the pattern)
    if (cps[i].cp == U'\'' && i + 1 < e) {
      const char32_t c1 = cps[i + 1].cp;
      std::size_t len = 0;
      if (c1 == U's' || c1 == U't' || c1 == U'm' || c1 == U'd') {
        len = 2;
      } else if (i + 2 < e) {
        const char32_t c2 = cps[i + 2].cp;
        if ((c1 == U'r' && c2 == U'e') || (c1 == U'v' && c2 == U'e') ||
            (c1 == U'l' && c2 == U'l')) {
          len = 3;
        }
      }
      if (len != 0) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a run of one class
    const std::size_t j = cps[i].cp == U' ' ? i + 1 : i;
    if (j < e && cps[j].cls != char_class::space) {
      const char_class c = cps[j].cls;
      std::size_t k = j + 1;
      while (k < e && cps[k].cls == c) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // '\s+(?!\S)|\s+': a whitespace run, less its last character when something follows it (that
    // character then starts the next piece, e.g. as the space of " word").
    std::size_t k = i + 1;
    while (k < e && cps[k].cls == char_class::space) ++k;
    if (k < e && k - i >= 2) k -= 1;
    else if (k < e) k = i + 1;
    emit(i, k);
    i = k;
  }
}

/// Cuts `text` into pre-tokenizer pieces; emit(std::string_view) is called for each, in order.
/// `cps` is scratch space.
template <class Emit>
void for_each_piece(std::string_view text, pre_tokenizer pre, std::vector<cp_info>& cps,
                    Emit&& emit) {
  cps.clear();
  for (std::size_t i = 0; i < text.size();) {
    const utf8_char u = decode_utf8(text, i);
    cps.push_back({static_cast<std::uint32_t>(i), u.cp,
                   u.valid ? classify(u.cp) : char_class::other});
    i += u.len;
  }
  const std::size_t n = cps.size();
  auto emit_range = [&](std::size_t first, std::size_t last) {
    const std::size_t from = cps[first].offset;
    const std::size_t to = last < n ? cps[last].offset : text.size();
    emit(text.substr(from, to - from));
  };
  if (pre == pre_tokenizer::gpt2) {
    split_gpt2(cps, 0, n, emit_range);
    return;
  }
  std::size_t start = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (cps[i].cls != char_class::number) continue;
    split_gpt2(cps, start, i, emit_range);
    emit_range(i, i + 1);
    start = i + 1;
  }
  split_gpt2(cps, start, n, emit_range);
}

}  // namespace detail::bpe

/// The pre-tokenizer's pieces of `text`, as views into it (special tokens are not looked for).
/// Exposed for tests and for inspecting how text is cut.
inline std::vector<std::string_view> pre_tokenize(std::string_view text, pre_tokenizer pre) {
  KVSCOUT_EXPECTS(text.size() < std::numeric_limits<std::uint32_t>::max(),
                  "text of ", text.size(), " bytes is too long");
  std::vector<std::string_view> pieces;
  std::vector<detail::bpe::cp_info> cps;
  detail::bpe::for_each_piece(text, pre, cps, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

/// Byte-level BPE tokenizer over a GPT-2 style vocabulary.
///
///   tokens[i]       token i spelled in the byte alphabet ("Ġworld" for " world"); control and
///                   user-defined tokens spelled as plain text ("<|im_end|>")
///   token_types[i]  token_type values (GGUF tokenizer.ggml.token_type); same length as tokens
///   merges[r]       "left right", merge rank r (lower merges first); left, right and left+right
///                   must all be tokens
///   bos, eos        token ids, or -1 when the vocabulary has none
///
/// Construction validates all of this and throws kvscout::error naming the offending entry.
/// Thread-safe after construction (encode / decode do not mutate).
class bpe_tokenizer {
 public:
  bpe_tokenizer(std::vector<std::string> tokens, std::vector<std::int32_t> token_types,
                std::vector<std::string> merges, std::int32_t bos, std::int32_t eos,
                pre_tokenizer pre = pre_tokenizer::smollm)
      : tokens_(std::move(tokens)), bos_(bos), eos_(eos), pre_(pre) {
    namespace b = detail::bpe;
    const std::size_t n = tokens_.size();
    KVSCOUT_EXPECTS(n > 0, "empty vocabulary");
    constexpr auto max_id = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());
    KVSCOUT_EXPECTS(n <= max_id, "vocabulary of ", n, " tokens does not fit int32 ids");
    KVSCOUT_EXPECTS(token_types.size() == n, "token_types has ", token_types.size(),
                    " entries for ", n, " tokens");
    const auto vocab = static_cast<std::int32_t>(n);
    KVSCOUT_EXPECTS(bos >= -1 && bos < vocab, "bos id ", bos, " out of range [-1, ", vocab, ")");
    KVSCOUT_EXPECTS(eos >= -1 && eos < vocab, "eos id ", eos, " out of range [-1, ", vocab, ")");

    types_.resize(n);
    ids_.reserve(n);
    for (std::int32_t id = 0; id < vocab; ++id) {
      const std::int32_t t = token_types[id];
      KVSCOUT_EXPECTS(t >= 0 && t <= 6, "token ", id, " ", b::quoted(tokens_[id]),
                      " has type ", t, "; GGUF token types are 0..6");
      types_[id] = static_cast<token_type>(t);
      const auto [it, inserted] = ids_.emplace(tokens_[id], id);
      KVSCOUT_EXPECTS(inserted, "duplicate token ", b::quoted(tokens_[id]), ": ids ", it->second,
                      " and ", id);
    }

    // Each token's bytes, and the specials matched in text.
    text_.resize(n);
    for (std::int32_t id = 0; id < vocab; ++id) {
      const std::string& s = tokens_[id];
      if (is_literal(types_[id])) {
        text_[id] = s;
        if (!s.empty()) add_special(id);
        continue;
      }
      std::string& out = text_[id];
      for (std::size_t i = 0; i < s.size();) {
        const b::utf8_char u = b::decode_utf8(s, i);
        // Characters outside the byte alphabet (not produced by GPT-2 vocabularies) are kept as
        // they are stored.
        if (u.valid && u.cp < b::byte_alphabet_end && b::unicode_to_byte[u.cp] >= 0) {
          out += static_cast<char>(b::unicode_to_byte[u.cp]);
        } else {
          out.append(s, i, u.len);
        }
        i += u.len;
      }
    }
    for (int byte = 0; byte < 256; ++byte) {
      std::string ch;
      b::append_utf8(ch, b::byte_to_unicode[byte]);
      const auto it = ids_.find(ch);
      // A control or user-defined token spelled like a byte's character is not that byte: it
      // decodes to its stored text, so the byte counts as having no token.
      byte_id_[byte] = it == ids_.end() || is_literal(types_[it->second]) ? -1 : it->second;
    }

    KVSCOUT_EXPECTS(merges.size() <= max_id, merges.size(), " merges do not fit int32 ranks");
    merges_.reserve(merges.size());
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      const std::size_t sp = m.find(' ');
      KVSCOUT_EXPECTS(sp != std::string::npos && sp != 0 && sp + 1 < m.size() &&
                          m.find(' ', sp + 1) == std::string::npos,
                      "merge ", r, " ", b::quoted(m),
                      " is not two tokens separated by exactly one space");
      const std::string left = m.substr(0, sp);
      const std::string right = m.substr(sp + 1);
      const auto l = ids_.find(left);
      KVSCOUT_EXPECTS(l != ids_.end(), "merge ", r, " ", b::quoted(m), ": left part ",
                      b::quoted(left), " is not in the vocabulary");
      const auto rt = ids_.find(right);
      KVSCOUT_EXPECTS(rt != ids_.end(), "merge ", r, " ", b::quoted(m), ": right part ",
                      b::quoted(right), " is not in the vocabulary");
      const auto lr = ids_.find(left + right);
      KVSCOUT_EXPECTS(lr != ids_.end(), "merge ", r, " ", b::quoted(m), ": merged token ",
                      b::quoted(left + right), " is not in the vocabulary");
      const auto [it, inserted] = merges_.emplace(
          pair_key(l->second, rt->second), merge_entry{static_cast<std::int32_t>(r), lr->second});
      KVSCOUT_EXPECTS(inserted, "merge ", r, " ", b::quoted(m), " repeats merge ",
                      it->second.rank);
    }
  }

  /// Token ids of `text`; with add_bos, bos() first. With parse_special off, special-token text
  /// is encoded as ordinary text (for untrusted input). Bytes without a single-byte token are
  /// left out (see has_byte_token).
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text, bool add_bos = false,
                                                 bool parse_special = true) const {
    KVSCOUT_EXPECTS(text.size() < std::numeric_limits<std::uint32_t>::max(), "text of ",
                    text.size(), " bytes is too long");
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos) {
      KVSCOUT_EXPECTS(bos_ >= 0, "add_bos requested but the vocabulary has no bos token");
      out.push_back(bos_);
    }
    workspace ws;
    auto encode_plain = [&](std::string_view stretch) {
      detail::bpe::for_each_piece(stretch, pre_, ws.cps,
                                  [&](std::string_view piece) { encode_piece(piece, ws, out); });
    };
    std::size_t start = 0;
    std::size_t i = 0;
    while (parse_special && i < text.size()) {
      if (!special_first_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const std::int32_t hit = longest_special_at(text, i);
      if (hit < 0) {
        ++i;
        continue;
      }
      encode_plain(text.substr(start, i - start));
      out.push_back(hit);
      i += tokens_[hit].size();
      start = i;
    }
    encode_plain(text.substr(start));
    return out;
  }

  /// The bytes the ids stand for, concatenated. Throws for an id outside [0, vocab_size()).
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int32_t id = ids[i];
      KVSCOUT_EXPECTS(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(), "token id ", id,
                      " at position ", i, " out of range [0, ", tokens_.size(),
                      ") (vocabulary size ", tokens_.size(), ")");
      out += text_[id];
    }
    return out;
  }

  /// The bytes one token stands for (" world" for "Ġworld"; "<|im_end|>" for that control token).
  [[nodiscard]] const std::string& token_text(std::int32_t id) const {
    check_id(id);
    return text_[id];
  }

  /// The vocabulary entry as stored ("Ġworld").
  [[nodiscard]] const std::string& token_string(std::int32_t id) const {
    check_id(id);
    return tokens_[id];
  }

  [[nodiscard]] token_type type(std::int32_t id) const {
    check_id(id);
    return types_[id];
  }

  /// The id of a vocabulary entry spelled as stored ("Ġworld"), if there is one.
  [[nodiscard]] std::optional<std::int32_t> token_id(std::string_view token) const {
    const auto it = ids_.find(std::string(token));
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }

  /// Whether `byte` has a single-byte token; encode leaves out the bytes that do not.
  [[nodiscard]] bool has_byte_token(unsigned char byte) const noexcept {
    return byte_id_[byte] >= 0;
  }

  [[nodiscard]] std::int32_t bos() const noexcept { return bos_; }
  [[nodiscard]] std::int32_t eos() const noexcept { return eos_; }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return tokens_.size(); }
  [[nodiscard]] std::size_t merge_count() const noexcept { return merges_.size(); }
  [[nodiscard]] pre_tokenizer pre() const noexcept { return pre_; }

 private:
  struct merge_entry {
    std::int32_t rank;
    std::int32_t result;
  };
  struct symbol {
    std::int32_t id;
    std::int32_t prev;  // -1: none
    std::int32_t next;  // -1: none
  };
  struct candidate {
    std::int32_t rank;
    std::int32_t left;  // symbol index; ties go to the leftmost pair
    std::int32_t left_id;
    std::int32_t right_id;
  };
  struct workspace {
    std::vector<detail::bpe::cp_info> cps;
    std::vector<symbol> symbols;
    std::vector<candidate> heap;
  };

  void add_special(std::int32_t id) {
    const std::string& s = tokens_[id];
    special_first_[static_cast<unsigned char>(s[0])] = true;
    std::int32_t node = 0;
    for (const char c : s) {
      KVSCOUT_EXPECTS(special_end_.size() < std::numeric_limits<std::int32_t>::max(),
                      "special tokens of more than 2^31 bytes in all");
      const auto next = static_cast<std::int32_t>(special_end_.size());
      const auto [it, inserted] = special_edges_.try_emplace(special_key(node, c), next);
      if (inserted) special_end_.push_back(-1);
      node = it->second;
    }
    special_end_[static_cast<std::size_t>(node)] = id;  // tokens are unique: set once
  }

  static std::uint64_t special_key(std::int32_t node, char c) noexcept {
    return (static_cast<std::uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }

  /// The longest special token that `text` holds at `pos`, or -1.
  [[nodiscard]] std::int32_t longest_special_at(std::string_view text, std::size_t pos) const {
    std::int32_t node = 0;
    std::int32_t hit = -1;
    for (std::size_t j = pos; j < text.size(); ++j) {
      const auto it = special_edges_.find(special_key(node, text[j]));
      if (it == special_edges_.end()) break;
      node = it->second;
      if (special_end_[static_cast<std::size_t>(node)] >= 0) {
        hit = special_end_[static_cast<std::size_t>(node)];
      }
    }
    return hit;
  }

  static constexpr bool is_literal(token_type t) noexcept {
    return t == token_type::control || t == token_type::user_defined;
  }
  static constexpr std::uint64_t pair_key(std::int32_t l, std::int32_t r) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 32) |
           static_cast<std::uint32_t>(r);
  }

  void check_id(std::int32_t id) const {
    KVSCOUT_EXPECTS(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(), "token id ", id,
                    " out of range [0, ", tokens_.size(), ") (vocabulary size ", tokens_.size(),
                    ")");
  }

  const merge_entry* find_merge(std::int32_t l, std::int32_t r) const {
    const auto it = merges_.find(pair_key(l, r));
    return it == merges_.end() ? nullptr : &it->second;
  }

  /// BPE of one pre-tokenizer piece: a linked list of symbols and a min-heap of candidate pairs
  /// keyed by (rank, position). Entries made stale by earlier merges are skipped when popped, so
  /// a piece of n bytes costs O(n log n). Bytes without a token are left out, and their
  /// neighbours become adjacent, as in the reference tokenizers.
  void encode_piece(std::string_view piece, workspace& ws, std::vector<std::int32_t>& out) const {
    auto& sym = ws.symbols;
    auto& heap = ws.heap;
    sym.clear();
    heap.clear();
    for (const char c : piece) {
      const std::int32_t id = byte_id_[static_cast<unsigned char>(c)];
      if (id < 0) continue;
      const auto i = static_cast<std::int32_t>(sym.size());
      sym.push_back({id, i - 1, i + 1});
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    if (sym.size() == 1) {
      out.push_back(sym[0].id);
      return;
    }
    const auto n = static_cast<std::int32_t>(sym.size());
    constexpr auto later = [](const candidate& x, const candidate& y) {
      return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
    };
    auto push = [&](std::int32_t left) {
      const std::int32_t right = sym[left].next;
      if (right < 0) return;
      if (const merge_entry* m = find_merge(sym[left].id, sym[right].id)) {
        heap.push_back({m->rank, left, sym[left].id, sym[right].id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const candidate c = heap.back();
      heap.pop_back();
      symbol& l = sym[c.left];
      // Stale: the left symbol was absorbed or changed, or its right neighbour changed.
      if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;
      const std::int32_t right = l.next;
      l.id = find_merge(c.left_id, c.right_id)->result;
      l.next = sym[right].next;
      if (l.next >= 0) sym[l.next].prev = c.left;
      sym[right].id = -1;  // absorbed
      if (l.prev >= 0) push(l.prev);
      push(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }

  std::vector<std::string> tokens_;
  std::vector<token_type> types_;
  std::vector<std::string> text_;  // bytes of each token
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::uint64_t, merge_entry> merges_;  // (left id, right id) -> rank, result
  std::array<std::int32_t, 256> byte_id_{};                 // byte -> its single-byte token, -1
  // The literal (special) tokens as a byte trie: node 0 is the root, an edge is keyed by
  // (node << 8 | byte), and special_end_[node] is the token spelled by the path to it, or -1.
  // Finding the longest special at a position walks the trie once (at most the longest
  // special's length), whatever the number of specials.
  std::unordered_map<std::uint64_t, std::int32_t> special_edges_;
  std::vector<std::int32_t> special_end_{-1};
  std::array<bool, 256> special_first_{};  // first bytes of the specials
  std::int32_t bos_;
  std::int32_t eos_;
  pre_tokenizer pre_;
};

}  // namespace kvscout::model
