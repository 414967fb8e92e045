// --config FILE.toml: the flags of train and tune read from a TOML file, and the resolved
// configuration a run writes beside its results (--out DIR: DIR/config.toml), which
// --config reads back to repeat the run.
//
// A key is a flag's name without its dashes (seq-len = 64; seq_len alike), its value of the
// flag's type: a string, an integer, a number, true or false for a switch, and for a flag
// that takes a list separated by commas (--pp-split, --normalize, --resume-change) an array
// or that string. Tables ([model], [training]) only group keys: their names are ignored.
// Flags given on the command line override the file's. The file's values go through the
// flags' own checks. The flags are CLI11's: a flag defined in cli/args.cpp is a key here,
// with no list of names to keep beside it.
//
// Every error is one line that names the file, the line and the key (sat::Error): a key
// that names no flag (with the names close to it), a value of the wrong type, a key given
// twice, a value the flag's check refuses (its message), and TOML's own syntax errors.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace sat {
struct TrainConfig;
}

namespace sat::cli {

// A flag of a command once the command line and --config are read.
struct FlagValue {
  std::string key;     // the flag's name without its dashes: "seq-len"
  std::string type;    // CLI11's: INT, UINT, FLOAT or TEXT; "" for a switch
  bool set = false;    // given, or a default with a value (false: the flag's help says what applies)
  std::string value;   // as the flag takes it; "true" or "false" for a switch
  std::string origin;  // "command line", "FILE:LINE" (--config) or "default"
  std::string help;    // the flag's description
  std::vector<std::string> excludes;  // the keys of the flags it cannot go with (epochs, steps)
};

// Reads FILE into the flags of `command` (an App CLI11 has parsed) that the command line
// left unset. sat::Error as above.
void apply_config_file(CLI::App* command, const std::string& file);

// Every flag of `command` but --help and --config, in the order they were defined.
std::vector<FlagValue> flag_values(const CLI::App* command);

// An error about a flag the config file set ("--shuffle: expected on or off, got 'x'",
// found by a check that runs after parsing) with the file, the line and the key in front:
// "run.toml:3: shuffle: expected on or off, got 'x'". Other messages are returned as they are.
std::string with_config_origin(const std::string& message);

// A value saturate resolved for a run, written in config.toml in place of the flag's.
struct Resolved {
  std::string toml;   // the value as TOML; "" keeps the flag's value and only adds `why`
  std::string why;    // the comment beside it ("chosen by --batch auto")
  bool drop = false;  // written commented out: its choice is written in other flags (--layout)
};

// What the run resolved (cfg once tuned): --batch auto's micro-batch, accumulation and
// learning rate, --layout's layout, the optimizer's default learning rate and weight decay,
// --device auto. Keyed by the flag's key.
std::map<std::string, Resolved> resolved_flags(const TrainConfig& cfg, const std::vector<FlagValue>& flags,
                                               bool tuned_batch, bool tuned_layout);

// config.toml: every flag with its value and, in a comment, where it came from; a flag not
// given (and without a default) as a comment; the flags of where a run writes and resumes
// from (--out, --checkpoint-dir, ...) commented out, so that `saturate COMMAND --config
// config.toml --out NEW` repeats the run without touching the first one's files.
std::string config_toml(const std::string& command, const std::vector<FlagValue>& flags,
                        const std::map<std::string, Resolved>& resolved);

// A float as the shortest decimal that reads back (strtod, then float) as the same float.
std::string float_text(float x);

}  // namespace sat::cli
