// Helpers shared by the CPU suites.
#pragma once

#include <exception>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"

namespace cuda_agent::testing {

// Runs `fn`, expects it to throw cuda_agent::Error, and returns the message (empty, with a
// test failure recorded, when it does not).
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected cuda_agent::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected cuda_agent::Error, nothing was thrown";
  return "";
}

}  // namespace cuda_agent::testing
