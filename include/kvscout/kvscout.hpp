#pragma once
// kvscout: speculative KV-cache prefetch for offloaded LLM decoding, as generic parts.
// This umbrella header includes every host-compilable part (.hpp); CUDA parts (.cuh) are
// included one by one from code compiled with nvcc.

#include "kvscout/core/config.hpp"
#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/page_table.hpp"
#include "kvscout/kv/paged.hpp"
#include "kvscout/backend/host/thread_pool.hpp"
