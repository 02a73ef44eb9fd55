// The first include of every file in src/lm (before its own header).
//
// libtorch's include folder carries its own fmt (v12), and because torch's include directories
// come before /usr/include, <fmt/format.h> means torch's copy in this module while ca_core,
// ca_policy and spdlog are built against the system fmt (v9, a shared library). libtorch does
// not export fmt's functions, so here fmt is used header-only: CA_CHECK's fmt::format then needs
// no library. spdlog's headers do not compile against fmt v12, so cuda_agent/core/log.h cannot
// be included in this module either.
#pragma once

#ifdef FMT_VERSION
#error "src/lm/torch_fmt.h must be included before anything that includes fmt"
#endif
#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
