#pragma once
// How the device selectors (topk_selector_cuda, threshold_selector_cuda) split a long row over
// several blocks: an argument of their constructors and workspace_bytes. Plain data; no CUDA
// header needed.

namespace kvscout {

/// The SMs to fill (0: the current device's, asked when the selector is built) and the smallest
/// chunk of a row worth a block (a multiple of it starts every chunk). Tests pass small chunks to
/// exercise the split on short rows.
struct select_split_options {
  int num_sms = 0;
  int min_chunk_tokens = 2048;  // the default: detail::select_split_granule
};

}  // namespace kvscout
