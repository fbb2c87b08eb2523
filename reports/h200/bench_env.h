// The benches' A/B switches (KDB_PDL=0 and the like, read by the launchers at every launch): f() run with the
// environment variable `name` set to `value`, then the variable restored to what it was (or unset).
#pragma once
#include <cstdlib>
#include <string>

template <class F>
auto with_env(const char* name, const char* value, F&& f) {
  const char* was = std::getenv(name);
  const std::string before = was ? was : "";
  setenv(name, value, 1);
  struct Restore {  // also when f returns early (a check's EXPECT) or returns void
    const char* name;
    bool was;
    const std::string& before;
    ~Restore() { was ? setenv(name, before.c_str(), 1) : unsetenv(name); }
  } restore{name, was != nullptr, before};
  return f();
}
