#pragma once
// Page tables: which physical pages hold a sequence's tokens. Two forms, one concept; both only
// hold pointers, whose arrays must stay readable where the table is used.
//   flashinfer_page_table  CSR form: indptr[num_seqs + 1] into indices[] (page ids), and
//                          last_page_len[num_seqs] in [1, page_size] for a sequence with pages.
//   block_table            vLLM form: table[num_seqs, max_blocks_per_seq] (row-major) of page
//                          ids, and seq_lens[num_seqs].

#include <concepts>
#include <cstdint>

#include "kvscout/core/config.hpp"
#include "kvscout/core/error.hpp"

namespace kvscout {

/// A sequence's length and the physical page of a logical page; validate(page_size, num_pages)
/// checks it on the host.
template <class P>
concept page_table = std::copyable<P> && requires(const P& p, int s, int i, int page_size) {
  { p.num_seqs() } -> std::same_as<int>;
  { p.seq_len(s, page_size) } -> std::same_as<int>;
  { p.page(s, i) } -> std::same_as<int>;
  p.validate(page_size, i);
};

struct flashinfer_page_table {
  const int32_t* indptr = nullptr;         // [num_seqs + 1]
  const int32_t* indices = nullptr;        // [indptr[num_seqs]]
  const int32_t* last_page_len = nullptr;  // [num_seqs]
  int seqs = 0;

  KVSCOUT_HOST_DEVICE int num_seqs() const { return seqs; }
  KVSCOUT_HOST_DEVICE int num_pages(int s) const { return indptr[s + 1] - indptr[s]; }
  KVSCOUT_HOST_DEVICE int seq_len(int s, int page_size) const {
    const int n = num_pages(s);
    return n == 0 ? 0 : (n - 1) * page_size + last_page_len[s];
  }
  KVSCOUT_HOST_DEVICE int page(int s, int i) const { return indices[indptr[s] + i]; }

  void validate(int page_size, int total_pages) const {
    KVSCOUT_EXPECTS(seqs >= 0, "num_seqs must be non-negative, got ", seqs);
    KVSCOUT_EXPECTS(indptr != nullptr, "page table indptr is null");
    KVSCOUT_EXPECTS(seqs == 0 || last_page_len != nullptr, "page table last_page_len is null");
    KVSCOUT_EXPECTS(indptr[0] >= 0, "page table indptr[0] = ", indptr[0], " is negative");
    // All of indptr before any page id: indices covers every sequence's pages only when indptr
    // never decreases.
    for (int s = 0; s < seqs; ++s) {
      KVSCOUT_EXPECTS(indptr[s + 1] >= indptr[s], "page table indptr is not non-decreasing: "
                      "indptr[", s, "] = ", indptr[s], " > indptr[", s + 1, "] = ", indptr[s + 1]);
    }
    for (int s = 0; s < seqs; ++s) {
      const int n = num_pages(s);
      KVSCOUT_EXPECTS(n == 0 || indices != nullptr, "page table indices is null, but sequence ", s,
                      " has ", n, " pages (indptr[", s, "] = ", indptr[s], ", indptr[", s + 1,
                      "] = ", indptr[s + 1], ")");
      if (n > 0) {
        KVSCOUT_EXPECTS(last_page_len[s] >= 1 && last_page_len[s] <= page_size,
                        "last_page_len[", s, "] = ", last_page_len[s], " disagrees with page_size ",
                        page_size, ": expected a value in [1, ", page_size, "] for a sequence with ",
                        n, " pages");
        const std::int64_t len = static_cast<std::int64_t>(n - 1) * page_size + last_page_len[s];
        KVSCOUT_EXPECTS(len <= INT32_MAX, "sequence ", s, " has ", n, " pages of ", page_size,
                        " tokens: ", len, " tokens exceed the int range of a sequence length");
      }
      for (int i = 0; i < n; ++i) {
        const int p = page(s, i);
        KVSCOUT_EXPECTS(p >= 0 && p < total_pages, "page id ", p, " (sequence ", s,
                        ", logical page ", i, ") is outside [0, ", total_pages, ")");
      }
    }
  }
};

struct block_table {
  const int32_t* table = nullptr;     // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;  // [num_seqs]
  int max_blocks_per_seq = 0;
  int seqs = 0;

  KVSCOUT_HOST_DEVICE int num_seqs() const { return seqs; }
  KVSCOUT_HOST_DEVICE int seq_len(int s, int /*page_size*/) const { return seq_lens[s]; }
  KVSCOUT_HOST_DEVICE int page(int s, int i) const {
    return table[static_cast<std::int64_t>(s) * max_blocks_per_seq + i];
  }

  void validate(int page_size, int total_pages) const {
    KVSCOUT_EXPECTS(seqs >= 0, "num_seqs must be non-negative, got ", seqs);
    KVSCOUT_EXPECTS(max_blocks_per_seq >= 0, "max_blocks_per_seq must be non-negative, got ",
                    max_blocks_per_seq);
    KVSCOUT_EXPECTS(seqs == 0 || seq_lens != nullptr, "block table seq_lens is null");
    KVSCOUT_EXPECTS(seqs == 0 || max_blocks_per_seq == 0 || table != nullptr,
                    "block table is null, with ", seqs, " sequences of ", max_blocks_per_seq,
                    " blocks");
    const std::int64_t room = static_cast<std::int64_t>(max_blocks_per_seq) * page_size;
    for (int s = 0; s < seqs; ++s) {
      KVSCOUT_EXPECTS(seq_lens[s] >= 0 && seq_lens[s] <= room, "seq_lens[", s, "] = ",
                      seq_lens[s], " disagrees with the block table: expected a value in [0, ",
                      room, "] (", max_blocks_per_seq, " blocks of ", page_size, " tokens)");
      const auto used = static_cast<int>(
          (static_cast<std::int64_t>(seq_lens[s]) + page_size - 1) / page_size);
      for (int i = 0; i < used; ++i) {
        const int p = page(s, i);
        KVSCOUT_EXPECTS(p >= 0 && p < total_pages, "page id ", p, " (sequence ", s,
                        ", logical page ", i, ") is outside [0, ", total_pages, ")");
      }
    }
  }
};

static_assert(page_table<flashinfer_page_table>);
static_assert(page_table<block_table>);

}  // namespace kvscout
