#pragma once
// The online softmax, written once for every path that needs one: the host and device attention
// and the sum_prob aggregation of speculation scores, host and device.
//
// A state (m, l, acc) summarises the rows pushed so far:
//   m = the largest logit, l = sum_i e^(x_i - m), acc = sum_i e^(x_i - m) v_i.
// softmax_push folds in one row of logit x and returns the two factors the caller applies to its
// accumulator, acc = acc * f + w * v. softmax_merge folds in another state the same way:
// acc = acc * fa + acc_b * fb.
//
// Edge cases, the same on every path:
// - an empty state is l == 0 (and m = -inf, acc = 0); merging it changes nothing;
// - a NaN logit is never a maximum and makes l (and so the output) NaN; merging a NaN state
//   keeps the NaN (its l is not 0, so it is never taken for empty);
// - a -inf logit weighs 0 and leaves the state as it was (a row of them only is empty);
// - the output of a state is acc / l, or 0 for an empty state.

#include <math.h>

#include "kvscout/core/config.hpp"

namespace kvscout::detail {

template <class Acc>
struct softmax_factors {
  Acc f;  // multiplies the accumulator so far
  Acc w;  // multiplies what is added (the row's v, or the merged state's accumulator)
};

template <class T>
KVSCOUT_HOST_DEVICE T softmax_exp(T x) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return expf(x);
  } else {
    return exp(x);
  }
}

template <class Acc>
KVSCOUT_HOST_DEVICE softmax_factors<Acc> softmax_push(Acc& m, Acc& l, Acc x) {
  // First, e^(-inf - -inf) would be NaN.
  if (x == -static_cast<Acc>(INFINITY)) return {Acc(1), Acc(0)};
  if (x > m) {
    const Acc f = softmax_exp(m - x);  // 0 on the first row (m = -inf)
    l = l * f + Acc(1);
    m = x;
    return {f, Acc(1)};
  }
  const Acc w = softmax_exp(x - m);
  l += w;
  return {Acc(1), w};
}

/// Raises the state's maximum to bm where bm is larger (a block of rows about to be pushed at
/// once): l is rescaled and *f set to the factor the caller's accumulator needs; returns false
/// otherwise. The block's rows then add e^(x - m) each to l.
template <class Acc>
KVSCOUT_HOST_DEVICE bool softmax_raise(Acc& m, Acc& l, Acc bm, Acc* f) {
  if (!(bm > m)) return false;
  *f = softmax_exp(m - bm);  // 0 on the first block (m = -inf)
  l *= *f;
  m = bm;
  return true;
}

template <class Acc>
KVSCOUT_HOST_DEVICE softmax_factors<Acc> softmax_merge(Acc& m, Acc& l, Acc mb, Acc lb) {
  const Acc M = mb > m ? mb : m;
  const Acc fa = l == Acc(0) ? Acc(0) : softmax_exp(m - M);
  const Acc fb = lb == Acc(0) ? Acc(0) : softmax_exp(mb - M);
  l = l * fa + lb * fb;
  m = M;
  return {fa, fb};
}

/// The n-ary merge of states b = 0 .. n-1: with M the largest m of the non-empty states, state b
/// weighs e^(m_b - M) (0 when empty). The same weights softmax_merge gives, folded once.
template <class Acc>
KVSCOUT_HOST_DEVICE Acc softmax_weight(Acc mb, Acc lb, Acc M) {
  return lb == Acc(0) ? Acc(0) : softmax_exp(mb - M);
}

template <class Acc>
KVSCOUT_HOST_DEVICE Acc softmax_share(Acc x, Acc m, Acc l) {
  return softmax_exp(x - m) / l;
}

}  // namespace kvscout::detail
