#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/concepts.hpp.
#pragma message("kvscout/spec/concepts.hpp is deprecated: include kvscout/score/concepts.hpp")
#include "kvscout/score/concepts.hpp"
