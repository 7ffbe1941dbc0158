#pragma once
// Errors. Host facades validate their inputs and throw kvscout::error; nothing in include/ calls
// exit() or abort(). The message names the offending values and what was expected, then the
// failed condition, the function that checked it (maybe a checker shared by several facades) and
// its source location, e.g.
//
//   kvscout::error: check_host_selection: token index 4096 (entry 3) for sequence 1, kv_head 0
//     is out of range [0, seq_len = 4096) [expected `t >= 0 && t < len`]
//     (at include/kvscout/fetch/detail/checks.hpp:<line>)

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace kvscout {

/// The one exception type kvscout throws. what() holds the full message; the parts are also
/// available one by one.
class error : public std::runtime_error {
 public:
  error(std::string message, std::string function, std::string file, int line)
      : std::runtime_error(compose(message, function, file, line)),
        message_(std::move(message)),
        function_(std::move(function)),
        file_(std::move(file)),
        line_(line) {}

  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  [[nodiscard]] const std::string& function() const noexcept { return function_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  static std::string compose(const std::string& message, const std::string& function,
                             const std::string& file, int line) {
    std::string s = "kvscout::error: ";
    s += function;
    s += ": ";
    s += message;
    s += " (at ";
    s += file;
    s += ':';
    s += std::to_string(line);
    s += ')';
    return s;
  }

  std::string message_;
  std::string function_;
  std::string file_;
  int line_;
};

namespace detail {

template <class... Parts>
std::string concat_message(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

/// Strips the directories in front of include/, so messages do not carry the build machine's paths.
constexpr std::string_view short_file(std::string_view path) {
  const auto pos = path.rfind("include/kvscout/");
  if (pos != std::string_view::npos) return path.substr(pos);
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

template <class... Parts>
[[noreturn]] void throw_error(const char* function, const char* file, int line,
                              const Parts&... parts) {
  throw ::kvscout::error(concat_message(parts...), function, std::string(short_file(file)), line);
}

}  // namespace detail
}  // namespace kvscout

#define KVSCOUT_FAIL(...) ::kvscout::detail::throw_error(__func__, __FILE__, __LINE__, __VA_ARGS__)

/// Throws kvscout::error when `cond` is false; the message is the streamed parts (any values with
/// an operator<<) followed by the condition's text.
#define KVSCOUT_EXPECTS(cond, ...)                                                         \
  do {                                                                                     \
    if (!(cond)) [[unlikely]] {                                                            \
      ::kvscout::detail::throw_error(__func__, __FILE__, __LINE__, __VA_ARGS__,            \
                                     " [expected `" #cond "`]");                           \
    }                                                                                      \
  } while (0)
