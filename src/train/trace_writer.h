// Writes the Chrome trace (contracts.md "Trace"): every rank's spans gathered to rank 0,
// pid = rank. Opens in Perfetto or chrome://tracing.
#pragma once
#include <string>

#include "comm/comm.h"
#include "zoe/status.h"

namespace zoe {
Status write_trace(Comm& comm, const std::string& path);
// Checks up front that `path` could be written (its directory writable, the name absent or a
// regular file), creating nothing; "" is fine. The trace is written whole, through an AtomicFile.
Status check_trace_path(const std::string& path);
}
