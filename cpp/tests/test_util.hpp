// Helpers shared by the unit tests: forked children that never reach doctest's reporting,
// bounded waits for them, and the /dev/shm leak check.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace zcoll_test {

// Whether /proc/cpuinfo lists `flag` (e.g. "bmi2", "avx2") for this CPU.
inline bool cpu_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

// Runs `body` in a forked child, which leaves with _exit(body()) (101 on an exception, its message
// on stderr), so neither doctest's reporter nor any destructor of the parent's objects runs there.
template <class Body>
pid_t fork_child(Body body) {
  std::fflush(nullptr);  // no buffered output duplicated into the child
  const pid_t pid = ::fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    int code = 100;
    try {
      code = body();
    } catch (const std::exception& e) {  // said, so a failure in a child can be told apart
      std::fprintf(stderr, "forked child %d: %s\n", static_cast<int>(::getpid()), e.what());
      code = 101;
    } catch (...) {
      code = 101;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

// Exit status of `pid`, or -1 if it had to be killed after `limit_s`, -2 if it died of a signal.
inline int wait_child(pid_t pid, double limit_s = 10.0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  for (;;) {
    int status = 0;
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return -2;
    }
    if (got < 0) return -3;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Entries of /dev/shm whose name starts with `prefix` (no leading slash).
inline std::vector<std::string> shm_entries(const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name);
    }
    ::closedir(dir);
  }
  return out;
}

// Prefix of every segment this process creates: "zcoll-<uid>-<pid>-" (see arena.cpp's naming).
// (Built with append: GCC 12 warns falsely, -Wrestrict, on chains of string operator+.)
inline std::string own_segment_prefix(char lead = '\0') {
  std::string s;
  if (lead) s += lead;
  s.append("zcoll-").append(std::to_string(::getuid())).append("-");
  s.append(std::to_string(::getpid())).append("-");
  return s;
}

inline bool shm_exists(const std::string& segment_name) {  // name as returned by name(): "/..."
  return ::access(("/dev/shm" + segment_name).c_str(), F_OK) == 0;
}

}  // namespace zcoll_test
