#include "comm/comm.h"

namespace zoe {

Status agree(Comm& comm, const Status& mine, const Status& elsewhere) {
  double bad = mine.ok() ? 0 : 1;
  ZOE_RETURN_IF_ERROR(comm.all_reduce_sum(&bad, 1));
  if (!mine.ok()) return mine;
  return bad > 0 ? elsewhere : Status::Ok();
}

}  // namespace zoe
