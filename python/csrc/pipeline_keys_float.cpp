// The pipeline instances with float partial keys (key_bits 0): pipeline.hpp.
#include "pipeline.hpp"

namespace kvscout_py {
template std::unique_ptr<pipeline_calls> build_pipeline<float>(const pipeline_args&);
}  // namespace kvscout_py
