#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/streaming.cuh.
#pragma message("kvscout/spec/streaming.cuh is deprecated: include kvscout/score/streaming.cuh")
#include "kvscout/score/streaming.cuh"
