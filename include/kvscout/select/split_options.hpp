#pragma once
// How the device selectors split a long row over several blocks. Plain data.

namespace kvscout {

/// The SMs to fill (0: the current device's, asked when the selector is built) and the smallest
/// chunk of a row worth a block (a multiple of it starts every chunk).
struct select_split_options {
  int num_sms = 0;
  int min_chunk_tokens = 2048;  // the default: detail::select_split_granule
};

}  // namespace kvscout
