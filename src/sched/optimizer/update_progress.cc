#include "sched/optimizer/update_progress.h"

#include <algorithm>

namespace zoe {

void UpdateProgress::start() {
  std::lock_guard<std::mutex> l(mu_);
  upto_ = 0;
  running_ = true;
  status_ = Status::Ok();
}

void UpdateProgress::advance(int64_t upto) {
  {
    std::lock_guard<std::mutex> l(mu_);
    upto_ = std::max(upto_, upto);
  }
  cv_.notify_all();
}

void UpdateProgress::finish(const Status& st) {
  {
    std::lock_guard<std::mutex> l(mu_);
    running_ = false;
    if (st.ok()) upto_ = kAll;
    status_ = st;
    reported_ = st.ok();
  }
  cv_.notify_all();
}

Status UpdateProgress::wait_until(int64_t upto) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return upto_ >= upto || !running_; });
  if (!running_) reported_ = true;
  return status_;
}

bool UpdateProgress::updated(int64_t upto) const {
  std::lock_guard<std::mutex> l(mu_);
  return upto_ >= upto && status_.ok();
}

Status UpdateProgress::take_unreported() {
  std::lock_guard<std::mutex> l(mu_);
  if (reported_) return Status::Ok();
  reported_ = true;
  return status_;
}

bool UpdateProgress::running() const {
  std::lock_guard<std::mutex> l(mu_);
  return running_;
}

}  // namespace zoe
