// Writes the Chrome trace (contracts.md "Trace"): every rank's spans gathered to rank 0,
// pid = rank. Opens in Perfetto or chrome://tracing.
#pragma once
#include <string>

#include "comm/comm.h"
#include "zoe/status.h"

namespace zoe {
Status write_trace(Comm& comm, const std::string& path);
// Checks up front that `path` can be written (creating it empty if absent); "" is fine.
Status check_trace_path(const std::string& path);
}
