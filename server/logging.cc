#include "server/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace snapserve::server {

void InitLogging(const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("snapserve");
  // The message is already a complete JSON object; time and level go inside it.
  logger->set_pattern("%v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

void LogEvent(const std::string& level, const std::string& event, nlohmann::json fields) {
  const auto lvl = spdlog::level::from_str(level);
  if (!spdlog::should_log(lvl)) return;
  nlohmann::json line = {
      {"ts",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"level", level},
      {"event", event}};
  if (fields.is_object()) line.update(fields);
  spdlog::log(lvl, "{}", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace snapserve::server
