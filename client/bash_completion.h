// Bash completion generated from a CLI11 app's subcommands and flags (`wbctl completion bash`):
// what the completion offers is what the parser accepts, with nothing listed twice by hand.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace wb::client {

struct CompletionHints {
  // A flag ("--engine", or a subcommand name for its positional) -> the words that follow it.
  std::map<std::string, std::vector<std::string>> choices;
  // Flags whose value is a file name.
  std::vector<std::string> file_flags;
};

// A bash script defining _<program> and `complete -F _<program> <program>`: the subcommands,
// then each subcommand's flags plus the app's own (global) flags.
std::string BashCompletion(CLI::App& app, const std::string& program, const CompletionHints& hints);

}  // namespace wb::client
