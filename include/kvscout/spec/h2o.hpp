#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/h2o.hpp.
#pragma message("kvscout/spec/h2o.hpp is deprecated: include kvscout/score/h2o.hpp")
#include "kvscout/score/h2o.hpp"
