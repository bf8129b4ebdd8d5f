#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace zoe {
namespace {

Status with_code(Code c, std::string m) {
  switch (c) {
    case Code::kInvalidInput: return Status::Invalid(std::move(m));
    case Code::kIo: return Status::Io(std::move(m));
    case Code::kOutOfMemory: return Status::OutOfMemory(std::move(m));
    case Code::kCorrupt: return Status::Corrupt(std::move(m));
    case Code::kComm: return Status::CommError(std::move(m));
    case Code::kUnsupported: return Status::Unsupported(std::move(m));
    default: return Status::Runtime(std::move(m));
  }
}

// The first failed rank's error, sent to every rank (collective; only after a failure).
Result<std::pair<int, Status>> first_failure(Comm& comm, const Status& mine) {
  int32_t failed = mine.ok() ? 0 : 1;
  std::vector<int32_t> all(comm.size());
  ZOE_RETURN_IF_ERROR(comm.all_gather_control(&failed, all.data(), sizeof failed));
  const int first = static_cast<int>(std::find(all.begin(), all.end(), 1) - all.begin());
  if (first == comm.size()) return Status::Runtime("agree: no rank reported the failure");
  struct Head {
    uint64_t bytes;
    uint8_t code;
  } head{mine.message().size(), static_cast<uint8_t>(mine.code())};
  ZOE_RETURN_IF_ERROR(comm.broadcast(&head, sizeof head, first));
  std::string text = comm.rank() == first ? mine.message() : std::string(std::min<uint64_t>(head.bytes, 1 << 20), ' ');
  ZOE_RETURN_IF_ERROR(comm.broadcast(text.data(), text.size(), first));
  return std::pair<int, Status>(first, with_code(static_cast<Code>(head.code), std::move(text)));
}

}  // namespace

Status agree(Comm& comm, const Status& mine, const Status& elsewhere) {
  double bad = mine.ok() ? 0 : 1;
  ZOE_RETURN_IF_ERROR(comm.all_reduce_sum(&bad, 1));
  if (bad == 0) return Status::Ok();
  // A rank that failed says why on every rank's line, not only on its own: the user reads one.
  auto first = first_failure(comm, mine);
  if (!mine.ok()) return mine;
  if (!first.ok()) return elsewhere;
  const auto& [rank, why] = first.value();
  return with_code(why.code(), elsewhere.message() + "; rank " + std::to_string(rank) + ": " + why.message());
}

}  // namespace zoe
