#include "edgeaccel/host/once_logger.h"

#include "glog/logging.h"

namespace edgeaccel {

void OnceLogger::Warn(const std::string& message) {
  if (First(message)) LOG(WARNING) << message;
}

void OnceLogger::Info(const std::string& message) {
  if (First(message)) LOG(INFO) << message;
}

bool OnceLogger::First(const std::string& message) {
  if (seen_.size() > 1000) seen_.clear();  // bounded, whatever a broken host throws at us
  return seen_.insert(message).second;
}

}  // namespace edgeaccel
