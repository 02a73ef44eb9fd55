// Internal to the tokenizer: the pre-tokenizer pipeline (pretokenizer.cpp).
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "cuda_agent/policy/tokenizer.h"

namespace cuda_agent::policy {

// Receives one word: its raw bytes (not yet mapped to the byte alphabet).
using WordSink = std::function<void(std::string_view)>;

// Cuts `text` into words with `steps` (the last step is kByteLevel) and passes each word, in
// order, to `sink`. The views are valid only during the call.
void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text, const WordSink& sink);

// Recognizes a Split regex by its exact text; false when it is none of the known patterns.
bool parse_split_pattern(const std::string& regex, SplitPattern& out);

}  // namespace cuda_agent::policy
