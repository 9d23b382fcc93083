#include "edgeaccel/host/once_logger.h"

#include "glog/logging.h"

namespace edgeaccel {

void OnceLogger::Warn(const std::string& message) {
  if (seen_.size() > 1000) seen_.clear();  // bounded, whatever a broken host throws at us
  if (seen_.insert(message).second) LOG(WARNING) << message;
}

void OnceLogger::Info(const std::string& message) {
  if (seen_.size() > 1000) seen_.clear();
  if (seen_.insert(message).second) LOG(INFO) << message;
}

}  // namespace edgeaccel
